"""`activation_checkpointing_skip_blocks: auto`'s GPU branch on the CPU (issue 47 item 6): two gloo ranks
report different "GPU" sizes (SOLAR_FAKE_GPU_MEMORY, a drill honoured with SOLAR_ALLOW_FAULTS=1); every
rank gathers both, and both take the choice of the smallest."""

from __future__ import annotations

import json
import math

import pytest

from solar.config import memory
from solar.config.resolve import resolve_file
from tests.e2e.helpers import TINY, train

pytestmark = pytest.mark.slow
SETS = ["distributed.world_size=2", "train.global_batch_size=2", "distributed.activation_checkpointing=true",
        "distributed.activation_checkpointing_skip_blocks=auto", "train.max_steps=1", "runtime.validate_every=0",
        "runtime.save_every=0"]


def _least_memory_keeping(resolved, kept: int) -> int:
    """The fewest bytes of GPU memory with which auto keeps ``kept`` blocks (the usable limit less the margin)."""
    peak = memory.forecast(memory.with_kept_blocks(resolved, kept), gpu_memory_bytes=4 << 30, gpus_per_node=2,
                           look_faster=False).peak_bytes
    return math.ceil((memory.RESERVE_MIN + peak) / (1 - memory.AUTO_MARGIN)) + 4096


def test_every_rank_takes_the_choice_of_the_smallest_gpu(wan_data, tmp_path):
    sets = [f"data.root={wan_data}", f"runtime.output_dir={tmp_path / 'run'}", *SETS]
    resolved = resolve_file(TINY["wan22_ti2v_5b"], sets, expected_action="train")
    small, large = _least_memory_keeping(resolved, 1), _least_memory_keeping(resolved, 2)
    assert memory.auto_kept_blocks(resolved, gpu_memory_bytes=small, gpus_per_node=2)[0] == 1   # the premise:
    assert memory.auto_kept_blocks(resolved, gpu_memory_bytes=large, gpus_per_node=2)[0] == 2   # sizes that differ
    proc = train(TINY["wan22_ti2v_5b"], sets, nproc=2,
                 extra_env={"SOLAR_ALLOW_FAULTS": "1", "SOLAR_FAKE_GPU_MEMORY": f"{large},{small}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        events = [json.loads(line) for line in
                  (tmp_path / "run" / "events" / f"rank-{rank:05d}.jsonl").read_text().splitlines()]
        (chosen,) = [e for e in events if e["event"] == "activation_checkpointing"]
        assert (chosen["skip_blocks"], chosen["blocks"], chosen["gpu_memory_bytes"]) == (1, 2, small), (rank, chosen)
    assert "activation_checkpointing_skip_blocks auto -> 1 of 2 blocks keeps its activations (forecast" in \
        proc.stderr, proc.stderr[-2000:]
