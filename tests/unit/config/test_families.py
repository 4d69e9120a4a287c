"""Family contract table: latent layouts and frame mapping."""

from __future__ import annotations

import pytest

from solar.config import families


@pytest.mark.parametrize("family, pixels, latents", [
    ("wan22_ti2v_5b", 81, 21), ("wan22_ti2v_5b", 153, 39), ("wan22_i2v_a14b", 81, 21),
    ("ltx25_video", 153, 20), ("minimax_h3", 158, 47), ("minimax_h3", 5, 2), ("minimax_h3", 22, 7),
])
def test_latent_frames(family, pixels, latents):
    assert families.spec(family).vae.latent_frames(pixels) == latents


@pytest.mark.parametrize("family, pixels", [
    ("wan22_ti2v_5b", 80), ("ltx25_video", 150), ("minimax_h3", 157), ("minimax_h3", 4), ("wan22_ti2v_5b", 0)])
def test_unrepresentable_frames(family, pixels):
    assert families.spec(family).vae.latent_frames(pixels) is None


@pytest.mark.parametrize("family, height, width, tokens", [
    ("wan22_ti2v_5b", 480, 864, 405), ("wan22_i2v_a14b", 480, 832, 1560),
    ("ltx25_video", 512, 768, 384), ("minimax_h3", 768, 1344, 1008),
])
def test_tokens_per_latent_frame_at_released_resolution(family, height, width, tokens):
    spec = families.spec(family)
    dims = spec.dims("released")
    lh, lw = height // spec.vae.spatial, width // spec.vae.spatial
    assert (lh // dims.patch_size[1]) * (lw // dims.patch_size[2]) == tokens


def test_aliases_and_heads():
    assert families.canonical_family("Wan2.2-TI2V-5B") == "wan22_ti2v_5b"
    assert families.canonical_family("ltx-2.5") == "ltx25_video"
    assert families.canonical_family("minimax-h3") == "minimax_h3"
    assert families.canonical_family("wan") is None
    heads = {f: families.spec(f).dims("released").num_heads for f in families.FAMILIES}
    assert heads == {"wan22_ti2v_5b": 24, "wan22_i2v_a14b": 40, "ltx25_video": 32, "minimax_h3": 56}
    for family in families.FAMILIES:  # tiny twins allow the SP degrees the recipes need
        assert families.spec(family).dims("tiny").num_heads % 4 == 0
