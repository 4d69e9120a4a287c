"""The FLOP accounting of performance.md and the peak MFU is measured against."""

from __future__ import annotations

import pytest

from solar.config import families
from solar.train.flops import peak_flops, train_flops_per_clip


def test_ti2v_5b_at_81_frames_720p_is_about_0_92_pflop_per_clip():
    dims = families.spec("wan22_ti2v_5b").dims("released")
    flops = train_flops_per_clip(layers=dims.num_layers, hidden=dims.hidden_size, ffn=dims.ffn_dim, tokens=18_480)
    assert flops == pytest.approx(0.92e15, rel=0.01)
    linear_only = train_flops_per_clip(layers=dims.num_layers, hidden=dims.hidden_size, ffn=dims.ffn_dim, tokens=1)
    assert linear_only == pytest.approx(6 * 30 * (6 * 3072**2 + 2 * 3072 * 14336) + 14 * 30 * 3072)


@pytest.mark.parametrize("name, environ, peak", [
    ("NVIDIA H200", {}, 989e12),
    ("NVIDIA H20", {}, 148e12),
    ("NVIDIA GB200", {}, 2500e12),
    ("NVIDIA A100-SXM4-80GB", {}, 312e12),
    ("Some Future GPU", {}, None),          # unknown: no MFU rather than a wrong one
    (None, {}, None),                       # CPU
    (None, {"SOLAR_PEAK_FLOPS": "2e12"}, 2e12),
])
def test_peak_flops(name, environ, peak):
    assert peak_flops(name, environ) == peak
