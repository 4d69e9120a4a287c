"""MiniMax-H3's packed row layout: one self-attention document ``[text | anchor | audio | video]``.

Stage0.5 packs the target video once; teacher forcing packs it twice (``clean`` then ``noisy``,
same positions and cameras). Positions are the (t, h, w) RoPE coordinates of H3: text rows at
t = 0..L-1; the keyframe anchor at t = L; audio latent j of each of the two audio channels at
t = L + j with the channel's w at the first/last width coordinate; video latent frame f at
t = L + time(f), where latent spans follow H3's 17n+5 <-> 5n+2 rhythm, (5/3) * (1, 4, 4, 4, 4);
spatial coordinates are centred on a square canvas and scaled to [0, 32).

Every row also carries its modality tag (0 video, 1 text, 2 audio), its time group (rows of one
group share a timestep: text, anchor, audio, clean, and each noisy frame), the latent frame whose
camera it uses, and its teacher-forcing kind/chunk for ``TokenMask``. Rows without a pose of their
own (text, audio) use the first latent's camera, as the keyframe anchor does: PRoPE then only ever
sees cameras relative to each other, so one rigid transform of every camera changes nothing and
identity cameras equal no camera conditioning (rows left unprojected would break both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from solar.models.attention import CLEAN, NOISY, PREFIX

VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2
MODALITIES = 3
FRAME_SPANS = (1.0, 4.0, 4.0, 4.0, 4.0)
FRAME_RESCALE = 5.0 / 3.0
SPATIAL_SCALE = 32.0
AUDIO_CHANNELS = 2
# Time groups (noisy frame f is group NOISY_BASE + f).
G_TEXT, G_ANCHOR, G_AUDIO, G_CLEAN, NOISY_BASE = 0, 1, 2, 3, 4


def temporal_grid(frames: int, origin: float, start: int = 0) -> torch.Tensor:
    """RoPE time of latent frames start..start+frames-1 (H3's non-uniform spacing)."""
    total = start + frames
    spans = torch.tensor([FRAME_RESCALE * FRAME_SPANS[i % 5] for i in range(total)], dtype=torch.float64)
    times = origin + torch.cat([torch.zeros(1, dtype=torch.float64), spans[:-1].cumsum(0)])
    return times[start:total]


def spatial_axis(size: int, patch: int, sqrt_area: float) -> torch.Tensor:
    ratio = size / sqrt_area
    left = (1.0 - ratio) / 2.0
    steps = size // patch
    return (left + torch.arange(steps, dtype=torch.float64) * (ratio / steps)) * SPATIAL_SCALE


def frame_grid(height: int, width: int, patch: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows_per_frame, 2] (h, w) coordinates of one latent frame, and the width axis."""
    sqrt_area = math.sqrt(height * width)
    hs, ws = spatial_axis(height, patch[1], sqrt_area), spatial_axis(width, patch[2], sqrt_area)
    gh, gw = torch.meshgrid(hs, ws, indexing="ij")
    return torch.stack([gh.reshape(-1), gw.reshape(-1)], dim=-1), ws


@dataclass(frozen=True)
class Layout:
    positions: torch.Tensor      # [S, 3] float64
    tags: torch.Tensor           # [S] modality tag
    groups: torch.Tensor         # [S] time group
    camera_frame: torch.Tensor   # [S] latent frame of the row's camera (-1: none, unused by build)
    kinds: torch.Tensor          # [S] PREFIX / CLEAN / NOISY
    chunks: torch.Tensor         # [S] chunk index (0 for prefix rows)
    text: slice
    anchor: slice
    audio: slice
    clean: slice | None
    noisy: slice                 # the target video rows
    rows_per_frame: int

    @property
    def length(self) -> int:
        return self.positions.shape[0]

    def slice_rows(self, rows: slice) -> "RowSlice":
        return RowSlice(self.positions[rows], self.tags[rows], self.groups[rows], self.camera_frame[rows])


@dataclass(frozen=True)
class RowSlice:
    positions: torch.Tensor
    tags: torch.Tensor
    groups: torch.Tensor
    camera_frame: torch.Tensor


def video_positions(frames: int, grid: torch.Tensor, origin: float, start: int = 0) -> torch.Tensor:
    times = temporal_grid(frames, origin, start)
    n = grid.shape[0]
    pos = torch.empty(frames, n, 3, dtype=torch.float64)
    pos[:, :, 0] = times[:, None]
    pos[:, :, 1:] = grid[None]
    return pos.reshape(-1, 3)


def build(*, text_tokens: int, frames: int, height: int, width: int, audio_latents: int,
          patch: tuple[int, int, int], teacher_forcing: bool, chunk: int = 5, anchor: bool = True) -> Layout:
    grid, width_axis = frame_grid(height, width, patch)
    n = grid.shape[0]
    L = text_tokens
    pieces_pos, tags, groups, cams, kinds, chunks = [], [], [], [], [], []

    def add(pos, tag, group, cam, kind, chunk_ids):
        rows = pos.shape[0]
        pieces_pos.append(pos)
        tags.append(torch.full((rows,), tag, dtype=torch.long))
        groups.append(group if isinstance(group, torch.Tensor) else torch.full((rows,), group, dtype=torch.long))
        cams.append(cam if isinstance(cam, torch.Tensor) else torch.full((rows,), cam, dtype=torch.long))
        kinds.append(torch.full((rows,), kind, dtype=torch.long))
        chunks.append(chunk_ids if isinstance(chunk_ids, torch.Tensor) else torch.full((rows,), chunk_ids, dtype=torch.long))
        return rows

    text_pos = torch.zeros(L, 3, dtype=torch.float64)
    text_pos[:, 0] = torch.arange(L, dtype=torch.float64)
    cursor = add(text_pos, TEXT_TAG, G_TEXT, 0, PREFIX, 0)
    text = slice(0, cursor)
    anchor_rows = 0
    if anchor:
        pos = torch.empty(n, 3, dtype=torch.float64)
        pos[:, 0] = float(L)
        pos[:, 1:] = grid
        anchor_rows = add(pos, VIDEO_TAG, G_ANCHOR, 0, PREFIX, 0)
    anchor_slice = slice(cursor, cursor + anchor_rows)
    cursor += anchor_rows
    audio_pos = torch.zeros(AUDIO_CHANNELS * audio_latents, 3, dtype=torch.float64)
    if audio_latents:
        audio_pos[:, 0] = float(L) + torch.arange(audio_latents, dtype=torch.float64).repeat(AUDIO_CHANNELS)
        audio_pos[:audio_latents, 2] = width_axis[0]
        audio_pos[audio_latents:, 2] = width_axis[-1]
    audio_rows = add(audio_pos, AUDIO_TAG, G_AUDIO, 0, PREFIX, 0)
    audio = slice(cursor, cursor + audio_rows)
    cursor += audio_rows
    vpos = video_positions(frames, grid, float(L))
    frame_ids = torch.arange(frames).repeat_interleave(n)
    chunk_ids = frame_ids // chunk
    clean = None
    if teacher_forcing:
        rows = add(vpos, VIDEO_TAG, G_CLEAN, frame_ids, CLEAN, chunk_ids)
        clean = slice(cursor, cursor + rows)
        cursor += rows
    rows = add(vpos, VIDEO_TAG, NOISY_BASE + frame_ids, frame_ids, NOISY, chunk_ids)
    noisy = slice(cursor, cursor + rows)
    return Layout(torch.cat(pieces_pos), torch.cat(tags), torch.cat(groups), torch.cat(cams),
                  torch.cat(kinds), torch.cat(chunks), text, anchor_slice, audio, clean, noisy, n)
