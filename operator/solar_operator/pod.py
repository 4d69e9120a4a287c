"""What every stage pod carries, whatever the job kind (contract.md §4 and §7); pure.

The run volume and the extra volumes with their mounts, ``/dev/shm`` as a memory-backed
``emptyDir`` of ``spec.sharedMemory`` (none when it is ``"0"``), the container environment (the
operator's own variables first, then ``spec.env``) and the pod-level settings. ``jobs`` (PyTorchJob)
and ``trainjobs`` (TrainJob) place these pieces where their kinds want them.
"""

from __future__ import annotations

from solar.run.plan import StagePlan
from solar.run.spec import SolarRunSpec
from solar.storage.fence import ENV as ATTEMPT_ENV

RUN_VOLUME, SHM_VOLUME, SHM_PATH = "solar-runs", "solar-shm", "/dev/shm"
METRICS_PORT = 9400


def volumes(spec: SolarRunSpec) -> tuple[list[dict], list[dict]]:
    """(pod volumes, container volumeMounts)."""
    mounts = [{"name": RUN_VOLUME, "mountPath": spec.storage.mountPath}]
    vols = [{"name": RUN_VOLUME, **spec.storage.volume}]
    for extra in spec.volumes:
        mounts.append({"name": extra.name, "mountPath": extra.mountPath, "readOnly": extra.readOnly})
        vols.append({"name": extra.name, **extra.volume})
    if spec.shm_bytes() > 0:
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
        vols.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.sharedMemory}})
    return vols, mounts


# torch.compile's caches (Inductor's FX graph and AOTAutograd caches, Triton's kernels) below the run
# root: every attempt of every stage (a resume, an elastic shrink or grow, the next stage at the same
# block shapes) loads what an earlier pod compiled instead of compiling it again in its own /tmp.
# Entries are keyed by graph, torch/Triton version and device, and written by atomic rename.
COMPILE_CACHES = (("TORCHINDUCTOR_CACHE_DIR", "torchinductor"), ("TRITON_CACHE_DIR", "triton"))


def env(run: dict, spec: SolarRunSpec, plan: StagePlan, attempt: int) -> list[dict]:
    """The trainer container's environment: the operator's variables, the compile caches on the run
    volume (unless ``spec.env`` names them: the user's place wins), then ``spec.env`` (whose names
    never collide with the operator's: the spec refuses SOLAR_*, PET_* and the rendezvous names)."""
    theirs = spec.pod_env()
    own = {item["name"] for item in theirs}
    return [{"name": "SOLAR_METRICS_PORT", "value": str(METRICS_PORT)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            # recorded in run-result.json: evidence of another run is recognised (run/observe.py)
            {"name": "SOLAR_RUN_UID", "value": run["metadata"].get("uid", "")},
            {"name": "SOLAR_RUN_STAGE", "value": plan.name},
            # the MLflow experiment's default name and its runs' solar.run tag (solar.train.tracking)
            {"name": "SOLAR_RUN_NAME", "value": run["metadata"].get("name", "")},
            # the attempt's fencing token (solar.storage.fence): a process of a replaced attempt that
            # wakes up (a healed partition, a kubelet that died with its containers running) writes nothing
            {"name": ATTEMPT_ENV, "value": str(attempt)},
            *({"name": name, "value": f"{spec.run_root}/.cache/{leaf}"}
              for name, leaf in COMPILE_CACHES if name not in own),
            *theirs]


def settings(spec: SolarRunSpec, *, scheduling: bool = True) -> dict:
    """Pod-spec fields from the run: scheduling (nodeSelector, tolerations, affinity and, with
    ``scheduling``, priorityClassName and schedulerName), imagePullSecrets, serviceAccountName and
    securityContext (``spec.podSecurityContext``); only those the run sets."""
    pod: dict = {}
    keys = ("nodeSelector", "affinity", "priorityClassName", "schedulerName") if scheduling else \
        ("nodeSelector", "affinity")
    for key in keys:
        value = getattr(spec, key)
        if value:
            pod[key] = value
    if spec.tolerations:
        pod["tolerations"] = spec.tolerations
    if spec.imagePullSecrets:
        pod["imagePullSecrets"] = [s.model_dump() for s in spec.imagePullSecrets]
    if spec.serviceAccountName:
        pod["serviceAccountName"] = spec.serviceAccountName
    if spec.podSecurityContext:
        pod["securityContext"] = spec.podSecurityContext
    return pod
