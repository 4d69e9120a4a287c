"""``solar diagnose``: evidence (``evidence.py``, read-only I/O) -> a diagnosis (``classify.py``, pure).
Torch-free, so the operator can diagnose a failed stage from the run volume."""

from __future__ import annotations

import os
import time

from solar.diagnose.classify import Diagnosis, diagnose
from solar.diagnose.evidence import gather


def diagnose_dir(run_dir: str | os.PathLike, *, now: float | None = None) -> Diagnosis:
    return diagnose(gather(run_dir, now=time.time() if now is None else now))


def failure_summary(run_dir: str | os.PathLike) -> str | None:
    """One line for a failed stage's status and event ("<kind>: <summary>"); None when the evidence
    shows no fault or cannot be read. Never raises: a diagnosis only adds to a failure message."""
    try:
        found = diagnose_dir(run_dir)
    except Exception:  # noqa: BLE001 - missing or unreadable evidence adds nothing
        return None
    if found.status not in ("failed", "degraded"):
        return None
    return f"{found.kind}: {found.summary}"


__all__ = ["Diagnosis", "diagnose", "diagnose_dir", "failure_summary", "gather"]
