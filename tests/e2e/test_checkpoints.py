"""Checkpoint transactions: verify/list through the CLI, tampering, and SIGKILL crash consistency."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(wan_stage0p5, tmp_path_factory):
    """A copy of the session's 4-step run (checkpoints at steps 2 and 4): the listing test adds to it."""
    out = tmp_path_factory.mktemp("ck") / "run"
    shutil.copytree(wan_stage0p5, out)
    return out


def test_verify_and_list(run, cli, tmp_path):
    ckpt = run / "checkpoints" / "step_00000004"
    result = cli("checkpoint", "verify", str(ckpt))
    report = json.loads(result.out)
    assert result.code == 0 and report["valid"] and report["complete"] and report["step"] == 4
    assert report["roles"]["model"]["weights"] == ["live", "ema"]
    assert set(report["roles"]["model"]["members"]) >= {"model/live.safetensors", "model/ema.safetensors"}
    resolved = run / "resolved-config.json"
    assert cli("checkpoint", "verify", str(ckpt), "--route-config", str(resolved)).code == 0
    copy = tmp_path / "checkpoints" / "step_00000004"
    shutil.copytree(ckpt, copy)
    with open(copy / "model" / "ema.safetensors", "ab") as handle:
        handle.write(b"x")
    result = cli("checkpoint", "verify", str(copy))
    assert result.code == 2 and "member model/ema.safetensors has" in result.out
    (copy / "COMPLETE.json").unlink()
    assert "no COMPLETE.json" in cli("checkpoint", "verify", str(copy)).out
    (run / "checkpoints" / ".step_00000006.deadbeef.partial").mkdir()
    listing = json.loads(cli("checkpoint", "list", str(run)).out)
    assert [(r["step"], r["complete"], r["valid"]) for r in listing] == [(2, True, True), (4, True, True),
                                                                          (6, False, False)]
    other = tmp_path / "other.yaml"
    other.write_text((REPO / "configs/solar_wm/tiny/minimax_h3/train_stage0p5_fm_158f.yaml").read_text()
                     .replace("/path/to/solar-synth/minimax_h3", "/d").replace("/path/to/outputs/", "/o/"))
    mismatch = cli("checkpoint", "verify", str(ckpt), "--route-config", str(other))
    assert mismatch.code == 2 and "contract family: checkpoint has 'wan22_ti2v_5b', expected 'minimax_h3'" in mismatch.out


# bench/crash as it is; its runs' validations (the tiny config validates every 4 steps) decode one latent per slot
# instead of whole clips (--decode-latents 1): seconds of decoding and encoding took most of each trial, and most
# kills landed in them rather than in the steps and checkpoint saves the bench is about.
def _crash_bench(*args: str, timeout: int) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "bench/crash/crash_consistency.py"), "--decode-latents", "1",
                           *args], capture_output=True, text=True, timeout=timeout)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["failures"] == 0, proc.stdout
    return report


def test_crash_consistency_under_sigkill():
    """A short run of bench/crash (30+ trials are recorded in bench/RESULTS.md)."""
    _crash_bench("--trials", "4", "--seed", "7", "--workdir", str(REPO / ".cache/crash-test"), timeout=600)


def test_sharded_crash_consistency_under_sigkill():
    """bench/crash at world 2, full_shard (every rank writes its own shards), each kill aimed inside a save
    (--kill-in-save: a partial holds some of the save's files): seed 3 SIGKILLs rank 1, then the torchrun
    agent (its ranks die with it); every save left verifies, the torn save is left as a partial and never
    taken for a checkpoint, and a world-2 full resume from the newest commits the next step (the recorded
    random-moment trials at world 2-4, sync and async: bench/crash/results/2026-12-06-sharded-*.json)."""
    report = _crash_bench("--trials", "2", "--seed", "3", "--world", "2", "--sharding", "full_shard",
                          "--agent-kills", "0.5", "--kill-in-save", "--workdir", str(REPO / ".cache/crash-test-sharded"),
                          timeout=600)
    assert [t["killed"] for t in report["details"]] == ["rank 1", "agent"], report["details"]
    assert all(t["layouts"] == ["sharded"] and t["resume_rc"] == 0 for t in report["details"]), report["details"]
    assert report["trials_with_partial_left"] >= 1, report["details"]   # a save was torn, not only steps killed
