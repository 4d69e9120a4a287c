"""`solar run`: a whole SolarRun on this machine, with the operator's planner and state machine."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from solar.local.executor import has_gpu
from tests.conftest import REPO
from tests.e2e.helpers import env
from tests.support.files import snapshot

pytestmark = pytest.mark.slow


def _manifest(tmp_path, data, edit=None):
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    for stage in doc["spec"]["stages"]:
        stage["set"] = [f"data.root={data}" if s.startswith("data.root=") else s for s in stage["set"]]
    if edit:
        edit(doc)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _solar_run(manifest, workdir, *, wait=True):
    cmd = [sys.executable, "-m", "solar", "run", str(manifest), "--workdir", str(workdir)]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def data(wan_data):
    return wan_data


def _short_decodes(doc):
    # Validations and the generation decode one latent per slot instead of whole clips (most of a tiny stage's
    # time). Not in anyflow: the stage interrupted, whose whole-clip validation after its step-2 checkpoint keeps
    # it running while the SIGINT arrives.
    for stage in doc["spec"]["stages"]:
        if stage["name"] != "anyflow":
            stage["set"].append("validation.decode_latents=1")


def _interrupt_after_step_2(manifest, workdir, stage: str = "fm") -> str:
    """`solar run` of ``manifest`` interrupted (SIGINT) once ``stage`` committed its step-2 checkpoint: its
    exit status 130, and its stderr."""
    proc = _solar_run(manifest, workdir, wait=False)
    step2 = workdir / "tiny-wan" / stage / "checkpoints" / "step_00000002"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not step2.is_dir() and proc.poll() is None:
        time.sleep(0.2)
    assert step2.is_dir(), proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    return err


def test_interrupted_run_continues_where_it_stopped_and_finishes(data, tmp_path):
    manifest, workdir = _manifest(tmp_path, data, _short_decodes), tmp_path / "runs"
    err = _interrupt_after_step_2(manifest, workdir, "anyflow")
    assert "run the same command again to continue" in err
    status = json.loads((workdir / "tiny-wan" / "status.json").read_text())
    assert status["stages"][0]["phase"] == "Succeeded" and status["currentStage"] == "anyflow"
    again = _solar_run(manifest, workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    # from the checkpoint the interruption left: step 2, or the one saved on stop when the signal
    # arrived during a later step (the trainer finishes the step and saves), or the final one
    assert re.search(r"stage anyflow attempt 2 \(from \S+/anyflow/checkpoints/step_0000000[234]\)", again.stderr), \
        again.stderr[-3000:]
    status = json.loads((workdir / "tiny-wan" / "status.json").read_text())
    assert status["phase"] == "Succeeded"
    assert [s["phase"] for s in status["stages"]] == ["Succeeded"] * 4
    assert status["stages"][2]["checkpoint"]["step"] == 10 and status["stages"][3]["validation"]["complete"]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])
    assert (workdir / "tiny-wan" / "generate" / "generation" / "COMPLETE.json").is_file()
    assert (workdir / "tiny-wan" / "logs" / "anyflow-2.log").is_file()
    assert "solar run: Succeeded" in again.stderr
    summary = again.stderr.split("solar run: Succeeded", 1)[1]
    assert re.search(r"generate +Succeeded .*\| generation complete", summary) and "validation complete" in summary
    usage = {s["name"]: s["usage"] for s in status["stages"]}  # GPU time from each stage's run-result.json
    assert all(u["gpuSeconds"] > 0 for u in usage.values()) and [a["status"] for a in usage["anyflow"]["attempts"]][-1] \
        == "complete"
    assert status["gpuHours"] == pytest.approx(sum(u["gpuSeconds"] for u in usage.values()) / 3600, abs=1e-4)
    assert "GPU-hours:" in again.stderr
    third = _solar_run(manifest, workdir)  # a finished run is left as it is
    assert third.returncode == 0 and "already succeeded" in third.stderr


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["spec"]["stages"][1]["init"]["model"].update(stage="nope"), "(InvalidInit)"),
    (lambda d: d["spec"]["topology"].update(nodes=2), "single-node runs only"),
    (lambda d: d["spec"]["stages"][0]["set"].append("runtime.output_dir=/x"), "is set by the run"),
    (lambda d: d["spec"].update(family="wan3"), "spec.family"),
    (lambda d: d["spec"]["topology"].update(gpuMemory="3Gi"), "does not fit topology.gpuMemory 3Gi"),
])
def test_bad_manifests_are_refused_before_anything_runs(edit, fragment, data, tmp_path):
    manifest, workdir = _manifest(tmp_path, data, edit), tmp_path / "runs"
    proc = _solar_run(manifest, workdir)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and proc.stderr.count("\n") == 1
    assert not workdir.exists()


def test_a_failing_stage_fails_the_run_with_its_reason(data, tmp_path):
    # the first stage's data is missing: the trainer refuses its input (exit 2), which no retry changes: the
    # run fails at once with the trainer's own line, its backoffLimit unspent
    manifest = _manifest(tmp_path, tmp_path / "missing-data", lambda d: d["spec"]["runPolicy"].update(backoffLimit=1))
    proc = _solar_run(manifest, tmp_path / "runs")
    assert proc.returncode == 1, proc.stderr[-2000:]
    status = json.loads((tmp_path / "runs" / "tiny-wan" / "status.json").read_text())
    assert status["phase"] == "Failed" and status["stages"][0]["attempt"] == 1
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InputRefused" and "stage fm attempt 1" in failed["message"]
    assert "missing-data" in failed["message"] and "error_file" not in failed["message"]
    assert "missing-data" in proc.stderr.splitlines()[-3] or "missing-data" in proc.stderr[-1500:]


def test_an_interrupted_run_continues_at_another_nproc_with_the_same_global_batch(data, tmp_path):
    def one_stage(doc, accumulation=1):
        doc["spec"]["topology"].update(gpusPerNode=2, gradientAccumulation=accumulation)
        # a whole-clip validation after the step-2 checkpoint keeps the stage running while SIGINT arrives
        doc["spec"]["stages"] = [dict(doc["spec"]["stages"][0], set=doc["spec"]["stages"][0]["set"] + [
            "runtime.validate_every=2"])]
    manifest, workdir = _manifest(tmp_path, data, one_stage), tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "solar", "run", str(manifest), "--workdir", str(workdir),
                             "--nproc", "2"], cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    step2 = workdir / "tiny-wan" / "fm" / "checkpoints" / "step_00000002"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not step2.is_dir() and proc.poll() is None:
        time.sleep(0.2)
    assert step2.is_dir(), proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    status_path = workdir / "tiny-wan" / "status.json"
    before = status_path.read_text()

    def again(nproc):
        return subprocess.run([sys.executable, "-m", "solar", "run", str(manifest), "--workdir", str(workdir),
                               "--nproc", str(nproc)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    refused = again(1)   # half the ranks, the same accumulation: another global batch
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "global batch from 2 to 1" in refused.stderr and "(TopologyMismatch)" in refused.stderr
    assert "{gradientAccumulation: 2, microBatchSize: 1}" in refused.stderr
    assert status_path.read_text() == before and not (workdir / "tiny-wan" / "logs" / "fm-2.log").exists()

    manifest = _manifest(tmp_path, data, lambda d: one_stage(d, accumulation=2))
    dry = subprocess.run([sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(workdir),
                          "--nproc", "1"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "at a new shape: world 2 (1 node x 2)" in dry.stdout, dry.stderr[-2000:]
    done = again(1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TopologyChanged" in done.stderr and "-> world 1 (1 node x 1)" in done.stderr
    status = json.loads(status_path.read_text())
    fm = status["stages"][0]
    assert status["phase"] == "Succeeded" and fm["attempt"] == 2
    assert [(a["topology"]["worldSize"], a["topology"]["gradientAccumulation"]) for a in fm["attempts"]] == [(2, 1),
                                                                                                            (1, 2)]
    assert [a["worldSize"] for a in fm["usage"]["attempts"]][-1] == 1 and fm["usage"]["attempts"][0]["worldSize"] == 2


def _fm_only(*extra):
    """The run cut to its first stage, whose whole-clip validation after the step-2 checkpoint keeps it running
    while SIGINT arrives; ``extra``: more of the stage's set: values."""
    def edit(doc):
        fm = doc["spec"]["stages"][0]
        doc["spec"]["stages"] = [dict(fm, set=fm["set"] + ["runtime.validate_every=2", *extra])]
    return edit



