"""Deterministic safetensors bytes that the safetensors library reads back exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load

from solar.safetensors_io import encode

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


def test_round_trip_every_dtype():
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t_{str(d).split('.')[-1]}": (torch.randn(3, 5, generator=gen) * 50).to(d) for d in DTYPES}
    tensors["empty"] = torch.zeros(0, 4)
    tensors["scalar"] = torch.tensor(2.5)
    tensors["strided"] = torch.arange(12.0).reshape(3, 4).t()
    back = load(encode(tensors, {"b": "2", "a": "1"}))
    assert set(back) == set(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def test_bytes_do_not_depend_on_the_process():
    code = ("import sys, torch; from solar.safetensors_io import encode; "
            "sys.stdout.buffer.write(encode({'x': torch.arange(6.0), 'a': torch.ones(2)}, "
            "{'zeta': '1', 'alpha': '2', 'mid': '3'}))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                           env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout
            for seed in ("1", "2", "3")}
    assert len(outs) == 1


def test_rejects_bad_metadata():
    with pytest.raises(TypeError):
        encode({"x": torch.ones(1)}, {"a": 1})
