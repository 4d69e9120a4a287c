"""Ulysses sequence parallelism as a wrapper around any attention function.

Each rank of an SP group holds a contiguous run of whole latent frames (splits may be uneven:
21 frames over 2 ranks are 11 + 10). Around attention, an all-to-all trades the sequence split for
a head split (every rank then sees the whole sequence for heads/sp heads), the wrapped attention
runs with the global mask, and a second all-to-all trades back. Both all-to-alls are autograd
functions whose backward is the opposite exchange. Works over gloo (CPU) and NCCL. Models that keep
keys/values between calls (the teacher-forcing context) call the two exchanges themselves
(``HeadExchange``) and keep them in the head-sharded layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist


def frame_splits(frames: int, size: int) -> list[int]:
    """Whole frames per SP rank, the first ``frames % size`` ranks one more (e.g. 21/2 -> 11, 10)."""
    if size < 1 or frames < size:
        raise ValueError(f"cannot split {frames} frames over {size} sequence-parallel ranks")
    base, extra = divmod(frames, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


@dataclass(frozen=True)
class SPGroup:
    group: dist.ProcessGroup | None
    rank: int
    size: int

    def frame_range(self, frames: int) -> tuple[int, int]:
        splits = frame_splits(frames, self.size)
        start = sum(splits[: self.rank])
        return start, start + splits[self.rank]


class _SeqToHeads(torch.autograd.Function):
    """[B, H, S_r, D] local sequence -> [B, H/sp, S_total, D] local heads."""

    @staticmethod
    def forward(ctx, x, group, seq_sizes):
        ctx.group, ctx.seq_sizes = group, seq_sizes
        return _seq_to_heads(x, group, seq_sizes)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad.contiguous(), ctx.group, ctx.seq_sizes), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, seq_sizes):
        ctx.group, ctx.seq_sizes = group, seq_sizes
        return _heads_to_seq(x, group, seq_sizes)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad.contiguous(), ctx.group, ctx.seq_sizes), None, None


def _seq_to_heads(x: torch.Tensor, group, seq_sizes: list[int]) -> torch.Tensor:
    sp = len(seq_sizes)
    rank = dist.get_rank(group)
    B, H, S, D = x.shape
    hg = H // sp
    send = x.reshape(B, sp, hg, S, D).transpose(0, 1).contiguous()  # [sp, B, hg, S_r, D]
    recv = torch.empty(sum(B * hg * s * D for s in seq_sizes), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv, send.reshape(-1), output_split_sizes=[B * hg * s * D for s in seq_sizes],
                           input_split_sizes=[B * hg * seq_sizes[rank] * D] * sp, group=group)
    pieces = recv.split([B * hg * s * D for s in seq_sizes])
    return torch.cat([p.reshape(B, hg, s, D) for p, s in zip(pieces, seq_sizes)], dim=2)


def _heads_to_seq(x: torch.Tensor, group, seq_sizes: list[int]) -> torch.Tensor:
    sp = len(seq_sizes)
    rank = dist.get_rank(group)
    B, hg, S, D = x.shape
    send = torch.cat([p.reshape(-1) for p in x.split(seq_sizes, dim=2)])
    mine = seq_sizes[rank]
    recv = torch.empty(sp * B * hg * mine * D, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv, send, output_split_sizes=[B * hg * mine * D] * sp,
                           input_split_sizes=[B * hg * s * D for s in seq_sizes], group=group)
    return recv.reshape(sp, B, hg, mine, D).transpose(0, 1).reshape(B, sp * hg, mine, D)


@dataclass(frozen=True)
class HeadExchange:
    """Ulysses' two exchanges for one call, for attention code that keeps head-sharded keys and
    values between calls (the teacher-forcing context): ``to_heads`` [B, H, S_r, D] -> [B, H/sp, S, D]
    (this rank's heads over the whole sequence, ranks' runs in rank order), ``to_sequence`` back.
    ``sizes``: every rank's sequence length in this call."""

    sp: SPGroup
    sizes: list[int]

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] % self.sp.size:
            raise ValueError(f"{x.shape[1]} heads are not divisible by sequence parallelism {self.sp.size}")
        return _SeqToHeads.apply(x, self.sp.group, self.sizes)

    def to_sequence(self, x: torch.Tensor) -> torch.Tensor:
        return _HeadsToSeq.apply(x, self.sp.group, self.sizes)


def ulysses(attend: Callable, sp: SPGroup, tokens_per_frame: Callable[[], list[int]]) -> Callable:
    """Wrap ``attend(q, k, v, mask)`` for SP; ``tokens_per_frame()`` gives each rank's sequence length
    for the current call (whole frames times tokens per frame)."""

    def wrapped(q, k, v, mask):
        exchange = HeadExchange(sp, tokens_per_frame())
        q, k, v = (exchange.to_heads(t) for t in (q, k, v))
        return exchange.to_sequence(attend(q, k, v, mask))
    return wrapped


def gather_frames(x_BF: torch.Tensor, sp: SPGroup, splits: list[int]) -> torch.Tensor:
    """All-gather a frame-split tensor [B, F_r, ...] into [B, F, ...] with autograd."""
    return _GatherFrames.apply(x_BF, sp.group, splits)


class _GatherFrames(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, splits):
        ctx.group, ctx.splits = group, splits
        rank = dist.get_rank(group)
        tail = x.shape[2:]
        pieces = [torch.empty(x.shape[0], s, *tail, dtype=x.dtype, device=x.device) for s in splits]
        padded_max = max(splits)
        # all_gather needs equal shapes: pad to the longest split, then trim.
        buf = torch.zeros(x.shape[0], padded_max, *tail, dtype=x.dtype, device=x.device)
        buf[:, : splits[rank]] = x
        gathered = [torch.empty_like(buf) for _ in splits]
        dist.all_gather(gathered, buf.contiguous(), group=group)
        for i, s in enumerate(splits):
            pieces[i] = gathered[i][:, :s]
        return torch.cat(pieces, dim=1)

    @staticmethod
    def backward(ctx, grad):
        # SP peers hold identical gathered tensors and compute identical losses, so this rank's own
        # gradient already is the full gradient of its frames; no exchange is needed. (Parameter
        # gradients are summed over the SP group by the trainer.)
        rank = dist.get_rank(ctx.group)
        start = sum(ctx.splits[:rank])
        return grad[:, start:start + ctx.splits[rank]], None, None
