"""``runtime.save_every_seconds``: a save once that much training time has passed on rank 0's clock.

Only rank 0 reads its clock. Its reading, the seconds since the launch's first step began or since the
last save returned (the training a disruption would lose: a sync save has committed by then; an async
save's state was captured then, and a write that fails fails the run), travels in the step's stop
check (``Stop.agree_with``, a collective the step takes anyway), the other ranks sending 0. Every rank
so learns the same number and decides the same step, at any world size and sharding; no rank's own
clock, which drifts and starts at another moment, takes part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class SaveClock:
    interval: float                          # runtime.save_every_seconds; 0: off
    reader: bool                             # this rank's clock decides (rank 0)
    clock: Callable[[], float] = time.monotonic
    since: float | None = None               # the launch's first step, or the last save's return

    def restart(self) -> None:
        """Count from now: before the launch's first step, and when a save returns."""
        self.since = self.clock()

    def reading(self) -> float:
        """What this rank contributes to the stop check: rank 0's seconds since ``restart`` (0 when off,
        not yet started, or on any other rank)."""
        if not self.interval or not self.reader or self.since is None:
            return 0.0
        return max(0.0, self.clock() - self.since)

    def due(self, agreed: float) -> bool:
        """Whether the reading every rank agreed on (rank 0's) has reached the interval."""
        return bool(self.interval) and agreed >= self.interval
