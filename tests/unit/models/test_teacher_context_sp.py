"""The teacher-forcing context (the clean half's keys/values, run once) under Ulysses SP = 2 over
gloo: each rank keeps its heads of every clean token, and the noisy half alone predicts what the
whole ``[clean | noisy]`` sequence does, at SP = 2 and at SP = 1."""

from __future__ import annotations

import pytest
import torch

from solar.models.sequence_parallel import SPGroup
from tests.support.distributed import run_ranks
from tests.unit.models import sp_worker


@pytest.mark.parametrize("frames", [5])   # clean half 3 + 2 frames a rank, the whole sequence 5 + 5
def test_wan_context_under_sp2_gives_the_full_sequence_prediction(frames):
    single = sp_worker.run_context(0, 1, frames)
    for pairs in run_ranks(sp_worker.run_context, 2, frames):
        for (full, half), (single_full, single_half) in zip(pairs, single):
            assert (half - full).abs().max().item() <= 1e-5
            assert (full - single_full).abs().max().item() <= 1e-5
            assert (half - single_half).abs().max().item() <= 1e-5


def test_a_context_serves_the_sp_place_it_was_built_in():
    from tests.unit.models.wan_helpers import TI2V, dims, ours, randomize

    model = randomize(ours(dims(TI2V, heads=4, head_dim=8), chunk_latents=2, max_prior_clean_chunks=1,
                           camera_transform=None))
    x, clean, ctx, t, _, _ = sp_worker.inputs(4)
    context = model.teacher_context(clean, ctx)
    model.set_sequence_parallel(SPGroup(None, 1, 2))   # no collective runs before the check
    with torch.no_grad(), pytest.raises(ValueError, match=r"rank/size \(0, 1\).*\(1, 2\)"):
        model.forward_teacher_forcing(clean, x, t, ctx, context=context)
