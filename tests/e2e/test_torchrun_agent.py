"""Issue 51 item 8, the trainer's half: the container's main process of a stage pod is torchrun's agent,
which exits 1 with a traceback when SIGTERM stops it, although every rank stopped at a checkpoint and
exited 0; ``python -m solar.launch.torchrun`` (torchrun's arguments) passes SIGTERM to the ranks
itself and exits with their status: 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.helpers import TINY, env, result

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CONFIG = TINY["wan22_ti2v_5b"]


def _agent(data, out: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "solar.launch.torchrun", "--standalone", "--nproc-per-node=2", "-m", "solar",
           "train", "--config", str(CONFIG)]
    for item in (f"data.root={data}", f"runtime.output_dir={out}", "distributed.world_size=2",
                 "train.global_batch_size=2", "train.max_steps=100000", "runtime.save_every=2",
                 "runtime.validate_every=0", "runtime.log_every=1"):
        cmd += ["--set", item]
    with open(log, "wb") as handle:
        return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=handle, stderr=subprocess.STDOUT)


def test_an_agent_stopped_by_sigterm_exits_0_after_its_ranks_saved(wan_data, tmp_path):
    out = tmp_path / "stage"
    agent = _agent(wan_data, out, tmp_path / "agent.log")
    try:
        deadline = time.monotonic() + 120
        while not list((out / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            time.sleep(0.05)
        agent.send_signal(signal.SIGTERM)                   # the kubelet signals the container's main process only
        assert agent.wait(timeout=120) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if agent.poll() is None:   # its ranks die with it (PR_SET_PDEATHSIG)
            agent.kill()
            agent.wait()
    said = (tmp_path / "agent.log").read_text()
    assert "solar: SIGTERM passed to 2 rank(s); waiting for them to stop" in said and "Traceback" not in said
    doc = result(out)
    assert doc["status"] == "stopped" and doc["checkpoints"][-1]["step"] == doc["final"]["step"]
