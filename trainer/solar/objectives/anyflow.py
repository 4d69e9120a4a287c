"""AnyFlow v1_5: the flow-map objective of Stage1 (semantics.md §4).

The model F(z, t, r) predicts the *average* velocity of the flow map from level t to level r
(sigma convention, raw units: t, r in [0, 1000], F = (z_t - z_r) / (sigma_t - sigma_r)). The loss
uses the identity ``F(z_t, t, r) + (t - r) dF/dt = v(z_t, t)`` along the trajectory:

    target     = g (eps - x0) + (1 - g) F(z, t, t | negative prompt)     (no grad; g = 1: eps - x0)
    v          = F(z, t, t)                                               (no grad)
    t+, t-     = min(t + e, 1000), max(t - e, r)                           (e = 5 raw units)
    d          = (F(z + v dt+, t+, r) - F(z - v dt-, t-, r)) / (t+ - t-)   (no grad)
    prediction = F(z, t, r) + (t - r) d                                    (grad through F only)
    loss_i     = masked mean of ((prediction - target) / g)^2

then non-diffusion losses are rescaled by mean(diffusion losses over the logical-global batch) /
(loss + 1e-5) and every loss is multiplied by the Gaussian weight at t. Which samples are
diffusion (r = t), consistency (r = 0) or flow-map (0 < r < t) is fixed by their index in the
logical-global batch: the first 50 %, the next 25 %, the rest.

Everything here is convention-free: H3 wraps its reversed-time model into this sigma coordinate
(``reversed_time_velocity``). Randomness comes only from the generator passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from solar.objectives.fm import NUM_TRAIN_TIMESTEPS, gaussian_weights, shift_sigma, sigma_table

DIFFUSION, CONSISTENCY, FLOW_MAP = 0, 1, 2
KIND_NAMES = ("diffusion", "consistency", "flow_map")

# velocity(z, t_raw [B, F], r_raw [B, F], negative: bool) -> average velocity [B, C, F, H, W]
Velocity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass(frozen=True)
class TimePairs:
    t: torch.Tensor       # [B] normalised start level in (0, 1]
    r: torch.Tensor       # [B] normalised end level in [0, t]
    kind: torch.Tensor    # [B] int8: DIFFUSION, CONSISTENCY or FLOW_MAP

    @property
    def is_diffusion(self) -> torch.Tensor:
        return self.kind == DIFFUSION


def sample_time_pairs(batch: int, *, global_offset: int, global_size: int, diffusion_ratio: float,
                      consistency_ratio: float, generator: torch.Generator) -> TimePairs:
    """All u1, then all u2 (two uniforms per sample); t = u1, r = u2 t; kinds by global index.

    ``global_offset`` is this micro-batch's first index in the logical-global batch of
    ``global_size`` samples (every logical DP rank and micro-batch of the step); SP peers pass the
    same values and generator state, so they draw the same pairs."""
    if not 0 <= global_offset <= global_size - batch:
        raise ValueError(f"global_offset {global_offset} + batch {batch} exceeds global_size {global_size}")
    if diffusion_ratio + consistency_ratio > 1.0:
        raise ValueError("diffusion_ratio + consistency_ratio must not exceed 1")
    u1 = torch.rand(batch, generator=generator, dtype=torch.float32)
    u2 = torch.rand(batch, generator=generator, dtype=torch.float32)
    t, r = u1, u2 * u1
    index = torch.arange(batch) + global_offset
    n_diffusion = round(diffusion_ratio * global_size)
    n_consistency = round(consistency_ratio * global_size)
    kind = torch.full((batch,), FLOW_MAP, dtype=torch.int8)
    kind[index < n_diffusion + n_consistency] = CONSISTENCY
    kind[index < n_diffusion] = DIFFUSION
    r = torch.where(kind == DIFFUSION, t, r)
    r = torch.where(kind == CONSISTENCY, torch.zeros_like(r), r)
    # torch.rand can return 0 and two draws can coincide: keep flow-map pairs strict (0 < r < t)
    # without drawing again.
    zero, one = torch.zeros(()), torch.ones(())
    strict_r = torch.where(r > 0, r, torch.nextafter(zero, one))
    strict_t = torch.where(t > strict_r, t, torch.nextafter(strict_r, one))
    flow = kind == FLOW_MAP
    return TimePairs(torch.where(flow, strict_t, t), torch.where(flow, strict_r, r), kind)


def raw_levels(pairs: TimePairs, shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifted and scaled to raw units: (1000 shift(t), 1000 shift(r)), each [B]."""
    return (shift_sigma(pairs.t, shift) * NUM_TRAIN_TIMESTEPS, shift_sigma(pairs.r, shift) * NUM_TRAIN_TIMESTEPS)


