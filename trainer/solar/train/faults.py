"""Opt-in fault injection for drills and tests: ``SOLAR_INJECT_FAULT=KIND:step=N[:rank=R]``, honoured
only when ``SOLAR_ALLOW_FAULTS=1`` is set as well (a stray variable in a production environment is
reported and ignored). Never on by default. Each kind produces the real failure ``solar diagnose``
classifies:

- ``nan_batch``   the rank's micro-batch latents become NaN -> the non-finite guard
- ``oom``         the rank's forward raises ``torch.OutOfMemoryError`` (what an allocator failure raises)
- ``shape``       the rank's micro-batch loses a latent frame -> the model's own shape error
- ``sp_mismatch`` the rank's micro-batch differs from its SP peers' -> the SP identity check
- ``hang``        the rank stops entering collectives (sleeps) -> peers time out in a collective
- ``raise``, ``exit``  an exception / ``os._exit(17)`` on that rank
- ``kill_validation``  SIGKILL right after the first validation slot of step N is written
- ``enospc``, ``eio``  the rank's checkpoint write at step N fails with that OSError after its first
  member (what a full or failing volume raises), leaving a partial directory as a real one would
- ``enospc_commit``  rank 0's commit of the checkpoint at step N (manifest, COMPLETE.json) fails with ENOSPC
- ``enospc_validation``  the rank's first validation slot write at step N fails with ENOSPC

``SOLAR_FAKE_GPU_MEMORY=B0,B1,...`` (bytes per rank, also only with ``SOLAR_ALLOW_FAULTS=1``) makes
``activation_checkpointing_skip_blocks: auto`` take its GPU branch on the CPU, each rank reporting
that much device memory: the gather of every rank's memory and the choice by the smallest run as on
GPUs (the model itself stays where it is). Only on the CPU: where the device is a GPU it is ignored.

``SOLAR_SLOW_STEP_SECONDS=S`` (also only with ``SOLAR_ALLOW_FAULTS=1``) makes every training step of
the rank at least S seconds longer (a sleep after the step), so that time passes at a known pace:
the drill of ``runtime.save_every_seconds``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

KINDS = ("nan_batch", "oom", "shape", "sp_mismatch", "hang", "raise", "exit", "kill_validation", "enospc", "eio",
         "enospc_commit", "enospc_validation")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None

    def fires(self, kind: str, step: int, rank: int) -> bool:
        return self.kind == kind and self.step == step and (self.rank is None or self.rank == rank)


def _drill(name: str, environ) -> str | None:
    """The drill variable's value when ``SOLAR_ALLOW_FAULTS=1`` allows it; a stray one is reported and ignored."""
    text = environ.get(name)
    if not text:
        return None
    if environ.get("SOLAR_ALLOW_FAULTS") != "1":
        print(f"solar: warning: ignoring {name}={text!r} (drills need SOLAR_ALLOW_FAULTS=1)", file=sys.stderr)
        return None
    return text


def from_environment(environ=os.environ) -> Fault | None:
    text = _drill("SOLAR_INJECT_FAULT", environ)
    if text is None:
        return None
    kind, *parts = text.split(":")
    fields = dict(p.split("=", 1) for p in parts if "=" in p)
    if kind not in KINDS or "step" not in fields:
        raise ValueError(f"SOLAR_INJECT_FAULT={text!r}: expected KIND:step=N[:rank=R] with KIND in {KINDS}")
    return Fault(kind, int(fields["step"]), int(fields["rank"]) if "rank" in fields else None)


def storage_error(fault: Fault, step: int, rank: int, where) -> OSError | None:
    """The OSError a drilled checkpoint write at ``step`` raises on ``rank`` (None when it does not)."""
    import errno

    for kind, code in (("enospc", errno.ENOSPC), ("eio", errno.EIO)):
        if fault.fires(kind, step, rank):
            return OSError(code, os.strerror(code), str(where))
    return None


def device_memory(rank: int, device_type: str = "cpu", environ=os.environ) -> int | None:
    """This rank's faked GPU memory (``SOLAR_FAKE_GPU_MEMORY``), or None. Honoured only where the device is
    the CPU (the drill stands in for a GPU there): on a GPU the device's own memory decides and the variable
    is ignored, with no effect (rank 0 says so)."""
    text = _drill("SOLAR_FAKE_GPU_MEMORY", environ)
    if text is None:
        return None
    if device_type != "cpu":
        if rank == 0:
            print(f"solar: warning: ignoring SOLAR_FAKE_GPU_MEMORY={text!r} on a {device_type} device (it stands in "
                  "for a GPU's memory on the CPU only)", file=sys.stderr)
        return None
    sizes = [int(v) for v in text.split(",")]
    return sizes[rank % len(sizes)]


def slow_step_seconds(environ=os.environ) -> float:
    """The seconds ``SOLAR_SLOW_STEP_SECONDS`` adds to each step (0 without the drill)."""
    text = _drill("SOLAR_SLOW_STEP_SECONDS", environ)
    return float(text) if text is not None else 0.0
