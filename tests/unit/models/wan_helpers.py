"""Tiny Wan models for tests: diffusers' reference and ours with the same random weights."""

from __future__ import annotations

import torch

from solar.config.families import Dims
from solar.models.wan.model import WanConfig, WanDiT

TI2V = dict(in_channels=48, out_channels=48)
A14B = dict(in_channels=36, out_channels=16)


def dims(variant=TI2V, heads=2, head_dim=12, layers=2) -> Dims:
    return Dims(layers, heads * head_dim, heads, head_dim, 32, 24, 32, variant["in_channels"],
                variant["out_channels"], (1, 2, 2), 0)


def reference(d: Dims, seed: int = 0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=d.patch_size, num_attention_heads=d.num_heads, attention_head_dim=d.head_dim,
        in_channels=d.in_channels, out_channels=d.out_channels, text_dim=d.text_dim, freq_dim=d.freq_dim,
        ffn_dim=d.ffn_dim, num_layers=d.num_layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64).eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight random, norms included
            p.normal_(0, 0.2)
    return model


def ours(d: Dims, **options) -> WanDiT:
    options.setdefault("attention_backend", "reference")
    return WanDiT(WanConfig(dims=d, **options)).eval()


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def moving_cameras(frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    cams = torch.eye(4).repeat(batch, frames, 1, 1)
    angles = torch.linspace(0, 0.6, frames)
    cams[:, :, 0, 0], cams[:, :, 0, 2] = torch.cos(angles), torch.sin(angles)
    cams[:, :, 2, 0], cams[:, :, 2, 2] = -torch.sin(angles), torch.cos(angles)
    cams[:, :, :3, 3] = torch.randn(batch, frames, 3, generator=gen).cumsum(1) * 0.5
    return cams