def difference_window(t_raw: torch.Tensor, r_raw: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """t+ = min(t + e, 1000), t- = max(t - e, r): the central difference never crosses r or 1000."""
    if epsilon <= 0:
        raise ValueError(f"central_difference_epsilon must be > 0, got {epsilon}")
    return (t_raw + epsilon).clamp_max(float(NUM_TRAIN_TIMESTEPS)), torch.maximum(t_raw - epsilon, r_raw)


def gaussian_weight_at(t_raw: torch.Tensor, shift: float) -> torch.Tensor:
    """The Gaussian weight of the nearest point of the shifted 1000-point training grid."""
    grid = sigma_table(shift) * NUM_TRAIN_TIMESTEPS
    weights = gaussian_weights(grid)
    flat = t_raw.double().reshape(-1)
    nearest = torch.argmin((grid[:, None] - flat[None, :]).abs(), dim=0)
    return weights[nearest].reshape(t_raw.shape).float()


def adaptive_rescale(losses: torch.Tensor, is_diffusion: torch.Tensor, global_losses: torch.Tensor,
                     global_is_diffusion: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Scale each non-diffusion loss to the logical-global mean diffusion loss (detached factor).

    ``global_*`` are the losses and kinds of the whole logical-global batch (this micro-batch's
    included). Without a finite diffusion loss anywhere, or without non-diffusion samples here,
    the losses are returned unchanged."""
    with torch.no_grad():
        reference = global_losses.detach()[global_is_diffusion.bool()]
        reference = reference[torch.isfinite(reference)]
        if reference.numel() == 0 or bool(is_diffusion.all()):
            return losses
        scale = reference.mean().to(losses) / (losses.detach() + eps)
        scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return torch.where(is_diffusion.to(losses.device), losses, losses * scale)


def _frames(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B, F] levels -> broadcastable over [B, C, F, H, W]."""
    return x.to(like.device, torch.float32)[:, None, :, None, None]


@dataclass
class AnyFlowTerms:
    losses: torch.Tensor          # [B] per-sample squared residuals (before rescale and weight)
    prediction: torch.Tensor
    target: torch.Tensor


def flow_map_terms(velocity: Velocity, x0: torch.Tensor, eps: torch.Tensor, t_raw: torch.Tensor,
                   r_raw: torch.Tensor, frame_mask: torch.Tensor, *, guidance: float, epsilon: float,
                   keep: torch.Tensor | None = None) -> AnyFlowTerms:
    """The AnyFlow residual of each sample. ``t_raw``/``r_raw`` [B, F] per latent frame; frames
    where ``keep`` [B, F] is true hold the clean latent (the image condition) in every model input.
    Four forwards run without grad (negative, diagonal, plus, minus); the prediction runs last."""
    if guidance <= 0:
        raise ValueError(f"guidance must be > 0, got {guidance}")
    sigma = _frames(t_raw, x0) / NUM_TRAIN_TIMESTEPS
    z = (1 - sigma) * x0.float() + sigma * eps.float()

    def pin(sample: torch.Tensor) -> torch.Tensor:
        if keep is None:
            return sample
        return torch.where(keep.to(sample.device)[:, None, :, None, None], x0.float(), sample)

    z = pin(z)
    velocity_target = eps.float() - x0.float()
    with torch.no_grad():
        if guidance != 1.0:
            unconditional = velocity(z, t_raw, t_raw, True).float()
            target = guidance * velocity_target + (1.0 - guidance) * unconditional
        else:
            target = velocity_target
        v = velocity(z, t_raw, t_raw, False).float()
        t_plus, t_minus = difference_window(t_raw, r_raw, epsilon)
        z_plus = pin(z + v * (_frames(t_plus - t_raw, z) / NUM_TRAIN_TIMESTEPS))
        z_minus = pin(z - v * (_frames(t_raw - t_minus, z) / NUM_TRAIN_TIMESTEPS))
        u_plus = velocity(z_plus, t_plus, r_raw, False).float()
        u_minus = velocity(z_minus, t_minus, r_raw, False).float()
        width = _frames((t_plus - t_minus).clamp_min(1e-6), z)
        derivative = (u_plus - u_minus) / width
    u = velocity(z, t_raw, r_raw, False).float()
    prediction = u + _frames(t_raw - r_raw, z) * derivative
    residual = (prediction - target) / guidance
    err = residual.square().mean(dim=(1, 3, 4))                        # [B, F]
    mask = frame_mask.to(err.device, torch.float32)
    losses = (err * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    return AnyFlowTerms(losses, prediction, target)


def reversed_time_velocity(model_output: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
                           ) -> Velocity:
    """An H3-style model (fed data-ward time 1 - sigma, predicting x0 - eps) as a sigma-convention
    average velocity: F_sigma(z, t, r) = -model(z, 1 - t / 1000, 1 - r / 1000)."""

    def velocity(z, t_raw, r_raw, negative):
        return -model_output(z, 1.0 - t_raw / NUM_TRAIN_TIMESTEPS, 1.0 - r_raw / NUM_TRAIN_TIMESTEPS, negative)

    return velocity


__all__ = ["AnyFlowTerms", "TimePairs", "adaptive_rescale", "difference_window", "flow_map_terms",
           "gaussian_weight_at", "raw_levels", "reversed_time_velocity", "sample_time_pairs",
           "DIFFUSION", "CONSISTENCY", "FLOW_MAP", "KIND_NAMES"]
