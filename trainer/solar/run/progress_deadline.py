"""Progress deadline: a stage that shows no sign of life for ``runPolicy.progressDeadlineSeconds`` fails.

Signs of life are the newest modification time among the stage's heartbeats, event logs,
checkpoints and run-result, or the start of the current attempt (its job's creation). This also
bounds a job whose pods never start (a pending pod keeps every other rank waiting at rendezvous):
nothing is written, so the deadline runs from the attempt's start.
"""

from __future__ import annotations


def idle_seconds(now: float, *, last_activity: float | None, attempt_started: float | None) -> float:
    marks = [t for t in (last_activity, attempt_started) if t is not None]
    return now - max(marks) if marks else 0.0


def exceeded(now: float, *, last_activity: float | None, attempt_started: float | None, limit: int) -> float | None:
    """The idle time when it is past the deadline, else None."""
    idle = idle_seconds(now, last_activity=last_activity, attempt_started=attempt_started)
    return idle if idle > limit else None