def test_an_interrupted_run_edited_to_train_longer_continues_and_a_recipe_edit_is_refused(data, tmp_path):
    workdir = tmp_path / "runs"
    _interrupt_after_step_2(_manifest(tmp_path, data, _fm_only()), workdir)
    status_path = workdir / "tiny-wan" / "status.json"
    before = snapshot(workdir / "tiny-wan")

    refused = _solar_run(_manifest(tmp_path, data, _fm_only("train.optimizer.lr=0.5")), workdir)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "train.optimizer.lr 0.001 -> 0.5" in refused.stderr and "(RecipeChanged)" in refused.stderr
    assert "checkpoint.accept_changes=[train.optimizer.lr]" in refused.stderr
    assert snapshot(workdir / "tiny-wan") == before  # nothing written

    longer = _manifest(tmp_path, data, _fm_only("train.max_steps=6"))
    dry = subprocess.run([sys.executable, "-m", "solar", "run", "--dry-run", str(longer), "--workdir", str(workdir)],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "final checkpoint step 6" in dry.stdout, dry.stderr[-2000:]
    done = _solar_run(longer, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "schedule change: train.max_steps 4 -> 6" in done.stderr
    status = json.loads(status_path.read_text())
    assert status["phase"] == "Succeeded" and status["stages"][0]["checkpoint"]["step"] == 6
    fm = workdir / "tiny-wan" / "fm"
    records = sorted((fm / "launches").glob("*-launch-manifest.json"))
    changes = json.loads(records[-1].read_text())["changes"]
    assert [(c["key"], c["old"], c["new"], c["kind"]) for c in changes] == [("train.max_steps", 4, 6, "schedule")]
    assert changes[0]["from_step"] >= 3


def test_a_failed_run_continues_once_its_manifest_is_fixed(data, tmp_path):
    workdir = tmp_path / "runs"

    def broken(doc):
        _fm_only("train.max_steps=2")(doc)
        doc["spec"]["runPolicy"]["backoffLimit"] = 0
    failing = _manifest(tmp_path, tmp_path / "missing-data", broken)
    first = _solar_run(failing, workdir)
    assert first.returncode == 1, first.stderr[-2000:]
    status = json.loads((workdir / "tiny-wan" / "status.json").read_text())
    assert status["phase"] == "Failed" and status["stages"][0]["reason"] == "InputRefused"
    assert "missing-data" in status["stages"][0]["message"]   # the trainer's own line
    said = status["stages"][0]["message"]   # one exit code: the trainer's 2, not torchrun's 1 beside it
    assert said.startswith("stage fm attempt 1: the trainer refused its input (exit code 2)") and \
        said.count("exit code") == 1, said
    if not has_gpu():   # no GPU memory forecast where no stage runs on a GPU
        assert "MemoryForecast" not in first.stderr and " GiB" not in first.stderr, first.stderr[-2000:]
    fixed = _solar_run(_manifest(tmp_path, data, broken), workdir)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "SpecChanged" in fixed.stderr
    status = json.loads((workdir / "tiny-wan" / "status.json").read_text())
    assert status["phase"] == "Succeeded" and status["stages"][0]["checkpoint"]["step"] == 2
    manifest = _manifest(tmp_path, data, broken)
    before = snapshot(tmp_path)
    dry = subprocess.run([sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(workdir)],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and dry.stdout.startswith("# solar run tiny-wan: already succeeded ("), dry.stderr
    assert "solar run would do nothing" in dry.stdout
    assert "#   fm: Succeeded, attempt 2, checkpoint step 2" in dry.stdout
    assert snapshot(tmp_path) == before


def test_an_example_manifest_runs_from_another_directory(data, tmp_path):
    # the example as a user copies it: data.root relative to the manifest's own directory, the stage
    # configs found in the repository of the installed package, the command run from elsewhere
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    assert doc["spec"]["stages"][0]["set"][0] == "data.root=../demo-out/synth/wan22_ti2v_5b"
    fm = doc["spec"]["stages"][0]
    doc["spec"]["stages"] = [dict(fm, set=fm["set"] + ["train.max_steps=2", "runtime.validate_every=0"])]
    (tmp_path / "examples").mkdir()
    manifest = tmp_path / "examples" / "solarrun-tiny.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    (tmp_path / "demo-out" / "synth").mkdir(parents=True)
    (tmp_path / "demo-out" / "synth" / "wan22_ti2v_5b").symlink_to(data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [sys.executable, "-m", "solar", "run", "../examples/solarrun-tiny.yaml", "--workdir", "runs"]
    dry = subprocess.run([*args, "--dry-run"], cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    command = yaml.safe_load(dry.stdout.split("---\n", 1)[1])["command"]
    assert f"data.root={tmp_path / 'demo-out' / 'synth' / 'wan22_ti2v_5b'}" in command   # the resolved paths
    assert str(REPO / "configs" / "solar_wm" / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml") in command
    done = subprocess.run(args, cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads((elsewhere / "runs" / "tiny-wan" / "status.json").read_text())
    assert status["phase"] == "Succeeded" and status["stages"][0]["checkpoint"]["step"] == 2
