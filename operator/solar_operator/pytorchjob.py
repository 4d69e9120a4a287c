"""One stage as a Kubeflow ``kubeflow.org/v1`` PyTorchJob (contract.md §4, kubernetes.md).

Pure: the manifest is a function of the SolarRun and the stage plan. The job's container runs
``torchrun --nproc-per-node=<gpusPerNode> -m solar <action> --config ... --set ...`` as an
argument list (no shell; torchrun reads the PET_* variables the training operator injects). Pods
restart through the SolarRun (``restartPolicy: Never``, job ``backoffLimit: 0``): a retry must
resume from the newest verified checkpoint, which a plain pod restart would not do.

``webhook_problems`` enforces the training operator's admission rules, which its CRD schema does
not express.
"""

from __future__ import annotations

import re

from solar.run.plan import StagePlan
from solar.run.spec import SolarRunSpec

API_VERSION, KIND, PLURAL = "kubeflow.org/v1", "PyTorchJob", "pytorchjobs"
GROUP, VERSION = "kubeflow.org", "v1"
RUN_LABEL, STAGE_LABEL, ATTEMPT_LABEL = "solarwm.io/run", "solarwm.io/stage", "solarwm.io/attempt"
METRICS_PORT = 9400
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def build(run: dict, spec: SolarRunSpec, plan: StagePlan, job: str, *, attempt: int,
          resume_from: str | None) -> dict:
    """The PyTorchJob of one stage attempt, owned by the SolarRun ``run`` (its API object)."""
    meta = run["metadata"]
    labels = {RUN_LABEL: meta["name"], STAGE_LABEL: plan.name, "app.kubernetes.io/managed-by": "solar-operator",
              "app.kubernetes.io/part-of": "solar"}
    mounts = [{"name": "solar-runs", "mountPath": spec.storage.mountPath}]
    volumes = [{"name": "solar-runs", **spec.storage.volume}]
    for extra in spec.volumes:
        mounts.append({"name": extra.name, "mountPath": extra.mountPath, "readOnly": extra.readOnly})
        volumes.append({"name": extra.name, **extra.volume})
    container = {
        "name": "pytorch",
        "image": spec.image,
        "imagePullPolicy": spec.imagePullPolicy,
        "command": ["torchrun"],
        "args": [f"--nproc-per-node={plan.nproc}", *plan.arguments(resume_from)],
        "env": [{"name": "SOLAR_METRICS_PORT", "value": str(METRICS_PORT)},
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "pytorchjob-port", "containerPort": 23456},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "volumeMounts": mounts,
        "resources": spec.resources,
    }
    pod = {"containers": [container], "volumes": volumes, "restartPolicy": "Never"}
    for key in ("nodeSelector", "affinity", "priorityClassName", "schedulerName"):
        value = getattr(spec, key)
        if value:
            pod[key] = value
    if spec.tolerations:
        pod["tolerations"] = spec.tolerations
    template = {"metadata": {"labels": {**labels, ATTEMPT_LABEL: str(attempt)},
                             "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)}},
                "spec": pod}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if plan.nodes > 1:
        replicas["Worker"] = {"replicas": plan.nodes - 1, "restartPolicy": "Never", "template": template}
    policy = spec.runPolicy
    run_policy = {"cleanPodPolicy": policy.cleanPodPolicy, "backoffLimit": 0}
    if policy.ttlSecondsAfterFinished is not None:
        run_policy["ttlSecondsAfterFinished"] = policy.ttlSecondsAfterFinished
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {
            "name": job, "namespace": meta.get("namespace"),
            "labels": {**labels, ATTEMPT_LABEL: str(attempt)},
            "annotations": {"solarwm.io/resume-from": resume_from or ""},
            "ownerReferences": [{"apiVersion": run["apiVersion"], "kind": run["kind"], "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"nprocPerNode": str(plan.nproc), "pytorchReplicaSpecs": replicas, "runPolicy": run_policy},
    }


def webhook_problems(job: dict) -> list[str]:
    """The training operator's admission checks (v1.9 webhook)."""
    problems = []
    name = job.get("metadata", {}).get("name", "")
    if not DNS1035.match(name) or len(name) > 63:
        problems.append(f"metadata.name {name!r} is not a DNS-1035 label")
    specs = job.get("spec", {}).get("pytorchReplicaSpecs", {})
    for kind, replica in specs.items():
        if kind not in ("Master", "Worker"):
            problems.append(f"replica type {kind!r} (only Master and Worker)")
            continue
        containers = replica.get("template", {}).get("spec", {}).get("containers", [])
        if not any(c.get("name") == "pytorch" for c in containers):
            problems.append(f"{kind}: no container named pytorch")
        if any(not c.get("image") for c in containers):
            problems.append(f"{kind}: a container without an image")
    if "Master" in specs and specs["Master"].get("replicas") != 1:
        problems.append("Master.replicas must be 1")
    if "Worker" in specs and (specs["Worker"].get("replicas") or 0) < 1:
        problems.append("Worker.replicas must be >= 1")
    if job.get("spec", {}).get("elasticPolicy") and "Worker" not in specs:
        problems.append("elasticPolicy needs a Worker replica spec")
    return problems


def state(job: dict):
    """The job's phase: the last condition whose status is True (kubernetes.md)."""
    from solar.run.machine import JobState

    conditions = job.get("status", {}).get("conditions") or []
    true = [c for c in conditions if c.get("status") == "True"]
    last = true[-1] if true else None
    return JobState(job["metadata"]["name"], last.get("type") if last else None,
                    (last or {}).get("message", ""), bool(job["metadata"].get("deletionTimestamp")))
