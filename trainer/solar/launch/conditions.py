"""Conditioning tensors a launch reads from ``data.root`` besides its samples: the negative prompt
embedding (guidance) and MiniMax-H3's encoded audio silence."""

from __future__ import annotations

from pathlib import Path

import torch

from solar.data.layout import AUDIO_SILENCE
from solar.errors import SolarError


def negative_prompt(cfg, needed_by: str) -> torch.Tensor:
    """data.root/data.negative_prompt; ``needed_by`` names the setting that asked for it."""
    from safetensors.torch import load_file

    if not cfg.data.negative_prompt:
        raise SolarError(f"{needed_by} needs data.negative_prompt (the negative prompt embedding)")
    path = Path(cfg.data.root) / cfg.data.negative_prompt
    if not path.is_file():
        raise SolarError(f"data.negative_prompt {path} does not exist")
    return load_file(path)["prompt_embeds"].float()


def audio_silence(cfg) -> torch.Tensor | None:
    """H3's encoded silence [2, T_a, A] (audio rows of a video without sound); None for other families."""
    if cfg.model.family != "minimax_h3":
        return None
    from safetensors.torch import load_file

    path = Path(cfg.data.root) / AUDIO_SILENCE
    if not path.is_file():
        raise SolarError(f"MiniMax-H3 needs the encoded silence {path} (data.root/{AUDIO_SILENCE})")
    return load_file(path)["audio_latents"].float()
