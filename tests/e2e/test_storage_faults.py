"""A checkpoint save meeting a full or failing volume (issue 26 item 4): the run ends with one message
naming the directory and the fix, classed ``storage_full`` / ``storage_error`` in run-result.json,
the events and ``solar diagnose``; the partial directory is removed, earlier checkpoints stay valid
and listed, and a resume once the volume is fixed continues exactly. Faults come from the drill
(``SOLAR_INJECT_FAULT=enospc|eio``) and, where this machine lets the test mount one, from a real
small tmpfs that cannot hold the next checkpoint (the save is refused before it writes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from solar.storage import checkpoints as ckpt
from tests.e2e.helpers import TINY, result, steps, train

pytestmark = pytest.mark.slow
CONFIG = TINY["wan22_ti2v_5b"]


def _sets(data, out, *extra):
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=100", "train.max_steps=6",
            "runtime.save_every=2", "runtime.validate_every=0", "runtime.validation_steps=[]", *extra]


def _drill(kind: str, step: int) -> dict:
    return {"SOLAR_ALLOW_FAULTS": "1", "SOLAR_INJECT_FAULT": f"{kind}:step={step}"}


def _checkpoints(out):
    return [(c["step"], c["valid"]) for c in ckpt.list_checkpoints(out)]


@pytest.mark.parametrize("kind, error_type, saving", [("enospc", "storage_full", "sync"),
                                                      ("eio", "storage_error", "sync"),
                                                      ("enospc", "storage_full", "async"),
                                                      ("enospc_commit", "storage_full", "async")])
def test_a_failed_save_names_the_volume_removes_its_partial_and_resumes_exactly(kind, error_type, saving, wan_data,
                                                                                 tmp_path, cli):
    background = ["runtime.async_checkpoint=true"] if saving == "async" else []
    out = tmp_path / "run"
    proc = train(CONFIG, _sets(wan_data, out, *background), extra_env=_drill(kind, 4))
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("solar: error:")]
    assert len(lines) == 1 and "checkpoint step 4: " in lines[0] and str(out / "checkpoints") in lines[0], lines
    assert ("no space left" in lines[0]) == (error_type == "storage_full")
    assert "Traceback" not in proc.stderr
    doc = result(out)
    assert doc["status"] == "failed" and doc["error_type"] == error_type and str(out / "checkpoints") in doc["message"]
    assert not [p for p in (out / "checkpoints").iterdir() if ckpt.PARTIAL_DIR.match(p.name)]  # removed
    assert _checkpoints(out) == [(2, True)]  # the earlier checkpoint is intact and listed
    listed = cli("checkpoint", "list", str(out))
    assert listed.code == 0 and "step_00000002" in listed.out
    diagnosis = cli("diagnose", str(out), "--json")
    report = json.loads(diagnosis.out)
    assert report["kind"] == error_type and "step 2" in " ".join(report["details"])

    # The volume fixed: resuming from step 2 gives the uninterrupted run's steps and final weights.
    resumed = train(CONFIG, _sets(wan_data, out, *background, "checkpoint.mode=full_resume",
                                  f"checkpoint.path={out}/checkpoints/step_00000002"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    straight = tmp_path / "straight"
    assert train(CONFIG, _sets(wan_data, straight, *background)).returncode == 0
    assert [e["loss"] for e in steps(out) if e["step"] > 2][-4:] == [e["loss"] for e in steps(straight)][2:]
    final = "checkpoints/step_00000006/model/live.safetensors"
    assert (out / final).read_bytes() == (straight / final).read_bytes()


def _mount_tmpfs(where, size: int) -> bool:
    where.mkdir(parents=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_volume_too_small_for_the_next_checkpoint_refuses_the_save_before_writing(wan_data, tmp_path):
    # How large one checkpoint of this config is, from a run on the ordinary disk.
    probe = tmp_path / "probe"
    assert train(CONFIG, _sets(wan_data, probe, "train.max_steps=2")).returncode == 0
    size = sum(f.stat().st_size for f in (probe / "checkpoints" / "step_00000002").rglob("*") if f.is_file())
    volume = tmp_path / "volume"
    if not _mount_tmpfs(volume, int(size * 1.6) + (256 << 10)):  # room for one checkpoint and the run files
        pytest.skip("cannot mount a small tmpfs here (needs root); the drill tests cover the write path")
    try:
        out = volume / "run"
        proc = train(CONFIG, _sets(wan_data, out))
        assert proc.returncode != 0
        line = next(line for line in proc.stderr.splitlines() if line.startswith("solar: error:"))
        assert "checkpoint step 4: needs " in line and "free" in line and str(out / "checkpoints") in line
        assert result(out)["error_type"] == "storage_full"
        assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000002"]  # nothing of step 4 written
        assert _checkpoints(out) == [(2, True)]
    finally:
        subprocess.run(["umount", str(volume)], capture_output=True)


def test_a_validation_write_on_a_full_volume_fails_the_run_and_the_resume_finishes_it(wan_data, tmp_path):
    out = tmp_path / "run"
    sets = _sets(wan_data, out, "train.max_steps=4", "runtime.validation_steps=[2]", "validation.decode_latents=1")
    proc = train(CONFIG, sets, extra_env=_drill("enospc_validation", 2))
    assert proc.returncode != 0
    line = next(line for line in proc.stderr.splitlines() if line.startswith("solar: error:"))
    assert "validation slot 0 of pass" in line and "no space left" in line and str(out / "validation") in line
    assert result(out)["error_type"] == "storage_full"
    assert not list((out / "validation").rglob(".slot_*.partial"))  # the slot's partial was removed
    assert not (out / "validation" / "step_00000002" / "COMPLETE.json").exists()
    assert _checkpoints(out) == [(2, True)]
    resumed = train(CONFIG, sets + ["checkpoint.mode=full_resume", f"checkpoint.path={out}/checkpoints/step_00000002"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "validation" / "step_00000002" / "COMPLETE.json").read_text())["status"] == "complete"
    assert result(out)["status"] == "complete"
