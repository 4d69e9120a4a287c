"""The command `solar diagnose` prints for a stopped run (issue 52 item 5) continues it, run as printed:
the latest launch's resolved config with the run directory and a full resume from its newest
checkpoint. (tests/unit/diagnose/test_rewind.py checks on hand-built directories that the command
and its source-config form resolve to the launch's config.)"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.e2e.helpers import TINY, env, result, steps, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_printed_command_continues_a_stopped_run(wan_data, tmp_path):
    out = tmp_path / "run"
    sets = [f"data.root={wan_data}", f"runtime.output_dir={out}", "runtime.log_every=100", "train.max_steps=4",
            "runtime.save_every=2", "runtime.validate_every=0", "runtime.validation_steps=[]",
            "runtime.exit_after_step=2"]
    first = train(TINY["wan22_ti2v_5b"], sets)
    assert first.returncode == 0 and result(out)["status"] == "stopped", first.stderr[-2000:]
    diagnosed = subprocess.run([sys.executable, "-m", "solar", "diagnose", str(out), "--json"], cwd=REPO, env=env(),
                               capture_output=True, text=True, timeout=120)
    found = json.loads(diagnosed.stdout)
    assert found["status"] == "stopped" and found["next"]["step"] == 2, found
    argv = shlex.split(found["next"]["command"])
    assert argv[:3] == ["solar", "train", "--config"] and argv[3] == str(out / "resolved-config.json")
    again = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env(), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert result(out)["status"] == "complete" and result(out)["final"]["step"] == 4
    assert [e["step"] for e in steps(out)] == [1, 2, 3, 4]
