"""The distributed context: ranks, logical DP and SP groups, and collectives that fail together.

Runs under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set; gloo on CPU, NCCL on CUDA) or
as a single process. SP groups are contiguous ranks (``dp_rank = rank // sp``); DP groups take
one rank of each SP group. Every collective goes through ``Dist`` so the heartbeat knows the last
one entered (name, sequence number) for hang diagnosis.

``exchange_error(message)`` is the collective error exchange: every rank contributes its local
failure (or None) before the next collective; if any rank failed, all raise ``CollectiveFailure``
with the same ordered message, instead of some ranks hanging in a collective the failed rank never
enters.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from solar.errors import SolarError


class CollectiveFailure(SolarError):
    """A failure on one or more ranks, known identically on every rank."""

    def __init__(self, message: str, error_type: str = "error", ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.ranks = ranks or []  # the failing ranks, in rank order


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    local_world: int
    sp: int
    device: torch.device
    backend: str | None
    sp_group: object = None
    dp_group: object = None
    seq: int = 0
    on_collective: Callable[[str, int], None] = field(default=lambda name, seq: None)
    _checkpoint_group: object = None

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp

    @property
    def dp_world(self) -> int:
        return self.world // self.sp

    @property
    def initialized(self) -> bool:
        return self.backend is not None

    def _enter(self, name: str) -> None:
        self.seq += 1
        self.on_collective(name, self.seq)

    def barrier(self, name: str = "barrier") -> None:
        if self.initialized:
            self._enter(name)
            dist.barrier()

    def checkpoint_group(self):
        """A gloo group of every rank for sharded checkpoint saves (made at the first, which every rank
        enters together): its collectives may run on a background thread beside training's."""
        if self.initialized and self._checkpoint_group is None:
            self._enter("checkpoint-group")
            self._checkpoint_group = dist.new_group(backend="gloo")
        return self._checkpoint_group

    def all_reduce(self, tensor: torch.Tensor, name: str, op=None, group=None) -> torch.Tensor:
        if self.initialized:
            self._enter(name)
            dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group)
        return tensor

    def all_gather_object(self, obj, name: str, group=None) -> list:
        if not self.initialized:
            return [obj]
        self._enter(name)
        size = dist.get_world_size(group)
        out = [None] * size
        dist.all_gather_object(out, obj, group=group)
        return out

    def exchange_error(self, message: str | None, error_type: str = "error") -> None:
        """All ranks learn every rank's failure; raise the same CollectiveFailure everywhere."""
        entries = self.all_gather_object((message, error_type), "error-exchange")
        failed = [(r, m, t) for r, (m, t) in enumerate(entries) if m is not None]
        if failed:
            kind = failed[0][2]
            raise CollectiveFailure("; ".join(f"rank {r}: {m}" for r, m, _ in failed), kind, [r for r, _, _ in failed])

    def any_flag(self, flag: bool, name: str) -> bool:
        if not self.initialized:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device if self.backend == "nccl" else "cpu")
        self.all_reduce(t, name, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def close(self) -> None:
        if self.initialized and dist.is_initialized():
            dist.destroy_process_group()


def from_environment(*, expected_world: int, sp: int, backend: str = "auto", device: str = "auto",
                     timeout_seconds: int = 1800) -> Dist:
    """Join the process group torchrun describes (or run alone) and check the topology."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world != expected_world:
        raise SolarError(
            f"distributed.world_size={expected_world} but this launch has WORLD_SIZE={world}; launch "
            f"{expected_world} processes (torchrun --nproc-per-node=...) or set distributed.world_size={world}")
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise SolarError("runtime.device=cuda but no CUDA device is visible")
    use_cuda = cuda and device in ("auto", "cuda")
    dev = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    chosen = None
    if world > 1:
        chosen = ("nccl" if use_cuda else "gloo") if backend == "auto" else backend
        dist.init_process_group(chosen, timeout=datetime.timedelta(seconds=timeout_seconds),
                                **({"device_id": dev} if chosen == "nccl" else {}))
    ctx = Dist(rank, world, local_rank, local_world, sp, dev, chosen)
    if chosen is not None:
        # Every rank creates every group in the same order (a collective requirement).
        for start in range(0, world, sp):
            group = dist.new_group(list(range(start, start + sp)))
            if start <= rank < start + sp:
                ctx.sp_group = group
        for offset in range(sp):
            group = dist.new_group(list(range(offset, world, sp)))
            if rank % sp == offset:
                ctx.dp_group = group
    return ctx
