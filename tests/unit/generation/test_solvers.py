"""Stage0.5 solvers: on an exactly linear flow every solver lands on the clean sample."""

from __future__ import annotations

import pytest
import torch

from solar.generation import solvers


def _linear_flow(solver, x0, eps, *, reversed_time):
    x = eps.clone()
    for i in range(solver.steps):
        level = solver.level(i)
        sigma = 1.0 - level if reversed_time else level / 1000.0
        assert 0.0 <= sigma <= 1.0
        v = (x0 - eps) if reversed_time else (eps - x0)
        x = solver.step(v, i, x)
    return x


@pytest.mark.parametrize("name, steps, shift", [("euler", 30, 5.0), ("euler", 3, 1.0), ("unipc", 50, 5.0),
                                                ("unipc", 4, 3.0)])
def test_sigma_convention_reaches_the_clean_sample(name, steps, shift):
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(2, 4, 3, 5, 6, generator=g), torch.randn(2, 4, 3, 5, 6, generator=g)
    solver = solvers.build(name, steps, shift=shift, reversed_time=False)
    assert solver.steps == steps
    assert solver.level(0) == pytest.approx(1000.0, abs=1.0)  # UniPC starts one train step in
    assert torch.allclose(_linear_flow(solver, x0, eps, reversed_time=False), x0, atol=1e-4)


def test_h3_reversed_time_euler_reaches_the_clean_sample():
    g = torch.Generator().manual_seed(1)
    x0, eps = torch.randn(1, 4, 7, 2, 2, generator=g), torch.randn(1, 4, 7, 2, 2, generator=g)
    solver = solvers.build("euler", 30, shift=3.0, reversed_time=True)
    assert solver.level(0) == 0.0 and solver.level(29) > 0.0  # t climbs from noise (0) towards clean (1)
    assert torch.allclose(_linear_flow(solver, x0, eps, reversed_time=True), x0, atol=1e-5)


def test_shift_spends_steps_at_high_noise():
    plain = solvers.build("euler", 10, shift=1.0, reversed_time=False)
    shifted = solvers.build("euler", 10, shift=5.0, reversed_time=False)
    assert all(shifted.level(i) >= plain.level(i) for i in range(10))
    assert shifted.level(5) > plain.level(5) + 100


def test_unknown_or_misplaced_solvers_are_refused():
    with pytest.raises(ValueError, match="not a Stage0.5 solver"):
        solvers.build("flowmap", 4, shift=1.0, reversed_time=False)
    with pytest.raises(ValueError, match="H3 uses euler"):
        solvers.build("unipc", 4, shift=1.0, reversed_time=True)
