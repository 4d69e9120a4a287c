"""(c) Attention kernels at Wan video shapes (24 heads x 128, bf16) against the FLOP limit: torch SDPA
with the flash, cuDNN and memory-efficient kernels pinned, and FlexAttention with the Stage1
teacher-forcing block mask ([clean | noisy] 2 x 21 latent frames, 3-latent chunks, 5 prior chunks).

    PYTHONPATH=trainer:. python3 bench/gpu/attention.py

Masked FLOPs count only the key blocks the block mask keeps (its sparsity), fwd 4·H·D·Sq·Sk, bwd 2.5x.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.gpu.common import PEAK_BF16, attention_flops, emit, timed
from solar.models.attention import _kernel_context, make_flex, teacher_forcing_mask

H, HD = 24, 128


def run(label: str, tokens: int, fn, flops_fwd: float, flops_bwd: float, q, k, v) -> None:
    grad = torch.randn_like(q)
    try:
        fwd = timed(lambda: fn(q, k, v))
        both = timed(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad))
    except Exception as exc:  # noqa: BLE001 - report and go on
        emit({"bench": "attention", "kernel": label, "tokens": tokens, "error": repr(exc)[:300]})
        return
    bwd_s = max(both["median_s"] - fwd["median_s"], 1e-9)
    emit({"bench": "attention", "kernel": label, "tokens": tokens, "fwd_s": fwd["median_s"],
          "fwd_bwd_s": both["median_s"], "fwd_tflops": flops_fwd / fwd["median_s"] / 1e12,
          "bwd_tflops": flops_bwd / bwd_s / 1e12, "fwd_mfu": flops_fwd / fwd["median_s"] / PEAK_BF16,
          "fwd_bwd_mfu": (flops_fwd + flops_bwd) / both["median_s"] / PEAK_BF16})


def main() -> None:
    for tokens in (18_480, 27_280):
        q, k, v = (torch.randn(1, H, tokens, HD, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        fwd = attention_flops(heads=H, head_dim=HD, q=tokens, k=tokens, backward=False)
        bwd = attention_flops(heads=H, head_dim=HD, q=tokens, k=tokens, backward=True) - fwd
        for kernel in ("cudnn", "flash", "efficient"):
            def sdpa(q, k, v, kernel=kernel):
                with _kernel_context(kernel):
                    return F.scaled_dot_product_attention(q, k, v)
            run(f"sdpa_{kernel}", tokens, sdpa, fwd, bwd, q, k, v)
        run("flex_dense", tokens, lambda q, k, v: make_flex(True)(q, k, v, None), fwd, bwd, q, k, v)
        del q, k, v
        torch.cuda.empty_cache()
    # Stage1 teacher forcing: [clean | noisy] of 21 latent frames at 704x1280
    n, frames = 880, 21
    mask = teacher_forcing_mask(frames, n, 3, 5, device="cuda")
    tokens = 2 * frames * n
    flex = make_flex(True)
    q, k, v = (torch.randn(1, H, tokens, HD, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flex(q, k, v, mask)  # builds the block mask
    from torch.nn.attention.flex_attention import create_block_mask

    block = create_block_mask(lambda b, h, qi, ki: mask.allowed(qi, ki), None, None, tokens, tokens, device="cuda")
    kept = 1.0 - block.sparsity() / 100.0
    fwd = kept * attention_flops(heads=H, head_dim=HD, q=tokens, k=tokens, backward=False)
    bwd = kept * attention_flops(heads=H, head_dim=HD, q=tokens, k=tokens, backward=True) - fwd
    emit({"bench": "attention_mask", "tokens": tokens, "kept_fraction": kept})
    run("flex_teacher_forcing", tokens, lambda q, k, v: flex(q, k, v, mask), fwd, bwd, q, k, v)


if __name__ == "__main__":
    main()
