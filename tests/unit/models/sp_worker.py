"""Worker of the sequence-parallel test: one rank of a gloo SP group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from solar.models.sequence_parallel import SPGroup
from tests.unit.models.wan_helpers import TI2V, dims, moving_cameras, ours, randomize


def inputs(frames: int):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, 48, frames, 4, 6, generator=gen)
    clean = torch.randn(1, 48, frames, 4, 6, generator=gen)
    ctx = torch.randn(1, 5, 24, generator=gen)
    t = torch.rand(1, frames, generator=gen) * 1000
    weight = torch.randn(1, 48, frames, 4, 6, generator=gen)
    return x, clean, ctx, t, weight, moving_cameras(frames)


def run(rank: int, world: int, mode: str, frames: int):
    torch.manual_seed(0)
    model = randomize(ours(dims(TI2V, heads=4, head_dim=8), camera_transform="linear", chunk_latents=2,
                           max_prior_clean_chunks=1, attention_backend="reference"))
    if world > 1:
        model.set_sequence_parallel(SPGroup(None, rank, world))
    x, clean, ctx, t, weight, cams = inputs(frames)
    if mode == "bidirectional":
        out = model(x, t, ctx, cameras=cams)
    else:
        out = model.forward_teacher_forcing(clean, x, t, ctx, cameras=cams)
    (out * weight).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    if world > 1:  # parameter gradients are summed over the SP group
        for g in grads.values():
            dist.all_reduce(g)
    return out.detach(), grads
