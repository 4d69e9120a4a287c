"""Saving a checkpoint in two halves: capture on the training thread, write on any thread.

*capture* (every rank, collective under FSDP2) copies every tensor the checkpoint holds off the
training state and turns the JSON members (``trainer.json``, each rank's RNG and data-stream state)
into bytes, so training may go on changing its state afterwards. With ``runtime.async_checkpoint``
the tensors land in host buffers that are allocated once and reused by every later save (pinned when
they come from the GPU, so the copy runs at bus speed), and *write* runs in a background thread.
*write* puts rank 0's role members and each rank's own files into the partial directory; the
transaction's commit (``solar.storage.checkpoints.commit``) happens on the training thread, only
after every rank's write finished. A crash or a failed write leaves a partial directory, never a
checkpoint.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solar.train import checkpoint_io as io


class Staging:
    """Host buffers for checkpoint tensors, keyed by name and reused from save to save."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.cuda = False

    def copy(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        t = tensor.detach()
        if hasattr(t, "full_tensor"):  # DTensor (FSDP2): gathered first (a collective)
            t = t.full_tensor()
        buf = self.buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            self.buffers[key] = buf
        buf.copy_(t, non_blocking=t.is_cuda)
        self.cuda = self.cuda or t.is_cuda
        return buf

    def ready(self) -> None:
        """Every copy issued so far has landed (device-to-host copies run asynchronously)."""
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class RoleCapture:
    role: str
    snap: dict              # checkpoint_io.snapshot's result
    names: list[str]
    weights: list[str]      # "live", and "ema" when the EMA exists


@dataclass
class Capture:
    """One rank's share of one checkpoint, detached from the training state."""
    step: int
    partial: Path
    roles: list[RoleCapture]          # rank 0 only; empty on the other ranks
    trainer_state: dict               # the manifest's trainer_state
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> bytes (this rank's)


def write(capture: Capture) -> dict[str, dict]:
    """Write this rank's members into the partial directory; the manifest's ``roles``."""
    roles = {}
    for rc in capture.roles:
        roles[rc.role] = {"weights": rc.weights,
                          "members": io.save_role(capture.partial, rc.role, rc.snap, rc.names)}
    for rel, data in capture.files.items():
        io.write_bytes(capture.partial / rel, data)
    return roles


class BackgroundWrite:
    """``write(capture)`` in a daemon thread: a process that dies mid-write leaves a partial."""

    def __init__(self, capture: Capture, *, started: float, blocking: float) -> None:
        self.capture, self.started, self.blocking = capture, started, blocking
        self.roles: dict[str, dict] = {}
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"solar-checkpoint-{capture.step}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.roles = write(self.capture)
        except BaseException as exc:  # noqa: BLE001 - reported on the training thread by finish()
            self.error = (f"checkpoint step {self.capture.step}: writing {self.capture.partial} failed: "
                          f"{type(exc).__name__}: {exc}")

    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self) -> None:
        self.thread.join()
