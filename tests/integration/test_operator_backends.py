"""The operator under each job backend (contract.md §7) against the emulated API server: TrainJobs
that validate strictly against Trainer v2.3.0's CRD, their failure, suspend and resume, the checks
before any job exists (BackendUnavailable), and a Kueue queue that holds jobs suspended.

The test plays the Trainer controller (it patches TrainJob status), Kueue (a webhook that creates
jobs suspended and a queue that admits them later) and the trainer (it writes stage directories)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from solar_operator import metrics
from tests.integration.world import World, crds, load_case
from tests.support.kube import emulated_cluster, wait_for

pytestmark = pytest.mark.timeout(180)

POD = {"env": [{"name": "NCCL_DEBUG", "value": "WARN"},
               {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}}],
       "imagePullSecrets": [{"name": "registry"}], "serviceAccountName": "solar-trainer",
       "podSecurityContext": {"fsGroup": 10001}, "sharedMemory": "8Gi"}


@pytest.fixture
def trainjob_world(tmp_path):
    with emulated_cluster(crds("PyTorchJob", "TrainJob"), tmp_path) as cluster:
        yield World(cluster, tmp_path / "storage", backend="TrainJob")


def _run(name, **spec):
    doc = load_case("three-stage")
    doc["metadata"]["name"] = name
    doc["spec"]["storage"]["path"] = f"team-a/{name}"
    doc["spec"].update(spec)
    return doc


def _stage(status, name):
    """The stage's status; {} until the operator has written one (the job may appear first)."""
    return next((s for s in status.get("stages", []) if s["name"] == name), {})


def _pod(job):
    node = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return node["template"]["spec"]["template"]["spec"]


