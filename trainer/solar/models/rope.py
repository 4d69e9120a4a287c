"""Wan's 3-D rotary embedding: head dims split into (t, h, w) parts, pairs rotated in place.

Frame positions are explicit so the teacher-forcing layout can give the clean and the noisy copy
of frame f the same temporal position, and chunk-by-chunk generation can start at any frame.
"""

from __future__ import annotations

import torch


def axis_split(rope_dims: int) -> tuple[int, int, int]:
    h = w = 2 * (rope_dims // 6)
    return rope_dims - h - w, h, w


def _freqs(dim: int, positions: torch.Tensor, theta: float) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    return positions.to(torch.float64)[:, None] * inv[None, :]  # [P, dim/2]


def rope_tables(frame_positions: torch.Tensor, height: int, width: int, rope_dims: int,
                theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [F*height*width, rope_dims/2] for tokens in (frame, row, col) order."""
    t_dim, h_dim, w_dim = axis_split(rope_dims)
    device = frame_positions.device
    ft = _freqs(t_dim, frame_positions, theta)
    fh = _freqs(h_dim, torch.arange(height, device=device), theta)
    fw = _freqs(w_dim, torch.arange(width, device=device), theta)
    frames = frame_positions.numel()
    angles = torch.cat([
        ft[:, None, None, :].expand(frames, height, width, -1),
        fh[None, :, None, :].expand(frames, height, width, -1),
        fw[None, None, :, :].expand(frames, height, width, -1),
    ], dim=-1).reshape(frames * height * width, -1)
    return angles.cos(), angles.sin()


def apply_rope(x_BSHD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of the first ``2 * cos.shape[-1]`` head dims (Wan convention)."""
    dims = 2 * cos.shape[-1]
    head, rest = x_BSHD[..., :dims], x_BSHD[..., dims:]
    pairs = head.float().unflatten(-1, (-1, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    c = cos.to(torch.float32)[None, :, None, :]
    s = sin.to(torch.float32)[None, :, None, :]
    rotated = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).to(x_BSHD.dtype)
    return rotated if rest.shape[-1] == 0 else torch.cat([rotated, rest], dim=-1)
