"""Issue 52 items 2 and 3, the SolarRun side, with the real trainer: a stage whose launches committed no
checkpoint starts over (StageRestarted) under ``solar run`` and under the operator, after a spec fix and
after a disruption, an attempt like any other; a stage whose set names one of its own checkpoints
(checkpoint.mode=full_resume, checkpoint.path) rewinds to it, the newer checkpoints kept under
checkpoints/superseded/. Each test is one Stage0.5 stage of the tiny Wan recipe, two to four steps.
Under the operator the test plays kubelet and the training operator, running each job's command here
with the container's own environment (as tests/e2e/test_operator_steering.py does)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from solar.storage.checkpoints import verify
from tests.conftest import REPO
from tests.e2e.helpers import env, steps
from tests.e2e.test_operator_topology_change import launcher
from tests.integration.world import World, crds, load_case
from tests.support.kube import emulated_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


# -- solar run -------------------------------------------------------------------------------------------

def _manifest(tmp_path, data, *extra, backoff=0, name="run.yaml"):
    """The tiny manifest cut to its Stage0.5 stage: validation off, 2 steps, a checkpoint at step 2."""
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    fm = doc["spec"]["stages"][0]
    doc["spec"]["stages"] = [dict(fm, set=[f"data.root={data}", "runtime.validate_every=0", "train.max_steps=2",
                                           "runtime.log_every=1", *extra])]
    doc["spec"]["runPolicy"]["backoffLimit"] = backoff
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _solar_run(manifest, workdir, extra_env=None):
    return subprocess.run([sys.executable, "-m", "solar", "run", str(manifest), "--workdir", str(workdir)], cwd=REPO,
                          env=env(extra_env), capture_output=True, text=True, timeout=280)


def _status(workdir):
    return json.loads((workdir / "tiny-wan" / "status.json").read_text())


def test_a_solar_run_with_a_typod_data_root_fixed_succeeds(wan_data, tmp_path):
    """Validation off, so no test set is read at start: the trainer met the typo only after its launch
    wrote its files (until issue 52), and the fixed run failed as NothingToResume."""
    workdir = tmp_path / "runs"
    first = _solar_run(_manifest(tmp_path, tmp_path / "typo-data"), workdir)
    assert first.returncode == 1, first.stderr[-3000:]
    fm = _status(workdir)["stages"][0]
    assert fm["phase"] == "Failed" and "typo-data" in fm["message"], fm
    fixed = _solar_run(_manifest(tmp_path, wan_data), workdir)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "SpecChanged" in fixed.stderr and "NothingToResume" not in fixed.stderr
    status = _status(workdir)
    assert status["phase"] == "Succeeded" and status["stages"][0]["checkpoint"]["step"] == 2, status
    assert verify(workdir / "tiny-wan" / "fm" / "checkpoints" / "step_00000002")["valid"]


def test_a_solar_run_stage_that_failed_before_its_first_checkpoint_starts_over_with_the_fixed_manifest(
        wan_data, tmp_path):
    """The launch writes its files and fails at step 1 (an injected fault), before its step-2 save; the
    manifest is then fixed (another learning rate: a recipe key, which a SolarRun stage's restart takes)
    and `solar run` again starts the stage over: StageRestarted, attempt 2 from step 0, the first launch
    kept as history."""
    workdir = tmp_path / "runs"
    first = _solar_run(_manifest(tmp_path, wan_data, "train.optimizer.lr=0.5"), workdir,
                       {"SOLAR_INJECT_FAULT": "raise:step=1"})
    assert first.returncode == 1, first.stderr[-3000:]
    stage_dir = workdir / "tiny-wan" / "fm"
    fm = _status(workdir)["stages"][0]
    assert (fm["phase"], fm["reason"]) == ("Failed", "BackoffLimitExceeded"), fm
    assert (stage_dir / "launch-manifest.json").is_file() and not list(stage_dir.glob("checkpoints/step_*"))

    fixed = _solar_run(_manifest(tmp_path, wan_data), workdir)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "StageRestarted: stage fm attempt 2 starts over from step 0" in fixed.stderr, fixed.stderr[-3000:]
    status = _status(workdir)
    fm = status["stages"][0]
    assert status["phase"] == "Succeeded" and fm["checkpoint"]["step"] == 2 and fm["failures"] == 0
    assert [(a["attempt"], a.get("resumedFrom")) for a in fm["attempts"]] == [(1, None), (2, None)]
    assert [u["status"] for u in fm["usage"]["attempts"]][-1] == "complete"
    # the first launch is history; the second records the restart and the recipe change it took
    record = json.loads((stage_dir / "launches" / "0001-launch-manifest.json").read_text())
    assert record["restart"]["earlier_launches"] == 1, record
    assert [(c["key"], c["old"], c["new"]) for c in record["changes"]] == [("train.optimizer.lr", 0.5, 0.001)]
    events = [json.loads(line) for line in (stage_dir / "events" / "rank-00000.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("start") == 2 and "restarted" in [e["event"] for e in events]
    assert [e["step"] for e in steps(stage_dir)][-2:] == [1, 2]


def test_a_solar_run_stage_is_rewound_by_its_manifest(wan_data, tmp_path):
    """A failed stage (checkpoints at steps 1 and 2, a fault at step 3) whose manifest names its step-1
    checkpoint: `solar run` again rewinds it there (StageRewound), the step-2 checkpoint moved to
    checkpoints/superseded/ and kept, trains step 2 again as the first time, and finishes at step 4."""
    workdir = tmp_path / "runs"
    base = ("train.max_steps=4", "runtime.save_every=1")
    first = _solar_run(_manifest(tmp_path, wan_data, *base), workdir, {"SOLAR_INJECT_FAULT": "raise:step=3"})
    assert first.returncode == 1, first.stderr[-3000:]
    stage_dir = (workdir / "tiny-wan" / "fm").resolve()
    assert verify(stage_dir / "checkpoints" / "step_00000002")["valid"]
    before = {e["step"]: e for e in steps(stage_dir)}

    step1 = stage_dir / "checkpoints" / "step_00000001"
    rewound = _solar_run(_manifest(tmp_path, wan_data, *base, "checkpoint.mode=full_resume",
                                   f"checkpoint.path={step1}"), workdir)
    assert rewound.returncode == 0, rewound.stderr[-3000:]
    assert f"StageRewound: stage fm attempt 2 rewinds to {step1}" in rewound.stderr, rewound.stderr[-3000:]
    status = _status(workdir)
    fm = status["stages"][0]
    assert status["phase"] == "Succeeded" and fm["checkpoint"]["step"] == 4
    assert [a.get("resumedFrom") for a in fm["attempts"]] == [None, 1] and fm["rewoundTo"] == 1
    superseded = list((stage_dir / "checkpoints" / "superseded").glob("*/step_00000002"))
    assert len(superseded) == 1 and verify(superseded[0])["valid"]      # kept, never deleted
    record = json.loads(sorted((stage_dir / "launches").glob("*-launch-manifest.json"))[-1].read_text())
    assert record["rewind"]["step"] == 1 and record["rewind"]["superseded"] == ["step_00000002"], record
    again = [e for e in steps(stage_dir) if e["step"] == 2][-1]
    assert again["loss_mean"] == pytest.approx(before[2]["loss_mean"], rel=1e-5)   # step 2 as the first time


# -- the operator ----------------------------------------------------------------------------------------

def _doc(storage, data, name, *extra):
    doc = load_case("three-stage")
    doc["metadata"]["name"] = name
    doc["spec"]["topology"] = {"nodes": 1, "gpusPerNode": 1}
    doc["spec"]["storage"].update(mountPath=str(storage), path=name)
    doc["spec"]["volumes"] = []
    doc["spec"]["runPolicy"]["backoffLimit"] = 0          # a disruption must not spend a retry
    doc["spec"]["stages"] = [dict(doc["spec"]["stages"][0], set=[
        f"data.root={data}", "runtime.validate_every=0", "train.max_steps=2", *extra])]
    return doc


def _pod_env(job: dict) -> dict:
    """The trainer container's own environment (SOLAR_RUN_UID, SOLAR_RUN_STAGE, SOLAR_ATTEMPT, ...): its plain
    values, as the kubelet sets them."""
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e
            and not e["name"].endswith("_CACHE_DIR")}


def _start(world: World, job: dict, extra_env: dict | None = None) -> subprocess.Popen:
    """kubelet: the job's container command, started here in its own process group."""
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    world.set_job(job["metadata"]["name"], "Running")
    return subprocess.Popen([*launcher(container["command"]), "--standalone", *container["args"]], cwd=REPO,
                            env=env({**_pod_env(job), **(extra_env or {})}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(world: World, job: dict, proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=240)
    world.set_job(job["metadata"]["name"], "Succeeded" if proc.returncode == 0 else "Failed",
                  f"exit code {proc.returncode}")
    return proc.returncode, err


def _run(world, job, extra_env=None):
    return _finish(world, job, _start(world, job, extra_env))


def _stage(status):
    return (status.get("stages") or [{}])[0]


def _succeeds(world, name, job):
    code, err = _run(world, job)
    assert code == 0, err[-3000:]
    return wait_for(lambda: (s := world.status(name)).get("phase") in ("Succeeded", "Failed") and s, timeout=60,
                    interval=0.2, message="the run to finish")


def test_the_operator_restarts_a_stage_that_failed_before_its_first_checkpoint_after_a_spec_fix(wan_data, tmp_path):
    storage = tmp_path / "runs"
    doc = _doc(storage, wan_data, "fixed", "train.optimizer.lr=0.5")
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        with world.operator(backends=("PyTorchJob",)):
            world.apply(doc)
            code, err = _run(world, world.wait_job("fixed-fm-1"), {"SOLAR_INJECT_FAULT": "raise:step=1"})
            assert code != 0 and "injected fault" in err, err[-3000:]
            fm = _stage(world.wait_phase("fixed", "Failed"))
            assert fm["reason"] == "BackoffLimitExceeded", fm
            stage_dir = storage / "fixed" / "fm"
            assert (stage_dir / "launch-manifest.json").is_file() and not list(stage_dir.glob("checkpoints/step_*"))

            world.patch_spec("fixed", {"stages": [dict(doc["spec"]["stages"][0], set=[
                s for s in doc["spec"]["stages"][0]["set"] if not s.startswith("train.optimizer.lr")])]})
            job = wait_for(lambda: (j := world.jobs().get("fixed-fm-2")) and j, timeout=30, message="attempt 2")
            args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
            assert "checkpoint.mode=full_resume" not in args
            status = _succeeds(world, "fixed", job)
        assert status["phase"] == "Succeeded", status
        fm = _stage(status)
        assert fm["checkpoint"]["step"] == 2 and fm["failures"] == 0
        assert [(a["attempt"], a.get("resumedFrom")) for a in fm["attempts"]] == [(1, None), (2, None)]
        reasons = world.event_reasons("fixed")
        assert "StageRestarted" in reasons and "NothingToResume" not in reasons
        assert reasons.index("SpecChanged") < reasons.index("StageRestarted")
        record = json.loads((stage_dir / "launches" / "0001-launch-manifest.json").read_text())
        assert record["restart"]["earlier_launches"] == 1, record


def test_the_operator_restarts_a_stage_disrupted_before_its_first_checkpoint(wan_data, tmp_path):
    """Attempt 1's pod is lost (SIGKILL while its rank hangs in step 1, then a DisruptionTarget on the pod and
    the job Failed): StageDisrupted, not counted (backoffLimit 0), and attempt 2 starts over."""
    storage = tmp_path / "runs"
    doc = _doc(storage, wan_data, "lost")
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        with world.operator(backends=("PyTorchJob",)):
            world.apply(doc)
            job = world.wait_job("lost-fm-1")
            proc = _start(world, job, {"SOLAR_INJECT_FAULT": "hang:step=1"})
            beat = storage / "lost" / "fm" / "heartbeat" / "rank-00000.json"

            def hanging():
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                try:
                    return "hang" in json.loads(beat.read_text()).get("phase", "")
                except (OSError, ValueError):
                    return False
            wait_for(hanging, timeout=120, interval=0.2, message="attempt 1 in its step 1")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
            template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
            pods = f"/api/v1/namespaces/{world.namespace}/pods"
            cluster.create(pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "lost-fm-1-master-0", "labels": template["metadata"]["labels"]},
                "spec": {"containers": [{"name": "trainer", "image": "solar-trainer:dev"}], "nodeName": "n1"}})
            cluster.patch(f"{pods}/lost-fm-1-master-0/status", {"status": {"phase": "Failed", "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint"}]}})
            world.set_job("lost-fm-1", "Failed", "exit code 137")
            job = wait_for(lambda: (j := world.jobs().get("lost-fm-2")) and j, timeout=30, message="attempt 2")
            assert not list((storage / "lost" / "fm").glob("checkpoints/step_*"))
            status = _succeeds(world, "lost", job)
        assert status["phase"] == "Succeeded", status
        fm = _stage(status)
        assert fm["checkpoint"]["step"] == 2 and fm["failures"] == 0 and fm["attempt"] == 2
        reasons = world.event_reasons("lost")
        assert reasons.index("StageDisrupted") < reasons.index("StageRestarted")
        assert "JobFailed" not in reasons and "NothingToResume" not in reasons


