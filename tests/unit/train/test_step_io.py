"""Issue 18's host-side step pieces on the CPU: per-sample values read in one copy, and the copy
helper (pinned and non-blocking on a GPU, tests/gpu/test_step_io.py; a plain copy here)."""

from __future__ import annotations

import torch

from solar.launch.batch import to_device
from solar.train.engine import read_records


def test_read_records_turns_every_tensor_into_its_float_and_leaves_the_rest():
    losses = torch.tensor([0.25, float("nan"), 3.0])
    records = [{"sample_id": f"s{i}", "timestep": 10.0 * i, "loss": losses[i]} for i in range(3)]
    out = read_records(records)
    assert [r["loss"] for r in out[::2]] == [0.25, 3.0] and out[1]["loss"] != out[1]["loss"]  # NaN stays NaN
    assert all(type(r["loss"]) is float for r in out)
    assert [(r["sample_id"], r["timestep"]) for r in out] == [("s0", 0.0), ("s1", 10.0), ("s2", 20.0)]
    assert isinstance(records[0]["loss"], torch.Tensor)  # the objective's records are not modified
    plain = [{"loss": 1.5}]
    assert read_records(plain) is plain  # floats already: nothing to read


def test_to_device_on_the_host_is_the_plain_copy():
    t = torch.randn(3, 4)
    assert to_device(t, "cpu") is t and torch.equal(to_device(t, torch.device("cpu")), t)
