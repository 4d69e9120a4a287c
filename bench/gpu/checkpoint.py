"""(e) Checkpoint saving: how long the trainer is blocked by one save of a Wan-1.3B-shaped model's
role (live weights, fp32 EMA, AdamW moments: the same ``checkpoint_io`` / ``checkpoint_save`` calls
and transaction as ``solar train``), synchronous and in the background (``runtime.async_checkpoint``:
pinned staging buffers, a writer thread, commit after the write), and the write rate against this
disk's own sequential write bandwidth measured in the same run (a 4 GiB file written and fsynced).
The background saves also report GPU matmul throughput while the writer runs against alone.

    PYTHONPATH=trainer:. python3 bench/gpu/checkpoint.py [DIR]     # DIR defaults to /tmp/solar-ckpt-bench
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from bench.gpu.common import emit
from solar.config import families
from solar.models.wan.model import WanConfig, WanDiT
from solar.storage import checkpoints as ckpt
from solar.train import checkpoint_io as io
from solar.train import checkpoint_save as cs


def disk_bandwidth(folder: Path, gib: int = 4) -> float:
    block = os.urandom(64 << 20)
    path = folder / "bandwidth.bin"
    started = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(gib * 16):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return gib * 2**30 / seconds


def _matmul_rate(seconds: float) -> float:
    """bf16 8192^3 matmuls per second on the GPU for ``seconds`` (a stand-in for training steps)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        done += 10
    return done / (time.perf_counter() - started)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/solar-ckpt-bench")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    bw = disk_bandwidth(root)
    emit({"bench": "disk_write", "gib_per_s": bw / 2**30})
    five = families.spec("wan22_ti2v_5b").dims("released")
    dims = dataclasses.replace(five, hidden_size=1536, num_heads=12, ffn_dim=8960, in_channels=16, out_channels=16)
    with torch.device("cuda"):
        model = WanDiT(WanConfig(dims, camera_transform=None))
    params = {n: p for n, p in model.named_parameters()}
    names = list(params)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-4, fused=True)
    for p in params.values():
        p.grad = torch.zeros_like(p)
    opt.step()  # moments exist, as after a training step
    ema = {n: p.detach().float().clone() for n, p in params.items()}
    alone = _matmul_rate(3.0)
    staging = cs.Staging()
    for step, background in ((1, False), (2, True), (3, True), (4, True)):
        torch.cuda.synchronize()
        started = time.perf_counter()
        partial = ckpt.begin(root, step)
        snap = io.snapshot(model, opt, names, sharded=False, adapter_only=False, ema=ema,
                           staging=staging if background else None)
        capture = cs.Capture(step, partial, [cs.RoleCapture("model", snap, names, ["live", "ema"])],
                             {"step": step}, io.trainer_file({"step": step}))
        if background:  # what the trainer does with runtime.async_checkpoint: true
            staging.ready()
            blocking = time.perf_counter() - started
            writer = cs.BackgroundWrite(capture, started=started, blocking=blocking)
            beside = _matmul_rate(0.5)  # training goes on while the writer runs
            writer.wait()
            assert writer.error is None, writer.error
            roles, snapped = writer.roles, started + blocking
        else:
            snapped = time.perf_counter()
            roles = cs.write(capture)
            beside = None
        final = ckpt.commit(partial, step=step, contract={"bench": True}, roles=roles, trainer_state={"step": step})
        done = time.perf_counter()
        if not background:
            blocking = done - started
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
        emit({"bench": "checkpoint_save", "mode": "async" if background else "sync", "step": step,
              "parameters": sum(p.numel() for p in params.values()), "bytes": size, "blocking_s": blocking,
              "snapshot_s": snapped - started, "write_s": done - snapped,
              "write_gib_per_s": size / (done - snapped) / 2**30,
              "fraction_of_disk_bandwidth": size / (done - snapped) / bw,
              "matmuls_per_s_alone": alone, "matmuls_per_s_during_write": beside})
        shutil.rmtree(final)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
