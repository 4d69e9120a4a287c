"""DMD via self-gradient forcing (Stage2): cadence, levels and the two losses (semantics.md §4).

Cadence, with outer steps numbered from 1: outer step s updates the critic; it first updates the
student when ``s - 1 > 0 and (s - 1) % n == 0`` (n = critic_updates_per_student, 5), so student
update k happens at outer step ``n k + 1``. The student EMA exists from student update
``ema_start`` (39, outer step 196) and has ``1 + (k - ema_start)`` updates after student update k.

Student loss: the student's rollout x is noised at a score level; fake = critic's x0, real =
teacher's guided x0 (cond + g (cond - uncond)); grad = (fake - real) / mean|x - real| (per sample,
masked; NaN -> 0); loss = 0.5 mean((x - stopgrad(x - grad))^2), whose gradient with respect to x
is grad / N. Critic loss: flow matching on the student's (detached) rollout.
"""

from __future__ import annotations

import torch

from solar.objectives.fm import NUM_TRAIN_TIMESTEPS, shift_sigma


def student_updates(outer_step: int, ratio: int) -> bool:
    """Whether outer step ``outer_step`` (1-based) begins with a student update."""
    if ratio < 1:
        raise ValueError("train.sgf.critic_updates_per_student must be >= 1")
    before = outer_step - 1
    return before > 0 and before % ratio == 0


def student_step_after(outer_step: int, ratio: int) -> int:
    """Student updates done once outer step ``outer_step`` has finished."""
    return 0 if outer_step < 1 else (outer_step - 1) // ratio


def ema_updates_after(student_step: int, ema_start: int) -> int:
    """EMA updates of the student after student update ``student_step`` (0 before ``ema_start``)."""
    return 0 if student_step < ema_start else 1 + student_step - ema_start


def denoising_levels(steps: list[int], shift: float) -> list[float]:
    """Raw labels (1000, 750, 500, 250) onto the shifted table: 1000 shift(d / 1000), descending."""
    out = []
    for d in steps:
        if not 0 < d <= NUM_TRAIN_TIMESTEPS:
            raise ValueError(f"denoising step {d} is outside (0, {NUM_TRAIN_TIMESTEPS}]")
        out.append(float(shift_sigma(torch.tensor(d / NUM_TRAIN_TIMESTEPS, dtype=torch.float64), shift))
                   * NUM_TRAIN_TIMESTEPS)
    if any(b >= a for a, b in zip(out, out[1:])):
        raise ValueError(f"denoising steps {steps} must be strictly descending")
    return out


def score_levels(batch: int, shift: float, generator: torch.Generator, *, low: float, high: float) -> torch.Tensor:
    """Per sample: a uniform integer label in [0, 1000), shifted, scaled, clamped to [low, high]."""
    raw = torch.randint(0, NUM_TRAIN_TIMESTEPS, (batch,), generator=generator).double() / NUM_TRAIN_TIMESTEPS
    return (shift_sigma(raw, shift) * NUM_TRAIN_TIMESTEPS).clamp(low, high).float()


def guided(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """The real score's guidance as specified: cond + g (cond - uncond)."""
    return cond + scale * (cond - uncond)


def _mask(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if mask is None else torch.broadcast_to(mask.to(like.device, torch.bool), like.shape)


def kl_gradient(fake_x0: torch.Tensor, real_x0: torch.Tensor, output: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """(fake - real) / mean |output - real| per sample over the masked elements; NaN/inf -> 0."""
    fake, real, out = fake_x0.float(), real_x0.float(), output.detach().float()
    grad = fake - real
    valid = _mask(mask, grad)
    dims = tuple(range(1, grad.dim()))
    distance = (out - real).abs()
    if valid is None:
        normaliser = distance.mean(dim=dims, keepdim=True)
    else:
        grad = torch.where(valid, grad, torch.zeros_like(grad))
        distance = torch.where(valid, distance, torch.zeros_like(distance))
        normaliser = distance.sum(dim=dims, keepdim=True) / valid.float().sum(dim=dims, keepdim=True).clamp_min(1)
    return torch.nan_to_num(grad / normaliser.clamp_min(1e-8), nan=0.0, posinf=0.0, neginf=0.0)


def student_loss(output: torch.Tensor, gradient: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """0.5 mean((x - stopgrad(x - grad))^2) over the masked elements: d loss / d x = grad / N."""
    out = output.float()
    diff = out - (out - gradient.detach().float()).detach()
    valid = _mask(mask, diff)
    if valid is None:
        return 0.5 * diff.square().mean()
    diff = torch.where(valid, diff, torch.zeros_like(diff))
    return 0.5 * diff.square().sum() / valid.float().sum().clamp_min(1)


def critic_loss(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Flow-matching MSE of the critic on the rollout (target: the family's velocity target)."""
    diff = prediction.float() - target.float()
    valid = _mask(mask, diff)
    if valid is None:
        return diff.square().mean()
    diff = torch.where(valid, diff, torch.zeros_like(diff))
    return diff.square().sum() / valid.float().sum().clamp_min(1)


__all__ = ["critic_loss", "denoising_levels", "ema_updates_after", "guided", "kl_gradient", "score_levels",
           "student_loss", "student_step_after", "student_updates"]
