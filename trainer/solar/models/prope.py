"""Camera conditioning by PRoPE (projective positional encoding) inside self-attention.

For the camera of token i, ``P_i = lift(K) @ V_i`` with ``V_i`` the rebased viewmat (translation
transformed by ``linear`` or ``logd4``) and ``K`` the fixed Wan intrinsics with the principal point
zeroed. On the PRoPE channels of each head, per 4-channel block::

    q_i <- P_i^T q_i,   k_j <- P_j^-1 k_j,   v_j <- P_j^-1 v_j,   out_i <- P_i out_i

so scores see only P_i P_j^-1: one rigid transform applied to every camera changes nothing, and
equal cameras everywhere give plain attention. Matrices are per frame (all tokens of a latent frame
share its camera) and are computed in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solar.data.cameras import transform_translation

WAN_FIXED_FX = 969.697 / 1920.0
WAN_FIXED_FY = 969.697 / 1080.0


def _intrinsics(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # fill_ on each element: assigning a Python number to one element of a GPU tensor is a blocking
    # host-to-device copy (a stream sync per element, every forward; issue 18). Same values.
    K = torch.zeros(4, 4, dtype=like.dtype, device=like.device)
    K_inv = torch.zeros_like(K)
    for i, (k, k_inv) in enumerate(((WAN_FIXED_FX, 1 / WAN_FIXED_FX), (WAN_FIXED_FY, 1 / WAN_FIXED_FY), (1.0, 1.0),
                                    (1.0, 1.0))):
        K[i, i].fill_(k)
        K_inv[i, i].fill_(k_inv)
    return K, K_inv


def _invert_rigid(view: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(view)
    rot_t = view[..., :3, :3].transpose(-1, -2)
    out[..., :3, :3] = rot_t
    out[..., :3, 3] = -(rot_t @ view[..., :3, 3:4]).squeeze(-1)
    out[..., 3, 3].fill_(1.0)  # not ``= 1.0``: see _intrinsics
    return out


@dataclass(frozen=True)
class CameraMatrices:
    """Per-frame PRoPE matrices: [B, F, 4, 4] each."""

    query: torch.Tensor   # P^T
    key: torch.Tensor     # P^-1 (keys and values)
    output: torch.Tensor  # P

    def select(self, frames: slice) -> CameraMatrices:
        return CameraMatrices(self.query[:, frames], self.key[:, frames], self.output[:, frames])

    def repeat_frames(self, times: int) -> CameraMatrices:
        return CameraMatrices(*(m.repeat(1, times, 1, 1) for m in (self.query, self.key, self.output)))


def camera_matrices(viewmats_BF44: torch.Tensor, transform: str) -> CameraMatrices:
    view = viewmats_BF44.to(torch.float32).clone()
    view[..., :3, 3] = transform_translation(view[..., :3, 3], transform)
    K, K_inv = _intrinsics(view)
    P = K @ view
    P_inv = _invert_rigid(view) @ K_inv
    return CameraMatrices(P.transpose(-1, -2), P_inv, P)


def block_diagonal(matrix_BF44: torch.Tensor, channels: int) -> torch.Tensor:
    """``diag(M, M, ..., M)`` [B, F, C, C] of each frame's 4x4 matrix, C = ``channels``."""
    B, F = matrix_BF44.shape[:2]
    eye = torch.eye(channels // 4, dtype=matrix_BF44.dtype, device=matrix_BF44.device)
    return torch.einsum("pq,bfij->bfpiqj", eye, matrix_BF44).reshape(B, F, channels, channels)


def apply_blocks(x_BSHD: torch.Tensor, matrix_BF44: torch.Tensor, tokens_per_frame: int,
                 start: int) -> torch.Tensor:
    """Multiply channels [start, D) of every head, in 4-blocks, by the token's frame matrix.

    One matrix product per frame, [tokens x heads, C] by the C x C block-diagonal matrix
    (``block_diagonal``), not a batched product of 4x4 blocks: cuBLAS serves the 4x4 form with a
    small-tile kernel at about a tenth of memory speed (11% of a 5B Stage1 step on the H200,
    bench/RESULTS.md). The added terms are exact zeros, so the products are the same."""
    B, S, H, D = x_BSHD.shape
    frames, C = S // tokens_per_frame, D - start
    head, cam = x_BSHD[..., :start], x_BSHD[..., start:]
    rows = cam.reshape(B, frames, tokens_per_frame * H, C)
    wide = block_diagonal(matrix_BF44.to(cam.dtype), C)
    mixed = torch.matmul(rows, wide.transpose(-1, -2)).reshape(B, S, H, C)
    return mixed if start == 0 else torch.cat([head, mixed], dim=-1)


def apply_blocks_4x4(x_BSHD: torch.Tensor, matrix_BF44: torch.Tensor, tokens_per_frame: int,
                     start: int) -> torch.Tensor:
    """``apply_blocks`` as a batched product of the 4x4 blocks (the reference for its tests and
    benchmarks)."""
    B, S, H, D = x_BSHD.shape
    frames = S // tokens_per_frame
    head, cam = x_BSHD[..., :start], x_BSHD[..., start:]
    blocks = cam.reshape(B, frames, tokens_per_frame, H, (D - start) // 4, 4)
    mixed = torch.einsum("bfij,bfnhpj->bfnhpi", matrix_BF44.to(cam.dtype), blocks)
    mixed = mixed.reshape(B, S, H, D - start)
    return mixed if start == 0 else torch.cat([head, mixed], dim=-1)


def apply_rows(x_BSHD: torch.Tensor, matrix_BF44: torch.Tensor, frame_of_row: torch.Tensor,
               start: int) -> torch.Tensor:
    """Per-row variant for packed sequences: rows with ``frame_of_row >= 0`` are multiplied by their
    frame's matrix on channels [start, D); other rows (text, audio) pass through unchanged."""
    rows = (frame_of_row >= 0).nonzero().squeeze(-1)
    if rows.numel() == 0:
        return x_BSHD
    B, _, H, D = x_BSHD.shape
    sub = x_BSHD.index_select(1, rows)
    mats = matrix_BF44.index_select(1, frame_of_row.index_select(0, rows)).to(x_BSHD.dtype)  # [B, R, 4, 4]
    cam = sub[..., start:].reshape(B, rows.numel(), H, (D - start) // 4, 4)
    mixed = torch.einsum("brij,brhpj->brhpi", mats, cam).reshape(B, rows.numel(), H, D - start)
    sub = mixed if start == 0 else torch.cat([sub[..., :start], mixed], dim=-1)
    return x_BSHD.index_copy(1, rows, sub)
