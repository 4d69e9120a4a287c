"""Stage jobs as Kubeflow Trainer v2 ``TrainJob``s (``trainer.kubeflow.org/v1alpha1``; contract.md §7).

``manifest`` and ``state`` are pure. One TrainJob per stage attempt, named, labelled and owned like
the PyTorchJob (``jobs.manifest``), referencing a ``ClusterTrainingRuntime`` (default
``torch-distributed``). ``spec.trainer`` carries the image, the same launcher (``python -m
solar.launch.torchrun``: torchrun exiting as its ranks did) with the same argument list
as the PyTorchJob's container, the node count, processes per node, resources and environment; the
runtime's torch plugin injects the ``PET_*`` rendezvous variables torchrun reads. Everything else a
pod needs (run volume, extra volumes, ``/dev/shm``, scheduling, pull secrets, service account,
security context, pod labels) goes through ``spec.runtimePatches`` under the manager
``solarwm.io/operator``, into the runtime's replicated job ``node`` and its container ``node`` —
as far as the v2.3.0 schema allows: it has no place for ``priorityClassName``, ``schedulerName``,
``imagePullPolicy`` or container ports, so ``problems`` refuses a run that sets the first three
(they belong in the runtime) and the trainer's metrics port is not declared.

Failure is the ``Failed`` condition, completion ``Complete``; a stage still succeeds only by its
files. SolarRun suspend sets ``spec.suspend`` (and the ``solarwm.io/suspended`` annotation that says
the operator did it); the operator never clears a suspend, whoever set it.
"""

from __future__ import annotations

from solar.run.machine import Action, JobState
from solar.run.plan import StagePlan
from solar.run.spec import DEFAULT_RUNTIME, SolarRunSpec
from solar_operator import pod
from solar_operator.jobs import (
    ATTEMPT_LABEL,
    DNS1035,
    LAUNCHER,
    POD_LABELS,
    RESUME_ANNOTATION,
    RUN_LABEL,
    STAGE_LABEL,
    SUSPEND_ANNOTATION,
    create_owned,
    delete_owned,
    job_state,
    observe_owned,
    owned_object,
    queue_label,
    stage_resources,
)

GROUP, VERSION, KIND, PLURAL = "trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs"
API_VERSION = f"{GROUP}/{VERSION}"
RES = (GROUP, VERSION, PLURAL)
RUNTIME_RES = (GROUP, VERSION, "clustertrainingruntimes")
RUNTIME_KIND = "ClusterTrainingRuntime"
MANAGER = "solarwm.io/operator"
REPLICATED_JOB = CONTAINER = "node"   # the torch-distributed runtime's replicated job and container


def runtime_name(spec: SolarRunSpec) -> str:
    return spec.trainingRuntime or DEFAULT_RUNTIME


def spec_problems(spec: SolarRunSpec) -> list[str]:
    """Run fields a TrainJob cannot carry (the v2.3.0 runtime patch has no place for them)."""
    out = []
    for key in ("priorityClassName", "schedulerName"):
        if getattr(spec, key):
            out.append(f"spec.{key}: a TrainJob cannot set it (Trainer v2.3.0 runtimePatches have no such field); "
                       f"set it in the ClusterTrainingRuntime {runtime_name(spec)} or use backend PyTorchJob")
    if spec.imagePullPolicy != "IfNotPresent":
        out.append(f"spec.imagePullPolicy: a TrainJob cannot set {spec.imagePullPolicy} (the trainer has no pull "
                   f"policy); set it in the ClusterTrainingRuntime {runtime_name(spec)} or use backend PyTorchJob")
    return out


