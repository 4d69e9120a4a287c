"""Sampling plans: exact partition, SP peers identical, stable fingerprints, start-frame rules."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solar.data.index import load_table
from solar.data.plan import PlanParams, describe, fingerprint, plan_readers
from solar.errors import DataError
from tests.unit.data.helpers import rows, write_index


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "index.jsonl.gz"
    return write_index(path, rows(97, per_shard=5, repeats={3: 2, 10: 4, 50: 3}, num_frames=153))


@pytest.fixture(scope="module")
def table(index):
    return load_table(index)


def _expected(table):
    return Counter((row, rep) for row, count in enumerate(table.repeats) for rep in range(count))


@settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(["global_occurrence", "node_shard"]), sp=st.sampled_from([1, 2, 4]),
       dp=st.integers(1, 6), nodes=st.integers(1, 3), workers=st.integers(1, 3),
       shuffle=st.sampled_from([0, 1, 4, 64]), random_start=st.booleans(), seed=st.integers(0, 10**6),
       epoch=st.integers(0, 2))
def test_readers_partition_occurrences_exactly_once(table, mode, sp, dp, nodes, workers, shuffle,
                                                    random_start, seed, epoch):
    world = sp * dp * nodes
    params = PlanParams(seed=seed, pixel_frames=81, world_size=world, sequence_parallel_size=sp,
                        local_world_size=world // nodes, num_workers=workers, epoch=epoch, mode=mode,
                        shuffle_buffer=shuffle, random_start=random_start)
    plans = plan_readers(table, params)
    assert sorted(plans) == list(range(params.readers))
    seen = Counter((p.rows[i], p.repeats[i]) for p in plans.values() for i in range(len(p)))
    assert seen == _expected(table)
    for p in plans.values():
        for i in range(len(p)):
            start = p.starts[i]
            if random_start:
                assert 0 <= start <= 153 - 81
            else:
                assert start == 0
    # SP peers (raw ranks of one SP group) read one reader's plan: the same occurrences.
    for rank in range(world):
        assert params.reader_of(rank, 0) == params.reader_of(rank - rank % sp, 0)


def test_global_occurrence_is_round_robin_before_shuffle(table):
    params = PlanParams(seed=1, pixel_frames=81, world_size=3, shuffle_buffer=0)
    plans = plan_readers(table, params)
    order = [(r, k) for r, count in enumerate(table.repeats) for k in range(count)]
    for g in range(3):
        assert list(zip(plans[g].rows, plans[g].repeats)) == order[g::3]


def test_node_shard_keeps_shard_groups_on_one_node(table):
    params = PlanParams(seed=5, pixel_frames=81, world_size=8, local_world_size=4, mode="node_shard")
    plans = plan_readers(table, params)
    node_of_shard: dict[int, int] = {}
    for g, p in plans.items():
        node = g // 4
        for row in p.rows:
            assert node_of_shard.setdefault(table.shard_of[row], node) == node


def test_fingerprint_changes_with_the_plan_and_not_otherwise(table):
    base = PlanParams(seed=3, pixel_frames=81, world_size=4, random_start=True)
    fp = fingerprint(table, base, plan_readers(table, base))
    assert fp == fingerprint(table, base, plan_readers(table, base))
    for other in (PlanParams(seed=4, pixel_frames=81, world_size=4, random_start=True),
                  PlanParams(seed=3, pixel_frames=81, world_size=2, random_start=True),
                  PlanParams(seed=3, pixel_frames=81, world_size=4, random_start=True, epoch=1),
                  PlanParams(seed=3, pixel_frames=81, world_size=4, random_start=False)):
        assert fingerprint(table, other, plan_readers(table, other)) != fp


def test_fingerprint_is_stable_across_processes(index):
    args = ["data", "plan", str(index), "--seed", "7", "--pixel-frames", "81", "--world-size", "8",
            "--sequence-parallel-size", "2", "--rank", "5", "--num-workers", "2", "--worker-id", "1",
            "--limit", "4", "--mode", "node_shard", "--local-world-size", "4"]
    outputs = []
    for hash_seed in ("0", "12345"):  # different str hashing per process must not matter
        proc = subprocess.run([sys.executable, "-m", "solar", *args], capture_output=True, text=True,
                              env={"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"}, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outputs.append(json.loads(proc.stdout))
    assert outputs[0] == outputs[1]
    out = outputs[0]
    assert out["logical_dp_rank"] == 2 and out["logical_dp_world_size"] == 4 and out["reader"] == 5
    assert len(out["shown"]) == 4
    assert set(out["shown"][0]) == {"sample_id", "key", "shard", "repeat_ordinal", "start_frame",
                                    "source_frame_indices"}
    assert out["shown"][0]["source_frame_indices"] == list(range(out["shown"][0]["start_frame"],
                                                                 out["shown"][0]["start_frame"] + 81))


def test_describe_shows_the_first_planned_occurrences(index, table):
    params = PlanParams(seed=11, pixel_frames=81, world_size=6, sequence_parallel_size=2, num_workers=2)
    out = describe(str(index), params, rank=3, worker_id=1, limit=5)
    plan = plan_readers(table, params)[params.reader_of(3, 1)]
    assert [s["sample_id"] for s in out["shown"]] == [f"s{plan.rows[i]:05d}" for i in range(5)]
    assert out["full_plan_count"] == table.virtual_occurrences
    peer = describe(str(index), params, rank=2, worker_id=1, limit=5)  # same SP group
    assert peer == out
    for mode in ("global_occurrence", "node_shard"):
        p = PlanParams(seed=11, pixel_frames=81, world_size=1, mode=mode)
        assert len(describe(str(index), p, rank=0, limit=200)["shown"]) == table.virtual_occurrences


def test_describe_names_readers_and_counts_consistently(index, table):
    """`readers` is how many readers there are, `reader` this rank's, `reader_plan_count` that reader's
    occurrences and `full_plan_count` every reader's (no `reader_count` beside `readers`)."""
    params = PlanParams(seed=11, pixel_frames=81, world_size=4, num_workers=1)
    outs = [describe(str(index), params, rank=r, limit=0) for r in range(4)]
    assert [o["reader"] for o in outs] == [0, 1, 2, 3] and {o["readers"] for o in outs} == {4}
    assert sum(o["reader_plan_count"] for o in outs) == outs[0]["full_plan_count"] == table.virtual_occurrences
    assert all("reader_count" not in o for o in outs)


