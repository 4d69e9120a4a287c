"""progress_deadline.py: a silent stage fails after progressDeadlineSeconds (table-driven, pure)."""

from __future__ import annotations

import pytest

from solar.run.progress_deadline import exceeded

T = 1_800_000_000.0


@pytest.mark.parametrize("now, activity, started, limit, idle", [
    (T + 100, T, T, 600, None),                 # busy
    (T + 601, T, T - 50, 600, 601.0),           # silent since its last heartbeat
    (T + 601, None, T, 600, 601.0),             # pods never started: nothing written since the attempt began
    (T + 601, T - 9000, T, 600, 601.0),         # an old directory does not count against a new attempt
    (T + 601, T + 10, T, 600, None),            # a heartbeat after the start
    (T + 600, T, T, 600, None),                 # exactly at the deadline: not past it
    (T + 10_000, None, None, 600, None),        # nothing to measure from
])
def test_deadline(now, activity, started, limit, idle):
    assert exceeded(now, last_activity=activity, attempt_started=started, limit=limit) == idle
