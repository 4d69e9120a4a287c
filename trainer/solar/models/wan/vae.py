"""Wan VAEs (2.2: 48 ch, 4x16x16; 2.1: 16 ch, 4x8x8) through diffusers' ``AutoencoderKLWan``, with
streaming decode of long horizons.

``decode_stream`` decodes latents tile by tile (``TILE_LATENTS`` = 60 latents per tile) through one
temporal cache: the cache is cleared once before the first tile and once after the last, never in
between, so a long rollout decodes exactly as one pass would while frames leave as each tile is
done (240 latents -> 957 frames). Latents are the model's normalised ones; they are mapped back
with the codec's ``latents_mean``/``latents_std`` before decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

TILE_LATENTS = 60

# Layouts of the released codecs (weights come from model.vae_path); tiny twins share channels
# and compression factors.
RELEASED = {
    "wan2.2": dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, in_channels=12,
                   out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4),
    "wan2.1": dict(base_dim=96, z_dim=16, scale_factor_spatial=8, scale_factor_temporal=4),
}
TINY = {
    "wan2.2": dict(base_dim=8, decoder_base_dim=8, z_dim=48, is_residual=True, in_channels=12,
                   out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                   num_res_blocks=1),
    "wan2.1": dict(base_dim=8, z_dim=16, scale_factor_spatial=8, scale_factor_temporal=4, num_res_blocks=1),
}


def build_vae(name: str, *, path: str | Path | None = None, profile: str = "tiny", seed: int = 0):
    """The codec: from ``path`` (a diffusers ``vae/`` folder) or randomly initialised from ``seed``."""
    from solar.models import diffusers_lib

    diffusers_lib.prepare()
    from diffusers import AutoencoderKLWan

    if path is not None:
        return AutoencoderKLWan.from_pretrained(str(path)).eval()
    layout = dict((TINY if profile == "tiny" else RELEASED)[name])
    z = layout["z_dim"]
    layout.update(latents_mean=[0.0] * z, latents_std=[1.0] * z)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoencoderKLWan(**layout).eval()


def denormalize(vae, latents: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(vae.config.latents_mean, dtype=latents.dtype, device=latents.device)
    std = torch.tensor(vae.config.latents_std, dtype=latents.dtype, device=latents.device)
    return latents * std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)


@torch.no_grad()
def decode_stream(vae, latents: torch.Tensor, tile: int = TILE_LATENTS) -> Iterator[torch.Tensor]:
    """Yield decoded pixel frames [B, 3, f, H, W] in [-1, 1], one tile of latents at a time."""
    from solar.models import diffusers_lib

    diffusers_lib.prepare()
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    z = denormalize(vae, latents.to(next(vae.parameters()).dtype))
    cuda = z.device.type == "cuda"
    if cuda:   # channels-last activations for channels-last weights (test_set.codec_for)
        z = z.contiguous(memory_format=torch.channels_last_3d)
    vae.clear_cache()
    try:
        frames = z.shape[2]
        for start in range(0, frames, tile):
            benchmark = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = benchmark or cuda   # the decoder's convolutions autotuned
            try:
                x = vae.post_quant_conv(z[:, :, start:start + tile])
                pieces = []
                for i in range(x.shape[2]):
                    vae._conv_idx = [0]
                    pieces.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map,
                                              feat_idx=vae._conv_idx, first_chunk=(start + i == 0)))
            finally:   # restored before the tile leaves: the caller's work runs with its own setting
                torch.backends.cudnn.benchmark = benchmark
            out = torch.cat(pieces, dim=2)
            if vae.config.patch_size is not None:
                out = unpatchify(out, patch_size=vae.config.patch_size)
            yield out.clamp(-1.0, 1.0)
    finally:
        vae.clear_cache()


def decode(vae, latents: torch.Tensor, tile: int = TILE_LATENTS) -> torch.Tensor:
    return torch.cat(list(decode_stream(vae, latents, tile)), dim=2)


def pixel_frames(latent_frames: int, temporal: int = 4) -> int:
    return 1 + temporal * (latent_frames - 1)
