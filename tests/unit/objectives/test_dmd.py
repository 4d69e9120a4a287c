"""DMD via SGF: cadence, EMA counting, levels, and the surrogate's gradient."""

from __future__ import annotations

import pytest
import torch

from solar.objectives import dmd


def test_student_updates_at_5k_plus_1_and_ema_from_update_39():
    updates = [s for s in range(1, 400) if dmd.student_updates(s, 5)]
    assert updates[:4] == [6, 11, 16, 21]
    assert all(s == 5 * k + 1 for k, s in enumerate(updates, start=1))
    student, ema, created = 0, 0, None
    for s in range(1, 400):
        if dmd.student_updates(s, 5):
            student += 1
            if student >= 39:
                created = created or s
                ema += 1
        assert student == dmd.student_step_after(s, 5)
        assert ema == dmd.ema_updates_after(student, 39)
        if student >= 39:
            assert ema == 1 + (student - 39)
    assert created == 196
    assert dmd.student_step_after(196, 5) == 39 and dmd.student_step_after(195, 5) == 38
    with pytest.raises(ValueError):
        dmd.student_updates(3, 0)


def test_denoising_levels_lie_on_the_shifted_table():
    levels = dmd.denoising_levels([1000, 750, 500, 250], 5.0)
    assert levels[0] == 1000.0
    for d, level in zip([750, 500, 250], levels[1:]):
        s = d / 1000
        assert level == pytest.approx(1000 * 5 * s / (1 + 4 * s))
    assert dmd.denoising_levels([1000, 750, 500, 250], 1.0) == [1000.0, 750.0, 500.0, 250.0]
    with pytest.raises(ValueError, match="descending"):
        dmd.denoising_levels([500, 750], 5.0)


def test_score_levels_are_clamped_shifted_labels():
    levels = dmd.score_levels(4096, 5.0, torch.Generator().manual_seed(0), low=20.0, high=980.0)
    assert levels.min() >= 20.0 and levels.max() <= 980.0
    assert (levels == 980.0).any() and (levels > 900).float().mean() > 0.3  # shift 5 favours high noise
    again = dmd.score_levels(4096, 5.0, torch.Generator().manual_seed(0), low=20.0, high=980.0)
    assert torch.equal(levels, again)


def test_surrogate_gradient_is_the_specified_direction():
    g = torch.Generator().manual_seed(0)
    output = torch.randn(2, 3, 4, 2, 2, generator=g, requires_grad=True)
    fake, real = torch.randn(2, 3, 4, 2, 2, generator=g), torch.randn(2, 3, 4, 2, 2, generator=g)
    mask = torch.ones(2, 1, 4, 1, 1, dtype=torch.bool)
    mask[:, :, 0] = False
    grad = dmd.kl_gradient(fake, real, output, mask)
    # independent: per sample, mean |output - real| over the unmasked elements
    full = mask.expand_as(output)
    for i in range(2):
        norm = (output[i] - real[i]).abs()[full[i]].mean()
        expected = torch.where(full[i], (fake[i] - real[i]) / norm, torch.zeros_like(fake[i]))
        assert torch.allclose(grad[i], expected.detach(), atol=1e-6)
    loss = dmd.student_loss(output, grad, mask)
    loss.backward()
    assert torch.allclose(output.grad, grad / full.sum(), atol=1e-7)
    assert float(loss.detach()) == pytest.approx(0.5 * float(grad[full].square().sum()) / int(full.sum()), rel=1e-5)


def test_non_finite_scores_give_zero_gradient_and_unmasked_surrogate_is_a_mean():
    output = torch.zeros(1, 1, 2, 1, 1, requires_grad=True)
    fake = torch.tensor([float("nan"), 1.0]).view(1, 1, 2, 1, 1)
    real = torch.tensor([0.0, -1.0]).view(1, 1, 2, 1, 1)
    grad = dmd.kl_gradient(fake, real, output)
    assert grad.flatten().tolist()[0] == 0.0 and torch.isfinite(grad).all()
    dmd.student_loss(output, grad).backward()
    assert torch.allclose(output.grad, grad / 2)


def test_critic_loss_and_guidance():
    pred, target = torch.ones(1, 1, 2, 1, 1), torch.zeros(1, 1, 2, 1, 1)
    mask = torch.tensor([False, True]).view(1, 1, 2, 1, 1)
    assert dmd.critic_loss(pred, target, mask) == 1.0 and dmd.critic_loss(pred * 2, target) == 4.0
    assert torch.equal(dmd.guided(torch.tensor(2.0), torch.tensor(1.0), 3.0), torch.tensor(5.0))
