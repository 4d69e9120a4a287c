"""Checkpoints by time (issue 52 item 4): ``runtime.save_every_seconds`` alone (``save_every`` 0) at world 2,
FSDP2 ``full_shard``, gloo under torchrun. Rank 0's clock decides and every rank learns its reading in the
step's stop check, so both ranks save at the same steps, each committed checkpoint holds both ranks' shards,
and the saves are spaced by the interval, not taken every step. A drill (``SOLAR_SLOW_STEP_SECONDS``, with
``SOLAR_ALLOW_FAULTS=1``) makes every step last at least a second, so the interval spans a few steps on any
machine."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import TINY, result, steps, train

pytestmark = pytest.mark.slow

CONFIG = TINY["wan22_ti2v_5b"]
INTERVAL, SLEEP, STEPS = 3.5, 1.0, 9


def _events(run, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / "events" / f"rank-{rank:05d}.jsonl").read_text().splitlines()]


def test_time_based_saves_commit_on_every_rank_at_the_same_steps(wan_data, tmp_path, cli):
    run = tmp_path / "run"
    proc = train(CONFIG, [f"data.root={wan_data}", f"runtime.output_dir={run}", "runtime.log_every=100",
                          "distributed.world_size=2", "distributed.sharding=full_shard",
                          "train.global_batch_size=2", f"train.max_steps={STEPS}", "runtime.save_every=0",
                          "runtime.save_steps=[]", f"runtime.save_every_seconds={INTERVAL}",
                          "runtime.validate_every=0", "runtime.validation_steps=[]"],
                 nproc=2, extra_env={"SOLAR_ALLOW_FAULTS": "1", "SOLAR_SLOW_STEP_SECONDS": str(SLEEP)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result(run)["status"] == "complete"
    assert [e["step"] for e in steps(run, 0)] == list(range(1, STEPS + 1))

    saves = {rank: [e for e in _events(run, rank) if e["event"] == "checkpoint"] for rank in (0, 1)}
    at = [e["step"] for e in saves[0]]
    assert at == [e["step"] for e in saves[1]], saves          # both ranks saved at the same steps
    assert at[-1] == STEPS                                     # the last step always saves
    by_time = [e for e in saves[0] if e.get("trigger") == "time"]
    assert [e["step"] for e in by_time] == at[:-1] and len(by_time) >= 2, at
    # every rank learnt rank 0's reading, which had reached the interval; a step lasts >= SLEEP s, so at
    # most ceil(INTERVAL / SLEEP) steps pass between saves (two saves by time before the last step)
    for mine, theirs in zip(by_time, saves[1]):
        assert mine["since_save_seconds"] == theirs["since_save_seconds"] >= INTERVAL, (mine, theirs)
    # ... and not every step: after the first (the launch's first step is slow), saves by time come a step
    # or more apart, each at the first step past the interval: the step before it was recorded less than
    # INTERVAL - SLEEP s (its sleep came after its event) after the save before it returned
    gaps = [b - a for a, b in zip(at, at[1:-1])]
    assert all(gap >= 2 for gap in gaps), at
    recorded = {e["step"]: e["time"] for e in steps(run, 0)}
    for before, after in zip(by_time, by_time[1:]):
        assert recorded[after["step"] - 1] - before["time"] < INTERVAL - SLEEP + 0.5, (before, after)

    # each committed checkpoint holds both ranks' shards in its step directory and verifies whole
    committed = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert committed == [f"step_{s:08d}" for s in at], committed
    for name in committed:
        ckpt = run / "checkpoints" / name
        shard_ranks = {p.name.split("-")[1] for p in (ckpt / "shards").glob("shard-*.safetensors")}
        assert shard_ranks == {"00001", "00002"}, sorted((ckpt / "shards").iterdir())   # DCP counts ranks from 1
        report = json.loads(cli("checkpoint", "verify", str(ckpt)).out)
        assert report["valid"], report["problems"]
