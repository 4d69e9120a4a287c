"""On a CUDA device: the paths the GPU benchmarks measure compute what the eager model computes —
compiled blocks (``runtime.compile``) under activation checkpointing and bf16 autocast match the
eager model in outputs and gradients, and bf16 autocast stays close to fp32. Skipped without CUDA
(CI has none; bench/RESULTS.md records the runs on the H200)."""

from __future__ import annotations

import copy

import pytest
import torch

from solar.config import families
from solar.models.wan.model import WanConfig, WanDiT
from solar.train.parallelize import apply_activation_checkpointing, apply_compile

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _model_and_inputs():
    dims = families.spec("wan22_ti2v_5b").dims("tiny")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = WanDiT(WanConfig(dims, camera_transform="linear", attention_backend="sdpa"))
    x = torch.randn(2, dims.in_channels, 6, 8, 12, device="cuda")
    t = torch.rand(2, 6, device="cuda") * 1000
    prompt = torch.randn(2, 16, dims.text_dim, device="cuda")
    cams = torch.eye(4, device="cuda").repeat(2, 6, 1, 1)
    cams[..., :3, 3] = torch.randn(2, 6, 3, device="cuda") * 0.1
    return model, (x, t, prompt), cams


def _run(model, inputs, cams, *, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        out = model(*inputs, cameras=cams)
    out.float().square().mean().backward()
    return out.float(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("policy, skip", [("full", 0), ("save_attention", 0), ("save_attention", 1)])
def test_compiled_checkpointed_blocks_match_eager_under_bf16_autocast(policy, skip):
    eager, inputs, cams = _model_and_inputs()
    compiled = copy.deepcopy(eager)
    apply_activation_checkpointing(compiled, policy=policy, skip_blocks=skip)
    assert apply_compile(compiled) == len(compiled.blocks)
    out_e, grads_e = _run(eager, inputs, cams, bf16=True)
    out_c, grads_c = _run(compiled, inputs, cams, bf16=True)
    torch.testing.assert_close(out_c, out_e, rtol=3e-2, atol=3e-2)
    assert grads_c.keys() == grads_e.keys()
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], rtol=5e-2, atol=5e-2, msg=name)
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in eager.named_parameters()]


def test_bf16_autocast_stays_close_to_fp32():
    model, inputs, cams = _model_and_inputs()
    out32, _ = _run(model, inputs, cams, bf16=False)
    out16, _ = _run(model, inputs, cams, bf16=True)
    rel = (out16 - out32).norm() / out32.norm()
    assert rel < 2e-2, float(rel)
