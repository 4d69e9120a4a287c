"""Issue 45 items 6 and 7 with real processes: ranks never outlive their launcher (SIGKILL of torchrun's
agent, or of `solar run`, leaves no rank alive 10 s later), and one writer per run directory (a second
launch into a directory a live launch holds is refused in one line naming the holder; the kernel lock
goes with its holder, so a killed run resumes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.helpers import TINY, env, train

pytestmark = pytest.mark.slow
LONG = ["train.max_steps=100000", "runtime.validate_every=0", "runtime.save_every=2", "runtime.log_every=1"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie (exited, not yet reaped by its new parent) is gone for this purpose
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _rank_pids(run, world: int, deadline: float) -> list[int]:
    """Every rank's pid from its heartbeat, once every rank has taken a step."""
    while time.monotonic() < deadline:
        beats = [run / "heartbeat" / f"rank-{r:05d}.json" for r in range(world)]
        if all(b.exists() for b in beats):
            states = [json.loads(b.read_text()) for b in beats]
            if all(s.get("step", 0) >= 1 for s in states):
                return [s["pid"] for s in states]
        time.sleep(0.2)
    raise AssertionError("the ranks did not start stepping")


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_ranks_do_not_outlive_a_killed_torchrun_agent(wan_data, tmp_path):
    run = tmp_path / "run"
    agent = train(TINY["wan22_ti2v_5b"], [f"data.root={wan_data}", f"runtime.output_dir={run}",
                                          "distributed.world_size=2", "train.global_batch_size=2", *LONG],
                  nproc=2, wait=False)
    try:
        ranks = _rank_pids(run, 2, time.monotonic() + 120)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        assert _gone_within(ranks, 10), f"ranks {ranks} still alive 10 s after their agent was killed"
    finally:
        for pid in [agent.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_ranks_do_not_outlive_a_killed_solar_run(wan_data, tmp_path):
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    fm = doc["spec"]["stages"][0]
    # quiet ranks: no line reaches the killed command's closed pipe (which would end them by itself)
    doc["spec"]["stages"] = [dict(fm, set=[f"data.root={wan_data}", *LONG, "runtime.log_every=1000000"])]
    manifest = tmp_path / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "solar", "run", str(manifest), "--workdir", str(tmp_path / "runs")],
                            cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks = _rank_pids(tmp_path / "runs" / "tiny-wan" / "fm", 1, time.monotonic() + 120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert _gone_within(ranks, 10), f"rank {ranks} still alive 10 s after solar run was killed"


def test_one_writer_per_run_directory_and_a_dead_holder_leaves_no_lock(wan_data, tmp_path):
    run = tmp_path / "run"
    sets = [f"data.root={wan_data}", f"runtime.output_dir={run}"]
    live = train(TINY["wan22_ti2v_5b"], [*sets, *LONG], wait=False)
    try:
        (pid,) = _rank_pids(run, 1, time.monotonic() + 120)
        deadline = time.monotonic() + 60
        while not (run / "checkpoints" / "step_00000002").is_dir() and time.monotonic() < deadline:
            time.sleep(0.2)
        resume = ["checkpoint.mode=full_resume", f"checkpoint.path={run}/checkpoints/step_00000002"]
        second = train(TINY["wan22_ti2v_5b"], [*sets, *LONG, *resume])
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr[-2000:]
        assert f"runtime.output_dir {run} is being written by a live launch (host " in second.stderr
        assert f"pid {pid}, since " in second.stderr and "Traceback" not in second.stderr
        assert not (run / "launches").exists()        # the refused launch recorded nothing
        assert _alive(pid)                            # and the live one trains on
    finally:
        os.kill(live.pid, signal.SIGKILL)             # a crash: the kernel releases the lock with its holder
        live.communicate(timeout=30)
    newest = sorted((run / "checkpoints").glob("step_*"))[-1]
    resumed = train(TINY["wan22_ti2v_5b"], [*sets, "train.max_steps=100000", "runtime.validate_every=0",
                                            "runtime.save_every=2", "runtime.exit_after_step=" +
                                            str(int(newest.name[5:]) + 1), "checkpoint.mode=full_resume",
                                            f"checkpoint.path={newest}"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "being written" not in resumed.stderr
