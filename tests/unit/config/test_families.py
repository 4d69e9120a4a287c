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


@pytest.mark.parametrize("given, meant", [("wan22_ti2v5b", "wan22_ti2v_5b"), ("wan2.2-ti2v-5", "wan22_ti2v_5b"),
                                          ("ltx25-video", "ltx25_video"), ("minimax-h4", "minimax_h3")])
def test_a_misspelt_family_is_named_with_the_family_it_is_closest_to(given, meant):
    line = families.not_a_family(given)
    assert line.startswith(f"--family {given!r} is not a family (did you mean {meant}?); use one of wan22_ti2v_5b, ")


def test_a_family_name_close_to_none_gets_the_list_only():
    assert families.not_a_family("sora") == ("--family 'sora' is not a family; use one of wan22_ti2v_5b, "
                                             "wan22_i2v_a14b, ltx25_video, minimax_h3")
