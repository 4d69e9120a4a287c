"""conditions.py: one way to set a condition; transition times and exclusive types."""

from __future__ import annotations

from solar.run import conditions as C


def _set(conds, type_, status, reason, now, message="m"):
    C.set_condition(conds, type_, status, reason, message, now=now, generation=1)


def test_transition_time_moves_only_when_the_status_flips():
    conds = []
    _set(conds, C.PROGRESSING, "True", C.STAGE_STARTED, "t1")
    _set(conds, C.PROGRESSING, "True", C.STAGE_RUNNING, "t2", "other message")
    c = C.find(conds, C.PROGRESSING)
    assert (c.reason, c.message, c.lastTransitionTime) == ("StageRunning", "other message", "t1")
    _set(conds, C.PROGRESSING, "False", C.COMPLETED, "t3")
    assert C.find(conds, C.PROGRESSING).lastTransitionTime == "t3"


def test_exclusive_types_move_together():
    conds = []
    _set(conds, C.PROGRESSING, "True", C.STAGE_RUNNING, "t1")
    _set(conds, C.FAILED, "True", C.BACKOFF_LIMIT_EXCEEDED, "t2", "stage fm failed")
    assert [(c.type, c.status, c.reason) for c in conds] == [
        ("Progressing", "False", "BackoffLimitExceeded"), ("Failed", "True", "BackoffLimitExceeded")]
    assert C.find(conds, C.READY) is None  # absent types are not invented


def test_every_reason_is_unique_and_camel_case():
    reasons = [v for v in vars(C).values() if isinstance(v, C.Reason)]
    names = [r.name for r in reasons]
    assert len(names) == len(set(names)) and all(n[0].isupper() and n.isalnum() for n in names)
    assert set(C.VALIDATION_REASONS) == {"UnsupportedRoute", "UnresolvedPlaceholder", "TopologyMismatch",
                                         "RecipeChanged", "InvalidInit", "InvalidSpec", "InsufficientGPUMemory",
                                         "InsufficientHostMemory", "BackendUnavailable"}
