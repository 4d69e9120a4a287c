"""On a CUDA device: the trainer's optimizer (``solar.train.optimizer.adamw``) takes torch's fused
AdamW for GPU parameters, and ten of its updates stay within a derived bound of the foreach
implementation the trainer used before (the same rule, rounded differently). Skipped without CUDA.

The bound: at each step the two may round the new fp32 parameter differently, by up to the unit
roundoff u = 2^-24 of |p| per rounding (weight decay and the update applied in one rounding or two:
at most 4u|p| apart), and the update itself (moments, square root, division) by a few u of |update|
(8u). Over n steps, accumulated linearly (the worst case), the difference is at most
n * 4u * ||p|| + 8u * ||moved||; the test divides by ||moved||. The fixed 1e-5 it asked before was
fitted to one card and failed on an H100 at 1.57e-5 (2026-12-05); this bound is ~1.3e-4 for these
tensors (on the CPU, fused and foreach differ by ~2e-7)."""

from __future__ import annotations

import pytest
import torch

from solar.config.schema import OptimizerBlock
from solar.train.optimizer import adamw

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_fused_adamw_within_a_bound_of_foreach():
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(3072, 3072), (3072,), (14336, 3072), (48, 3072)]
    start = [torch.randn(s, device="cuda", generator=g) * 0.02 for s in shapes]
    grads = [[torch.randn(s, device="cuda", generator=g) for s in shapes] for _ in range(10)]
    opt_cfg = OptimizerBlock(lr=1e-4, weight_decay=0.01)
    results = []
    for fused in (True, False):
        params = {f"p{i}": torch.nn.Parameter(t.clone()) for i, t in enumerate(start)}
        if fused:
            optimizer = adamw(params, opt_cfg)
            assert optimizer.param_groups[0]["fused"] is True
        else:
            optimizer = torch.optim.AdamW(list(params.values()), lr=1e-4, betas=tuple(opt_cfg.betas),
                                          eps=opt_cfg.eps, weight_decay=0.01, foreach=True)
        for step in grads:
            for p, grad in zip(params.values(), step):
                p.grad = grad.clone()
            optimizer.step()
        results.append([p.detach() for p in params.values()])
    u, n = 2.0 ** -24, len(grads)
    for a, b, s in zip(*results, start):
        moved = (b - s).norm()
        bound = (n * 4 * u * b.norm() + 8 * u * moved) / moved
        assert ((a - b).norm() / moved).item() < bound.item()
