"""The gradient step shared by every route: average over logical DP ranks (or take FSDP2's average),
add SP peers' partial gradients, clip, and return the global norm."""

from __future__ import annotations

import torch

from solar.launch.distributed import Dist


def sync_and_clip(d: Dist, params: dict, clip: float | None, sharded: bool) -> float:
    """Average gradients over logical DP ranks (SP peers' partial gradients add) and clip; the norm."""
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params.values()]
    if sharded:
        # FSDP2 already averaged over every rank; SP peers' partial gradients must add.
        for q, g in zip(params.values(), grads):
            q.grad = g * d.sp if d.sp > 1 else g
    elif d.world > 1:
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        d.all_reduce(flat, "grad-sync")
        flat /= d.dp_world  # SP peers' partial gradients add up; logical DP ranks average
        offset = 0
        for q, g in zip(params.values(), grads):
            n = g.numel()
            q.grad = flat[offset:offset + n].view_as(q).to(q.dtype)
            offset += n
    else:
        for q, g in zip(params.values(), grads):
            q.grad = g
    norm = torch.nn.utils.clip_grad_norm_(list(params.values()), clip if clip else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)
