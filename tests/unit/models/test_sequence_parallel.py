"""SP = 2 over gloo equals SP = 1: outputs and gradients, uneven whole-frame splits, for the
``reference`` and ``sdpa`` attention backends."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from solar.models.sequence_parallel import frame_splits
from tests.support.distributed import run_ranks
from tests.unit.models import family_helpers, sp_worker

BACKENDS = ["reference", "sdpa"]


def on_backend(rank: int, world: int, backend: str, worker: str, *args):
    """``sp_worker.<worker>(rank, world, *args)`` with every model built on ``backend`` attention
    (module-level so the spawned ranks can import it)."""
    def override(build):
        def built_on_backend(*a, **options):
            model = build(*a, **{**options, "attention_backend": backend})
            assert model.cfg.attention_backend == backend
            return model
        return built_on_backend

    with mock.patch.object(sp_worker, "ours", override(sp_worker.ours)), \
            mock.patch.object(family_helpers, "h3_ours", override(family_helpers.h3_ours)), \
            mock.patch.object(family_helpers, "ltx_ours", override(family_helpers.ltx_ours)):
        return getattr(sp_worker, worker)(rank, world, *args)


def test_frame_splits():
    assert frame_splits(21, 2) == [11, 10]
    assert frame_splits(47, 4) == [12, 12, 12, 11]
    assert frame_splits(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        frame_splits(3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode, frames", [("bidirectional", 5), ("teacher_forcing", 5)])
def test_sp2_equals_sp1(mode, frames, backend):
    single_out, single_grads = on_backend(0, 1, backend, "run", mode, frames)
    results = run_ranks(on_backend, 2, backend, "run", mode, frames)
    for out, grads in results:
        assert (out - single_out).abs().max().item() <= 1e-5
        for name, g in single_grads.items():
            assert torch.allclose(grads[name], g, atol=1e-5, rtol=1e-4), name


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("worker", ["run_h3", "run_ltx"])
def test_h3_and_ltx_sp2_equal_sp1(worker, backend):
    single_out, single_grads = on_backend(0, 1, backend, worker)
    for out, grads in run_ranks(on_backend, 2, backend, worker):
        assert (out - single_out).abs().max().item() <= 1e-5
        for name, g in single_grads.items():
            assert torch.allclose(grads[name], g, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("worker, args", [("run", ("teacher_forcing", 5)), ("run_h3", ()), ("run_ltx", ())])
def test_sdpa_and_reference_backends_agree_at_sp1(worker, args):
    """The SP comparisons above are on two backends that compute the same thing."""
    ref_out, ref_grads = on_backend(0, 1, "reference", worker, *args)
    out, grads = on_backend(0, 1, "sdpa", worker, *args)
    assert (out - ref_out).abs().max().item() <= 1e-4
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-4, rtol=1e-3), name
