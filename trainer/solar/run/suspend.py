"""Suspend and resume (``spec.runPolicy.suspend``).

Suspending stops the current stage's job (its pods go; nothing else is touched): a PyTorchJob is
deleted, a TrainJob gets ``spec.suspend: true`` (contract.md §7), and the stage and the run are
``Suspended``. Clearing the flag deletes a job the operator suspended and starts the next attempt of
that stage, which resumes from its newest verified checkpoint; a suspension is not a failure and
costs no retry. The operator never clears ``suspend`` on a job: one a queue holds (Kueue) is the
queue's to release.
"""

from __future__ import annotations


def suspended(flag: bool, previous_phase: str | None) -> str | None:
    """``suspend`` when the run must be (or stay) suspended, ``resume`` when it just left suspension."""
    if flag:
        return "suspend"
    if previous_phase == "Suspended":
        return "resume"
    return None
