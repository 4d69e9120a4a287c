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
    inject: OSError | None = None     # a drill's storage fault (train/faults.py), raised after the first member

    def size(self) -> int:
        """The bytes this rank will write (every tensor and file; the headers are not counted)."""
        def walk(value) -> int:
            if isinstance(value, torch.Tensor):
                return value.numel() * value.element_size()
            if isinstance(value, dict):
                return sum(walk(v) for v in value.values())
            if isinstance(value, (list, tuple)):
                return sum(walk(v) for v in value)
            return 0
        return sum(walk(rc.snap) for rc in self.roles) + sum(len(data) for data in self.files.values())


def write(capture: Capture) -> dict[str, dict]:
    """Write this rank's members into the partial directory; the manifest's ``roles``."""
    roles = {}
    for rc in capture.roles:
        roles[rc.role] = {"weights": rc.weights,
                          "members": io.save_role(capture.partial, rc.role, rc.snap, rc.names)}
        if capture.inject is not None:
            raise capture.inject
    for rel, data in capture.files.items():
        io.write_bytes(capture.partial / rel, data)
        if capture.inject is not None:
            raise capture.inject
    return roles


def failure(capture: Capture, exc: BaseException) -> tuple[str, str]:
    """(message, error_type) of a failed write: storage_full / storage_error naming the path and
    the fix, else ``checkpoint``."""
    from solar.storage import space

    what = f"checkpoint step {capture.step}"
    kind = space.storage_class(exc)
    if kind is not None:
        return space.message(kind, what, exc, capture.partial.parent) + " (the partial checkpoint was removed)", kind
    return f"{what}: writing {capture.partial} failed: {type(exc).__name__}: {exc}", "checkpoint"


class BackgroundWrite:
    """``write(capture)`` in a daemon thread: a process that dies mid-write leaves a partial."""

    def __init__(self, capture: Capture, *, started: float, blocking: float) -> None:
        self.capture, self.started, self.blocking = capture, started, blocking
        self.roles: dict[str, dict] = {}
        self.error: str | None = None
        self.error_type = "checkpoint"
        self.thread = threading.Thread(target=self._run, name=f"solar-checkpoint-{capture.step}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.roles = write(self.capture)
        except BaseException as exc:  # noqa: BLE001 - reported on the training thread by finish()
            self.error, self.error_type = failure(self.capture, exc)

    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self) -> None:
        self.thread.join()
