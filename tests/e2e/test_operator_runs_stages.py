"""The operator's PyTorchJobs really run: this test plays kubelet and the training operator by
executing each job's container (``torchrun`` + its argument list, unchanged) on this machine, with
the run volume mounted where the pods would see it. A three-stage tiny Wan run (Stage0.5 FM ->
Stage1 TF-AnyFlow from its EMA -> generation) must end Succeeded with real checkpoints and videos.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from solar.storage.checkpoints import verify
from tests.conftest import REPO
from tests.e2e.helpers import env
from tests.integration.world import CRD, World, load_case
from tests.support.crd_schema import anchor
from tests.support.kube import emulated_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _execute(world: World, job: dict) -> None:
    """kubelet + training operator for one single-node job: Running, the container's command, the verdict."""
    name = job["metadata"]["name"]
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["torchrun"] and set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    world.set_job(name, "Running")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *container["args"]]
    # the container's plain environment, as kubelet sets it (not the metrics port: no scrape here)
    extra = {e["name"]: e["value"] for e in container.get("env", [])
             if "value" in e and e["name"] != "SOLAR_METRICS_PORT"}
    proc = subprocess.run(cmd, cwd=REPO, env=env(extra), capture_output=True, text=True, timeout=400)
    if proc.returncode == 0:
        world.set_job(name, "Succeeded")
    else:
        world.set_job(name, "Failed", f"exit code {proc.returncode}: {proc.stderr[-300:]}")
    world.ran.append((name, proc.returncode, proc.stderr[-3000:]))


def test_the_operators_jobs_run_the_recipe_to_the_end(wan_data, tmp_path):
    data, storage = wan_data, tmp_path / "runs"
    doc = load_case("three-stage")
    doc["metadata"]["name"] = "real"
    doc["spec"]["topology"] = {"nodes": 1, "gpusPerNode": 1}
    doc["spec"]["storage"].update(mountPath=str(storage), path="real")  # the pods' view is this machine's
    doc["spec"]["volumes"] = []
    for stage in doc["spec"]["stages"]:
        stage["set"] = [f"data.root={data}"]
    with emulated_cluster([CRD, anchor("kubeflow.org_pytorchjobs.yaml")], tmp_path) as cluster:
        world = World(cluster, storage)
        world.ran = []
        with world.operator():
            world.apply(doc)
            done = set()

            def step():
                status = world.status("real")
                if status.get("phase") in ("Succeeded", "Failed"):
                    return status
                for name, job in sorted(world.jobs().items()):
                    if name not in done:
                        done.add(name)
                        _execute(world, job)
                return None
            status = wait_for(step, timeout=540, interval=0.2, message="the run to finish")
        assert status["phase"] == "Succeeded", (status, world.ran)
        assert [r[:2] for r in world.ran] == [("real-fm", 0), ("real-anyflow", 0), ("real-generate", 0)]
        fm = storage / "real" / "fm" / "checkpoints" / "step_00000004"
        assert verify(fm)["valid"] and verify(storage / "real" / "anyflow" / "checkpoints" / "step_00000004")["valid"]
        launch = (storage / "real" / "anyflow" / "launch-manifest.json").read_text()
        assert str(fm) in launch and '"weights": "ema"' in launch
        videos = sorted((storage / "real" / "generate" / "generation").glob("*/slot_*/generated.mp4"))
        assert videos and (storage / "real" / "generate" / "generation" / "COMPLETE.json").is_file()
        assert [s["phase"] for s in status["stages"]] == ["Succeeded"] * 3
        assert world.event_reasons("real")[-1] == "Completed"
        uid = world.run("real")["metadata"]["uid"]
        for stage in ("fm", "anyflow", "generate"):  # each stage's evidence names the run and stage it is for
            result = json.loads((storage / "real" / stage / "run-result.json").read_text())
            assert result["owner"] == {"run_uid": uid, "stage": stage}
