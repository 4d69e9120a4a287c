"""On a CUDA device, at the released TI2V-5B shape (405 tokens per latent frame, 24 heads of 128
channels, 21 frames): camera PRoPE as one product per frame with the block-diagonal matrix gives
the 4x4 product's values and gradients — in fp32 within 1e-5, and in bf16 no farther from a float64
reference than the 4x4 product is. Each form's time is printed (figures belong in bench/RESULTS.md,
not in assertions). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from solar.models.prope import apply_blocks, apply_blocks_4x4, camera_matrices
from tests.unit.models.wan_helpers import moving_cameras

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
F, N, H, D = 21, 405, 24, 128


def _time(fn, *args) -> float:
    for _ in range(3):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_diagonal_prope_on_gpu(dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    mats = camera_matrices(moving_cameras(F).cuda(), "linear")
    for matrix in (mats.query, mats.key):
        x = torch.randn(1, F * N, H, D, device="cuda", generator=gen).to(dtype).requires_grad_()
        y = x.detach().clone().requires_grad_()
        weight = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
        out, ref = apply_blocks(x, matrix, N, 0), apply_blocks_4x4(y, matrix, N, 0)
        (out.float() * weight.float()).sum().backward()
        (ref.float() * weight.float()).sum().backward()
        exact = apply_blocks_4x4(x.detach().double(), matrix.double(), N, 0)
        grad_exact = apply_blocks_4x4(weight.double(), matrix.double().transpose(-1, -2), N, 0)
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-5)
        for new, old, truth in ((out, ref, exact), (x.grad, y.grad, grad_exact)):
            err_new = ((new.double() - truth).norm() / truth.norm()).item()
            err_old = ((old.double() - truth).norm() / truth.norm()).item()
            assert err_new <= 1.5 * err_old + 1e-7, (err_new, err_old)
    with torch.no_grad():
        x = torch.randn(1, 2 * F * N, H, D, device="cuda", dtype=dtype)
        cams = mats.query.repeat(1, 2, 1, 1)
        print(f"\n{dtype}, 17,010 tokens: block-diagonal {_time(apply_blocks, x, cams, N, 0):.3f} ms, "
              f"4x4 {_time(apply_blocks_4x4, x, cams, N, 0):.3f} ms")
