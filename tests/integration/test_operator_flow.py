"""The real operator (kopf + solar_operator) against the emulated API server, stage by stage.

The test plays the Kubeflow training operator (it patches PyTorchJob conditions) and the trainer
(it writes stage directories with real checkpoint transactions under the operator's storage root).
"""

from __future__ import annotations

import re
import shutil
import time

import jsonschema
import pytest
from prometheus_client import generate_latest

from solar.run.plan import job_name
from solar_operator import jobs as pytorchjobs
from solar_operator import metrics
from tests.integration.world import CRD, World, load_case
from tests.support.crd_schema import anchor, crd_validator_schema
from tests.support.kube import emulated_cluster, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def world(tmp_path):
    with emulated_cluster([CRD, anchor("kubeflow.org_pytorchjobs.yaml")], tmp_path) as cluster:
        yield World(cluster, tmp_path / "storage")


def _run(name="three-stage", **policy):
    doc = load_case("three-stage")
    doc["metadata"]["name"] = name
    doc["spec"]["storage"]["path"] = f"team-a/{name}"
    doc["spec"]["runPolicy"].update(policy)
    return doc


def _args(job):
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]


def _stage(status, name):
    return next(s for s in status["stages"] if s["name"] == name)


def _scrape() -> str:
    return generate_latest(metrics.REGISTRY).decode()


def test_a_three_stage_run_advances_as_its_jobs_finish(world):
    schema = crd_validator_schema(anchor("kubeflow.org_pytorchjobs.yaml"), "v1")
    with world.operator():
        world.apply(_run())
        fm_job, anyflow_job, generate_job = (job_name("three-stage", stage, 1) for stage in ("fm", "anyflow", "generate"))
        fm = world.wait_job(fm_job)
        world.set_job(fm_job, "Running")
        world.wait_status("three-stage", lambda s: _stage(s, "fm")["phase"] == "Running", "fm Running")
        world.write_stage("three-stage", "fm", result=None, checkpoint=False, steps=(2,))
        world.wait_status("three-stage", lambda s: s.get("step") == 2, "step 2 from the stage's checkpoint")
        world.write_stage("three-stage", "fm")
        world.set_job(fm_job, "Succeeded")
        anyflow = world.wait_job(anyflow_job)
        assert "checkpoint.path=/runs/team-a/three-stage/fm/checkpoints/step_00000004" in _args(anyflow)
        assert "checkpoint.mode=weights_only" in _args(anyflow) and "checkpoint.weights=ema" in _args(anyflow)
        status = world.status("three-stage")
        assert _stage(status, "fm")["phase"] == "Succeeded" and status["currentStage"] == "anyflow"
        assert _stage(status, "fm")["checkpoint"]["path"] == "/runs/team-a/three-stage/fm/checkpoints/step_00000004"
        assert _stage(status, "fm")["validation"] == {"step": 4, "complete": True}
        world.write_stage("three-stage", "anyflow")
        world.set_job(anyflow_job, "Succeeded")
        generate = world.wait_job(generate_job)
        assert _args(generate)[:5] == ["--nproc-per-node=1", "-m", "solar", "infer", "--config"]
        assert set(generate["spec"]["pytorchReplicaSpecs"]) == {"Master"}
        world.write_stage("three-stage", "generate")
        world.set_job(generate_job, "Succeeded")
        status = world.wait_phase("three-stage", "Succeeded")
        assert {c["type"]: c["status"] for c in status["conditions"]} == {
            "Validated": "True", "Progressing": "False", "Ready": "True"}
        assert [s["phase"] for s in status["stages"]] == ["Succeeded"] * 3
        for job in (fm, anyflow, generate):
            jsonschema.validate(job, schema)
            assert pytorchjobs.webhook_problems(job) == []
            assert job["metadata"]["ownerReferences"][0]["uid"] == world.run("three-stage")["metadata"]["uid"]
        assert sorted(world.jobs()) == ["three-stage-anyflow-1", "three-stage-fm-1", "three-stage-generate-1"]
        reasons = wait_for(lambda: (lambda r: r if "Completed" in r else None)(world.event_reasons("three-stage")))
        assert reasons == ["Resolved", "MemoryForecast", "StageStarted", "StageRunning", "StageSucceeded", "StageStarted",
                           "StageSucceeded", "StageStarted", "StageSucceeded", "Completed"]
        plan = world.plan("three-stage")
        world_size = plan.stage("fm").nproc * plan.stage("fm").nodes
        # each stage's launch took an hour of each of its GPUs
        assert status["gpuHours"] == pytest.approx(sum(p.nproc * p.nodes for p in plan.stages), rel=1e-3)
        assert [len(s["usage"]["attempts"]) for s in status["stages"]] == [1, 1, 1]
        text = _scrape()
        labels = f'namespace="{world.namespace}",run="three-stage",stage="fm"'
        assert f"solar_run_checkpoint_step{{{labels}}} 4.0" in text
        fm_route = world.plan("three-stage").stage("fm").route.split(":")[1]
        assert _counter_at_least(text, fm_route, 3600 * world_size)
        assert f'solar_run_gpu_hours{{namespace="{world.namespace}",run="three-stage"}}' in text
        assert f"solar_run_validation_step{{{labels}}} 4.0" in text
        assert 'solar_operator_reconcile_total{handler="job",result="success"}' in text
        assert (f'solar_run_phase{{namespace="{world.namespace}",phase="Succeeded",run="three-stage",'
                f'stage="generate"}} 1.0') in text
        # finished: no job will be created for it any more, so the operator's finalizer goes (deleting
        # a finished run never waits for the operator)
        wait_for(lambda: not world.run("three-stage")["metadata"].get("finalizers"), message="finalizer released")
        world.cluster.delete(f"{world.runs_path}/three-stage")
        mine = re.compile(rf'namespace="{world.namespace}".*run="three-stage"|run="three-stage".*namespace="{world.namespace}"')
        wait_for(lambda: not mine.search(_scrape()), message="the deleted run's series to vanish")


