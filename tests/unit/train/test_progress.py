"""The rank-0 progress line on stderr: its format (tokens/s, MFU and peak GPU memory per GPU where
known), ``runtime.log_every`` gating, the final step always shown, an ETA from the recent steps with
the launch's warm-up left out, silent on other ranks."""

from __future__ import annotations

import re

import pytest

from solar.train import engine
from solar.train.engine import Progress, duration

LINE = re.compile(r"^solar: step (\d+)/(\d+) loss (-?\d+\.\d{4}) grad (\S+) lr (\S+) (\d+\.\d{2})s/step"
                  r"(?: ([\d,]+) tok/s)?(?: mfu (\d+\.\d)%)?(?: mem (\d+\.\d)GiB)? eta (\S+)$")


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
    clock[0] += 8.0  # one step in 8 s (warm-up: the only figure yet), 9 steps left
    progress.show(_event(1, loss_mean=0.5, grad_norm=0.0421, lr=1e-3, step_seconds=7.999))
    (line,) = _lines(capsys)
    assert line == "solar: step 1/10 loss 0.5000 grad 0.0421 lr 0.001 8.00s/step eta 1m12s"
    assert LINE.match(line)


def test_throughput_mfu_and_memory_per_gpu(capsys, clock):
    """Two clips per DP rank, 4 DP ranks of 2 SP ranks (8 GPUs): 8 clips of 1,000 tokens in 2 s is
    500 tokens/s per GPU; at 1e12 FLOPs a clip and 1e12 FLOP/s peak, 50% MFU."""
    progress = Progress(True, total=10, start=0, every=1, tokens_per_clip=1000, flops_per_clip=1e12,
                        peak_flops=1e12, dp_world=4, world=8)
    clock[0] += 2.0
    progress.show(_event(1, step_seconds=2.0, samples=[{}, {}], memory={"cuda_peak_bytes": 3 * 2**30 + 2**29}))
    (line,) = _lines(capsys)
    assert line.endswith(" 2.00s/step 500 tok/s mfu 50.0% mem 3.5GiB eta 18s")
    assert LINE.match(line)


def test_eta_leaves_out_the_warm_up_and_follows_the_recent_steps(capsys, clock):
    progress = Progress(True, total=1000, start=0, every=1, warmup=2, window=3)
    for step, seconds in enumerate([300.0, 40.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0], start=1):
        clock[0] += seconds
        progress.show(_event(step, step_seconds=seconds))
    etas = [LINE.match(line).group(10) for line in _lines(capsys)]
    # step 1: only the compile step; step 2: both warm-up steps; then the last three steps only
    assert etas[:3] == [duration(300 * 999), duration(170 * 998), duration(2 * 997)]
    assert etas[-1] == duration(1 * 992)


def test_durations():
    assert [duration(s) for s in (0, 42.4, 60, 425, 3600, 31_860, 86_400, 273_600)] == \
        ["0s", "42s", "1m00s", "7m05s", "1h00m", "8h51m", "1d00h", "3d04h"]


def test_log_every_gates_and_the_final_step_always_prints(capsys, clock):
    progress = Progress(True, total=7, start=0, every=3)
    for step in range(1, 8):
        clock[0] += 1.0
        progress.show(_event(step))
    steps = [int(LINE.match(line).group(1)) for line in _lines(capsys)]
    assert steps == [3, 6, 7]  # 7 is train.max_steps, not a multiple of 3


def test_resumed_run_rates_only_the_steps_it_ran(capsys, clock):
    progress = Progress(True, total=100, start=90, every=5)
    for step in range(91, 96):  # steps 91..95 at 2 s each: 5 steps left
        clock[0] += 2.0
        progress.show(_event(step))
    (line,) = _lines(capsys)
    assert LINE.match(line).group(1, 2, 10) == ("95", "100", "10s")


def test_other_ranks_print_nothing(capsys, clock):
    progress = Progress(False, total=4, start=0, every=1)
    for step in range(1, 5):
        progress.show(_event(step))
    assert capsys.readouterr().err == ""
