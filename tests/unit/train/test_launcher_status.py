"""The exit status of `solar train|infer` starting its own ranks (solar.launch.launcher): what the
ranks did, not torchrun's 1 for everything. Pure functions of the ranks' exit codes and of this
launch's run-result.json (the processes themselves: tests/e2e/test_exit_status.py)."""

from __future__ import annotations

import json
import signal
import time

from solar.launch.launcher import after_signal, exit_status


def test_the_ranks_own_exit_codes_decide():
    assert exit_status([]) == 0
    assert exit_status([130, 130]) == 130                # both ranks stopped by SIGINT
    assert exit_status([2, 2]) == 2                      # every rank refused the same input
    assert exit_status([-15, 2]) == 2                    # rank 1 refused, the agent then ended rank 0
    assert exit_status([-9]) == 128 + 9                  # a rank killed (OOM killer): 137, as a shell says


def test_after_a_signal_to_the_launcher_this_launchs_run_result_decides(tmp_path):
    result = tmp_path / "run-result.json"
    started = time.time() - 1
    assert after_signal(signal.SIGINT, result, started) == 130          # no run-result: 128 + SIGINT
    assert after_signal(signal.SIGTERM, result, started) == 143
    for status, sigint, sigterm in (("stopped", 130, 0), ("complete", 0, 0), ("failed", 2, 2)):
        result.write_text(json.dumps({"status": status}))
        assert (after_signal(signal.SIGINT, result, started), after_signal(signal.SIGTERM, result, started)) == \
            (sigint, sigterm)
    # a run-result.json from an earlier launch of the directory says nothing of this one
    assert after_signal(signal.SIGINT, result, time.time() + 60) == 130
    result.write_text(json.dumps({"status": "complete"}))
    assert after_signal(signal.SIGTERM, result, time.time() + 60) == 143