def _failures(error_type: str) -> float:
    return metrics.REGISTRY.get_sample_value("solar_run_stage_failures_total", {"error_type": error_type})


def test_failed_jobs_retry_from_the_newest_checkpoint_then_the_run_fails(world):
    before = _failures("non_finite"), _failures("unknown")
    with world.operator():
        world.apply(_run("retry", backoffLimit=1))
        world.wait_job("retry-fm-1")
        bad = {"event": "non_finite", "step": 3, "rank": 1, "loss": float("nan"), "sample_id": "clip-7",
               "start_frame": 0, "timestep": 812.5}
        world.write_stage("retry", "fm", result="failed", checkpoint=False, steps=(2,), error_type="non_finite",
                          events={1: [bad, {"event": "error", "error_type": "non_finite", "message": "rank 1: nan"}]})
        world.set_job("retry-fm-1", "Failed", "pod retry-fm-1-master-0 exited with code 1")
        # the retry is a job of its own, named for its attempt; the failed first one was deleted before it
        second = world.wait_job("retry-fm-2")
        assert second["metadata"]["labels"]["solarwm.io/attempt"] == "2" and "retry-fm-1" not in world.jobs()
        assert _args(second)[-4:] == ["--set", "checkpoint.mode=full_resume", "--set",
                                      "checkpoint.path=/runs/team-a/retry/fm/checkpoints/step_00000002"]
        assert second["metadata"]["annotations"]["solarwm.io/resume-from"].endswith("step_00000002")
        # the stage directory's evidence, diagnosed, goes into the retry's message and its event
        diagnosed = ("diagnosis: non_finite: non-finite loss at step 3 on rank 1 (sample 'clip-7', start frame 0, "
                     "timestep 812.5)")
        assert any(diagnosed in e.get("message", "") for e in world.events() if e["reason"] == "JobFailed")
        world.set_job("retry-fm-2", "Failed", "OOMKilled")
        status = world.wait_phase("retry", "Failed")
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "BackoffLimitExceeded" and "OOMKilled" in failed["message"]
        assert diagnosed in failed["message"] and diagnosed in _stage(status, "fm")["message"]
        assert sorted(world.jobs()) == ["retry-fm-2"]  # the last failed job is kept for inspection
        wait_for(lambda: {"JobFailed", "BackoffLimitExceeded"} <= set(world.event_reasons("retry")),
                 message="the failure events (kopf posts them asynchronously)")
    # both attempts counted by the trainer's error type (the second left the first attempt's run-result)
    assert _failures("non_finite") - before[0] == 2 and _failures("unknown") == before[1]


@pytest.mark.parametrize("break_it, reason", [
    (lambda root: shutil.rmtree(root / "checkpoints" / "step_00000004"), "CheckpointMissing"),
    (lambda root: (root / "checkpoints" / "step_00000004" / "COMPLETE.json").unlink(), "CheckpointIncomplete"),
    (lambda root: (root / "checkpoints" / "step_00000004" / "model" / "live.safetensors").write_bytes(b"oops"),
     "CheckpointUnverifiable"),
    (lambda root: shutil.rmtree(root / "validation"), "ValidationIncomplete"),
    (lambda root: (root / "run-result.json").unlink(), "ResultIncomplete"),
])
def test_a_succeeded_job_without_its_files_fails_the_stage_and_starts_nothing(world, break_it, reason):
    with world.operator():
        world.apply(_run("broken"))
        world.wait_job("broken-fm-1")
        break_it(world.write_stage("broken", "fm"))
        world.set_job("broken-fm-1", "Succeeded")
        status = world.wait_phase("broken", "Failed")
        assert _stage(status, "fm")["reason"] == reason
        assert sorted(world.jobs()) == ["broken-fm-1"]


