"""Samplers of the bidirectional (Stage0.5) route, behind one small interface.

A solver walks a noise-level grid: ``levels`` are what the model is fed (sigma * 1000 for Wan/LTX,
H3 time t in [0, 1]) and ``step(velocity, i, x)`` moves ``x`` from level i to i + 1. Later stages
add flow-map and self-forcing solvers with the same interface.

- ``unipc``: diffusers' UniPC multistep scheduler on the shifted flow-sigma grid (Wan, LTX).
- ``euler``: first-order steps along the velocity on the shifted grid (H3 in reversed time; also
  available for Wan/LTX).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def shifted(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * sigma / (1 + (shift - 1) * sigma)


@dataclass
class Euler:
    sigmas: torch.Tensor              # steps + 1 values from 1 (noise) to 0 (clean)
    reversed_time: bool = False       # H3: feed t = 1 - sigma, velocity d x / d t

    @property
    def steps(self) -> int:
        return self.sigmas.numel() - 1

    def level(self, i: int) -> float:
        s = float(self.sigmas[i])
        return 1.0 - s if self.reversed_time else s * 1000.0

    def step(self, velocity: torch.Tensor, i: int, x: torch.Tensor) -> torch.Tensor:
        ds = float(self.sigmas[i + 1] - self.sigmas[i])
        # sigma convention: dx/dsigma = eps - x0 (the velocity); H3: dx/dt = x0 - eps with dt = -dsigma
        return x + (-ds if self.reversed_time else ds) * velocity.to(x.dtype)


@dataclass
class UniPC:
    shift: float
    num_steps: int
    scheduler: object = field(init=False)

    def __post_init__(self) -> None:
        from solar.models import diffusers_lib

        diffusers_lib.prepare()
        from diffusers import UniPCMultistepScheduler

        self.scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction",
                                                 use_flow_sigmas=True, flow_shift=self.shift, solver_order=2)
        self.scheduler.set_timesteps(self.num_steps)

    @property
    def steps(self) -> int:
        return self.num_steps

    def level(self, i: int) -> float:
        return float(self.scheduler.sigmas[i]) * 1000.0

    def step(self, velocity: torch.Tensor, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.scheduler.step(velocity.to(x.dtype), self.scheduler.timesteps[i], x, return_dict=False)[0]


def build(name: str, steps: int, *, shift: float, reversed_time: bool) -> Euler | UniPC:
    if name == "unipc":
        if reversed_time:
            raise ValueError("UniPC is implemented for the sigma convention (Wan, LTX); H3 uses euler")
        return UniPC(shift, steps)
    if name == "euler":
        base = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
        return Euler(shifted(base, shift), reversed_time)
    raise ValueError(f"solver {name!r} is not a Stage0.5 solver (unipc, euler)")
