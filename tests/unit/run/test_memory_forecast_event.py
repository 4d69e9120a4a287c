"""The MemoryForecast event (issue 53 item 7): a forecast of GPU memory where the stages run on GPUs, in
units that show it (a tiny config's forecast is not "0.0 GiB"), and none on a machine without a GPU."""

from __future__ import annotations

import re

from solar.local.executor import has_gpu
from solar.run.machine import Observation, reconcile
from tests.unit.run.test_machine import PLAN, T0, _spec


def _events(gpus: bool) -> list[tuple[str, str, str]]:
    return reconcile(_spec(), None, Observation("tiny-wan", 1, T0, plan=PLAN, gpus=gpus)).events


def test_on_gpus_every_training_stage_has_a_forecast_that_is_not_zero():
    (forecast,) = [e for e in _events(True) if e[1] == "MemoryForecast"]
    sizes = re.findall(r"(fm|anyflow|dmd) (\d+\.\d) (MiB|GiB)", forecast[2])
    assert [s[0] for s in sizes] == ["fm", "anyflow", "dmd"], forecast
    assert all(float(value) > 0 for _, value, _ in sizes) and "0.0 GiB" not in forecast[2]


def test_without_a_gpu_no_forecast_is_said():
    events = _events(False)
    assert "MemoryForecast" not in [e[1] for e in events] and "Resolved" in [e[1] for e in events]


def test_a_machine_whose_gpus_are_hidden_has_none():
    assert has_gpu({"CUDA_VISIBLE_DEVICES": ""}) is False and has_gpu({"CUDA_VISIBLE_DEVICES": "-1"}) is False
