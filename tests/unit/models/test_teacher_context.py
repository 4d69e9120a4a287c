"""The teacher-forcing context: the rows before the noisy ones run once (without grad) and the noisy
rows alone against their keys/values predict what the whole sequence does. Wan under Ulysses SP = 2
over gloo (each rank keeps its heads of every clean token); MiniMax-H3 ``[text | anchor | audio |
clean]`` without SP and at SP = 2 (Wan without SP: ``test_wan.py``)."""

from __future__ import annotations

import pytest
import torch

from solar.models.attention import NOISY, TokenMask
from solar.models.h3 import layout as L
from solar.models.sequence_parallel import SPGroup
from tests.support.distributed import run_ranks
from tests.unit.models import sp_worker


def _assert_pairs(pairs, single):
    for (full, half), (single_full, single_half) in zip(pairs, single, strict=True):
        assert (half - full).abs().max().item() <= 1e-5
        assert (full - single_full).abs().max().item() <= 1e-5
        assert (half - single_half).abs().max().item() <= 1e-5


def test_wan_context_under_sp2_gives_the_full_sequence_prediction():
    """5 frames: the clean half 3 + 2 frames a rank, the whole sequence 5 + 5."""
    single = sp_worker.run_context(0, 1, 5)
    for pairs in run_ranks(sp_worker.run_context, 2, 5):
        _assert_pairs(pairs, single)


def test_a_context_serves_the_sp_place_it_was_built_in():
    from tests.unit.models.wan_helpers import TI2V, dims, ours, randomize

    model = randomize(ours(dims(TI2V, heads=4, head_dim=8), chunk_latents=2, max_prior_clean_chunks=1,
                           camera_transform=None))
    x, clean, ctx, t, _, _ = sp_worker.inputs(4)
    context = model.teacher_context(clean, ctx)
    model.set_sequence_parallel(SPGroup(None, 1, 2))   # no collective runs before the check
    with torch.no_grad(), pytest.raises(ValueError, match=r"rank/size \(0, 1\).*\(1, 2\)"):
        model.forward_teacher_forcing(clean, x, t, ctx, context=context)


def test_h3_context_rows_never_see_a_noisy_row():
    """Why H3 can keep a context: by its teacher-forcing mask no text, anchor, audio or clean row
    attends to a noisy row (the rest is per row: modulation by the row's own time group)."""
    lay = L.build(text_tokens=3, frames=12, height=4, width=6, audio_latents=2, patch=(1, 2, 2),
                  teacher_forcing=True, chunk=2, anchor=True)
    dense = TokenMask(lay.kinds, lay.chunks, 2).dense()
    noisy = lay.kinds == NOISY
    assert lay.noisy.start == int((~noisy).sum()) and bool(noisy[lay.noisy].all())
    assert not dense[:lay.noisy.start][:, noisy].any()
    assert dense[lay.noisy][:, :lay.noisy.start].any()   # the noisy rows do read the context
    assert set(lay.groups[:lay.noisy.start].tolist()) == {L.G_TEXT, L.G_ANCHOR, L.G_AUDIO, L.G_CLEAN}


@pytest.mark.filterwarnings("ignore::UserWarning")   # flex attention on the CPU
@pytest.mark.parametrize("backend", ["reference", "sdpa", "flex"])
def test_h3_context_gives_the_full_sequence_prediction(backend):
    single = sp_worker.run_h3_context(0, 1, backend)
    _assert_pairs(single, single)


def test_h3_context_under_sp2_gives_the_full_sequence_prediction():
    single = sp_worker.run_h3_context(0, 1)
    for pairs in run_ranks(sp_worker.run_h3_context, 2):
        _assert_pairs(pairs, single)


def test_h3_context_without_anchor_or_audio():
    from tests.unit.models.family_helpers import h3_ours, randomize

    model = randomize(h3_ours(chunk_latents=2, max_prior_clean_chunks=1, camera_transform="logd4", anyflow=True))
    gen = torch.Generator().manual_seed(9)
    clean, z = (torch.randn(1, 24, 5, 4, 6, generator=gen) for _ in range(2))
    ctx, t = torch.randn(1, 3, 40, generator=gen), torch.rand(1, 5, generator=gen)
    cams = sp_worker.moving_cameras(5)
    with torch.no_grad():
        context = model.teacher_context(clean, ctx, cameras=cams)
        full = model.forward_teacher_forcing(clean, z, t, ctx, cameras=cams, r_timestep=t)
        half = model.forward_teacher_forcing(clean, z, t, ctx, cameras=cams, r_timestep=t, context=context)
    assert (full - half).abs().max().item() <= 1e-5


def test_h3_context_checks():
    from tests.unit.models.family_helpers import h3_ours

    model = h3_ours(chunk_latents=2, max_prior_clean_chunks=1, camera_transform=None)
    clean, ctx = torch.randn(1, 24, 4, 4, 6), torch.randn(1, 3, 40)
    context = model.teacher_context(clean, ctx)
    t = torch.rand(1, 4)
    with pytest.raises(ValueError, match="without grad"):
        model.forward_teacher_forcing(clean, clean, t, ctx, context=context)
    with torch.no_grad():
        with pytest.raises(ValueError, match="return_audio"):
            model.forward_teacher_forcing(clean, clean, t, ctx, context=context, return_audio=True)
        with pytest.raises(ValueError, match=r"\(4, 4, 6\), got \(2, 4, 6\)"):
            model.forward_teacher_forcing(clean, clean[:, :, :2], t[:, :2], ctx, context=context)
        model.set_sequence_parallel(SPGroup(None, 1, 2))
        with pytest.raises(ValueError, match=r"rank/size \(0, 1\)"):
            model.forward_teacher_forcing(clean, clean, t, ctx, context=context)
