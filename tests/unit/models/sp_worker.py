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


def run_h3(rank: int, world: int):
    from tests.unit.models.family_helpers import h3_ours, randomize as rnd

    model = rnd(h3_ours(camera_transform="logd4", chunk_latents=2, max_prior_clean_chunks=1))
    if world > 1:
        model.set_sequence_parallel(SPGroup(None, rank, world))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 24, 4, 4, 6, generator=gen)
    clean = torch.randn(1, 24, 4, 4, 6, generator=gen)
    ctx = torch.randn(1, 3, 40, generator=gen)
    audio = torch.randn(1, 2, 2, 32, generator=gen)
    t = torch.rand(1, 4, generator=gen)
    weight = torch.randn(1, 24, 4, 4, 6, generator=gen)
    out = model.forward_teacher_forcing(clean, x, t, ctx, anchor=clean[:, :, :1], audio=audio, audio_timestep=0.3,
                                        cameras=moving_cameras(4))
    (out * weight).sum().backward()
    grads = {name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
             for name, p in model.named_parameters()}  # the audio head has no gradient here
    if world > 1:
        for g in grads.values():
            dist.all_reduce(g)
    return out.detach(), grads


def run_ltx(rank: int, world: int):
    from tests.unit.models.family_helpers import ltx_dims, ltx_ours, randomize as rnd

    model = rnd(ltx_ours(ltx_dims(), camera_transform="linear"))
    if world > 1:
        model.set_sequence_parallel(SPGroup(None, rank, world))
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 128, 5, 2, 3, generator=gen)
    ctx = torch.randn(1, 4, 24, generator=gen)
    weight = torch.randn(1, 128, 5, 2, 3, generator=gen)
    out = model(x, torch.tensor([[0.0, 500.0, 500.0, 500.0, 500.0]]), ctx, cameras=moving_cameras(5))
    (out * weight).sum().backward()
    grads = {name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
             for name, p in model.named_parameters()}
    if world > 1:
        for g in grads.values():
            dist.all_reduce(g)
    return out.detach(), grads


def run_context(rank: int, world: int, frames: int):
    """Wan teacher forcing: the whole ``[clean | noisy]`` sequence, and the clean half run once
    (``teacher_context``) then the noisy half alone, for two noisy inputs; without grad."""
    torch.manual_seed(0)
    model = randomize(ours(dims(TI2V, heads=4, head_dim=8), camera_transform="linear", chunk_latents=2,
                           max_prior_clean_chunks=1, attention_backend="sdpa", anyflow=True))
    if world > 1:
        model.set_sequence_parallel(SPGroup(None, rank, world))
    x, clean, ctx, t, _, cams = inputs(frames)
    r = t * 0.5
    with torch.no_grad():
        context = model.teacher_context(clean, ctx, cameras=cams, with_r=True)
        pairs = []
        for z in (x, x.flip(2)):
            full = model.forward_teacher_forcing(clean, z, t, ctx, cameras=cams, r_timestep=r)
            half = model.forward_teacher_forcing(clean, z, t, ctx, cameras=cams, r_timestep=r, context=context)
            pairs.append((full, half))
    return pairs


def run_h3_context(rank: int, world: int, backend: str = "sdpa"):
    """H3 teacher forcing: the whole ``[text | anchor | audio | clean | noisy]`` sequence, and the
    rows before the noisy ones run once (``teacher_context``) then the noisy rows alone, for two
    noisy inputs and time pairs; without grad."""
    from tests.unit.models.family_helpers import h3_ours
    from tests.unit.models.family_helpers import randomize as rnd

    model = rnd(h3_ours(camera_transform="logd4", chunk_latents=2, max_prior_clean_chunks=1, anyflow=True,
                        attention_backend=backend))
    if world > 1:
        model.set_sequence_parallel(SPGroup(None, rank, world))
    gen = torch.Generator().manual_seed(5)
    B, frames = 2, 5
    clean = torch.randn(B, 24, frames, 4, 6, generator=gen)
    ctx = torch.randn(B, 3, 40, generator=gen)
    audio = torch.randn(B, 2, 2, 32, generator=gen)
    audio_t = torch.rand(B, generator=gen)
    anchor = clean[:, :, :1] * 0.9
    cams = moving_cameras(frames, batch=B)
    pairs = []
    with torch.no_grad():
        context = model.teacher_context(clean, ctx, anchor=anchor, audio=audio, audio_timestep=audio_t, cameras=cams)
        for _ in range(2):
            z = torch.randn(B, 24, frames, 4, 6, generator=gen)
            t = torch.rand(B, frames, generator=gen)
            r = t + (1 - t) * torch.rand(B, frames, generator=gen)
            kwargs = dict(anchor=anchor, audio=audio, audio_timestep=audio_t, cameras=cams, r_timestep=r)
            full = model.forward_teacher_forcing(clean, z, t, ctx, **kwargs)
            half = model.forward_teacher_forcing(clean, z, t, ctx, **kwargs, context=context)
            pairs.append((full, half))
    return pairs
