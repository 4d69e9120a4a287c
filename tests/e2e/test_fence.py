"""Issue 51 item 3 with real processes: a stage trained under torchrun over gloo as attempt 1 is frozen
(SIGSTOP of its agent and ranks, a silent node) after its first checkpoint; attempt 2 resumes the
newest checkpoint in the same directory (going ahead of the writer lock the frozen attempt still holds)
and commits; attempt 1 wakes (SIGCONT) while attempt 2 is frozen in turn, and leaves with one line and
exit status 3 having changed no byte of the stage (checkpoints, run-result.json, events, heartbeats,
logs, launch records); attempt 2 then finishes with every step's loss and grad norm equal to an
uninterrupted run's. Each attempt runs under ``python -m solar.launch.torchrun`` (torchrun exiting
with its ranks' status, so the stale attempt's 3 shows)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.helpers import TINY, env, result, steps, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CONFIG = TINY["wan22_ti2v_5b"]
MAX_STEPS = 10


def _sets(data, out, *extra) -> list[str]:
    return [f"data.root={data}", f"runtime.output_dir={out}", "distributed.world_size=2",
            "train.global_batch_size=2", f"train.max_steps={MAX_STEPS}", "runtime.save_every=2",
            "runtime.validate_every=0", "runtime.log_every=1", *extra]


def _attempt(sets: list[str], attempt: int, log: Path) -> subprocess.Popen:
    """One attempt of the stage as the operator's pods start it, with its fencing token, under
    ``solar.launch.torchrun`` (torchrun's agent, exiting with the ranks' status)."""
    cmd = [sys.executable, "-m", "solar.launch.torchrun", "--standalone", "--nproc-per-node=2",
           "-m", "solar", "train", "--config", str(CONFIG)]
    for item in sets:
        cmd += ["--set", item]
    with open(log, "wb") as handle:
        return subprocess.Popen(cmd, cwd=REPO, env=env({"SOLAR_ATTEMPT": str(attempt)}), stdout=handle,
                                stderr=subprocess.STDOUT)


def _children(pid: int) -> list[int]:
    from solar.launch.torchrun import children

    return children(pid)


def _signal(agent: subprocess.Popen, sig: int) -> None:
    """``sig`` to an attempt: every rank's process group (each leads its own session) and its agent."""
    for rank in _children(agent.pid):
        os.killpg(rank, sig)
    agent.send_signal(sig)


def _checkpoints(out: Path) -> list[int]:
    root = out / "checkpoints"
    return sorted(int(p.name[5:]) for p in root.glob("step_*")) if root.is_dir() else []


def _wait(predicate, seconds: float, what: str, *procs: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        for proc in procs:
            assert proc.poll() is None, f"{what}: the attempt ended first (exit {proc.returncode})"
        time.sleep(0.02)
    raise AssertionError(f"{what} within {seconds} s")


def _tree(out: Path) -> dict[str, str]:
    """Every file and directory under the stage directory, hidden ones included, path -> digest, but
    for an atomic write's temporary files (``.<name>.<hex>.tmp``, never read): a rank stopped in the middle
    of a write leaves one, which it removes when it wakes up stale."""
    found = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            continue
        found[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return found


def _last_per_step(run: Path) -> dict[int, dict]:
    """The stage's step records, the newest of each step (the live attempt's)."""
    return {e["step"]: e for e in steps(run)}


def test_a_stale_attempt_that_wakes_up_changes_nothing_and_the_stage_trains_as_uninterrupted(wan_data, tmp_path):
    out = tmp_path / "stage"
    first = _attempt(_sets(wan_data, out), 1, tmp_path / "attempt-1.log")
    second = None
    try:
        _wait(lambda: _checkpoints(out), 120, "attempt 1's first checkpoint", first)
        _signal(first, signal.SIGSTOP)                       # a silent node: its ranks freeze where they are
        resumed = _checkpoints(out)[-1]
        assert json.loads((out / ".fence.json").read_text())["token"] == 1
        second = _attempt(_sets(wan_data, out, "checkpoint.mode=full_resume",
                                f"checkpoint.path={out}/checkpoints/step_{resumed:08d}"), 2, tmp_path / "attempt-2.log")
        _wait(lambda: _checkpoints(out)[-1] > resumed, 120, "attempt 2's first checkpoint", second)
        _signal(second, signal.SIGSTOP)                      # the live attempt holds still: the stage's files are quiet
        before = _tree(out)
        fence = json.loads((out / ".fence.json").read_text())
        assert fence["token"] == 2 and fence["pid"] in _children(second.pid)

        _signal(first, signal.SIGCONT)                       # the node returns
        assert first.wait(timeout=60) == 3
        assert _tree(out) == before, "attempt 1 changed the stage's files after it woke up"
        said = (tmp_path / "attempt-1.log").read_text()
        stale = [line for line in said.splitlines() if " is stale: " in line]
        assert stale and stale[0].startswith(f"solar: attempt 1 of {out} is stale: attempt 2 took over at "
                                             f"{fence['since']} (host {fence['host']}, pid {fence['pid']}); "
                                             "exiting without writing (exit status 3)"), said[-3000:]
        assert "solar: ranks ended: rank 0 3, rank 1 3 (exit status 3)" in said

        _signal(second, signal.SIGCONT)
        assert second.wait(timeout=120) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                _signal(proc, signal.SIGCONT)
                _signal(proc, signal.SIGKILL)
                proc.wait()
    said = (tmp_path / "attempt-2.log").read_text()
    assert "is held by attempt 1 (host " in said and "an older attempt of this stage: it is fenced" in said, \
        said[-3000:]
    doc = result(out)
    assert doc["status"] == "complete" and doc["final"]["step"] == MAX_STEPS
    assert [c["step"] for c in doc["checkpoints"]][-1] == MAX_STEPS

    reference = tmp_path / "uninterrupted"
    proc = train(CONFIG, _sets(wan_data, reference), nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = _last_per_step(out), _last_per_step(reference)
    assert sorted(got) == sorted(want) == list(range(1, MAX_STEPS + 1))
    for step in want:
        for key in ("loss_mean", "grad_norm"):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5), (step, key)

