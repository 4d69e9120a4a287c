"""Suspend and resume (``spec.runPolicy.suspend``).

Suspending deletes the current stage's job (its pods go; nothing else is touched) and marks the
stage and the run ``Suspended``. Clearing the flag starts the next attempt of that stage, which
resumes from its newest verified checkpoint; a suspension is not a failure and costs no retry.
"""

from __future__ import annotations


def suspended(flag: bool, previous_phase: str | None) -> str | None:
    """``suspend`` when the run must be (or stay) suspended, ``resume`` when it just left suspension."""
    if flag:
        return "suspend"
    if previous_phase == "Suspended":
        return "resume"
    return None