def test_start_frame_rules(tmp_path):
    items = [{"sample_id": "a", "key": "a", "shard": "s", "num_frames": 100, "start_frame": 7},
             {"sample_id": "b", "key": "b", "shard": "s", "num_frames": 100},
             {"sample_id": "c", "key": "c", "shard": "s"},
             {"sample_id": "d", "key": "d", "shard": "s", "num_frames": 153, "family": "wan22_ti2v_5b"},
             {"sample_id": "e", "key": "e", "shard": "s", "num_frames": 158, "family": "minimax-h3"}]
    table = load_table(write_index(tmp_path / "i.jsonl", items))
    fixed = plan_readers(table, PlanParams(seed=0, pixel_frames=5, world_size=1, shuffle_buffer=0))[0]
    assert list(fixed.starts) == [7, 0, 0, 0, 0]
    seen = {r: set() for r in range(5)}
    for seed in range(60):
        p = plan_readers(table, PlanParams(seed=seed, pixel_frames=81, world_size=1, shuffle_buffer=0,
                                           random_start=True))[0]
        for row, start in zip(p.rows, p.starts):
            seen[row].add(start)
    assert seen[2] == {0}                                   # no num_frames: the clip is the sample
    assert max(seen[0]) <= 19 and len(seen[0]) > 5           # 100 - 81
    assert seen[3] <= set(range(0, 73, 4)) and len(seen[3]) > 5  # Wan: latent-aligned starts
    assert seen[4] <= {0, 17, 34, 51, 68}                    # H3: 17-frame stride within 158 - 81


def test_rows_too_short_are_named(tmp_path):
    table = load_table(write_index(tmp_path / "i.jsonl", [
        {"sample_id": "a", "key": "a", "shard": "s", "num_frames": 90},
        {"sample_id": "b", "key": "b", "shard": "s", "num_frames": 50}]))
    with pytest.raises(DataError, match=r"i.jsonl:2: row 1 has num_frames 50, too few for 81"):
        plan_readers(table, PlanParams(seed=0, pixel_frames=81, world_size=1))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"world_size": 6, "sequence_parallel_size": 4}, "not divisible by --sequence-parallel-size"),
    ({"world_size": 8, "local_world_size": 3}, "must divide --world-size"),
    ({"world_size": 8, "local_world_size": 2, "sequence_parallel_size": 4}, "SP groups stay within a node"),
    ({"world_size": 2, "mode": "nope"}, "--mode must be one of"),
])
def test_bad_params(kwargs, fragment):
    with pytest.raises(DataError, match=fragment):
        PlanParams(seed=0, pixel_frames=1, **kwargs)


def test_bad_rank_via_cli(index, cli):
    result = cli("data", "plan", str(index), "--seed", "0", "--pixel-frames", "1", "--world-size", "2",
                 "--rank", "2")
    assert result.code == 2 and "--rank 2 is outside 0..1" in result.err
