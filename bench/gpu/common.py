"""Shared pieces of the GPU benchmarks: CUDA-event timing, the FLOP formulas of performance.md,
the bf16 peak, and one JSON line per result on stdout. Run from the repository root with
``PYTHONPATH=trainer:.`` (see each script's docstring for its command)."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

PEAK_BF16 = 989e12  # H100/H200 dense bf16 (performance.md); the measured matmul ceiling is reported beside it


def timed(fn, *, warmup: int = 3, iters: int = 10) -> dict:
    """Median and spread of ``fn()`` in seconds over ``iters`` runs after ``warmup``, by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "iters": iters}


def block_train_flops(*, hidden: int, ffn: int, tokens: int, layers: int = 1) -> float:
    """fwd+bwd model FLOPs of DiT blocks for one clip: 6·N_tok·s + 14·L·d·s² (performance.md)."""
    per_token = layers * (4 * hidden * hidden + 2 * hidden * hidden + 2 * hidden * ffn)
    return 6.0 * per_token * tokens + 14.0 * layers * hidden * float(tokens) ** 2


def attention_flops(*, heads: int, head_dim: int, q: int, k: int, backward: bool) -> float:
    """4·H·D·Sq·Sk forward (QK^T and PV), 2.5x that for the backward."""
    fwd = 4.0 * heads * head_dim * q * k
    return fwd * (3.5 if backward else 1.0)


def matmul_ceiling(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b, warmup=3, iters=10)["median_s"]
    return 2 * n**3 / t


def emit(record: dict) -> None:
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, **record}
    print(json.dumps(record), flush=True)


def peak_memory() -> float:
    return torch.cuda.max_memory_allocated() / 2**30


def fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    sys.exit(1)
