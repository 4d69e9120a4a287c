"""Saving a checkpoint in two halves: capture on the training thread, write on any thread.

*capture* (every rank, collective under FSDP2) copies every tensor the checkpoint holds off the
training state and turns the JSON members (``trainer.json``, each rank's RNG and data-stream state)
into bytes, so training may go on changing its state afterwards. With ``runtime.async_checkpoint``
the tensors land in host buffers that are allocated once and reused by every later save (pinned when
they come from the GPU, so the copy runs at bus speed), and *write* runs in a background thread.
*write* puts rank 0's role members and each rank's own files into the partial directory (under
FSDP2, every rank's own shards of every role: ``checkpoint_shards``); the
transaction's commit (``solar.storage.checkpoints.commit``) happens on the training thread, only
after every rank's write finished. A crash or a failed write leaves a partial directory, never a
checkpoint.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solar.storage.checkpoints import SHARDS_LAYOUT
from solar.train import checkpoint_io as io


class Staging:
    """Host buffers for checkpoint tensors, keyed by name and reused from save to save."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.cuda = False

    def copy(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``tensor`` (a plain one: sharded saves pass each DTensor's local shard)."""
        t = tensor.detach()
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


class Fresh:
    """``Staging``'s interface with new host copies each time (a sharded save written at once)."""

    cuda = False

    def copy(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", copy=True).contiguous()

    def ready(self) -> None:
        pass


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
    roles: list[RoleCapture]          # whole files: rank 0 only, empty on the other ranks; sharded: every rank
    trainer_state: dict               # the manifest's trainer_state
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> bytes (this rank's)
    inject: OSError | None = None     # a drill's storage fault (train/faults.py), raised after the first member
    shards: dict | None = None        # sharded (FSDP2): this rank's host copies for checkpoint_shards.save
    group: object = None              # the gloo group the sharded save's collectives run on

    def size(self) -> int:
        """The bytes this rank will write (every tensor and file; the headers are not counted)."""
        from solar.train.checkpoint_shards import local_bytes

        def walk(value) -> int:
            if isinstance(value, torch.Tensor):
                return local_bytes(value)
            if isinstance(value, dict):
                return sum(walk(v) for v in value.values())
            if isinstance(value, (list, tuple)):
                return sum(walk(v) for v in value)
            return 0
        if self.shards is not None:
            return walk(self.shards) + sum(len(data) for data in self.files.values())
        return sum(walk(rc.snap) for rc in self.roles) + sum(len(data) for data in self.files.values())


def sharded(step: int, partial: Path, roles: list[RoleCapture], trainer_state: dict, files: dict[str, bytes],
            staging, dist) -> Capture:
    """A sharded save's capture (every rank; ``roles`` from ``checkpoint_io.snapshot(sharded=True)``):
    this rank's shards copied to the host (into ``staging``'s reused buffers for a background write),
    and on rank 0 the JSON members (``shards.json``, each role's ``optimizer.json``) beside ``files``."""
    from solar.train import checkpoint_shards as shards

    state = {}
    for rc in roles:
        state.update(shards.role_state(rc.role, rc.snap))
    staged = shards.stage(state, staging if staging is not None else Fresh())
    if dist.rank == 0:
        files = {**files, SHARDS_LAYOUT: shards.layout_document(state, dist.world),
                 **{f"{rc.role}/optimizer.json": io.optimizer_document(rc.snap, rc.names) for rc in roles}}
    light = [RoleCapture(rc.role, {}, rc.names, rc.weights) for rc in roles]
    return Capture(step, partial, light, trainer_state, files, shards=staged, group=dist.checkpoint_group())


def write(capture: Capture) -> dict[str, dict]:
    """Write this rank's members into the partial directory; the manifest's ``roles`` (rank 0's;
    a sharded save's shard files join each role's members at the commit)."""
    if capture.shards is not None:
        return _write_sharded(capture)
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


def _write_sharded(capture: Capture) -> dict[str, dict]:
    from solar.train import checkpoint_shards as shards

    shards.save(capture.shards, capture.partial, capture.group, fail=capture.inject)
    roles = {}
    for rel, data in capture.files.items():   # rank 0: shards.json, each role's optimizer.json, trainer.json
        io.write_bytes(capture.partial / rel, data)
    for rc in capture.roles:
        roles[rc.role] = {"weights": rc.weights, "layout": "sharded", "members": [f"{rc.role}/optimizer.json"]}
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