def test_the_operator_rewinds_a_stage_by_its_manifest(wan_data, tmp_path):
    """A failed stage (checkpoints at steps 1 and 2, a fault at step 3) whose spec then names its step-1
    checkpoint in the stage's set: attempt 2 resumes step 1 (StageRewound), the trainer moves step 2 aside
    (kept), and the stage finishes at step 4."""
    storage = tmp_path / "runs"
    doc = _doc(storage, wan_data, "back", "runtime.save_every=1")
    doc["spec"]["stages"][0]["set"] = [s for s in doc["spec"]["stages"][0]["set"] if "max_steps" not in s] + [
        "train.max_steps=4"]
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        with world.operator(backends=("PyTorchJob",)):
            world.apply(doc)
            code, err = _run(world, world.wait_job("back-fm-1"), {"SOLAR_INJECT_FAULT": "raise:step=3"})
            assert code != 0 and "injected fault" in err, err[-3000:]
            world.wait_phase("back", "Failed")
            stage_dir = storage / "back" / "fm"
            assert verify(stage_dir / "checkpoints" / "step_00000002")["valid"]

            step1 = f"{stage_dir}/checkpoints/step_00000001"
            stage = doc["spec"]["stages"][0]
            world.patch_spec("back", {"stages": [dict(stage, set=stage["set"] + [
                "checkpoint.mode=full_resume", f"checkpoint.path={step1}"])]})
            job = wait_for(lambda: (j := world.jobs().get("back-fm-2")) and j, timeout=30, message="attempt 2")
            args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
            assert args[-4:] == ["--set", "checkpoint.mode=full_resume", "--set", f"checkpoint.path={step1}"]
            status = _succeeds(world, "back", job)
        assert status["phase"] == "Succeeded", status
        fm = _stage(status)
        assert fm["checkpoint"]["step"] == 4 and [a.get("resumedFrom") for a in fm["attempts"]] == [None, 1]
        assert fm["rewoundTo"] == 1
        assert "StageRewound" in world.event_reasons("back")
        superseded = list((stage_dir / "checkpoints" / "superseded").glob("*/step_00000002"))
        assert len(superseded) == 1 and verify(superseded[0])["valid"]
