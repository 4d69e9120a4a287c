"""SP = 2 over gloo equals SP = 1: outputs and gradients, uneven whole-frame splits."""

from __future__ import annotations

import pytest
import torch

from solar.models.sequence_parallel import frame_splits
from tests.support.distributed import run_ranks
from tests.unit.models import sp_worker


def test_frame_splits():
    assert frame_splits(21, 2) == [11, 10]
    assert frame_splits(47, 4) == [12, 12, 12, 11]
    assert frame_splits(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        frame_splits(3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("mode, frames", [("bidirectional", 5), ("teacher_forcing", 5)])
def test_sp2_equals_sp1(mode, frames):
    single_out, single_grads = sp_worker.run(0, 1, mode, frames)
    results = run_ranks(sp_worker.run, 2, mode, frames)
    for out, grads in results:
        assert (out - single_out).abs().max().item() <= 1e-5
        for name, g in single_grads.items():
            assert torch.allclose(grads[name], g, atol=1e-5, rtol=1e-4), name


@pytest.mark.slow
@pytest.mark.parametrize("worker", ["run_h3", "run_ltx"])
def test_h3_and_ltx_sp2_equal_sp1(worker):
    fn = getattr(sp_worker, worker)
    single_out, single_grads = fn(0, 1)
    for out, grads in run_ranks(fn, 2):
        assert (out - single_out).abs().max().item() <= 1e-5
        for name, g in single_grads.items():
            assert torch.allclose(grads[name], g, atol=1e-5, rtol=1e-4), name
