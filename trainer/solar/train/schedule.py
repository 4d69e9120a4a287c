"""Learning-rate schedules as pure functions of the optimizer step (1-based), so resuming needs
nothing but the step: linear warmup to ``lr`` then constant, cosine or linear decay to
``min_lr_ratio * lr`` at ``max_steps``."""

from __future__ import annotations

import math

from solar.config.schema import OptimizerBlock


def lr_at(step: int, opt: OptimizerBlock, max_steps: int) -> float:
    if opt.warmup_steps and step <= opt.warmup_steps:
        return opt.lr * step / opt.warmup_steps
    if opt.schedule == "constant":
        return opt.lr
    span = max(1, max_steps - opt.warmup_steps)
    progress = min(1.0, max(0.0, (step - opt.warmup_steps) / span))
    floor = opt.min_lr_ratio
    if opt.schedule == "cosine":
        factor = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    else:
        factor = 1 - (1 - floor) * progress
    return opt.lr * factor
