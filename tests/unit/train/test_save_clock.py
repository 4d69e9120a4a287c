"""``runtime.save_every_seconds`` (issue 52 item 4): rank 0's ``SaveClock`` reading, carried by the step's
stop check (``Stop.agree_with``), decides a save by time for every rank. The multi-rank run is
tests/e2e/test_save_by_time.py."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
import torch

from solar.launch.stop import Stop
from solar.train.save_clock import SaveClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rank_0_reads_the_seconds_since_the_launch_or_the_last_save():
    clock = FakeClock()
    c = SaveClock(600.0, reader=True, clock=clock)
    assert c.reading() == 0.0                       # not started: nothing to count from
    c.restart()                                     # before the launch's first step
    clock.now += 599.5
    assert c.reading() == 599.5 and not c.due(c.reading())
    clock.now += 0.5
    assert c.reading() == 600.0 and c.due(c.reading())   # due once the interval has passed
    c.restart()                                     # a save returned: count again from it
    clock.now += 10
    assert c.reading() == 10.0 and not c.due(c.reading())


def test_other_ranks_and_an_unset_interval_read_nothing():
    clock = FakeClock()
    other, off = SaveClock(600.0, reader=False, clock=clock), SaveClock(0.0, reader=True, clock=clock)
    other.restart()
    off.restart()
    clock.now += 10**6
    assert other.reading() == 0.0 and off.reading() == 0.0
    assert other.due(700.0)                         # a rank decides on rank 0's reading, not its own
    assert not off.due(10**9)                       # 0: off


class PairedDist:
    """One rank's view of a two-rank MAX all-reduce: the peer's tensor is given."""

    initialized, backend, device = True, "gloo", torch.device("cpu")

    def __init__(self, peer: list[float]) -> None:
        self.peer, self.calls = peer, []

    def all_reduce(self, t, name, op=None):
        self.calls.append((name, op))
        t.copy_(torch.maximum(t, torch.tensor(self.peer, dtype=t.dtype)))
        return t


@pytest.mark.parametrize("rank0_stop, rank1_stop", [(False, False), (False, True), (True, False)])
def test_the_stop_check_carries_rank_0s_reading_to_every_rank(rank0_stop, rank1_stop):
    stops = [Stop(), Stop()]
    for stop, asked in zip(stops, (rank0_stop, rank1_stop)):
        if asked:
            stop.requested, stop.signum = True, signal.SIGTERM
    sent = [(float(signal.SIGTERM) if rank0_stop else 0.0, 612.25), (float(signal.SIGTERM) if rank1_stop else 0.0, 0.0)]
    seen = []
    for rank, (stop, value) in enumerate(zip(stops, (612.25, 0.0))):
        d = PairedDist(list(sent[1 - rank]))
        seen.append(stop.agree_with(d, value, "stop-check"))
        assert d.calls == [("stop-check", torch.distributed.ReduceOp.MAX)]   # one collective, the step's own
    assert seen[0] == seen[1] == (rank0_stop or rank1_stop, 612.25)
    assert [s.agreed for s in stops] == [signal.SIGTERM if (rank0_stop or rank1_stop) else None] * 2


def test_alone_the_stop_check_takes_no_collective():
    alone = SimpleNamespace(initialized=False)
    assert Stop().agree_with(alone, 3.5) == (False, 3.5)
    assert Stop().agree(alone) is False
