"""The rank-0 progress line on stderr: its format, ``runtime.log_every`` gating, the final step
always shown, silent on other ranks."""

from __future__ import annotations

import re

import pytest

from solar.train import engine
from solar.train.engine import Progress

LINE = re.compile(r"^solar: step (\d+)/(\d+) loss (-?\d+\.\d{4}) grad (\S+) lr (\S+) (\d+\.\d{2})s/step eta (\d+)s$")


def _event(step: int, **over) -> dict:
    return {"step": step, "loss_mean": 0.123456, "grad_norm": 1.23456, "lr": 2e-6, "step_seconds": 0.5, **over}


@pytest.fixture
def clock(monkeypatch):
    """A controllable ``time.perf_counter`` as the engine sees it."""
    now = [100.0]
    monkeypatch.setattr(engine.time, "perf_counter", lambda: now[0])
    return now


def _lines(capsys) -> list[str]:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_format_and_eta(capsys, clock):
    progress = Progress(True, total=10, start=0, every=1)
    clock[0] += 8.0  # two steps in 8 s: 4 s/step, 8 steps left
    progress.show(_event(2, loss_mean=0.5, grad_norm=0.0421, lr=1e-3, step_seconds=3.999))
    (line,) = _lines(capsys)
    assert line == "solar: step 2/10 loss 0.5000 grad 0.0421 lr 0.001 4.00s/step eta 32s"
    assert LINE.match(line)


def test_log_every_gates_and_the_final_step_always_prints(capsys, clock):
    progress = Progress(True, total=7, start=0, every=3)
    for step in range(1, 8):
        clock[0] += 1.0
        progress.show(_event(step))
    steps = [int(LINE.match(line).group(1)) for line in _lines(capsys)]
    assert steps == [3, 6, 7]  # 7 is train.max_steps, not a multiple of 3


def test_resumed_run_rates_only_the_steps_it_ran(capsys, clock):
    progress = Progress(True, total=100, start=90, every=5)
    clock[0] += 10.0  # steps 91..95 in 10 s: 2 s/step, 5 steps left
    progress.show(_event(95))
    (line,) = _lines(capsys)
    assert LINE.match(line).group(1, 2, 7) == ("95", "100", "10")


def test_other_ranks_print_nothing(capsys, clock):
    progress = Progress(False, total=4, start=0, every=1)
    for step in range(1, 5):
        progress.show(_event(step))
    assert capsys.readouterr().err == ""
