"""The rank-0 progress line on stderr: its format (tokens/s, MFU and peak GPU memory per GPU where
known; Stage2's roles each named), ``runtime.log_every`` gating, the final step always shown, an ETA
from the recent steps with the launch's warm-up left out (no ETA until a step after it is timed),
silent on other ranks."""

from __future__ import annotations

import re

import pytest

from solar.train import engine
from solar.train.engine import Progress, duration, eta_seconds

LINE = re.compile(r"^solar: step (\d+)/(\d+) loss (-?\d+\.\d{4}) grad (\S+) lr (\S+) (\d+\.\d{2})s/step"
                  r"(?: ([\d,]+) tok/s)?(?: mfu (\d+\.\d)%)?(?: mem (\d+\.\d)GiB)?(?: eta (\S+))?$")


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
    progress = Progress(True, total=10, start=0, every=1, warmup=2)
    for step, seconds in ((1, 8.0), (2, 4.0), (3, 2.0)):  # two warm-up steps, then one timed at 2 s
        clock[0] += seconds
        progress.show(_event(step, loss_mean=0.5, grad_norm=0.0421, lr=1e-3, step_seconds=seconds - 0.001))
    lines = _lines(capsys)
    # the warm-up steps say nothing of the steps to come: no ETA rather than a wrong one
    assert lines[0] == "solar: step 1/10 loss 0.5000 grad 0.0421 lr 0.001 8.00s/step"
    assert lines[1] == "solar: step 2/10 loss 0.5000 grad 0.0421 lr 0.001 4.00s/step"
    assert lines[2] == "solar: step 3/10 loss 0.5000 grad 0.0421 lr 0.001 2.00s/step eta 14s"
    assert all(LINE.match(line) for line in lines)


def test_eta_is_a_pure_function_of_the_timed_steps():
    assert eta_seconds([], 399) is None                 # only warm-up steps so far: no estimate
    assert eta_seconds([0.04, 0.02], 397) == pytest.approx(0.03 * 397)
    assert eta_seconds([], 0) == 0.0 and eta_seconds([5.0], 0) == 0.0   # the last step: nothing left


def test_a_short_fast_run_gets_no_inflated_eta(capsys, clock):
    """The reported case: 400 steps of 35 ms after a launch whose first interval (set-up, compile)
    took 0.66 s printed `step 1/400 ... eta 4m24s` for a 14 s run. The warm-up's lines now carry no
    ETA and the first ETA follows the steps after it."""
    progress = Progress(True, total=400, start=0, every=1)
    for step, seconds in enumerate([0.66, 0.2, 0.035, 0.035], start=1):
        clock[0] += seconds
        progress.show(_event(step, step_seconds=seconds))
    etas = [LINE.match(line).group(10) for line in _lines(capsys)]
    assert etas == [None, None, duration(0.035 * 397), duration(0.035 * 396)] == [None, None, "14s", "14s"]


def test_throughput_mfu_and_memory_per_gpu(capsys, clock):
    """Two clips per DP rank, 4 DP ranks of 2 SP ranks (8 GPUs): 8 clips of 1,000 tokens in 2 s is
    500 tokens/s per GPU; at 1e12 FLOPs a clip and 1e12 FLOP/s peak, 50% MFU."""
    progress = Progress(True, total=10, start=0, every=1, tokens_per_clip=1000, flops_per_clip=1e12,
                        peak_flops=1e12, dp_world=4, world=8)
    clock[0] += 2.0
    progress.show(_event(1, step_seconds=2.0, samples=[{}, {}], memory={"cuda_peak_bytes": 3 * 2**30 + 2**29}))
    (line,) = _lines(capsys)
    assert line.endswith(" 2.00s/step 500 tok/s mfu 50.0% mem 3.5GiB")  # step 1: warm-up, no ETA yet
    assert LINE.match(line)


