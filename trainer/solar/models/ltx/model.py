"""The LTX-2.5 video transformer (the video path of diffusers' LTX-2 audio-video model), with
camera PRoPE.

Parameter names follow diffusers' ``LTX2VideoTransformer3DModel`` for every video-path module, so
its checkpoints load after the audio modules are set aside (``convert.py`` lists them). Parts of
the reference without a counterpart here, because the route trains and generates video only:
the audio stream (``audio_*`` projections, norms, attentions, feed-forwards and tables), the
audio<->video cross-attentions and their modulation (``audio_to_video_*``, ``video_to_audio_*``,
``av_cross_attn_*``, per-block ``*_a2v_cross_attn_scale_shift_table``), the LTX-2.3 timestep-
dependent prompt modulation (``prompt_adaln``), and spatio-temporal guidance (perturbed attention,
an inference-time trick). With cross-modal attention off the reference's video output does not
depend on any of them, which is what the parity test checks.

Modulation is computed per latent frame; RoPE follows the reference's pixel-space coordinates
(causal first frame, fps-scaled time, fractions of the base grid); PRoPE acts on every head channel
after RoPE. Timesteps are sigma * 1000 as in the reference; frame 0 at 0 is the clean image
condition. Legend: B batch, S tokens, F frames, N tokens per frame, H heads, D head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solar.config.families import Dims
from solar.models.attention import build_attention
from solar.models.prope import apply_blocks, camera_matrices
from solar.models.sequence_parallel import SPGroup, frame_splits, gather_frames, ulysses
from solar.models.wan.model import MLP2, timestep_sinusoid


@dataclass(frozen=True)
class LTXConfig:
    dims: Dims
    eps: float = 1e-6
    gated_attn: bool = False
    cross_attn_mod: bool = False          # 9 modulation rows + a static prompt table per block
    ff_bias: bool = True
    caption_projection: bool = True       # False: prompt features already have the hidden width
    keyframes_embedding: bool = False
    rope_type: str = "interleaved"        # or "split"
    rope_theta: float = 10000.0
    base_frames: int = 20
    base_height: int = 2048
    base_width: int = 2048
    vae_scale: tuple[int, int, int] = (8, 32, 32)
    causal_offset: int = 1
    camera_transform: str | None = "linear"
    attention_backend: str = "auto"
    sdpa_kernel: str | None = None


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rope_angles(cfg: LTXConfig, frames: int, height: int, width: int, fps: float, device) -> torch.Tensor:
    """[F*h*w, 3 * (inner // 6)] angles in the reference's (frequency, axis) interleaving."""
    inner = cfg.dims.num_heads * cfg.dims.head_dim
    sf, sh, sw = cfg.vae_scale
    f = torch.arange(frames, dtype=torch.float32, device=device)
    f_start = ((f * sf) + cfg.causal_offset - sf).clamp(min=0) / fps
    f_end = (((f + 1) * sf) + cfg.causal_offset - sf).clamp(min=0) / fps
    t_mid = (f_start + f_end) / 2
    h_mid = (torch.arange(height, dtype=torch.float32, device=device) * sh + sh / 2)
    w_mid = (torch.arange(width, dtype=torch.float32, device=device) * sw + sw / 2)
    grid = torch.stack(torch.meshgrid(t_mid / cfg.base_frames, h_mid / cfg.base_height,
                                      w_mid / cfg.base_width, indexing="ij"), dim=-1).reshape(-1, 3)
    steps = inner // 6
    freqs = (torch.pow(cfg.rope_theta, torch.linspace(0.0, 1.0, steps, dtype=torch.float64, device=device))
             * math.pi / 2.0).to(torch.float32)
    angles = (grid[:, :, None] * 2 - 1) * freqs  # [S, 3, steps]
    return angles.transpose(-1, -2).flatten(1)  # [S, steps * 3]


def apply_ltx_rope(x_BSC: torch.Tensor, angles: torch.Tensor, cfg: LTXConfig) -> torch.Tensor:
    """RoPE over the flattened head channels, as the reference applies it (before splitting heads)."""
    inner = x_BSC.shape[-1]
    if cfg.rope_type == "interleaved":
        cos = angles.cos().repeat_interleave(2, dim=-1)
        sin = angles.sin().repeat_interleave(2, dim=-1)
        pad = inner % 6
        if pad:
            cos = torch.cat([torch.ones_like(cos[:, :pad]), cos], dim=-1)
            sin = torch.cat([torch.zeros_like(sin[:, :pad]), sin], dim=-1)
        real, imag = x_BSC.unflatten(2, (-1, 2)).unbind(-1)
        rotated = torch.stack([-imag, real], dim=-1).flatten(2)
        return (x_BSC.float() * cos + rotated.float() * sin).to(x_BSC.dtype)
    # split: per head, the first and second halves of the head channels form the pairs
    heads = cfg.dims.num_heads
    pad = inner // 2 - angles.shape[-1]
    cos, sin = angles.cos(), angles.sin()
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :pad]), sin], dim=-1)
    cos = cos.reshape(-1, heads, inner // heads // 2)[None]
    sin = sin.reshape(-1, heads, inner // heads // 2)[None]
    x = x_BSC.unflatten(-1, (heads, -1)).float()
    first, second = x.chunk(2, dim=-1)
    out = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return out.flatten(2).to(x_BSC.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, eps: float, kv_dim: int | None, gated: bool) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.norm_q = nn.RMSNorm(inner, eps=eps)
        self.norm_k = nn.RMSNorm(inner, eps=eps)
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(kv_dim or dim, inner)
        self.to_v = nn.Linear(kv_dim or dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])
        self.to_gate_logits = nn.Linear(dim, heads) if gated else None

    def finish(self, h: torch.Tensor, out_BSHD: torch.Tensor) -> torch.Tensor:
        if self.to_gate_logits is not None:
            out_BSHD = out_BSHD * (2.0 * torch.sigmoid(self.to_gate_logits(h)))[..., None]
        return self.to_out[0](out_BSHD.flatten(2))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool) -> None:
        super().__init__()
        proj = nn.Module()
        proj.proj = nn.Linear(dim, hidden, bias=bias)
        self.net = nn.ModuleList([proj, nn.Identity(), nn.Linear(hidden, dim, bias=bias)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](F.gelu(self.net[0].proj(x), approximate="tanh"))


class AdaLNSingle(nn.Module):
    """diffusers' LTX2AdaLayerNormSingle without additional conditions: (modulation, embedding)."""

    def __init__(self, dim: int, rows: int) -> None:
        super().__init__()
        self.emb = nn.Module()
        self.emb.timestep_embedder = MLP2(256, dim, dim, "silu")
        self.linear = nn.Linear(dim, rows * dim)

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedder = self.emb.timestep_embedder
        emb = embedder(timestep_sinusoid(t, 256).to(embedder.linear_1.weight.dtype))
        return self.linear(F.silu(emb)), emb


class Block(nn.Module):
    def __init__(self, d: Dims, cfg: LTXConfig) -> None:
        super().__init__()
        dim = d.num_heads * d.head_dim
        self.cfg = cfg
        # 1. Self-attention; 2. prompt cross-attention; 3. feed-forward (norms carry no weights)
        self.attn1 = Attention(dim, d.num_heads, d.head_dim, cfg.eps, None, cfg.gated_attn)
        self.attn2 = Attention(dim, d.num_heads, d.head_dim, cfg.eps, dim, cfg.gated_attn)
        self.ff = FeedForward(dim, d.ffn_dim, cfg.ff_bias)
        self.scale_shift_table = nn.Parameter(torch.randn(9 if cfg.cross_attn_mod else 6, dim) / dim**0.5)
        if cfg.cross_attn_mod:
            self.prompt_scale_shift_table = nn.Parameter(torch.randn(2, dim))

    def forward(self, x, context, ctx_bias, temb_BFRD, angles, cams, n, attend, prope_start):
        B, S, D = x.shape
        frames = S // n
        ada = (self.scale_shift_table[None, None] + temb_BFRD)            # [B, F, rows, D]
        ada = ada[:, :, None].expand(B, frames, n, -1, D).reshape(B, S, -1, D).unbind(dim=2)
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = ada[:6]
        eps = self.cfg.eps
        # 1. Self-attention
        h = rms(x, eps) * (1 + scale) + shift
        a = self.attn1
        q = apply_ltx_rope(a.norm_q(a.to_q(h)), angles, self.cfg).unflatten(-1, (a.heads, a.head_dim))
        k = apply_ltx_rope(a.norm_k(a.to_k(h)), angles, self.cfg).unflatten(-1, (a.heads, a.head_dim))
        v = a.to_v(h).unflatten(-1, (a.heads, a.head_dim))
        if cams is not None:
            q = apply_blocks(q, cams.query, n, prope_start)
            k = apply_blocks(k, cams.key, n, prope_start)
            v = apply_blocks(v, cams.key, n, prope_start)
        out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None).transpose(1, 2)
        if cams is not None:
            out = apply_blocks(out, cams.output, n, prope_start)
        x = x + a.finish(h, out) * gate
        # 2. Prompt cross-attention
        h = rms(x, eps)
        ctx = context
        if self.cfg.cross_attn_mod:
            shift_q, scale_q, gate_q = ada[6:9]
            h = h * (1 + scale_q) + shift_q
            shift_kv, scale_kv = self.prompt_scale_shift_table[None, None].unbind(dim=2)
            ctx = ctx * (1 + scale_kv) + shift_kv
        a = self.attn2
        q = a.norm_q(a.to_q(h)).unflatten(-1, (a.heads, a.head_dim)).transpose(1, 2)
        k = a.norm_k(a.to_k(ctx)).unflatten(-1, (a.heads, a.head_dim)).transpose(1, 2)
        v = a.to_v(ctx).unflatten(-1, (a.heads, a.head_dim)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx_bias).transpose(1, 2)
        out = a.finish(h, out)
        if self.cfg.cross_attn_mod:
            out = out * gate_q
        x = x + out
        # 3. Feed-forward
        h = rms(x, eps) * (1 + scale_mlp) + shift_mlp
        return x + self.ff(h) * gate_mlp


