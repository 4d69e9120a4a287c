"""Run a function on N CPU ranks over gloo (spawned processes, file rendezvous)."""

from __future__ import annotations

import os
import tempfile
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, init_file: str, fn, args, results) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results[rank] = fn(rank, world, *args)
    except BaseException:  # report to the parent instead of a silent exit code
        results[rank] = RuntimeError(traceback.format_exc())
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world: int, *args):
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; returns their results in rank order."""
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(_entry, args=(world, os.path.join(tmp, "rendezvous"), fn, args, results), nprocs=world,
                 join=True)
        out = [results[r] for r in range(world)]
        manager.shutdown()
    for item in out:
        if isinstance(item, BaseException):
            raise item
    return out
