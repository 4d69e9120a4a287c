"""Acceptance of issue 39 item 4 with the real trainer: a suspended three-stage SolarRun whose
topology changes resumes its stage at the new shape from its checkpoint and succeeds, and a change
of the global batch is refused before any job. The test plays kubelet and the training operator by
running each job's command on this machine (as test_operator_runs_stages.py does)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from solar.storage.checkpoints import data_position, verify
from tests.conftest import REPO
from tests.e2e.helpers import env
from tests.integration.world import World, crds, load_case
from tests.support.kube import emulated_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def launcher(command: list[str]) -> list[str]:
    """The job's container command as run here: ``python`` is the trainer image's interpreter, this one."""
    assert command == ["python", "-m", "solar.launch.torchrun"], command
    return [sys.executable, *command[1:]]


def _run_job(world: World, job: dict, extra: tuple[str, ...] = (), verdict: bool = True) -> subprocess.CompletedProcess:
    """kubelet + training operator for one single-node PyTorchJob: its container's command, run here.
    ``extra``: --set edits appended (a pod stopped after a step); ``verdict``: report how it ended."""
    name = job["metadata"]["name"]
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    world.set_job(name, "Running")
    cmd = [*launcher(container["command"]), "--standalone", *container["args"]]
    for item in extra:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=400)
    if verdict:
        world.set_job(name, "Succeeded" if proc.returncode == 0 else "Failed", f"exit code {proc.returncode}")
    world.ran.append((name, proc.returncode, proc.stderr[-3000:]))
    return proc


def _stage(status, name):
    return next(s for s in status["stages"] if s["name"] == name)


def test_a_suspended_run_resumes_its_stage_at_a_new_shape_and_a_new_global_batch_is_refused(wan_data, tmp_path):
    storage = tmp_path / "runs"
    doc = load_case("three-stage")
    doc["metadata"]["name"] = "reshape"
    doc["spec"]["topology"] = {"nodes": 1, "gpusPerNode": 2}   # world 2, accumulation 1: global batch 2
    doc["spec"]["storage"].update(mountPath=str(storage), path="reshape")
    doc["spec"]["volumes"] = []
    for stage in doc["spec"]["stages"]:
        stage["set"] = [f"data.root={wan_data}", "validation.decode_latents=1"]
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        world.ran = []
        with world.operator(backends=("PyTorchJob",)):
            world.apply(doc)
            # attempt 1 at world 2: its pods are stopped after step 2 (the run is then suspended)
            first = _run_job(world, world.wait_job("reshape-fm-1"), ("runtime.exit_after_step=2",), verdict=False)
            assert first.returncode == 0, first.stderr[-3000:]
            fm_dir = storage / "reshape" / "fm"
            saved = data_position(fm_dir / "checkpoints" / "step_00000002")
            assert saved["saved_with"]["world_size"] == 2 and saved["global_batch_size"] == 2
            world.patch_spec("reshape", {"runPolicy": {"suspend": True}})
            world.wait_phase("reshape", "Suspended")
            wait_for(lambda: "reshape-fm-1" not in world.jobs(), message="the suspended job to be deleted")

            # one GPU, the same accumulation: global batch 1, refused before any job
            world.patch_spec("reshape", {"topology": {"gpusPerNode": 1}, "runPolicy": {"suspend": False}})
            status = world.wait_status("reshape", lambda s: _stage(s, "fm").get("reason") == "TopologyMismatch",
                                       "the new global batch refused")
            message = _stage(status, "fm")["message"]
            assert "from 2 to 1" in message and "{gradientAccumulation: 2, microBatchSize: 1}" in message
            time.sleep(1.0)
            assert world.jobs() == {}

            # one GPU with twice the accumulation: attempt 2 resumes step 2 at world 1
            world.patch_spec("reshape", {"topology": {"gradientAccumulation": 2}})
            job = world.wait_job("reshape-fm-2")
            args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
            assert f"checkpoint.path={fm_dir}/checkpoints/step_00000002" in args
            assert "distributed.world_size=1" in args and "train.gradient_accumulation=2" in args
            done = {"reshape-fm-2"}
            second = _run_job(world, job)
            assert second.returncode == 0, second.stderr[-3000:]

            def step():
                status = world.status("reshape")
                if status.get("phase") in ("Succeeded", "Failed"):
                    return status
                for name, job in sorted(world.jobs().items()):
                    if name not in done:
                        done.add(name)
                        _run_job(world, job)
                return None
            status = wait_for(step, timeout=500, interval=0.2, message="the run to finish")
        assert status["phase"] == "Succeeded", (status, [r[:2] for r in world.ran])
        assert [r[:2] for r in world.ran] == [("reshape-fm-1", 0), ("reshape-fm-2", 0), ("reshape-anyflow-1", 0),
                                              ("reshape-generate-1", 0)]
        fm = _stage(status, "fm")
        assert [(a["attempt"], a["topology"]["worldSize"], a["topology"]["gradientAccumulation"], a.get("resumedFrom"))
                for a in fm["attempts"]] == [(1, 2, 1, None), (2, 1, 2, 2)]
        # each launch's GPU time at its own world size
        assert [a["worldSize"] for a in fm["usage"]["attempts"]] == [2, 1]
        final = fm_dir / "checkpoints" / "step_00000004"
        assert verify(final)["valid"] and data_position(final)["saved_with"]["world_size"] == 1
        assert data_position(final)["global_batch_size"] == 2
        assert "TopologyMismatch" in world.event_reasons("reshape") and "TopologyChanged" in world.event_reasons(
            "reshape")
        assert (storage / "reshape" / "generate" / "generation" / "COMPLETE.json").is_file()
        result = json.loads((fm_dir / "run-result.json").read_text())
        assert result["status"] == "complete"