def test_restarting_the_operator_mid_run_creates_no_duplicate_and_misses_no_transition(world):
    with world.operator():
        world.apply(_run("restart"))
        first = world.wait_job("restart-fm-1")
    # while the operator is down the stage finishes, and so does the next one's job creation window
    world.write_stage("restart", "fm")
    world.set_job("restart-fm-1", "Succeeded")
    with world.operator():
        anyflow = world.wait_job("restart-anyflow-1")
        status = world.wait_status("restart", lambda s: s.get("currentStage") == "anyflow", "stage anyflow")
        assert _stage(status, "fm")["phase"] == "Succeeded" and _stage(status, "anyflow")["attempt"] == 1
    assert world.jobs()["restart-fm-1"]["metadata"]["uid"] == first["metadata"]["uid"]  # never recreated
    with world.operator():  # and a restart with nothing new to see changes nothing
        time.sleep(1.5)  # several polls
        assert world.jobs()["restart-anyflow-1"]["metadata"]["uid"] == anyflow["metadata"]["uid"]
    reasons = world.event_reasons("restart")
    assert reasons.count("StageStarted") == 2 and reasons.count("StageSucceeded") == 1


def test_a_job_created_before_a_crash_is_adopted(world):
    doc = _run("adopt")
    with world.operator():
        world.apply(doc)
        job = world.wait_job("adopt-fm-1")
    # the status write is lost (the operator died between creating the job and recording it)
    world.cluster.patch(f"{world.runs_path}/adopt/status", {"status": None})
    with world.operator():
        status = world.wait_status("adopt", lambda s: s.get("phase") == "Running", "adoption")
        assert _stage(status, "fm")["job"] == "adopt-fm-1" and _stage(status, "fm")["attempt"] == 1
        wait_for(lambda: "JobAdopted" in world.event_reasons("adopt"), message="JobAdopted event")
    assert world.jobs()["adopt-fm-1"]["metadata"]["uid"] == job["metadata"]["uid"]


def test_suspend_deletes_the_job_and_resume_continues_from_the_checkpoint(world):
    with world.operator():
        world.apply(_run("pause"))
        world.wait_job("pause-fm-1")
        world.set_job("pause-fm-1", "Running")
        world.write_stage("pause", "fm", result=None, checkpoint=False, steps=(2,))
        world.patch_spec("pause", {"runPolicy": {"suspend": True}})
        world.wait_phase("pause", "Suspended")
        wait_for(lambda: "pause-fm-1" not in world.jobs(), message="the job to be deleted")
        status = world.status("pause")
        assert _stage(status, "fm")["phase"] == "Suspended"
        assert next(c for c in status["conditions"] if c["type"] == "Suspended")["status"] == "True"
        world.patch_spec("pause", {"runPolicy": {"suspend": False}})
        job = world.wait_job("pause-fm-2")  # the resumed stage's next attempt
        assert "checkpoint.path=/runs/team-a/pause/fm/checkpoints/step_00000002" in _args(job)
        status = world.wait_phase("pause", "Running")
        assert _stage(status, "fm")["failures"] == 0 and _stage(status, "fm")["attempt"] == 2
        assert next(c for c in status["conditions"] if c["type"] == "Suspended")["status"] == "False"
        assert status["observedGeneration"] == 3


def test_a_silent_stage_hits_the_progress_deadline(world):
    with world.operator():
        world.apply(_run("silent", progressDeadlineSeconds=2))
        world.wait_job("silent-fm-1")
        world.set_job("silent-fm-1", "Running")
        status = world.wait_phase("silent", "Failed", timeout=20)
        assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "ProgressDeadlineExceeded"
        wait_for(lambda: "silent-fm-1" not in world.jobs(), message="the silent job to be deleted")


def test_a_job_the_run_did_not_create_is_never_touched(world):
    # someone else's job already holds the name the first stage needs
    world.cluster.create(world.jobs_path, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                           "metadata": {"name": "squat-fm-1", "namespace": world.namespace},
                                           "spec": {"pytorchReplicaSpecs": {}}})
    with world.operator():
        world.apply(_run("squat"))
        status = world.wait_phase("squat", "Failed")
        assert _stage(status, "fm")["reason"] == "JobNameTaken" and "was not created for" in _stage(status, "fm")["message"]
        time.sleep(1.0)
        job = world.jobs()["squat-fm-1"]
        assert "labels" not in job["metadata"] and "ownerReferences" not in job["metadata"]  # untouched


def _counter_at_least(text: str, stage: str, seconds: float) -> bool:
    """The GPU-seconds counter of the stage's route (other tests in this process may have added to it)."""
    for line in text.splitlines():
        if line.startswith("solar_stage_gpu_seconds_total{") and f'stage="{stage}"' in line and 'action="train"' in line:
            return float(line.rsplit(" ", 1)[1]) >= seconds * 0.999
    return False
