"""Camera PRoPE as one product per frame with the block-diagonal matrix (``apply_blocks``) gives the
values and gradients of the batched 4x4 product it replaced (``apply_blocks_4x4``): on random
inputs, with and without RoPE channels in front, and through a whole tiny Wan Stage1 TF-AnyFlow
step (loss, records and every parameter's gradient within 1e-5 in float32). MiniMax-H3 packs its
rows and keeps ``apply_rows``, which this change does not touch."""

from __future__ import annotations

import pytest
import torch

from solar.models import prope
from solar.models.prope import apply_blocks, apply_blocks_4x4, block_diagonal, camera_matrices
from tests.unit.models.wan_helpers import moving_cameras


@pytest.mark.parametrize("start", [0, 8])
def test_values_and_gradients_equal_the_4x4_product(start):
    gen = torch.Generator().manual_seed(start + 3)
    B, F, n, H, D = 2, 3, 5, 4, 24
    mats = camera_matrices(moving_cameras(F, batch=B), "linear")
    for matrix in (mats.query, mats.key, mats.output):
        x = torch.randn(B, F * n, H, D, generator=gen, dtype=torch.float64).float().requires_grad_()
        y = x.detach().clone().requires_grad_()
        out, ref = apply_blocks(x, matrix, n, start), apply_blocks_4x4(y, matrix, n, start)
        assert out.shape == ref.shape == x.shape
        assert (out - ref).abs().max().item() <= 1e-6 * ref.abs().max().item()
        assert torch.equal(out[..., :start], x[..., :start])        # the RoPE channels pass through
        weight = torch.randn(out.shape, generator=gen)
        (out * weight).sum().backward()
        (ref * weight).sum().backward()
        assert (x.grad - y.grad).abs().max().item() <= 1e-6 * y.grad.abs().max().item()


def test_block_diagonal():
    m = torch.arange(2 * 16, dtype=torch.float32).reshape(2, 1, 4, 4)
    wide = block_diagonal(m, 12)
    assert wide.shape == (2, 1, 12, 12)
    for b in range(2):
        assert torch.equal(wide[b, 0], torch.block_diag(m[b, 0], m[b, 0], m[b, 0]))


def test_a_tiny_wan_stage1_step_is_unchanged(monkeypatch):
    import solar.models.wan.model as wan
    from tests.unit.train.test_stage1_context import _loss_and_grads, _setup

    cfg, model, batch, negative = _setup()
    calls = []
    monkeypatch.setattr(wan, "apply_blocks", lambda *a: calls.append(1) or apply_blocks(*a))
    loss, records, grads, *_ = _loss_and_grads(model, cfg, batch, negative, 4, True)
    assert len(calls) >= 4 * 2 * 7      # q, k, v, out in each block of every forward: the cameras are on
    monkeypatch.setattr(wan, "apply_blocks", prope.apply_blocks_4x4)
    ref_loss, ref_records, ref_grads, *_ = _loss_and_grads(model, cfg, batch, negative, 4, True)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in ref_records], rel=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 10
    for name, g in grads.items():
        assert (g - ref_grads[name]).abs().max().item() <= 1e-5 * max(ref_grads[name].abs().max().item(), 1e-6), name
