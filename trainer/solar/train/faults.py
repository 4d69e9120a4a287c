"""Opt-in fault injection for drills and tests. Honoured only when ``SOLAR_INJECT_FAULT`` is set,
e.g. ``SOLAR_INJECT_FAULT=nan_batch:step=3:rank=1`` or ``raise:step=2:rank=0``. Never on by default.

``kill_validation:step=N`` SIGKILLs the process right after it writes its first validation slot of
step N (a crash in the middle of validation)."""

from __future__ import annotations

import os
from dataclasses import dataclass

KINDS = ("nan_batch", "raise", "hang", "exit", "kill_validation")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None

    def fires(self, kind: str, step: int, rank: int) -> bool:
        return self.kind == kind and self.step == step and (self.rank is None or self.rank == rank)


def from_environment() -> Fault | None:
    text = os.environ.get("SOLAR_INJECT_FAULT")
    if not text:
        return None
    kind, *parts = text.split(":")
    fields = dict(p.split("=", 1) for p in parts if "=" in p)
    if kind not in KINDS or "step" not in fields:
        raise ValueError(f"SOLAR_INJECT_FAULT={text!r}: expected KIND:step=N[:rank=R] with KIND in {KINDS}")
    return Fault(kind, int(fields["step"]), int(fields["rank"]) if "rank" in fields else None)
