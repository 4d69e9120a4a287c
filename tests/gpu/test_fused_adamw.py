"""On a CUDA device: the trainer's optimizer (``solar.train.optimizer.adamw``) takes torch's fused
AdamW for GPU parameters, and ten of its updates stay within 1e-5 relative of the foreach
implementation the trainer used before (the same rule, rounded differently). Skipped without CUDA."""

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
    for a, b, s in zip(*results, start):
        moved = (b - s).norm()
        assert ((a - b).norm() / moved).item() < 1e-5