def test_a_trainjob_run_retries_a_failed_job_and_succeeds_like_a_pytorchjob_run(trainjob_world):
    world = trainjob_world
    world.install_runtime()
    admitted = world.validate_jobs_strictly()
    with world.operator(default_backend="TrainJob"):  # no spec.backend: the operator's default
        world.apply(_run("tj", **POD))
        fm = world.wait_job("tj-fm-1")
        assert fm["spec"]["runtimeRef"]["name"] == "torch-distributed"
        assert fm["spec"]["trainer"]["args"][:4] == ["--nproc-per-node=4", "-m", "solar", "train"]
        assert (fm["spec"]["trainer"]["numNodes"], fm["spec"]["trainer"]["numProcPerNode"]) == (2, 4)
        assert fm["spec"]["trainer"]["env"][-2:] == POD["env"]
        pod = _pod(fm)
        assert pod["serviceAccountName"] == "solar-trainer" and pod["securityContext"] == {"fsGroup": 10001}
        assert {"name": "solar-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
        world.set_job("tj-fm-1", "Running")
        world.wait_status("tj", lambda s: _stage(s, "fm").get("phase") == "Running", "fm Running")
        assert world.status("tj")["backend"] == "TrainJob"
        world.write_stage("tj", "fm", result=None, checkpoint=False, steps=(2,))
        world.set_job("tj-fm-1", "Failed", "node-0 exited 1")
        status = world.wait_status("tj", lambda s: _stage(s, "fm").get("attempt") == 2, "fm attempt 2")
        assert _stage(status, "fm")["failures"] == 1
        failed = [e["message"] for e in world.events() if e["reason"] == "JobFailed"]
        assert failed and "JobsFailed: node-0 exited 1" in failed[0]  # the Failed condition's reason and message
        retry = world.wait_job("tj-fm-2")
        assert retry["metadata"]["labels"]["solarwm.io/attempt"] == "2"
        assert "checkpoint.path=/runs/team-a/tj/fm/checkpoints/step_00000002" in retry["spec"]["trainer"]["args"]
        for stage, attempt in (("fm", 2), ("anyflow", 1), ("generate", 1)):
            world.wait_job(f"tj-{stage}-{attempt}")
            world.write_stage("tj", stage)
            world.set_job(f"tj-{stage}-{attempt}", "Succeeded")
        status = world.wait_phase("tj", "Succeeded")
        assert [s["phase"] for s in status["stages"]] == ["Succeeded"] * 3
        # every TrainJob the operator created passed the strict schema (fm twice: its retry, a job of its own)
        assert {(j["metadata"]["name"], j["metadata"]["labels"]["solarwm.io/attempt"]) for j in admitted} == {
            ("tj-fm-1", "1"), ("tj-fm-2", "2"), ("tj-anyflow-1", "1"), ("tj-generate-1", "1")}
        assert world.cluster.list(f"/apis/kubeflow.org/v1/namespaces/{world.namespace}/pytorchjobs")["items"] == []
        # kubectl and the metrics see the run exactly as under PyTorchJob
        table = world.cluster.kubectl("get", "srun", "-n", world.namespace).stdout.splitlines()
        assert table[0].split() == ["NAME", "PHASE", "STAGE", "STEP", "GPU-HOURS", "AGE"]
        assert table[1].split()[:4] == ["tj", "Succeeded", "generate", "4"]
        text = generate_latest(metrics.REGISTRY).decode()
        assert (f'solar_run_phase{{namespace="{world.namespace}",phase="Succeeded",run="tj",'
                f'stage="generate"}} 1.0') in text
        assert f'solar_run_checkpoint_step{{namespace="{world.namespace}",run="tj",stage="fm"}} 4.0' in text
        wait_for(lambda: world.event_reasons("tj")[-1:] == ["Completed"],   # kopf posts events asynchronously
                 message="the Completed event")


def test_suspend_sets_the_trainjobs_suspend_and_resume_replaces_the_job(trainjob_world):
    world = trainjob_world
    world.install_runtime()
    with world.operator():
        world.apply(_run("sus", backend="TrainJob"))
        world.wait_job("sus-fm-1")
        world.set_job("sus-fm-1", "Running")
        world.write_stage("sus", "fm", result=None, checkpoint=False, steps=(2,))
        world.patch_spec("sus", {"runPolicy": {"suspend": True}})
        world.wait_phase("sus", "Suspended")
        job = wait_for(lambda: (lambda j: j if j["spec"].get("suspend") else None)(world.jobs()["sus-fm-1"]),
                       message="the TrainJob suspended")
        assert job["metadata"]["annotations"]["solarwm.io/suspended"] == "true"
        world.patch_spec("sus", {"runPolicy": {"suspend": False}})
        job = wait_for(lambda: (lambda j: j if j and j["metadata"]["labels"]["solarwm.io/attempt"] == "2" else None)(
            world.jobs().get("sus-fm-2")), message="a new attempt of fm")
        assert "sus-fm-1" not in world.jobs()  # replaced: the suspended attempt's job was deleted first
        assert not job["spec"].get("suspend") and "checkpoint.mode=full_resume" in job["spec"]["trainer"]["args"]
        status = world.wait_phase("sus", "Running")
        assert _stage(status, "fm")["failures"] == 0


def test_a_backend_the_cluster_does_not_serve_fails_validation_before_any_job(tmp_path):
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:  # no Trainer v2 installed
        world = World(cluster, tmp_path / "storage")
        with world.operator():
            world.apply(_run("nope", backend="TrainJob"))
            status = world.wait_phase("nope", "Failed")
            validated = next(c for c in status["conditions"] if c["type"] == "Validated")
            assert (validated["status"], validated["reason"]) == ("False", "BackendUnavailable")
            assert "trainjobs.trainer.kubeflow.org/v1alpha1" in validated["message"]
            assert world.jobs() == {}
        with world.operator(backends=("PyTorchJob",)):  # a kind the operator was not given (the chart's backends)
            world.apply(_run("off", backend="TrainJob"))
            status = world.wait_phase("off", "Failed")
            assert next(c for c in status["conditions"] if c["type"] == "Validated")["reason"] == "BackendUnavailable"


def test_a_missing_runtime_or_a_field_trainjobs_cannot_carry_fails_validation(trainjob_world):
    world = trainjob_world
    world.install_runtime()
    with world.operator():
        world.apply(_run("rt", backend="TrainJob", trainingRuntime="torch-h200"))
        world.apply(_run("prio", backend="TrainJob", priorityClassName="high"))
        status = world.wait_phase("rt", "Failed")
        validated = next(c for c in status["conditions"] if c["type"] == "Validated")
        assert validated["reason"] == "BackendUnavailable" and "torch-h200 does not exist" in validated["message"]
        status = world.wait_phase("prio", "Failed")
        validated = next(c for c in status["conditions"] if c["type"] == "Validated")
        assert validated["reason"] == "InvalidSpec" and validated["message"].startswith("spec.priorityClassName")
        assert world.jobs() == {}


@pytest.mark.parametrize("backend", ["PyTorchJob", "TrainJob"])
def test_a_job_its_queue_holds_is_queued_without_the_deadline_running(backend, tmp_path):
    with emulated_cluster(crds(backend), tmp_path) as cluster:
        world = World(cluster, tmp_path / "storage", backend=backend)
        if backend == "TrainJob":
            world.install_runtime()
        doc = _run("q", backend=backend, queueName="gpu-queue")
        doc["spec"]["stages"] = doc["spec"]["stages"][:1]
        doc["spec"]["runPolicy"]["progressDeadlineSeconds"] = 4
        with world.queue("gpu-queue", hold=6) as admissions, world.operator():
            world.apply(doc)
            job = world.wait_job("q-fm-1")
            assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
            status = world.wait_status("q", lambda s: _stage(s, "fm").get("reason") == "Queued", "fm Queued")
            progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
            assert progressing["reason"] == "Queued" and status["phase"] == "Running"
            wait_for(lambda: admissions, timeout=20, message="the queue to admit the job")
            assert admissions[0][1] >= 6 > 4  # held longer than progressDeadlineSeconds, yet not failed
            status = world.wait_status("q", lambda s: _stage(s, "fm").get("admittedTime"), "fm admitted")
            assert status["phase"] == "Running" and _stage(status, "fm").get("reason") is None
            world.set_job("q-fm-1", "Running")
            world.write_stage("q", "fm")
            world.set_job("q-fm-1", "Succeeded")
            world.wait_phase("q", "Succeeded")
            assert "Queued" in world.event_reasons("q")
            # the operator never touched suspend: the only changes of it are the queue's admission
            paths = [r for r in cluster.emulator._requests if r.method == "PATCH" and r.name == "q-fm-1"
                     and r.subresource is None]
            assert len(paths) == 1 and "suspend" in paths[0].text
            assert "solarwm.io/suspended" not in (world.jobs()["q-fm-1"]["metadata"].get("annotations") or {})
            assert "ProgressDeadlineExceeded" not in world.event_reasons("q")


def test_a_job_its_queue_preempts_is_replaced_by_an_attempt_from_the_checkpoint(trainjob_world):
    world = trainjob_world
    world.install_runtime()
    doc = _run("pre", backend="TrainJob", queueName="gpu-queue")
    doc["spec"]["stages"] = doc["spec"]["stages"][:1]
    with world.queue("gpu-queue", hold=0.5) as admissions, world.operator():
        world.apply(doc)
        wait_for(lambda: admissions, timeout=20, message="the first admission")
        world.set_job("pre-fm-1", "Running")
        world.wait_status("pre", lambda s: _stage(s, "fm").get("phase") == "Running", "fm Running")
        world.write_stage("pre", "fm", result=None, checkpoint=False, steps=(2,))
        world.cluster.patch(f"{world.jobs_path}/pre-fm-1", {"spec": {"suspend": True}})  # Kueue preempts it
        job = wait_for(lambda: (lambda j: j if j and j["metadata"]["labels"]["solarwm.io/attempt"] == "2" else None)(
            world.jobs().get("pre-fm-2")), message="attempt 2 of fm")
        assert "checkpoint.path=/runs/team-a/pre/fm/checkpoints/step_00000002" in job["spec"]["trainer"]["args"]
        wait_for(lambda: len(admissions) == 2, timeout=20, message="attempt 2 admitted by the queue")
        status = world.status("pre")
        assert _stage(status, "fm")["failures"] == 0
        wait_for(lambda: "StagePreempted" in world.event_reasons("pre"), message="the StagePreempted event")
        world.write_stage("pre", "fm")
        world.set_job("pre-fm-2", "Succeeded")
        world.wait_phase("pre", "Succeeded")
