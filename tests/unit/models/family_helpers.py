"""Tiny LTX-2.5 and MiniMax-H3 pairs: diffusers' reference and ours with the same random weights."""

from __future__ import annotations

import torch

from solar.config.families import Dims
from solar.models.registry import LTX25, build

H3_DIMS = Dims(2, 64, 4, 32, 96, 40, 32, 24, 24, (1, 2, 2), 24)


def ltx_dims(heads=2, head_dim=12, caption=None) -> Dims:
    dim = heads * head_dim
    return Dims(2, dim, heads, head_dim, 4 * dim, caption or dim, 256, 128, 128, (1, 1, 1), 0)


def ltx_reference(d: Dims, flags: dict, seed: int = 0):
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(seed)
    ref = LTX2VideoTransformer3DModel(
        in_channels=d.in_channels, out_channels=d.out_channels, num_attention_heads=d.num_heads,
        attention_head_dim=d.head_dim, cross_attention_dim=d.hidden_size, audio_in_channels=8,
        audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=d.num_layers, caption_channels=d.text_dim, **flags).eval()
    randomize(ref, seed)
    return ref


# diffusers' flags for LTX-2.5 (ours: registry.LTX25) and for an LTX-2.0-style variant.
LTX25_DIFFUSERS = dict(gated_attn=True, cross_attn_mod=True, use_prompt_adaln_single=False, ff_bias=False,
                       rope_type="split", use_prompt_embeddings=False, use_keyframes_abs_pos_embedding=True)
LTX20_DIFFUSERS = dict(rope_type="interleaved")
LTX20_OURS = dict(gated_attn=False, cross_attn_mod=False, ff_bias=True, caption_projection=True,
                  keyframes_embedding=False, rope_type="interleaved")


def ltx_ours(d: Dims, flags: dict | None = None, **options):
    from solar.models.ltx.model import LTXConfig, LTXVideoDiT

    options.setdefault("attention_backend", "reference")
    return LTXVideoDiT(LTXConfig(dims=d, **(LTX25 if flags is None else flags), **options)).eval()


def h3_reference(d: Dims = H3_DIMS, seed: int = 0):
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed)
    ref = MiniMaxH3Transformer3DModel(
        num_attention_heads=d.num_heads, attention_head_dim=d.head_dim, hidden_size=d.hidden_size,
        num_layers=d.num_layers, num_refiner_layers=2, ffn_dim=d.ffn_dim, in_channels=d.in_channels,
        audio_in_channels=32, text_dim=d.text_dim, freq_dim=d.freq_dim, time_embed_hidden_dim=d.hidden_size,
        time_embed_dim=d.hidden_size // 2, rope_freq_dim=d.prope_start // 6).eval()
    randomize(ref, seed)
    return ref


def h3_ours(d: Dims = H3_DIMS, **options):
    options.setdefault("attention_backend", "reference")
    return build("minimax_h3", d, **options).eval()


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model
