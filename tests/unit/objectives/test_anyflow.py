"""AnyFlow v1_5 against closed forms: on a single-point data distribution the exact average velocity
is known, so the loss of the exact predictor is zero and of a perturbed one is positive."""

from __future__ import annotations

import pytest
import torch

from solar.objectives import anyflow as af
from solar.objectives import fm


def _setting(B=6, C=3, F=4, H=2, W=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x_star = torch.randn(1, C, 1, H, W, generator=g).expand(B, C, F, H, W).contiguous()
    eps = torch.randn(B, C, F, H, W, generator=g)
    # diffusion, consistency and flow-map pairs, one near the top of the range (t+ clamps at 1000)
    t = torch.tensor([400.0, 998.0, 400.0, 120.0, 700.0, 998.0])[:B, None].expand(B, F).clone()
    r = torch.tensor([400.0, 998.0, 0.0, 0.0, 250.0, 15.0])[:B, None].expand(B, F).clone()
    return x_star, eps, t, r


def _exact(x_star, scale=1.0, offset=0.0):
    """Average velocity of the flow map of a delta at x_star: (z - x_star) / sigma_t (any r)."""
    calls = []

    def velocity(z, t_raw, r_raw, negative):
        calls.append((negative, torch.is_grad_enabled()))
        sigma = (t_raw / 1000.0)[:, None, :, None, None]
        return scale * (z - x_star) / sigma + offset

    return velocity, calls


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_exact_flow_map_has_zero_loss_and_a_perturbed_one_does_not(guidance):
    x_star, eps, t, r = _setting()
    mask = torch.ones(t.shape)
    velocity, calls = _exact(x_star)
    terms = af.flow_map_terms(velocity, x_star, eps, t, r, mask, guidance=guidance, epsilon=5.0)
    assert terms.losses.shape == (6,)
    assert terms.losses.max() < 1e-9
    assert torch.allclose(terms.prediction, eps - x_star, atol=1e-4)
    # four detached forwards (three without guidance) and one with grad, the prediction, last
    assert [c[1] for c in calls] == [False] * (len(calls) - 1) + [True]
    assert sum(c[0] for c in calls) == (1 if guidance != 1.0 else 0)
    for scale, offset in ((1.1, 0.0), (1.0, 0.05)):
        wrong, _ = _exact(x_star, scale, offset)
        bad = af.flow_map_terms(wrong, x_star, eps, t, r, mask, guidance=guidance, epsilon=5.0)
        assert (bad.losses > 1e-4).all()


def test_prediction_uses_the_central_difference_along_the_velocity():
    """For F(z, t, r) = a z + b t + c r (no z-dependence along v cancels) the prediction is
    F + (t - r) (F(z+, t+) - F(z-, t-)) / (t+ - t-), computed here independently in float64."""
    g = torch.Generator().manual_seed(3)
    x0, eps = torch.randn(2, 2, 3, 1, 1, generator=g), torch.randn(2, 2, 3, 1, 1, generator=g)
    t = torch.tensor([[600.0] * 3, [997.0] * 3])
    r = torch.tensor([[100.0] * 3, [0.0] * 3])
    a, b, c = 0.3, 0.002, -0.001

    def velocity(z, t_raw, r_raw, negative):
        return a * z + b * t_raw[:, None, :, None, None] + c * r_raw[:, None, :, None, None]

    terms = af.flow_map_terms(velocity, x0, eps, t, r, torch.ones(2, 3), guidance=1.0, epsilon=5.0)
    x0d, epsd, td, rd = x0.double(), eps.double(), t.double()[:, None, :, None, None], r.double()[:, None, :, None, None]
    z = (1 - td / 1000) * x0d + td / 1000 * epsd
    F = lambda zz, tt, rr: a * zz + b * tt + c * rr  # noqa: E731
    v = F(z, td, td)
    tp, tm = torch.clamp(td + 5, max=1000), torch.maximum(td - 5, rd)
    d = (F(z + v * (tp - td) / 1000, tp, rd) - F(z - v * (td - tm) / 1000, tm, rd)) / (tp - tm)
    expected = F(z, td, rd) + (td - rd) * d
    assert torch.allclose(terms.prediction.double(), expected, atol=1e-5)
    residual = (expected - (epsd - x0d)).square().mean(dim=(1, 2, 3, 4))
    assert torch.allclose(terms.losses.double(), residual, atol=1e-5)


def test_kept_frames_hold_the_clean_latent_and_leave_the_loss():
    x_star, eps, t, r = _setting(B=2, F=3)
    t[:, 0] = r[:, 0] = 0.0
    keep = torch.zeros(t.shape, dtype=torch.bool)
    keep[:, 0] = True
    seen = []

    def velocity(z, t_raw, r_raw, negative):
        seen.append(z[:, :, 0].clone())
        sigma = (t_raw / 1000.0)[:, None, :, None, None]
        safe = torch.where(sigma > 0, sigma, torch.ones_like(sigma))
        return torch.where(sigma > 0, (z - x_star) / safe, torch.zeros_like(z))

    mask = (~keep).float()
    terms = af.flow_map_terms(velocity, x_star, eps, t, r, mask, guidance=3.0, epsilon=5.0, keep=keep)
    assert all(torch.equal(s, x_star[:, :, 0]) for s in seen)
    assert terms.losses.max() < 1e-9


def test_time_pairs_split_over_the_logical_global_batch():
    # four logical DP ranks x two samples: kinds by global index, 50 / 25 / 25
    kinds, gen_state = [], 7
    for rank in range(4):
        pairs = af.sample_time_pairs(2, global_offset=2 * rank, global_size=8, diffusion_ratio=0.5,
                                     consistency_ratio=0.25, generator=torch.Generator().manual_seed(gen_state))
        kinds += pairs.kind.tolist()
        assert (pairs.r <= pairs.t).all() and (pairs.t > 0).all()
        d, c, f = (pairs.kind == af.DIFFUSION), (pairs.kind == af.CONSISTENCY), (pairs.kind == af.FLOW_MAP)
        assert torch.equal(pairs.r[d], pairs.t[d]) and (pairs.r[c] == 0).all()
        assert ((pairs.r[f] > 0) & (pairs.r[f] < pairs.t[f])).all()
    assert kinds == [0, 0, 0, 0, 1, 1, 2, 2]
    # all u1, then all u2: t is the first draw block, r / t the second
    g = torch.Generator().manual_seed(11)
    u = torch.rand(6, generator=g)
    pairs = af.sample_time_pairs(3, global_offset=0, global_size=3, diffusion_ratio=0.0, consistency_ratio=0.0,
                                 generator=torch.Generator().manual_seed(11))
    assert torch.allclose(pairs.t, u[:3]) and torch.allclose(pairs.r, u[3:] * u[:3])
    with pytest.raises(ValueError, match="exceeds global_size"):
        af.sample_time_pairs(2, global_offset=7, global_size=8, diffusion_ratio=0.5, consistency_ratio=0.25,
                             generator=torch.Generator())


def test_difference_window_and_weights():
    t, r = torch.tensor([998.0, 3.0, 500.0]), torch.tensor([0.0, 1.0, 500.0])
    plus, minus = af.difference_window(t, r, 5.0)
    assert plus.tolist() == [1000.0, 8.0, 505.0] and minus.tolist() == [993.0, 1.0, 500.0]
    grid = fm.sigma_table(5.0) * 1000
    assert torch.allclose(af.gaussian_weight_at(grid.float(), 5.0), fm.gaussian_weights(grid).float())
    assert abs(float(af.gaussian_weight_at(grid.float(), 5.0).mean()) - 1.0) < 1e-5
    with pytest.raises(ValueError, match="epsilon"):
        af.difference_window(t, r, 0.0)


def test_adaptive_rescale_matches_the_global_diffusion_mean_with_a_detached_factor():
    losses = torch.tensor([2.0, 4.0, 8.0, 1.0], requires_grad=True)
    is_diff = torch.tensor([True, True, False, False])
    global_losses = torch.tensor([2.0, 4.0, 8.0, 1.0, 6.0, 3.0])   # another rank's two diffusion losses too
    global_diff = torch.tensor([True, True, False, False, True, False])
    out = af.adaptive_rescale(losses, is_diff, global_losses, global_diff)
    reference = (2 + 4 + 6) / 3
    assert torch.allclose(out[2:], torch.full((2,), reference), atol=1e-4)
    assert torch.equal(out[:2], losses[:2])
    out.sum().backward()
    assert torch.allclose(losses.grad, torch.tensor([1.0, 1.0, reference / (8 + 1e-5), reference / (1 + 1e-5)]))
    same = af.adaptive_rescale(losses, torch.zeros(4, dtype=torch.bool), global_losses, torch.zeros(6, dtype=torch.bool))
    assert same is losses


def test_reversed_time_wrapper_feeds_data_ward_time_and_negates():
    fed = {}

    def h3(z, t, r, negative):
        fed.update(t=t, r=r)
        return z * 2

    velocity = af.reversed_time_velocity(h3)
    out = velocity(torch.ones(1, 1, 1, 1, 1), torch.tensor([[250.0]]), torch.tensor([[0.0]]), False)
    assert fed["t"].item() == 0.75 and fed["r"].item() == 1.0 and out.item() == -2.0
