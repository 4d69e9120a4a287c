"""Topology arithmetic and the family SP rules (table-driven)."""

from __future__ import annotations

import pytest

from solar.config.topology import Topology, check_family_rules, compute
from solar.errors import ConfigError


@pytest.mark.parametrize("world, sp, micro, accum, given, expected", [
    (256, 1, 1, 1, 256, (256, 256)),
    (256, 2, 1, 1, 128, (128, 128)),
    (256, 2, 1, 2, 256, (128, 256)),
    (256, 4, 1, 1, None, (64, 64)),
    (1, 1, 2, 3, None, (1, 6)),
    (12, 3, 1, 1, 4, (4, 4)),
])
def test_compute(world, sp, micro, accum, given, expected):
    topo = compute(world_size=world, sequence_parallel_size=sp, micro_batch_size=micro,
                   gradient_accumulation=accum, global_batch_size=given)
    assert (topo.logical_dp_world_size, topo.global_batch_size) == expected
    assert topo.as_dict()["world_size"] == world


@pytest.mark.parametrize("world, sp, given, fragment", [
    (6, 4, None, "distributed.world_size=6 is not divisible by distributed.sequence_parallel_size=4"),
    (256, 2, 256, "train.global_batch_size=256 disagrees with logical_dp_world_size 128"),
    (8, 1, 4, "set train.global_batch_size=8"),
])
def test_compute_rejects(world, sp, given, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compute(world_size=world, sequence_parallel_size=sp, micro_batch_size=1,
                gradient_accumulation=1, global_batch_size=given)


def test_rank_mapping_is_contiguous_sp_groups():
    topo = Topology(8, 4, 2, 1, 1, 2)
    assert [topo.dp_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [topo.sp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize("family, action, stage, sp, heads, frames, fragment", [
    ("minimax_h3", "train", "stage0p5", 1, 56, 47, "requires sequence parallelism 2"),
    ("minimax_h3", "train", "stage2", 2, 56, 47, "requires sequence parallelism 4"),
    ("wan22_ti2v_5b", "train", "stage2", 2, 24, 21, "requires sequence parallelism 1"),
    ("wan22_ti2v_5b", "infer", "stage2", 2, 24, 21, "requires sequence parallelism 1"),
    ("wan22_ti2v_5b", "train", "stage0p5", 5, 24, 21, "does not divide the 24 attention heads"),
    ("ltx25_video", "train", "stage0p5", 3, 32, 20, "use one of 1, 2, 4, 8, 16, 32"),
    ("wan22_ti2v_5b", "train", "stage0p5", 4, 4, 3, "exceeds the 3 latent frames"),
])
def test_family_rules_reject(family, action, stage, sp, heads, frames, fragment):
    with pytest.raises(ConfigError, match=fragment):
        check_family_rules(family=family, profile="released", action=action, stage=stage, sp=sp,
                           num_heads=heads, latent_frames=frames)


@pytest.mark.parametrize("family, action, stage, sp, heads", [
    ("minimax_h3", "train", "stage1", 2, 56),
    ("minimax_h3", "train", "stage2", 4, 56),
    ("minimax_h3", "infer", "stage2", 8, 56),  # inference SP is free (divides heads)
    ("wan22_i2v_a14b", "train", "stage0p5", 2, 40),
    ("wan22_ti2v_5b", "train", "stage0p5", 8, 24),
])
def test_family_rules_accept(family, action, stage, sp, heads):
    check_family_rules(family=family, profile="released", action=action, stage=stage, sp=sp,
                       num_heads=heads, latent_frames=21)
