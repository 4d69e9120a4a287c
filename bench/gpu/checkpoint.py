"""(e) Checkpoint saving: how long the trainer is blocked by one save of a Wan-1.3B-shaped model's
role (live weights, fp32 EMA, AdamW moments: the same ``checkpoint_io`` calls and transaction as
``solar train``), and the write rate against this disk's own sequential write bandwidth measured in
the same run (a 4 GiB file written and fsynced).

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
    for step in (1, 2, 3):
        torch.cuda.synchronize()
        started = time.perf_counter()
        snap = io.snapshot(model, opt, names, sharded=False, adapter_only=False, ema=ema)
        snapped = time.perf_counter()
        partial = ckpt.begin(root, step)
        members = io.save_role(partial, "model", snap, names)
        io.write_trainer(partial, {"step": step})
        final = ckpt.commit(partial, step=step, contract={"bench": True},
                            roles={"model": {"weights": ["live", "ema"], "members": members}},
                            trainer_state={"step": step})
        done = time.perf_counter()
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
        emit({"bench": "checkpoint_save", "step": step, "parameters": sum(p.numel() for p in params.values()),
              "bytes": size, "blocking_s": done - started, "snapshot_s": snapped - started,
              "write_s": done - snapped, "write_gib_per_s": size / (done - snapped) / 2**30,
              "fraction_of_disk_bandwidth": size / (done - snapped) / bw})
        shutil.rmtree(final)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
