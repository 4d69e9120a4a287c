"""Wan VAEs through diffusers: streaming tiled decode equals one-shot decode."""

from __future__ import annotations

import pytest
import torch

from solar.models.wan.vae import build_vae, decode, decode_stream, denormalize, pixel_frames


@pytest.mark.parametrize("name, channels", [("wan2.2", 48), ("wan2.1", 16)])
def test_decode_matches_diffusers(name, channels):
    vae = build_vae(name, seed=3)
    z = torch.randn(1, channels, 7, 4, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = vae.decode(denormalize(vae, z)).sample
    got = decode(vae, z, tile=3)  # tiles of 3 latents: 3 + 3 + 1
    assert got.shape == expected.shape == (1, 3, pixel_frames(7), 4 * vae.config.scale_factor_spatial,
                                           6 * vae.config.scale_factor_spatial)
    assert (got - expected).abs().max().item() <= 1e-5


@pytest.mark.slow
def test_240_latents_decode_in_60_latent_tiles_through_one_cache(monkeypatch):
    vae = build_vae("wan2.2", seed=1)
    z = torch.randn(1, 48, 240, 2, 2, generator=torch.Generator().manual_seed(1))
    clears = []
    original = vae.clear_cache
    monkeypatch.setattr(vae, "clear_cache", lambda: (clears.append(1), original())[1])
    tiles = list(decode_stream(vae, z))
    assert len(clears) == 2  # before the first tile and after the last, never in between
    assert [t.shape[2] for t in tiles] == [1 + 59 * 4] + [60 * 4] * 3
    streamed = torch.cat(tiles, dim=2)  # what decode() returns (decoding through it is tested above)
    with torch.no_grad():
        one_shot = vae.decode(denormalize(vae, z)).sample
    assert streamed.shape[2] == 957
    assert (streamed - one_shot).abs().max().item() <= 1e-5


def test_random_tiny_codecs_are_reproducible():
    a, b = build_vae("wan2.1", seed=5), build_vae("wan2.1", seed=5)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    before = torch.random.get_rng_state()
    build_vae("wan2.1", seed=6)
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG is untouched
