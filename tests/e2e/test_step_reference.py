"""Issue 18: the Stage0.5 step's host-side changes (the next clip read ahead on a thread, per-sample
losses read once per step, heartbeats without fsync, ``fill_`` for one-element writes) leave the
training unchanged. ``solar train`` on the tiny Wan TI2V-5B Stage0.5 route (2 clips per micro-batch,
2 micro-batches) against the step written out plainly here, the way the trainer did it before: the
stream read in place, each sample's loss read right after its forward. Losses, gradient norms and
every sample record must be bit-identical. (On the CPU the copies are plain; the pinned,
non-blocking ones are tests/gpu/test_step_io.py's.)"""

from __future__ import annotations

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch import precision
from solar.launch.batch import collate
from solar.launch.distributed import Dist
from solar.train.fm_step import fm_loss
from solar.train.gradients import sync_and_clip
from solar.train.schedule import lr_at
from solar.train.setup import build_parts
from tests.e2e.helpers import TINY, steps, train

pytestmark = pytest.mark.slow

STEPS = 3


def _sets(data, out):
    return [f"data.root={data}", f"runtime.output_dir={out}", f"train.max_steps={STEPS}", "runtime.save_every=0",
            "runtime.validate_every=0", "runtime.validation_steps=[]", "train.micro_batch_size=2",
            "train.gradient_accumulation=2", "train.global_batch_size=4"]


def _reference(config, sets) -> list[dict]:
    resolved = resolve_file(config, sets, expected_action="train")
    cfg, device = resolved.config, torch.device("cpu")
    d = Dist(0, 1, 0, 1, 1, device, None)
    p = build_parts(resolved, 0, device)
    stream = p.stream.stream  # the plain RankStream under the trainer's read-ahead (nothing read yet)
    accum, out = cfg.train.gradient_accumulation, []
    for step in range(1, STEPS + 1):
        lr = lr_at(step, cfg.train.optimizer, cfg.train.max_steps)
        for group in p.optimizer.param_groups:
            group["lr"] = lr
        p.optimizer.zero_grad(set_to_none=True)
        total, records = torch.zeros((), device=device), []
        for micro in range(accum):
            batch = collate([stream.next_clip() for _ in range(cfg.train.micro_batch_size)]).to(device)
            with precision.autocast(cfg, device, sharded=False):
                loss, recs = fm_loss(p.model, cfg, batch, step=step, dp_rank=0, micro=micro)
            records += [{**r, "loss": float(r["loss"])} for r in recs]  # each sample read after its forward
            (loss / accum).backward()
            total = total + loss.detach() / accum
        norm = sync_and_clip(d, p.params, cfg.train.optimizer.grad_clip, False)
        p.optimizer.step()
        p.ema.update(step)
        out.append({"step": step, "loss": float(total), "grad_norm": norm, "lr": lr, "samples": records})
    return out


def test_tiny_stage0p5_steps_equal_the_plain_step(wan_data, tmp_path):
    config = TINY["wan22_ti2v_5b"]
    proc = train(config, _sets(wan_data, tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    product = steps(tmp_path / "run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the run's OMP_NUM_THREADS=1: the same reduction order
    try:
        reference = _reference(config, _sets(wan_data, tmp_path / "unused"))
    finally:
        torch.set_num_threads(threads)
    assert len(product) == STEPS
    for got, want in zip(product, reference):
        assert {k: got[k] for k in want} == want, got["step"]
        assert all(isinstance(s["loss"], float) for s in got["samples"])
