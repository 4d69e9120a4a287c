"""Camera tracks: rebasing to the first frame, the validity guards, translation transforms.

Stored ``c2w`` tracks keep their published convention and metric scale; nothing here rewrites
them. ``rebase`` gives ``rel[t] = inverse(c2w[t]) @ c2w[0]`` (frame 0 is the identity, no axis
flip). The translation transform is part of the model's configuration and checkpoint contract:
``linear`` is the identity, ``logd4`` maps t -> t * log1p(|t|) / (4 |t|) (0 at 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRANSFORMS = ("linear", "logd4")


def rebase(c2w: torch.Tensor) -> torch.Tensor:
    """[F, 4, 4] absolute camera-to-world -> [F, 4, 4] relative to frame 0 (computed in float64)."""
    track = c2w.to(torch.float64)
    rel = torch.linalg.inv(track) @ track[0]
    return rel.to(c2w.dtype)


@dataclass(frozen=True)
class GuardResult:
    ok: bool
    reason: str | None = None


def check_guards(rel: torch.Tensor, *, fps: float, seconds: float, max_translation: float,
                 max_abs: float) -> GuardResult:
    """Guards over the first ``seconds`` of a rebased track (semantics.md §3)."""
    frames = min(rel.shape[0], max(1, int(round(seconds * fps))))
    window = rel[:frames].to(torch.float64)
    if not bool(torch.isfinite(window).all()):
        return GuardResult(False, "non-finite camera entries")
    translation = torch.linalg.vector_norm(window[:, :3, 3], dim=-1)
    worst_t = float(translation.max())
    if worst_t > max_translation:
        frame = int(translation.argmax())
        return GuardResult(False, f"relative translation {worst_t:.3g} > {max_translation:g} at frame {frame}")
    worst_abs = float(window.abs().max())
    if worst_abs > max_abs:
        return GuardResult(False, f"camera entry {worst_abs:.3g} > {max_abs:g}")
    return GuardResult(True)


def transform_translation(t: torch.Tensor, mode: str) -> torch.Tensor:
    """Apply the configured translation transform to [..., 3] translations."""
    if mode == "linear":
        return t
    if mode == "logd4":
        norm = torch.linalg.vector_norm(t, dim=-1, keepdim=True)
        scale = torch.where(norm > 0, torch.log1p(norm) / (4.0 * norm.clamp_min(1e-30)),
                            torch.zeros_like(norm))
        return t * scale
    raise ValueError(f"unknown camera translation transform {mode!r}; use one of {TRANSFORMS}")


def transform_track(rel: torch.Tensor, mode: str) -> torch.Tensor:
    """A rebased [F, 4, 4] track with its translation column transformed."""
    out = rel.clone()
    out[:, :3, 3] = transform_translation(rel[:, :3, 3], mode)
    return out
