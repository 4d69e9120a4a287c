"""fp32 EMA of the trainable weights: ``shadow = d * shadow + (1 - d) * live``.

Nothing exists before update ``start_step`` (counted in optimizer updates; Stage2 counts student
updates); the first update copies the live weights, and the decay is 0 for ``warmup_steps``
updates after that. ``swapped(model)`` puts the shadow into the model and restores the live
weights afterwards (EMA validation).
"""

from __future__ import annotations

import contextlib

import torch


class EMA:
    def __init__(self, params: dict[str, torch.nn.Parameter], *, decay: float, start_step: int,
                 warmup_steps: int, enabled: bool = True) -> None:
        self.params, self.decay, self.start, self.warmup, self.enabled = params, decay, start_step, warmup_steps, enabled
        self.shadow: dict[str, torch.Tensor] | None = None
        self.first_update: int | None = None

    @property
    def exists(self) -> bool:
        return self.shadow is not None

    @torch.no_grad()
    def update(self, count: int) -> None:
        if not self.enabled or count < self.start:
            return
        if self.shadow is None:
            self.shadow = {n: p.detach().float().clone() for n, p in self.params.items()}
            self.first_update = count
            return
        decay = 0.0 if count <= self.first_update + self.warmup else self.decay
        # one multi-tensor kernel per operation instead of two per parameter (issue 18): the same
        # elementwise arithmetic, shadow * decay + (1 - decay) * p
        shadows = [self.shadow[name] for name in self.params]
        torch._foreach_mul_(shadows, decay)
        torch._foreach_add_(shadows, [p.detach().float() for p in self.params.values()], alpha=1 - decay)

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        return (self.shadow or {}), {"first_update": self.first_update, "exists": self.exists}

    def load(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        if meta.get("exists"):
            missing = set(self.params) - set(tensors)
            if missing:
                raise ValueError(f"EMA state lacks {len(missing)} parameters, e.g. {sorted(missing)[:2]}")
            self.shadow = {n: tensors[n].float().clone() for n in self.params}
            self.first_update = meta.get("first_update")

    @contextlib.contextmanager
    def swapped(self):
        if self.shadow is None:
            raise RuntimeError("no EMA weights exist yet")
        backup = {n: p.detach().clone() for n, p in self.params.items()}
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(self.shadow[n].to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(backup[n])
