"""Data positions without ranks (issue 39 item 2), on real tiny shards: the training plan's readers are
the global batch's positions, so every topology with the same global batch (world, SP, micro-batch,
accumulation) reads the same clip at the same position of every step; every rank's saved state merged
re-deals the readers to another topology, which then reads exactly what the uninterrupted run would
have; a state saved for another global batch is refused; a v1 state (readers as a list) is read."""

from __future__ import annotations

import pytest

from solar.config.resolve import resolve_file
from solar.data.from_config import rank_positions, train_stream
from solar.data.stream import merge_states, upgrade_state
from solar.data.synth import synthesize
from solar.errors import DataError
from tests.conftest import CONFIGS

CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
SHAPES = [(4, 1, 1, 1), (2, 1, 2, 1), (1, 1, 2, 2), (4, 2, 2, 1), (2, 2, 1, 4)]   # world, sp, micro, accumulation


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("positions") / "wan"
    synthesize("wan22_ti2v_5b", root, samples=6, seed=2)
    return root


def _cfg(root, tmp_path, world, sp, micro, accum, *extra):
    return resolve_file(CONFIG, [f"data.root={root}", f"runtime.output_dir={tmp_path}/out",
                                 f"distributed.world_size={world}", f"distributed.sequence_parallel_size={sp}",
                                 f"train.micro_batch_size={micro}", f"train.gradient_accumulation={accum}",
                                 "train.global_batch_size=4", "data.random_start=true", "data.shuffle_buffer=3",
                                 *extra]).config


def _steps(cfg, streams: dict, steps: int) -> list[dict[int, tuple]]:
    """Per step: global-batch position -> (sample, reader, epoch, position in plan, start frame), from
    every rank (SP peers must read the same)."""
    out = []
    for _ in range(steps):
        seen: dict[int, tuple] = {}
        for rank, stream in streams.items():
            for j in rank_positions(cfg, rank):
                clip = stream.next_clip()
                occ = clip.occurrence
                got = (clip.row.sample_id, occ.reader, occ.epoch, occ.position, occ.start_frame)
                assert seen.setdefault(j, got) == got, (rank, j)
        out.append(seen)
    return out


def test_every_topology_with_the_global_batch_reads_the_same_clips(data, tmp_path):
    runs = []
    for world, sp, micro, accum in SHAPES:
        cfg = _cfg(data, tmp_path, world, sp, micro, accum)
        runs.append(_steps(cfg, {r: train_stream(cfg, r) for r in range(world)}, 5))
    assert all(run == runs[0] for run in runs[1:])
    assert all(sorted(step) == [0, 1, 2, 3] for step in runs[0])
    assert all(step[j][1] == j for step in runs[0] for j in step)     # reader j fills position j


@pytest.mark.parametrize("before, after", [(SHAPES[0], SHAPES[1]), (SHAPES[2], SHAPES[3]), (SHAPES[4], SHAPES[0])])
def test_a_resume_at_another_topology_reads_what_the_run_would_have(data, tmp_path, before, after):
    a, b = _cfg(data, tmp_path, *before), _cfg(data, tmp_path, *after)
    straight = _steps(a, {r: train_stream(a, r) for r in range(before[0])}, 7)
    first = {r: train_stream(a, r) for r in range(before[0])}
    _steps(a, first, 3)
    state = merge_states([s.state_dict() for s in first.values()])
    assert state["global_batch_size"] == 4
    resumed = _steps(b, {r: train_stream(b, r, state) for r in range(after[0])}, 4)
    assert resumed == straight[3:]


def test_a_state_of_another_global_batch_is_refused(data, tmp_path):
    cfg = _cfg(data, tmp_path, 2, 1, 1, 2)
    stream = train_stream(cfg, 0)
    stream.next_clip()
    stream.next_clip()
    state = merge_states([stream.state_dict(), train_stream(cfg, 1).state_dict()])
    other = _cfg(data, tmp_path, 2, 1, 1, 1, "train.global_batch_size=2")
    with pytest.raises(DataError, match="saved with global batch 4, this run's is 2"):
        train_stream(other, 0, state)
    with pytest.raises(DataError, match="inside a step"):   # a state between two clips of a step
        merge_states([{**stream.state_dict(), "at": 1}])


def test_a_v1_state_reads_as_one_group_of_its_readers(data, tmp_path):
    cfg = _cfg(data, tmp_path, 4, 1, 1, 1)
    stream = train_stream(cfg, 2)
    stream.next_clip()
    v2 = stream.state_dict()
    [(key, reader)] = v2["readers"].items()
    v1 = {"schema": "solar.data-stream.v1", "turn": 1, "readers": [reader]}
    up = upgrade_state(v1)
    assert up["readers"] == {key: reader} and up["turns"] == {key: 1}
    resumed = train_stream(cfg, 2, {**up, "global_batch_size": 4})
    assert resumed.next_clip().occurrence == stream.next_clip().occurrence
