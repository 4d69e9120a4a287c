"""The latent codec of every family, through diffusers' implementations.

``build_codec(family, path=None, profile="tiny", seed=0)`` loads a released VAE from ``path`` (a
diffusers ``vae/`` folder) or builds a randomly initialised tiny twin with the family's channels and
compression (seeded; the global RNG is left alone). ``decode`` takes the model's normalised latents
and returns pixels in [-1, 1]: Wan decodes long horizons in 60-latent tiles through one temporal
cache (``wan/vae.py``); LTX-2 and MiniMax-H3 decode through their own ``decode`` (H3 chunks 5-latent
clips internally and cross-fades them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from solar.config import families
from solar.models.wan import vae as wan_vae

_LTX_TINY = dict(block_out_channels=(8, 8, 16, 16), decoder_block_out_channels=(16, 32, 64),
                 layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                 spatial_compression_ratio=32, temporal_compression_ratio=8)
_H3_TINY = dict(block_out_channels=(8, 8, 8, 8, 8, 8), norm_num_groups=4, decoder_num_layers=1,
                decoder_num_attention_heads=2, decoder_attention_head_dim=8)


@dataclass
class Codec:
    family: str
    vae: torch.nn.Module

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    def decode_stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        if self.family in ("wan22_ti2v_5b", "wan22_i2v_a14b"):
            yield from wan_vae.decode_stream(self.vae, latents)
            return
        yield self._decode_whole(latents)

    @torch.no_grad()
    def _decode_whole(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.to(self.dtype)
        if self.family == "ltx25_video":
            mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(z)
            std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(z)
            z = z * std / self.vae.config.scaling_factor + mean
        else:
            mean = torch.tensor(self.vae.config.latents_mean, dtype=z.dtype, device=z.device).view(1, -1, 1, 1, 1)
            std = torch.tensor(self.vae.config.latents_std, dtype=z.dtype, device=z.device).view(1, -1, 1, 1, 1)
            z = z * std + mean
        return self.vae.decode(z).sample.clamp(-1.0, 1.0)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.cat(list(self.decode_stream(latents)), dim=2)

    def pixel_frames(self, latent_frames: int) -> int:
        temporal = families.spec(self.family).vae.temporal
        if temporal == "h3":
            n, rest = divmod(latent_frames - 2, 5)
            if rest or n < 0:
                raise ValueError(f"MiniMax-H3 decodes 5n+2 latents, not {latent_frames}")
            return 17 * n + 5
        return 1 + (4 if temporal == "x4" else 8) * (latent_frames - 1)


def build_codec(family: str, *, path: str | Path | None = None, profile: str = "tiny", seed: int = 0) -> Codec:
    if family in ("wan22_ti2v_5b", "wan22_i2v_a14b"):
        name = families.spec(family).vae.name
        return Codec(family, wan_vae.build_vae(name, path=path, profile=profile, seed=seed))
    from solar.models import diffusers_lib

    diffusers_lib.prepare()
    from diffusers import AutoencoderKLLTX2Video, AutoencoderKLMiniMaxH3

    cls = AutoencoderKLLTX2Video if family == "ltx25_video" else AutoencoderKLMiniMaxH3
    if path is not None:
        return Codec(family, cls.from_pretrained(str(path)).eval())
    if profile != "tiny":
        raise ValueError(f"a released {family} codec needs its weights (model.vae_path)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Codec(family, cls(**(_LTX_TINY if family == "ltx25_video" else _H3_TINY)).eval())
