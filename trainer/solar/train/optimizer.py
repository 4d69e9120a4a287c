"""The optimizer every trainable role gets (``train.optimizer``, and Stage2's ``critic_optimizer``)."""

from __future__ import annotations

import torch


def adamw(params: dict[str, torch.nn.Parameter], opt) -> torch.optim.AdamW:
    """AdamW over ``params``: torch's fused kernel (one launch updates every parameter, as torchtitan
    runs it) when they live on a GPU, the default (foreach) implementation elsewhere. The same update
    rule; fused rounds the last bits differently (tests/gpu/test_fused_adamw.py bounds it)."""
    values = list(params.values())
    fused = bool(values) and all(p.device.type == "cuda" for p in values)
    return torch.optim.AdamW(values, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, weight_decay=opt.weight_decay,
                             fused=fused or None)


__all__ = ["adamw"]