def manifest(run: dict, spec: SolarRunSpec, plan: StagePlan, job: str, *, attempt: int,
             resume_from: str | None) -> dict:
    """The TrainJob of one stage attempt, owned by the SolarRun ``run`` (its API object)."""
    meta = run["metadata"]
    labels = {RUN_LABEL: meta["name"], STAGE_LABEL: plan.name, "app.kubernetes.io/managed-by": "solar-operator",
              "app.kubernetes.io/part-of": "solar"}
    volumes, mounts = pod.volumes(spec)
    trainer = {"image": spec.image, "command": LAUNCHER,
               "args": [f"--nproc-per-node={plan.nproc}", *plan.arguments(resume_from)],
               "numNodes": plan.nodes, "numProcPerNode": plan.nproc, "env": pod.env(run, spec, plan, attempt)}
    resources = stage_resources(spec, plan.name)
    if resources:
        trainer["resourcesPerNode"] = resources
    pod_spec = {"volumes": volumes, "containers": [{"name": CONTAINER, "volumeMounts": mounts}],
                **pod.settings(spec, scheduling=False)}
    pod_meta = {"labels": {**labels, **POD_LABELS, ATTEMPT_LABEL: str(attempt)}}
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": REPLICATED_JOB, "template": {"spec": {"template": {"metadata": pod_meta, "spec": pod_spec}}}}]}}}}
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {
            "name": job, "namespace": meta.get("namespace"),
            "labels": {**labels, ATTEMPT_LABEL: str(attempt), **queue_label(spec)},
            **({"annotations": {RESUME_ANNOTATION: resume_from}} if resume_from else {}),
            "ownerReferences": [{"apiVersion": run["apiVersion"], "kind": run["kind"], "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"runtimeRef": {"apiGroup": GROUP, "kind": RUNTIME_KIND, "name": runtime_name(spec)},
                 "trainer": trainer, "runtimePatches": [patch]},
    }


def admission_problems(job: dict) -> list[str]:
    """The TrainJob CRD's CEL rules (metadata.name an RFC 1035 label of at most 63 characters)."""
    name = job.get("metadata", {}).get("name", "")
    return [] if DNS1035.match(name) and len(name) <= 63 else [f"metadata.name {name!r} is not a DNS-1035 label"]


def state(job: dict) -> JobState:
    """``Failed``/``Complete`` conditions decide; else ``Suspended``; else Running once a child job is
    active (``status.jobsStatus``), Created before."""
    status = job.get("status") or {}
    conditions = status.get("conditions") or []
    true = {c.get("type"): c for c in conditions if c.get("status") == "True"}
    if "Failed" in true:
        c = true["Failed"]
        phase, message = "Failed", ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
    elif "Complete" in true:
        phase, message = "Succeeded", true["Complete"].get("message", "")
    elif "Suspended" in true:
        phase, message = "Suspended", true["Suspended"].get("message", "")
    elif any((j.get("active") or 0) + (j.get("succeeded") or 0) > 0 for j in status.get("jobsStatus") or []):
        phase, message = "Running", ""
    else:
        phase, message = "Created", ""
    return job_state(job, phase, message, bool((job.get("spec") or {}).get("suspend")), conditions)


class TrainJobBackend:
    def __init__(self, kube) -> None:
        self.kube = kube

    def unavailable(self, spec: SolarRunSpec) -> str | None:
        """Why this cluster cannot run the run's TrainJobs (checked before any job exists), or None."""
        if not self.kube.served(RES):
            return (f"spec.backend TrainJob: the cluster does not serve {PLURAL}.{GROUP}/{VERSION} (install Kubeflow "
                    "Trainer v2, or use backend PyTorchJob)")
        name = runtime_name(spec)
        if not self.kube.served(RUNTIME_RES) or self.kube.get_cluster_object(RUNTIME_RES, name) is None:
            return (f"spec.trainingRuntime: the ClusterTrainingRuntime {name} does not exist (kubectl get "
                    "clustertrainingruntimes lists those installed)")
        return None

    def observe(self, run: dict) -> dict[str, JobState]:
        return observe_owned(self.kube, RES, run, state)

    def create(self, run: dict, spec: SolarRunSpec, plan: StagePlan, action: Action) -> str | bool:
        job = manifest(run, spec, plan, action.job, attempt=action.attempt, resume_from=action.resume_from)
        return create_owned(self.kube, RES, run, job, admission_problems(job))

    def delete(self, run: dict, job: str) -> bool:
        return delete_owned(self.kube, RES, run, job)

    def suspend(self, run: dict, job: str) -> bool:
        """SolarRun suspend: ``spec.suspend: true``, marked as the operator's own doing."""
        if owned_object(self.kube, RES, run, job, "suspend") is None:
            return False
        patch = {"metadata": {"annotations": {SUSPEND_ANNOTATION: "true"}}, "spec": {"suspend": True}}
        return self.kube.patch_object(RES, run["metadata"]["namespace"], job, patch) is not None