def test_eta_leaves_out_the_warm_up_and_follows_the_recent_steps(capsys, clock):
    progress = Progress(True, total=1000, start=0, every=1, warmup=2, window=3)
    for step, seconds in enumerate([300.0, 40.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0], start=1):
        clock[0] += seconds
        progress.show(_event(step, step_seconds=seconds))
    etas = [LINE.match(line).group(10) for line in _lines(capsys)]
    # steps 1 and 2: the warm-up, no ETA; then the last three steps only
    assert etas[:3] == [None, None, duration(2 * 997)]
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


def test_stage2_names_both_roles_on_a_student_step(capsys, clock):
    """A Stage2 step names the critic's loss, grad and lr, and on a step that updates the student its
    loss (the mean over ranks), grad and lr beside them."""
    progress = Progress(True, total=10, start=0, every=1)
    critic_only = _event(5, student_updated=False, student_step=0, loss=0.4, loss_mean=0.25, grad_norm=0.5, lr=1e-3)
    student = _event(6, student_updated=True, student_step=1, student_loss=0.9, student_loss_mean=0.75, student_grad_norm=0.125,
                     student_lr=2e-6, loss_mean=0.25, grad_norm=0.5, lr=1e-3, losses={"critic": 0.4, "student": 0.9})
    for event in (critic_only, student):
        clock[0] += 1.0
        progress.show(event)
    lines = _lines(capsys)
    assert lines[0] == "solar: step 5/10 critic loss 0.2500 grad 0.5 lr 0.001 student no update yet 0.50s/step"
    assert lines[1] == ("solar: step 6/10 critic loss 0.2500 grad 0.5 lr 0.001 student loss 0.7500 grad 0.125 lr 2e-06 "
                        "(update 1) 0.50s/step")


def _stage2_event(step: int, ratio: int, updates: list) -> dict:
    """Step ``step`` of a Stage2 run whose student updates every ``ratio`` steps from ratio + 1 on
    (``dmd.student_updates``); ``updates`` collects (update, step, the mean over ranks) of each."""
    from solar.objectives import dmd

    event = _event(step, student_updated=False, loss=0.4, loss_mean=2.0 + step / 1000,
                   student_step=dmd.student_step_after(step, ratio))
    if dmd.student_updates(step, ratio):
        mean = 0.05 + step / 10_000
        event.update(student_updated=True, student_loss=mean + 0.01, student_loss_mean=mean, student_grad_norm=0.25,
                     student_lr=1e-5)
        updates.append((event["student_step"], step, mean))
    return event


@pytest.mark.parametrize("every, ratio", [(5, 3), (10, 5), (4, 5), (7, 2)])
def test_stage2_every_line_names_the_students_latest_loss_and_its_update(capsys, clock, every, ratio):
    """The released cadences print every 5, 10, 50 or 100 steps and the student updates every 5th:
    with ``log_every`` not a multiple of the interval, every line still names the student's latest
    loss (the mean over ranks) and the update and step it came from."""
    progress, updates, seen = Progress(True, total=40, start=0, every=every), [], []
    for step in range(1, 41):
        clock[0] += 1.0
        progress.show(_stage2_event(step, ratio, updates))
        for line in _lines(capsys):
            seen.append(line)
            number = int(re.match(r"solar: step (\d+)/", line).group(1))
            done = [u for u in updates if u[1] <= number]
            if not done:
                assert " student no update yet " in line, line
                continue
            update, at, mean = done[-1]
            if at == number:   # the step updated it: grad and lr too
                assert f" student loss {mean:.4f} grad 0.25 lr 1e-05 (update {update}) " in line, line
            else:
                assert f" student loss {mean:.4f} (update {update}, step {at}) " in line, line
    assert len(seen) == 40 // every + (40 % every > 0)
    assert any("student loss" in line and ", step " in line for line in seen)   # off-update lines were printed


def test_stage2_resumed_launch_names_the_update_before_its_first_own():
    from solar.train.engine import roles_text

    event = {"step": 21, "student_updated": False, "loss_mean": 2.0, "grad_norm": 0.5, "lr": 1e-3, "student_step": 4}
    assert roles_text(event).endswith(" student update 4 (its loss before this launch)")
