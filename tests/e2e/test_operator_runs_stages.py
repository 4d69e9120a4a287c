"""The operator's jobs really run, under each backend: this test plays kubelet and the training
operator (PyTorchJob) or the Trainer v2 controller with its ``torch-distributed`` runtime (TrainJob)
by executing each job's command (``python -m solar.launch.torchrun`` + its argument list, unchanged;
``python`` is this interpreter) on this machine, with the run volume mounted where the pods would see
it. A three-stage tiny Wan run (Stage0.5 FM -> Stage1 TF-AnyFlow from its EMA -> generation) must end
Succeeded with real checkpoints and videos, each stage's attempt 1 a job named ``<run>-<stage>-1``.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from solar.storage.checkpoints import verify
from tests.conftest import REPO
from tests.e2e.helpers import env
from tests.e2e.test_operator_topology_change import launcher
from tests.integration.world import World, crds, load_case
from tests.support.kube import emulated_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _execute_trainjob(world: World, job: dict) -> None:
    """The Trainer controller + kubelet for one single-node TrainJob: the runtime's container ``node``
    runs the trainer's command with the ``PET_*`` variables the torch plugin injects (``PET_NNODES``,
    ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``; the master is
    this machine), no ``--standalone``: torchrun takes its rendezvous from them."""
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    assert trainer["command"] == ["python", "-m", "solar.launch.torchrun"] and trainer["numNodes"] == 1
    node = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["name"] == "node" and node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"
    world.set_job(name, "Running")
    pet = {"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
           "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(_free_port())}
    extra = {e["name"]: e["value"] for e in trainer.get("env", [])
             if "value" in e and e["name"] != "SOLAR_METRICS_PORT"}
    cmd = [*launcher(trainer["command"]), *trainer["args"]]
    proc = subprocess.run(cmd, cwd=REPO, env=env({**extra, **pet}), capture_output=True, text=True, timeout=400)
    if proc.returncode == 0:
        world.set_job(name, "Succeeded")
    else:
        world.set_job(name, "Failed", f"exit code {proc.returncode}: {proc.stderr[-300:]}")
    world.ran.append((name, proc.returncode, proc.stderr[-3000:]))


def _execute(world: World, job: dict) -> None:
    """kubelet + training operator for one single-node job: Running, the container's command, the verdict."""
    name = job["metadata"]["name"]
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "solar.launch.torchrun"]
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    world.set_job(name, "Running")
    cmd = [*launcher(container["command"]), "--standalone", *container["args"]]
    # the container's plain environment, as kubelet sets it (not the metrics port: no scrape here)
    extra = {e["name"]: e["value"] for e in container.get("env", [])
             if "value" in e and e["name"] != "SOLAR_METRICS_PORT"}
    proc = subprocess.run(cmd, cwd=REPO, env=env(extra), capture_output=True, text=True, timeout=400)
    if proc.returncode == 0:
        world.set_job(name, "Succeeded")
    else:
        world.set_job(name, "Failed", f"exit code {proc.returncode}: {proc.stderr[-300:]}")
    world.ran.append((name, proc.returncode, proc.stderr[-3000:]))


@pytest.mark.parametrize("backend", ["PyTorchJob", "TrainJob"])
def test_the_operators_jobs_run_the_recipe_to_the_end(backend, wan_data, tmp_path):
    data, storage = wan_data, tmp_path / "runs"
    doc = load_case("three-stage")
    doc["metadata"]["name"] = "real"
    doc["spec"]["backend"] = backend
    doc["spec"]["env"] = [{"name": "NCCL_DEBUG", "value": "WARN"}]  # reaches the trainer's environment
    doc["spec"]["topology"] = {"nodes": 1, "gpusPerNode": 1}
    doc["spec"]["storage"].update(mountPath=str(storage), path="real")  # the pods' view is this machine's
    doc["spec"]["volumes"] = []
    for stage in doc["spec"]["stages"]:
        stage["set"] = [f"data.root={data}"]
    with emulated_cluster(crds(backend), tmp_path) as cluster:
        world = World(cluster, storage, backend=backend)
        world.ran = []
        if backend == "TrainJob":
            world.install_runtime()
        admitted = world.validate_jobs_strictly()
        execute = _execute_trainjob if backend == "TrainJob" else _execute
        with world.operator(backends=(backend,)):
            world.apply(doc)
            done = set()

            def step():
                status = world.status("real")
                if status.get("phase") in ("Succeeded", "Failed"):
                    return status
                for name, job in sorted(world.jobs().items()):
                    if name not in done:
                        done.add(name)
                        execute(world, job)
                return None
            status = wait_for(step, timeout=540, interval=0.2, message="the run to finish")
        assert status["phase"] == "Succeeded", (status, world.ran)
        assert [r[:2] for r in world.ran] == [("real-fm-1", 0), ("real-anyflow-1", 0), ("real-generate-1", 0)]
        assert [j["kind"] for j in admitted] == [backend] * 3 and status["backend"] == backend
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
