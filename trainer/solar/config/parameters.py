"""Parameter counts of every family's backbone from its dims, without torch.

Each family's module tree written out as its linear layers and other tensors, so the memory
forecast (and the operator, which has no torch) can count parameters, what LoRA trains, and what
one block holds. ``tests/unit/config/test_parameters.py`` holds these counts equal to the real
modules built on the meta device, at released, tiny and other dims.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from solar.config.families import Dims

LTX_TIME_FREQ = 256          # LTX's sinusoidal timestep width is fixed (not dims.freq_dim)
H3_REFINER_BLOCKS = 2        # MiniMax-H3's text token-refiner depth
H3_AUDIO_CHANNELS = 32       # MiniMax-H3's audio latent features
H3_MODALITIES = 3            # AdaLN rows per block: video, audio, text


@dataclass(frozen=True)
class Linear:
    name: str                # the module path's last parts, for LoRA target matching
    fan_in: int
    fan_out: int
    bias: bool

    @property
    def count(self) -> int:
        return self.fan_in * self.fan_out + (self.fan_out if self.bias else 0)


@dataclass(frozen=True)
class Layout:
    """One family's parameters: outside the blocks, per block, per H3 refiner block."""

    outside: int                      # every tensor outside the repeated blocks
    block: tuple[Linear, ...]         # the linears of one block
    block_other: int                  # one block's non-linear tensors (norms, modulation tables)
    blocks: int
    refiner: tuple[Linear, ...] = ()  # H3: the linears of one token-refiner block
    refiner_other: int = 0
    refiners: int = 0

    @property
    def per_block(self) -> int:
        return sum(x.count for x in self.block) + self.block_other

    @property
    def total(self) -> int:
        refiner = self.refiners * (sum(x.count for x in self.refiner) + self.refiner_other)
        return self.outside + self.blocks * self.per_block + refiner

    def lora(self, pattern: str, rank: int) -> int:
        """Adapter parameters of ``rank`` on the block (and refiner) linears ``pattern`` matches."""
        target = re.compile(pattern)
        per = lambda linears: sum(rank * (x.fan_in + x.fan_out) for x in linears if target.search(x.name))  # noqa: E731
        return self.blocks * per(self.block) + self.refiners * per(self.refiner)


def _mlp2(d_in: int, hidden: int, d_out: int) -> int:
    return d_in * hidden + hidden + hidden * d_out + d_out


def _wan(d: Dims, anyflow: bool) -> Layout:
    D, f, patch = d.num_heads * d.head_dim, d.ffn_dim, math.prod(d.patch_size)  # Wan's width is heads x head dim
    outside = (2 * D                                    # scale_shift_table
               + D * d.in_channels * patch + D          # patch_embedding (Conv3d)
               + _mlp2(d.freq_dim, D, D)                # time_embedder
               + D * 6 * D + 6 * D                      # time_proj
               + _mlp2(d.text_dim, D, D)                # text_embedder
               + d.out_channels * patch * D + d.out_channels * patch)  # proj_out
    if anyflow:
        outside += _mlp2(d.freq_dim, D, D)              # delta_embedding
    attention = lambda i: tuple(Linear(f"attn{i}.{n}", D, D, True) for n in ("to_q", "to_k", "to_v", "to_out.0"))  # noqa: E731
    block = attention(1) + attention(2) + (Linear("ffn.net.0.proj", D, f, True), Linear("ffn.net.2", f, D, True))
    other = 6 * D + 2 * D + 2 * D + 2 * D               # modulation table; q/k norms of both attentions; norm2
    return Layout(outside, block, other, d.num_layers)


def _ltx(d: Dims) -> Layout:
    D, f, heads = d.num_heads * d.head_dim, d.ffn_dim, d.num_heads  # LTX's width is heads x head dim
    outside = (D                                        # keyframes_abs_pos_embedding
               + 2 * D                                  # scale_shift_table
               + D * d.in_channels + D                  # proj_in
               + _mlp2(LTX_TIME_FREQ, D, D)             # time_embed.emb.timestep_embedder
               + D * 9 * D + 9 * D                      # time_embed.linear
               + d.out_channels * D + d.out_channels)   # proj_out
    def attention(i: int) -> tuple[Linear, ...]:
        return (*(Linear(f"attn{i}.{n}", D, D, True) for n in ("to_q", "to_k", "to_v", "to_out.0")),
                Linear(f"attn{i}.to_gate_logits", D, heads, True))
    block = attention(1) + attention(2) + (Linear("ff.net.0.proj", D, f, False), Linear("ff.net.2", f, D, False))
    other = 9 * D + 2 * D + 4 * D                       # modulation and prompt tables; q/k norms
    return Layout(outside, block, other, d.num_layers)


def _h3(d: Dims, anyflow: bool) -> Layout:
    D, f, hd = d.hidden_size, d.ffn_dim, d.head_dim
    inner = d.num_heads * hd  # attention's width; H3's hidden size differs from it
    time_dim, patch = D // 2, d.in_channels * math.prod(d.patch_size)
    attention = (*(Linear(f"attn.{n}", D, inner, False) for n in ("to_q", "to_k", "to_v")),
                 Linear("attn.to_out.0", inner, D, False))
    swiglu = (Linear("ff.net.0.proj", D, 2 * f, False), Linear("ff.net.2", f, D, False))
    outside = (patch * D + D                            # proj_in
               + H3_AUDIO_CHANNELS * D + D              # audio_proj_in
               + d.text_dim * D + D                     # context_embedder
               + _mlp2(d.freq_dim, D, time_dim)         # time_embedder
               + D                                      # token_refiner.final_norm
               + D + time_dim * 2 * D + 2 * D           # norm_out (norm, linear)
               + D * patch + patch                      # proj_out
               + D * H3_AUDIO_CHANNELS + H3_AUDIO_CHANNELS)  # audio_proj_out
    if anyflow:
        outside += _mlp2(d.freq_dim, D, time_dim)       # delta_embedding
    block = attention + swiglu + (Linear("adaln_proj.linear", time_dim, 6 * D * H3_MODALITIES, True),)
    other = 2 * D + 2 * hd                              # norm1, norm2; q/k norms (per head dim)
    return Layout(outside, block, other, d.num_layers, attention + swiglu, 2 * D + 2 * hd, H3_REFINER_BLOCKS)


def layout(family: str, dims: Dims, *, anyflow: bool = False) -> Layout:
    if family in ("wan22_ti2v_5b", "wan22_i2v_a14b"):
        return _wan(dims, anyflow)
    if family == "ltx25_video":
        return _ltx(dims)
    if family == "minimax_h3":
        return _h3(dims, anyflow)
    raise ValueError(f"no parameter layout for family {family!r}")


# LoRA targets as the trainer matches them inside a block (models/lora.py): one alternation per name.
LORA_TARGETS = {"q": r"attn\d?\.to_q$", "k": r"attn\d?\.to_k$", "v": r"attn\d?\.to_v$", "o": r"attn\d?\.to_out\.0$",
                "ffn": r"(ffn|ff)\.net\.(0\.proj|2)$"}


def lora_pattern(targets: list[str]) -> str:
    return "|".join(f"(?:{LORA_TARGETS[t]})" for t in targets)