class LTXVideoDiT(nn.Module):
    def __init__(self, cfg: LTXConfig) -> None:
        super().__init__()
        d = cfg.dims
        dim = d.num_heads * d.head_dim
        self.cfg = cfg
        self.proj_in = nn.Linear(d.in_channels, dim)
        if cfg.keyframes_embedding:
            self.keyframes_abs_pos_embedding = nn.Parameter(torch.zeros(1, dim))
        if cfg.caption_projection:
            self.caption_projection = MLP2(d.text_dim, dim, dim, "gelu_tanh")
        self.time_embed = AdaLNSingle(dim, 9 if cfg.cross_attn_mod else 6)
        self.scale_shift_table = nn.Parameter(torch.randn(2, dim) / dim**0.5)
        self.transformer_blocks = nn.ModuleList([Block(d, cfg) for _ in range(d.num_layers)])
        self.proj_out = nn.Linear(dim, d.out_channels)
        self.sp: SPGroup | None = None
        self._attend = None

    def set_sequence_parallel(self, sp: SPGroup | None) -> None:
        self.sp = sp if sp is not None and sp.size > 1 else None

    def attention_fn(self):
        if self._attend is None:
            device = next(self.parameters()).device.type
            self._attend = build_attention(self.cfg.attention_backend, device=device, sdpa_kernel=self.cfg.sdpa_kernel)
        return self._attend

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, prompt_embeds: torch.Tensor, *,
                prompt_mask: torch.Tensor | None = None, cameras: torch.Tensor | None = None,
                fps: float = 24.0, keyframe_frames: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, 128, F, h, w] -> velocity [B, 128, F, h, w]; ``timestep`` [B] or [B, F] (sigma * 1000);
        ``prompt_mask`` [B, L] (1 keep, 0 drop); ``keyframe_frames`` [F] bool marks frames whose tokens
        get the keyframe embedding."""
        B, C, frames, H, W = x.shape
        n = H * W
        tokens = self.proj_in(x.flatten(2).transpose(1, 2))                    # [B, S, D]
        if keyframe_frames is not None and self.cfg.keyframes_embedding:
            marker = keyframe_frames.to(tokens.dtype).repeat_interleave(n)[None, :, None]
            tokens = tokens + marker * self.keyframes_abs_pos_embedding.to(tokens.dtype)
        t = torch.as_tensor(timestep, dtype=torch.float32, device=x.device)
        if t.dim() == 0:
            t = t.expand(B)
        if t.dim() == 1:
            t = t[:, None].expand(B, frames)
        temb, emb = self.time_embed(t)                                           # [B, F, rows*D], [B, F, D]
        temb = temb.unflatten(-1, (-1, tokens.shape[-1]))
        context = self.caption_projection(prompt_embeds) if self.cfg.caption_projection else prompt_embeds
        ctx_bias = None
        if prompt_mask is not None:
            ctx_bias = ((1 - prompt_mask.to(tokens.dtype)) * -10000.0)[:, None, None, :]
        angles = rope_angles(self.cfg, frames, H, W, fps, x.device)
        cams = None
        if self.cfg.camera_transform is not None and cameras is not None:
            cams = camera_matrices(cameras, self.cfg.camera_transform)
        attend = self.attention_fn()
        sp = self.sp
        if sp is not None:
            splits = frame_splits(frames, sp.size)
            lo = sum(splits[: sp.rank])
            hi = lo + splits[sp.rank]
            tokens, temb, emb, angles = tokens[:, lo * n:hi * n], temb[:, lo:hi], emb[:, lo:hi], angles[lo * n:hi * n]
            cams = None if cams is None else cams.select(slice(lo, hi))
            sizes = [s * n for s in splits]
            attend = ulysses(attend, sp, lambda: sizes)
        hidden = tokens
        for block in self.transformer_blocks:
            hidden = block(hidden, context, ctx_bias, temb, angles, cams, n, attend, self.cfg.dims.prope_start)
        shift, scale = (self.scale_shift_table[None, None] + emb[:, :, None]).unbind(dim=2)  # [B, F, D]
        Bh, S, D = hidden.shape
        normed = F.layer_norm(hidden, (D,), eps=1e-6).view(Bh, -1, n, D)
        out = self.proj_out((normed * (1 + scale[:, :, None]) + shift[:, :, None]).view(Bh, S, D))
        if sp is not None:
            out = gather_frames(out.view(Bh, -1, n, out.shape[-1]), sp, splits).flatten(1, 2)
        return out.transpose(1, 2).reshape(B, -1, frames, H, W)
