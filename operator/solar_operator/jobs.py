"""Stage jobs: one stage attempt as a Kubeflow ``kubeflow.org/v1`` PyTorchJob (contract.md §4, kubernetes.md).

``manifest``, ``webhook_problems`` and ``state`` are pure: the manifest is a function of the
SolarRun and the stage plan. The job's container runs
``python -m solar.launch.torchrun --nproc-per-node=<gpusPerNode> -m solar <action> --config ... --set ...``
as an argument list (no shell): torchrun (torch's elastic agent, which reads the PET_* variables the
training operator injects) that exits as its ranks did, 0 after a stop on SIGTERM that saved
(``solar.launch.torchrun``; torch's own ``torchrun`` exits 1 then, so an evicted pod read as failed). Pods
restart through the SolarRun (``restartPolicy: Never``, job ``backoffLimit: 0``): a retry must
resume from the newest verified checkpoint, which a plain pod restart would not do.

``webhook_problems`` enforces the training operator's admission rules, which its CRD schema does
not express. ``PyTorchJobBackend`` carries them out through ``kube.Kube`` behind the small
``JobBackend`` interface, so a Kubeflow Trainer v2 ``TrainJob`` backend can sit beside it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

from solar.run.failure import REFUSED_PREFIX
from solar.run.machine import Action, JobState, parse_iso
from solar.run.plan import StagePlan
from solar.run.spec import SolarRunSpec
from solar_operator import errors, pod
from solar_operator.pod import METRICS_PORT

API_VERSION, KIND, PLURAL = "kubeflow.org/v1", "PyTorchJob", "pytorchjobs"
GROUP, VERSION = "kubeflow.org", "v1"
RES = (GROUP, VERSION, PLURAL)
# the container's command: torchrun that exits as its ranks did (solar.launch.torchrun); python is the
# trainer image's venv interpreter (images/trainer/Dockerfile)
LAUNCHER = ["python", "-m", "solar.launch.torchrun"]
RUN_LABEL, STAGE_LABEL, ATTEMPT_LABEL = "solarwm.io/run", "solarwm.io/stage", "solarwm.io/attempt"
RESUME_ANNOTATION = "solarwm.io/resume-from"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SUSPEND_ANNOTATION = "solarwm.io/suspended"   # "true": the operator set the job's suspend (SolarRun suspend)
REPLICA_LABEL = "solarwm.io/replica"   # master | worker
# Trainer pods: what the chart's trainer PodMonitor selects (with REPLICA_LABEL=master).
POD_LABELS = {"app.kubernetes.io/name": "solar-trainer", "app.kubernetes.io/component": "trainer"}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def manifest(run: dict, spec: SolarRunSpec, plan: StagePlan, job: str, *, attempt: int,
             resume_from: str | None) -> dict:
    """The PyTorchJob of one stage attempt, owned by the SolarRun ``run`` (its API object)."""
    meta = run["metadata"]
    labels = {RUN_LABEL: meta["name"], STAGE_LABEL: plan.name, "app.kubernetes.io/managed-by": "solar-operator",
              "app.kubernetes.io/part-of": "solar"}
    volumes, mounts = pod.volumes(spec)
    def template(replica: str) -> dict:
        """Rank 0 runs in the Master pod, so only Master pods declare the metrics port and carry the
        ``solarwm.io/replica: master`` label the chart's trainer PodMonitor selects."""
        master = replica == "Master"
        ports = [{"name": "pytorchjob-port", "containerPort": 23456}]
        if master:
            ports.append({"name": "metrics", "containerPort": METRICS_PORT})
        container = {
            "name": "pytorch",
            "image": spec.image,
            "imagePullPolicy": spec.imagePullPolicy,
            "command": LAUNCHER,
            "args": [f"--nproc-per-node={plan.nproc}", *plan.arguments(resume_from)],
            "env": pod.env(run, spec, plan, attempt),
            "ports": ports,
            "volumeMounts": mounts,
            "resources": stage_resources(spec, plan.name),
        }
        pod_spec = {"containers": [container], "volumes": volumes, "restartPolicy": "Never", **pod.settings(spec)}
        pod_labels = {**labels, **POD_LABELS, ATTEMPT_LABEL: str(attempt), REPLICA_LABEL: replica.lower()}
        metadata = {"labels": pod_labels}
        if master:
            metadata["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)}
        return {"metadata": metadata, "spec": pod_spec}

    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template("Master")}}
    if plan.nodes > 1:
        replicas["Worker"] = {"replicas": plan.nodes - 1, "restartPolicy": "Never", "template": template("Worker")}
    policy = spec.runPolicy
    run_policy = {"cleanPodPolicy": policy.cleanPodPolicy, "backoffLimit": 0}
    if policy.ttlSecondsAfterFinished is not None:
        run_policy["ttlSecondsAfterFinished"] = policy.ttlSecondsAfterFinished
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {
            "name": job, "namespace": meta.get("namespace"),
            "labels": {**labels, ATTEMPT_LABEL: str(attempt), **queue_label(spec)},
            **({"annotations": {RESUME_ANNOTATION: resume_from}} if resume_from else {}),
            "ownerReferences": [{"apiVersion": run["apiVersion"], "kind": run["kind"], "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"nprocPerNode": str(plan.nproc), "pytorchReplicaSpecs": replicas, "runPolicy": run_policy},
    }


def queue_label(spec: SolarRunSpec) -> dict:
    """Kueue's queue label when the run names a LocalQueue (contract.md §7)."""
    return {QUEUE_LABEL: spec.queueName} if spec.queueName else {}


def stage_resources(spec: SolarRunSpec, stage: str) -> dict:
    """The stage's own ``resources`` when it gives them (a stage on fewer GPUs), else the run's."""
    own = next(s for s in spec.stages if s.name == stage).resources
    return own if own is not None else spec.resources


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


def state(job: dict) -> JobState:
    """The job's phase: the last condition whose status is True (kubernetes.md); held suspended when
    ``runPolicy.suspend`` is set (by Kueue: the operator deletes rather than suspends a PyTorchJob)."""
    conditions = (job.get("status") or {}).get("conditions") or []
    true = [c for c in conditions if c.get("status") == "True"]
    last = true[-1] if true else {}
    suspended = bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    return job_state(job, last.get("type"), last.get("message", ""), suspended, conditions)


def job_state(job: dict, phase: str | None, message: str, suspended: bool, conditions: list[dict]) -> JobState:
    """What every job kind shares: name, attempt label, deletion, creation, suspension and the time
    its controller last reported it resumed (a ``Suspended`` condition turned False)."""
    meta = job["metadata"]
    attempt = (meta.get("labels") or {}).get(ATTEMPT_LABEL, "")
    resumed = next((c.get("lastTransitionTime") for c in conditions
                    if c.get("type") == "Suspended" and c.get("status") == "False"), None)
    try:
        resumed_at = parse_iso(resumed)
    except ValueError:
        resumed_at = None
    ours = (meta.get("annotations") or {}).get(SUSPEND_ANNOTATION) == "true"
    return JobState(meta["name"], phase, message, bool(meta.get("deletionTimestamp")),
                    int(attempt) if attempt.isdigit() else None, parse_iso(meta.get("creationTimestamp")),
                    suspended=suspended, suspended_by_operator=suspended and ours, resumed=resumed_at,
                    version=meta.get("resourceVersion"))


def owned_by(job: dict, run: dict) -> bool:
    """Created by the operator for this very SolarRun (labels and a controller owner reference)."""
    meta, owner = job["metadata"], run["metadata"]
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
    return ((meta.get("labels") or {}).get(RUN_LABEL) == owner["name"]
            and any(r.get("uid") == owner.get("uid") for r in refs))


# What every job kind's backend does the same way over its resource ``res`` (group, version, plural).
def observe_owned(kube, res: tuple[str, str, str], run: dict, to_state) -> dict[str, JobState]:
    """The run's own jobs of that kind by stage name; a failed one also with what its pods' trainer
    said when it refused its input (``refusal``)."""
    meta = run["metadata"]
    out = {}
    for job in kube.list_objects(res, meta["namespace"], f"{RUN_LABEL}={meta['name']}"):
        stage = (job["metadata"].get("labels") or {}).get(STAGE_LABEL)
        if stage and owned_by(job, run):
            state = to_state(job)
            if state.phase == "Failed" and not state.deleting:
                said = refusal(kube, meta, stage, state.attempt)
                if said:
                    state = dataclasses.replace(state, refused=True, message=f"{state.message}: {said}".lstrip(": "))
            out[stage] = state
    return out


def refusal(kube, meta: dict, stage: str, attempt: int | None) -> str | None:
    """The trainer's refusal of its input (``solar.launch.session.note_refusal``: the text after ``solar:
    refused:`` in a trainer container's termination message) among the attempt's pods, or None."""
    selector = f"{RUN_LABEL}={meta['name']},{STAGE_LABEL}={stage}" + (
        f",{ATTEMPT_LABEL}={attempt}" if attempt is not None else "")
    for pod in kube.list_pods(meta["namespace"], selector):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (status.get("state"), status.get("lastState")):
                message = ((state or {}).get("terminated") or {}).get("message") or ""
                if message.startswith(REFUSED_PREFIX):
                    return message[len(REFUSED_PREFIX):].strip()
    return None


def create_owned(kube, res: tuple[str, str, str], run: dict, job: dict, problems: list[str]) -> str | bool:
    """Create ``job`` (never one that fails its kind's admission: that would be our bug): the new job's
    resourceVersion (True when the server gave none); False when the run's job of that name exists
    already; NotOurs when one exists that the run did not create."""
    name, kind = job["metadata"]["name"], res[2][:-1]
    if problems:
        raise errors.Rejected(f"refusing to create {name}: {'; '.join(problems)}")
    version = kube.create_object(res, job)
    if version is not None:
        return version or True
    existing = kube.get_object(res, run["metadata"]["namespace"], name)
    if existing is not None and not owned_by(existing, run):
        raise errors.NotOurs(f"{kind} {name} exists but was not created for SolarRun {run['metadata']['name']} "
                             f"(uid {run['metadata'].get('uid')}); rename the stage or remove that job")
    return False


def owned_object(kube, res: tuple[str, str, str], run: dict, name: str, verb: str) -> dict | None:
    """The run's job ``name`` (None when gone); NotOurs when the run did not create it."""
    namespace = run["metadata"]["namespace"]
    existing = kube.get_object(res, namespace, name)
    if existing is not None and not owned_by(existing, run):
        raise errors.NotOurs(f"refusing to {verb} {res[2][:-1]} {namespace}/{name}: SolarRun "
                             f"{run['metadata']['name']} did not create it")
    return existing


def delete_owned(kube, res: tuple[str, str, str], run: dict, name: str) -> bool:
    """Delete the run's job ``name`` (that very object); False when it is already gone."""
    existing = owned_object(kube, res, run, name, "delete")
    if existing is None:
        return False
    return kube.delete_object(res, run["metadata"]["namespace"], name, existing["metadata"]["uid"])


class JobBackend(Protocol):
    def observe(self, run: dict) -> dict[str, JobState]:
        """The run's jobs by stage name."""

    def create(self, run: dict, spec: SolarRunSpec, plan: StagePlan, action: Action) -> str | bool:
        """Create a stage job: its resourceVersion (True when unknown); False when it already exists
        (a repeated reconcile)."""

    def delete(self, run: dict, job: str) -> bool:
        """Delete a job the run owns; False when it is already gone."""

    def suspend(self, run: dict, job: str) -> bool:
        """Stop a job the run owns for a SolarRun suspend (delete it, or set its suspend)."""

    def unavailable(self, spec: SolarRunSpec) -> str | None:
        """Why the cluster cannot run this kind (not served, no runtime), or None."""


class PyTorchJobBackend:
    def __init__(self, kube) -> None:
        self.kube = kube

    def unavailable(self, spec: SolarRunSpec) -> str | None:
        if not self.kube.served(RES):
            return (f"spec.backend PyTorchJob: the cluster does not serve {PLURAL}.{GROUP}/{VERSION} (install the "
                    "Kubeflow training operator v1, or use backend TrainJob)")
        return None

    def suspend(self, run: dict, job: str) -> bool:
        """A suspended PyTorchJob is deleted: its next attempt resumes from the checkpoint."""
        return self.delete(run, job)

    def observe(self, run: dict) -> dict[str, JobState]:
        return observe_owned(self.kube, RES, run, state)

    def create(self, run: dict, spec: SolarRunSpec, plan: StagePlan, action: Action) -> str | bool:
        job = manifest(run, spec, plan, action.job, attempt=action.attempt, resume_from=action.resume_from)
        return create_owned(self.kube, RES, run, job, webhook_problems(job))

    def delete(self, run: dict, job: str) -> bool:
        return delete_owned(self.kube, RES, run, job)
