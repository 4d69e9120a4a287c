"""Issue 44 under the operator with the real trainer: a suspended SolarRun whose stage is edited to
train longer resumes from its checkpoint and succeeds at the new final step; an edit of a recipe key
waits without a job (Validated=False/RecipeChanged, the trainer's own refusal) until the spec is fixed;
and a Failed run continues once its spec changes. The test plays kubelet and the training operator by
running each job's command on this machine (as test_operator_topology_change.py does)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from solar.storage.checkpoints import verify
from tests.e2e.test_operator_topology_change import _run_job, _stage, launcher
from tests.integration.world import World, crds, load_case
from tests.support.kube import emulated_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _one_stage(doc, name, storage, data, *extra):
    doc["metadata"]["name"] = name
    doc["spec"]["topology"] = {"nodes": 1, "gpusPerNode": 1}
    doc["spec"]["storage"].update(mountPath=str(storage), path=name)
    doc["spec"]["volumes"] = []
    doc["spec"]["stages"] = [dict(doc["spec"]["stages"][0], set=[f"data.root={data}", "runtime.validate_every=0",
                                                                 *extra])]
    return doc


@contextmanager
def _operating(doc, storage, tmp_path):
    """The emulated cluster with the operator running and ``doc`` applied: the World to play the jobs in."""
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        world.ran = []
        with world.operator(backends=("PyTorchJob",)):
            world.apply(doc)
            yield world


def test_a_suspended_stage_edited_to_train_longer_continues_and_a_recipe_edit_waits(wan_data, tmp_path):
    storage = tmp_path / "runs"
    doc = _one_stage(load_case("three-stage"), "steer", storage, wan_data)
    stage = doc["spec"]["stages"][0]
    with _operating(doc, storage, tmp_path) as world:
        first = _run_job(world, world.wait_job("steer-fm-1"), ("runtime.exit_after_step=2",), verdict=False)
        assert first.returncode == 0, first.stderr[-3000:]
        world.patch_spec("steer", {"runPolicy": {"suspend": True}})
        world.wait_phase("steer", "Suspended")
        wait_for(lambda: "steer-fm-1" not in world.jobs(), message="the suspended job to be deleted")

        # another learning rate: the trainer's refusal, before any job, until the spec is fixed
        edited = dict(stage, set=stage["set"] + ["train.optimizer.lr=0.5"])
        world.patch_spec("steer", {"stages": [edited], "runPolicy": {"suspend": False}})
        status = world.wait_status("steer", lambda s: _stage(s, "fm").get("reason") == "RecipeChanged",
                                   "the recipe change held")
        message = _stage(status, "fm")["message"]
        assert "train.optimizer.lr 0.001 -> 0.5" in message and "checkpoint.accept_changes" in message
        validated = next(c for c in status["conditions"] if c["type"] == "Validated")
        assert (validated["status"], validated["reason"]) == ("False", "RecipeChanged")
        time.sleep(1.0)
        assert world.jobs() == {}

        # train longer instead: attempt 2 resumes step 2 and trains to step 6
        longer = dict(stage, set=stage["set"] + ["train.max_steps=6"])
        world.patch_spec("steer", {"stages": [longer]})
        job = world.wait_job("steer-fm-2")
        second = _run_job(world, job)
        assert second.returncode == 0, second.stderr[-3000:]
        assert "schedule change: train.max_steps 4 -> 6 (from step 3)" in second.stderr
        status = wait_for(lambda: (s := world.status("steer")).get("phase") in ("Succeeded", "Failed") and s,
                          timeout=120, interval=0.2, message="the run to finish")
        assert status["phase"] == "Succeeded", status
        fm = _stage(status, "fm")
        assert fm["checkpoint"]["step"] == 6 and [a.get("resumedFrom") for a in fm["attempts"]] == [None, 2]
        assert verify(storage / "steer" / "fm" / "checkpoints" / "step_00000006")["valid"]
        assert "RecipeChanged" in world.event_reasons("steer")


def test_a_failed_run_continues_once_its_spec_changes(wan_data, tmp_path):
    storage = tmp_path / "runs"
    doc = _one_stage(load_case("three-stage"), "again", storage, wan_data, "train.max_steps=3")
    doc["spec"]["runPolicy"]["backoffLimit"] = 0
    with _operating(doc, storage, tmp_path) as world:
        # its pod is lost after the step-2 checkpoint: with backoffLimit 0 the run fails. A SIGKILLed
        # trainer writes no run-result.json: the one exit_after_step left (stopped, which the operator
        # resumes without counting it, StageStopped) goes, as the kill would never have written it
        first = _run_job(world, world.wait_job("again-fm-1"), ("runtime.exit_after_step=2",), verdict=False)
        assert first.returncode == 0, first.stderr[-3000:]
        (storage / "again" / "fm" / "run-result.json").unlink()
        world.set_job("again-fm-1", "Failed", "exit code 137")
        status = world.wait_phase("again", "Failed")
        assert _stage(status, "fm")["reason"] == "BackoffLimitExceeded"
        time.sleep(1.0)
        assert list(world.jobs()) == ["again-fm-1"]   # kept, not retried

        # the spec changes (a longer schedule): the run continues from step 2, its failures counted anew
        longer = dict(doc["spec"]["stages"][0], set=doc["spec"]["stages"][0]["set"] + ["train.max_steps=4"])
        world.patch_spec("again", {"stages": [longer]})
        job = wait_for(lambda: (j := world.jobs().get("again-fm-2")) and
                       j["metadata"]["labels"].get("solarwm.io/attempt") == "2" and j, timeout=30,
                       message="attempt 2 after the spec change")
        assert _run_job(world, job).returncode == 0
        status = wait_for(lambda: (s := world.status("again")).get("phase") == "Succeeded" and s,
                          timeout=120, interval=0.2, message="the run to succeed")
        fm = _stage(status, "fm")
        assert fm["checkpoint"]["step"] == 4 and fm["failures"] == 0
        assert [a.get("resumedFrom") for a in fm["attempts"]] == [None, 2]
        assert "SpecChanged" in world.event_reasons("again")


def _kubelet(world, job: dict, log_dir) -> int:
    """kubelet + training operator for a single-node PyTorchJob whose trainer may refuse its input: the
    container's command runs here with a termination-message file (as the kubelet mounts one); a failed
    run leaves its pod, terminated with that message, and the job Failed."""
    import subprocess

    from tests.conftest import REPO
    from tests.e2e.helpers import env

    name = job["metadata"]["name"]
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    log = log_dir / f"{name}-termination-log"
    log.write_text("")
    world.set_job(name, "Running")
    container = template["spec"]["containers"][0]
    proc = subprocess.run([*launcher(container["command"]), "--standalone", *container["args"]], cwd=REPO,
                          env=env({"SOLAR_TERMINATION_LOG": str(log)}), capture_output=True, text=True, timeout=400)
    if proc.returncode:
        pods = f"/api/v1/namespaces/{world.namespace}/pods"
        world.cluster.create(pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{name}-master-0", "labels": template["metadata"]["labels"]},
            "spec": {"containers": [{"name": "trainer", "image": "solar-trainer:dev"}]}})
        world.cluster.patch(f"{pods}/{name}-master-0/status", {"status": {
            "phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {
                "exitCode": proc.returncode, "reason": "Error", "message": log.read_text()}}}]}})
    world.set_job(name, "Succeeded" if proc.returncode == 0 else "Failed", f"exit code {proc.returncode}")
    world.ran.append((name, proc.returncode, proc.stderr[-3000:]))
    return proc.returncode


def test_a_trainer_that_refuses_its_input_is_not_retried_and_continues_once_fixed(wan_data, tmp_path):
    storage = tmp_path / "runs"
    # validation on: the trainer checks the test set at start and refuses the missing data before writing
    doc = _one_stage(load_case("three-stage"), "refuse", storage, tmp_path / "missing-data", "train.max_steps=2")
    doc["spec"]["stages"][0]["set"] = [s for s in doc["spec"]["stages"][0]["set"] if "validate_every" not in s] + [
        "runtime.validate_every=2", "validation.decode_latents=1"]
    doc["spec"]["runPolicy"]["backoffLimit"] = 2
    with _operating(doc, storage, tmp_path) as world:
        assert _kubelet(world, world.wait_job("refuse-fm-1"), tmp_path) != 0
        status = world.wait_phase("refuse", "Failed")
        fm = _stage(status, "fm")
        assert fm["reason"] == "InputRefused" and fm["attempt"] == 1, fm   # its backoffLimit unspent
        assert "missing-data" in fm["message"] and "not retried" in fm["message"]
        assert not (storage / "refuse" / "fm" / "launch-manifest.json").exists()   # refused before writing
        time.sleep(1.0)
        assert list(world.jobs()) == ["refuse-fm-1"]   # kept, not retried

        fixed = dict(doc["spec"]["stages"][0], set=[s.replace(str(tmp_path / "missing-data"), str(wan_data))
                                                    for s in doc["spec"]["stages"][0]["set"]])
        world.patch_spec("refuse", {"stages": [fixed]})
        job = wait_for(lambda: (j := world.jobs().get("refuse-fm-2")) and
                       j["metadata"]["labels"].get("solarwm.io/attempt") == "2" and j, timeout=30,
                       message="attempt 2 after the spec change")
        assert _kubelet(world, job, tmp_path) == 0, world.ran[-1]
        status = wait_for(lambda: (s := world.status("refuse")).get("phase") == "Succeeded" and s,
                          timeout=120, interval=0.2, message="the run to succeed")
        assert _stage(status, "fm")["checkpoint"]["step"] == 2
        assert {"InputRefused", "SpecChanged"} <= set(world.event_reasons("refuse"))
