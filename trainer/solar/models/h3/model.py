"""The MiniMax-H3 DiT: one packed self-attention sequence, camera PRoPE on head channels [96, 128).

Parameter names follow diffusers' ``MiniMaxH3Transformer3DModel`` (so its checkpoints load as they
are). Rows are laid out by ``layout.py``; modulation is selected per row from a (time group x
modality) table, as in the reference. Added here:

- camera PRoPE on the video rows (the anchor uses frame 0's camera) after H3's RoPE channels;
- teacher forcing ``[text | anchor | audio | clean | noisy]`` with ``TokenMask`` (the prefix rows
  see only the prefix, so they can be cached; no row before the noisy ones sees a noisy row, so
  ``teacher_context`` runs them once for forwards without grad, also under Ulysses SP),
  chunk-by-chunk generation with a KV cache of the prefix and of the committed clean chunks within
  the window (5 latents a chunk, 6-chunk window);
- AnyFlow's ``delta_embedding`` (a copy of ``time_embedder``) for the endpoint r.

H3 time is reversed: t = 1 is clean (x_t = t x0 + (1 - t) eps); timesteps are in [0, 1].
Legend: B batch, S rows, G time groups, F frames, H heads, D head dim.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from solar.config.families import Dims
from solar.models.attention import TokenMask, build_attention, layout_mask, prepare_mask
from solar.models.h3 import layout as L
from solar.models.prope import CameraMatrices, apply_rows, camera_matrices
from solar.models.sequence_parallel import HeadExchange, SPGroup, frame_splits, gather_frames
from solar.models.wan.model import MLP2, timestep_sinusoid


@dataclass(frozen=True)
class H3Config:
    dims: Dims
    num_refiner_layers: int = 2
    audio_in_channels: int = 32
    norm_eps: float = 1e-5
    qk_norm_eps: float = 1e-5
    final_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    camera_transform: str | None = "logd4"
    chunk_latents: int = 5
    max_prior_clean_chunks: int = 5
    anchor_timestep: float = 0.999
    anyflow: bool = False
    anyflow_gate: float = 0.25
    attention_backend: str = "auto"
    sdpa_kernel: str | None = None

    @property
    def time_embed_hidden_dim(self) -> int:
        return self.dims.hidden_size

    @property
    def time_embed_dim(self) -> int:
        return self.dims.hidden_size // 2

    @property
    def rope_freq_dim(self) -> int:
        return self.dims.prope_start // 6


def rope_tables(positions: torch.Tensor, freq_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """H3 RoPE: one inv_freq shared by (t, h, w); [S, 6 * freq_dim] cos/sin (rotate-half layout)."""
    inv = 1.0 / theta ** (torch.arange(0, 2 * freq_dim, 2, dtype=torch.float32) / (2 * freq_dim))
    angles = positions.to(torch.float32)[:, :, None] * inv.to(positions.device)[None, None]
    angles = angles.permute(0, 1, 2).reshape(positions.shape[0], -1)  # (t, h, w) blocks
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope_half(x_BSHD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dim = cos.shape[-1]
    head, rest = x_BSHD[..., :dim], x_BSHD[..., dim:]
    c, s = cos.to(x_BSHD.dtype)[None, :, None], sin.to(x_BSHD.dtype)[None, :, None]
    x1, x2 = head.chunk(2, dim=-1)
    rotated = head * c + torch.cat([-x2, x1], dim=-1) * s
    return torch.cat([rotated, rest], dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(hidden, inner, bias=False)
        self.to_k = nn.Linear(hidden, inner, bias=False)
        self.to_v = nn.Linear(hidden, inner, bias=False)
        self.norm_q = nn.RMSNorm(head_dim, eps=eps)
        self.norm_k = nn.RMSNorm(head_dim, eps=eps)
        self.to_out = nn.ModuleList([nn.Linear(inner, hidden, bias=False)])

    def qkv(self, h: torch.Tensor):
        q = self.norm_q(self.to_q(h).unflatten(-1, (self.heads, self.head_dim)))
        k = self.norm_k(self.to_k(h).unflatten(-1, (self.heads, self.head_dim)))
        v = self.to_v(h).unflatten(-1, (self.heads, self.head_dim))
        return q, k, v


class SwiGLUFeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        gate = nn.Module()
        gate.proj = nn.Linear(dim, 2 * hidden, bias=False)
        self.net = nn.ModuleList([gate, nn.Identity(), nn.Linear(hidden, dim, bias=False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.net[0].proj(x).chunk(2, dim=-1)
        return self.net[2](value * F.silu(gate))


class RefinerBlock(nn.Module):
    def __init__(self, d: Dims, cfg: H3Config) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(d.hidden_size, d.num_heads, d.head_dim, cfg.qk_norm_eps)
        self.norm2 = nn.RMSNorm(d.hidden_size, eps=cfg.norm_eps)
        self.ff = SwiGLUFeedForward(d.hidden_size, d.ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn.qkv(self.norm1(x))
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
        x = x + self.attn.to_out[0](out.flatten(2))
        return x + self.ff(self.norm2(x))


class TokenRefiner(nn.Module):
    def __init__(self, d: Dims, cfg: H3Config) -> None:
        super().__init__()
        self.refiner_blocks = nn.ModuleList([RefinerBlock(d, cfg) for _ in range(cfg.num_refiner_layers)])
        self.final_norm = nn.RMSNorm(d.hidden_size, eps=cfg.final_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.refiner_blocks:
            x = block(x)
        return self.final_norm(x)


class AdaLNProjection(nn.Module):
    def __init__(self, time_dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.linear = nn.Linear(time_dim, 6 * hidden * L.MODALITIES)

    def forward(self, temb_BGT: torch.Tensor) -> list[torch.Tensor]:
        """Six [B, G * 3, hidden] tables, row (group g, modality m) at g * 3 + m."""
        out = self.linear(F.silu(temb_BGT).to(self.linear.weight.dtype))
        B, G = temb_BGT.shape[:2]
        return list(out.view(B, G * L.MODALITIES, 6 * self.hidden).chunk(6, dim=-1))


class OutputNorm(nn.Module):
    def __init__(self, hidden: int, time_dim: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.linear = nn.Linear(time_dim, 2 * hidden)

    def forward(self, x: torch.Tensor, temb_BGT: torch.Tensor, group_of_row: torch.Tensor) -> torch.Tensor:
        shift, scale = self.linear(F.silu(temb_BGT).to(self.linear.weight.dtype)).chunk(2, dim=-1)
        return self.norm(x) * (1.0 + scale.index_select(1, group_of_row)) + shift.index_select(1, group_of_row)


@dataclass
class _Rows:
    """What a block needs about the rows it runs over."""

    temb: torch.Tensor                # [B, G, time_dim] time embedding of every group
    adaln: torch.Tensor               # [S] each row's (group, modality) row of the AdaLN tables
    cos: torch.Tensor
    sin: torch.Tensor
    camera_frame: torch.Tensor        # [S]
    cams: CameraMatrices | None
    mask: TokenMask | None
    attend: object
    exchange: HeadExchange | None = None   # Ulysses SP: attention runs on this rank's heads, all rows


@dataclass
class LayerCache:
    prefix_k: torch.Tensor | None = None
    prefix_v: torch.Tensor | None = None
    k: torch.Tensor | None = None     # committed clean chunks (window)
    v: torch.Tensor | None = None
    rows: list[int] = field(default_factory=list)


@dataclass
class KVCache:
    layers: list[LayerCache]
    text_tokens: int
    grid: torch.Tensor
    window_chunks: int
    committed_frames: int = 0
    audio_timestep: torch.Tensor | None = None


@dataclass
class TeacherContext:
    """The rows ``[text | anchor | audio | clean]`` of a teacher-forcing sequence, run once: every
    layer's keys/values of them (in ``prefix_k``/``prefix_v``). None of these rows depends on the
    noisy rows: by the mask rule (``TokenMask``) prefix rows see only prefix rows and clean rows only
    prefix rows and clean chunks; a row's modulation and output norm come from its own time group
    (text 1, anchor ``anchor_timestep``, audio the given time, clean 1; r = t for all four, only the
    noisy groups take r_timestep); positions and camera frames come from the layout. So forwards
    with the same clean latents, prompt, anchor, audio, audio time and cameras see exactly these,
    and one without grad given this context runs the noisy rows alone. Under Ulysses SP each rank
    keeps its heads of every context row (the layout attention sees after the exchange)."""

    cache: KVCache
    layout: L.Layout                   # the whole teacher-forcing layout, on the device
    mask: TokenMask                    # the teacher-forcing rule, queries = the noisy rows
    shape: tuple[int, int, int]        # frames, height, width of the clean (and noisy) latents
    audio_timestep: object
    dtype: torch.dtype                 # the rows' dtype (the noisy rows are cast to it)
    sp: tuple[int, int] = (0, 1)       # (rank, size) of the SP group it was built in


class Block(nn.Module):
    def __init__(self, d: Dims, cfg: H3Config) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(d.hidden_size, d.num_heads, d.head_dim, cfg.qk_norm_eps)
        self.norm2 = nn.RMSNorm(d.hidden_size, eps=cfg.norm_eps)
        self.ff = SwiGLUFeedForward(d.hidden_size, d.ffn_dim)
        self.adaln_proj = AdaLNProjection(cfg.time_embed_dim, d.hidden_size)
        self.prope_start = d.prope_start

    def attention(self, h: torch.Tensor, rows: _Rows, layer: LayerCache | None, mode: str) -> torch.Tensor:
        q, k, v = self.attn.qkv(h)
        q, k = apply_rope_half(q, rows.cos, rows.sin), apply_rope_half(k, rows.cos, rows.sin)
        if rows.cams is not None:
            q = apply_rows(q, rows.cams.query, rows.camera_frame, self.prope_start)
            k = apply_rows(k, rows.cams.key, rows.camera_frame, self.prope_start)
            v = apply_rows(v, rows.cams.key, rows.camera_frame, self.prope_start)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if rows.exchange is not None:  # [B, H/sp, S_all, D], the layout a teacher context keeps
            q, k, v = (rows.exchange.to_heads(t) for t in (q, k, v))
        if layer is None:
            out = rows.attend(q, k, v, rows.mask)
        elif mode == "prefix":   # generation's prefix (no mask) or a teacher context's rows
            layer.prefix_k, layer.prefix_v = k, v
            out = rows.attend(q, k, v, rows.mask)
        else:                    # generation's chunks (no mask) or a teacher context's noisy rows
            keys = [layer.prefix_k] + ([layer.k] if layer.k is not None else []) + [k]
            values = [layer.prefix_v] + ([layer.v] if layer.v is not None else []) + [v]
            out = rows.attend(q, torch.cat(keys, 2), torch.cat(values, 2), rows.mask)
            if mode == "commit":
                layer.k = k if layer.k is None else torch.cat([layer.k, k], 2)
                layer.v = v if layer.v is None else torch.cat([layer.v, v], 2)
        if rows.exchange is not None:
            out = rows.exchange.to_sequence(out)
        out = out.transpose(1, 2)
        if rows.cams is not None:
            out = apply_rows(out, rows.cams.output, rows.camera_frame, self.prope_start)
        return self.attn.to_out[0](out.flatten(2))

    def forward(self, x: torch.Tensor, rows: _Rows, layer: LayerCache | None = None, mode: str = "full") -> torch.Tensor:
        # Per-row modulation from the per-group tables, inside the block: under activation
        # checkpointing only the small tables are kept, not six [B, S, hidden] rows per block.
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = (
            m.index_select(1, rows.adaln) for m in self.adaln_proj(rows.temb))
        h = self.norm1(x) * (1.0 + scale) + shift
        x = x + gate * self.attention(h, rows, layer, mode)
        h = self.norm2(x) * (1.0 + scale_mlp) + shift_mlp
        return x + gate_mlp * self.ff(h)


class H3DiT(nn.Module):
    def __init__(self, cfg: H3Config) -> None:
        super().__init__()
        d = cfg.dims
        self.cfg = cfg
        patch_dim = d.in_channels * math.prod(d.patch_size)
        # 1. Per-modality input projections
        self.proj_in = nn.Linear(patch_dim, d.hidden_size)
        self.audio_proj_in = nn.Linear(cfg.audio_in_channels, d.hidden_size)
        self.context_embedder = nn.Linear(d.text_dim, d.hidden_size)
        # 2. Timestep embedding shared by every AdaLN projection
        self.time_embedder = MLP2(d.freq_dim, cfg.time_embed_hidden_dim, cfg.time_embed_dim, "silu")
        self.delta_embedding: MLP2 | None = None
        # 3. Text refiner and the block stack
        self.token_refiner = TokenRefiner(d, cfg)
        self.transformer_blocks = nn.ModuleList([Block(d, cfg) for _ in range(d.num_layers)])
        # 4. Output norm and heads
        self.norm_out = OutputNorm(d.hidden_size, cfg.time_embed_dim, cfg.final_norm_eps)
        self.proj_out = nn.Linear(d.hidden_size, patch_dim)
        self.audio_proj_out = nn.Linear(d.hidden_size, cfg.audio_in_channels)
        if cfg.anyflow:
            self.enable_anyflow()
        self.sp: SPGroup | None = None
        self._attend = None
        self._layouts: dict[tuple, L.Layout] = {}   # row layouts by call shape (_layout)

    # --- set-up -----------------------------------------------------------------------------
    def enable_anyflow(self) -> None:
        self.delta_embedding = copy.deepcopy(self.time_embedder)

    def init_delta_from_time(self) -> None:
        self.delta_embedding.load_state_dict(self.time_embedder.state_dict())

    def set_sequence_parallel(self, sp: SPGroup | None) -> None:
        self.sp = sp if sp is not None and sp.size > 1 else None

    def attention_fn(self):
        if self._attend is None:
            device = next(self.parameters()).device.type
            self._attend = build_attention(self.cfg.attention_backend, device=device,
                                           sdpa_kernel=self.cfg.sdpa_kernel)
        return self._attend

    # --- pieces -----------------------------------------------------------------------------
    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        pt, ph, pw = self.cfg.dims.patch_size
        B, C, Fr, H, W = x.shape
        x = x.reshape(B, C, Fr // pt, pt, H // ph, ph, W // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        return x.reshape(B, (Fr // pt) * (H // ph) * (W // pw), C * pt * ph * pw)

    def unpatchify(self, rows: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
        pt, ph, pw = self.cfg.dims.patch_size
        B, C = rows.shape[0], self.cfg.dims.out_channels
        x = rows.reshape(B, frames // pt, height // ph, width // pw, C, pt, ph, pw)
        return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(B, C, frames, height, width)

    def time_embedding(self, t_BG: torch.Tensor, r_BG: torch.Tensor | None) -> torch.Tensor:
        param = self.time_embedder.linear_1.weight
        temb = self.time_embedder(timestep_sinusoid(t_BG, self.cfg.dims.freq_dim).to(param.dtype))
        if self.delta_embedding is not None:
            if r_BG is None:
                raise ValueError("an AnyFlow model needs the endpoint r_timestep")
            remb = self.delta_embedding(timestep_sinusoid(r_BG, self.cfg.dims.freq_dim).to(param.dtype))
            temb = (1.0 - self.cfg.anyflow_gate) * temb + self.cfg.anyflow_gate * remb
        elif r_BG is not None:
            raise ValueError("r_timestep given to a model without AnyFlow conditioning")
        return temb

    def _cams(self, cameras: torch.Tensor | None, frames: int, batch: int) -> CameraMatrices | None:
        if self.cfg.camera_transform is None or cameras is None:
            return None
        if tuple(cameras.shape) != (batch, frames, 4, 4):
            raise ValueError(f"cameras must be [B, F, 4, 4] = [{batch}, {frames}, 4, 4], got {list(cameras.shape)}")
        return camera_matrices(cameras, self.cfg.camera_transform)

    def _prefix_rows(self, prompt_embeds, anchor, audio) -> list[torch.Tensor]:
        text = self.token_refiner(self.context_embedder(prompt_embeds))
        rows = [text]
        if anchor is not None:
            rows.append(self.proj_in(self.patchify(anchor)).to(text.dtype))
        if audio is not None:
            B, channels, T, A = audio.shape
            rows.append(self.audio_proj_in(audio.reshape(B, channels * T, A)).to(text.dtype))
        return rows

    def _stack(self, x: torch.Tensor, temb: torch.Tensor, rows: L.RowSlice, cams, mask,
               cache: KVCache | None = None, mode: str = "full", sharded: bool = False):
        """Blocks, output norm and both heads over the given rows -> (video rows, audio rows) outputs
        for every row ((None, None) in mode ``prefix``: a run kept for its keys/values); SP splits the
        rows when enabled (heads run locally, then rows are gathered). With a cache only a teacher
        context's runs (``sharded``) split; generation runs whole on every rank."""
        adaln = rows.groups * L.MODALITIES + rows.tags
        group_of_row, camera_frame, positions = rows.groups, rows.camera_frame, rows.positions
        attend = self.attention_fn()
        prepare_mask(attend, mask)
        sp = self.sp if cache is None or sharded else None
        exchange = None
        if sp is not None:
            splits = frame_splits(x.shape[1], sp.size)  # near-even contiguous row runs
            lo = sum(splits[: sp.rank])
            hi = lo + splits[sp.rank]
            x, adaln, group_of_row = x[:, lo:hi], adaln[lo:hi], group_of_row[lo:hi]
            camera_frame, positions = camera_frame[lo:hi], positions[lo:hi]
            exchange = HeadExchange(sp, splits)
        cos, sin = rope_tables(positions, self.cfg.rope_freq_dim, self.cfg.rope_theta)
        step = _Rows(temb, adaln, cos, sin, camera_frame, cams, mask, attend, exchange)
        for i, block in enumerate(self.transformer_blocks):
            x = block(x, step, None if cache is None else cache.layers[i], mode)
        if mode == "prefix":
            return None, None
        out = self.norm_out(x, temb, group_of_row)
        video = self.proj_out(out.to(self.proj_out.weight.dtype))
        audio = self.audio_proj_out(out.to(self.audio_proj_out.weight.dtype))
        if sp is not None:
            video, audio = gather_frames(video, sp, splits), gather_frames(audio, sp, splits)
        return video, audio

    def _groups(self, B: int, frames: int, t_video: torch.Tensor, r_video: torch.Tensor | None,
                text_t, audio_t, device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, G] times of the groups text, anchor, audio, clean, noisy frames (and their r)."""
        def col(value):
            return torch.as_tensor(value, dtype=torch.float32, device=device).reshape(-1).expand(B)[:, None]
        t = torch.cat([col(text_t), col(self.cfg.anchor_timestep), col(audio_t), col(1.0), t_video], dim=1)
        r = None
        if self.delta_embedding is not None:
            r = t.clone()
            if r_video is not None:
                r[:, L.NOISY_BASE:] = r_video
        return t, r

    def _frame_time(self, value, B: int, frames: int, device) -> torch.Tensor:
        t = torch.as_tensor(value, dtype=torch.float32, device=device)
        if t.dim() == 0:
            t = t.expand(B)
        if t.dim() == 1:
            t = t[:, None].expand(B, frames)
        if tuple(t.shape) != (B, frames):
            raise ValueError(f"timestep must be [B] or [B, F] = [{B}, {frames}], got {list(t.shape)}")
        return t

    # --- public forwards --------------------------------------------------------------------
    def forward(self, x: torch.Tensor, timestep, prompt_embeds: torch.Tensor, *,
                anchor: torch.Tensor | None = None, audio: torch.Tensor | None = None, audio_timestep=None,
                text_timestep=None, cameras: torch.Tensor | None = None, r_timestep=None,
                return_audio: bool = False):
        """Bidirectional full clip. x [B, C, F, H, W] (H3 time: 1 = clean); anchor [B, C, 1, H, W]; audio
        [B, 2, T_a, A] encoded silence. Returns the video velocity [B, C, F, H, W] (and audio rows)."""
        return self._full(None, x, timestep, prompt_embeds, anchor, audio, audio_timestep, text_timestep,
                          cameras, r_timestep, return_audio)

    def forward_teacher_forcing(self, clean: torch.Tensor, noisy: torch.Tensor, timestep, prompt_embeds, *,
                                anchor=None, audio=None, audio_timestep=None, cameras=None, r_timestep=None,
                                return_audio: bool = False, context: TeacherContext | None = None):
        """``[text | anchor | audio | clean | noisy]`` with the chunked mask; predicts the noisy frames.
        With ``context`` (``teacher_context`` of the same clean latents, prompt, anchor, audio, audio
        time and cameras) only the noisy rows run, against the context's keys/values: the same
        prediction."""
        if context is not None:
            return self._noisy_rows(noisy, timestep, context, cameras, r_timestep, return_audio)
        return self._full(clean, noisy, timestep, prompt_embeds, anchor, audio, audio_timestep, 1.0,
                          cameras, r_timestep, return_audio)

    @torch.no_grad()
    def teacher_context(self, clean: torch.Tensor, prompt_embeds: torch.Tensor, *, anchor=None, audio=None,
                        audio_timestep=None, cameras=None) -> TeacherContext:
        """Run the rows ``[text | anchor | audio | clean]`` of the teacher-forcing sequence once (without
        grad) and keep what the noisy rows read from them. Under SP every rank of the group calls it
        with the same inputs, as for the full forward."""
        B, _, frames, H, W = clean.shape
        device = clean.device
        audio_t = 1.0 if audio_timestep is None else audio_timestep
        lay = self._layout(prompt_embeds, frames, H, W, audio, anchor, True, device)
        pieces = self._prefix_rows(prompt_embeds, anchor, audio)
        pieces.append(self.proj_in(self.patchify(clean)).to(pieces[0].dtype))
        hidden = torch.cat(pieces, dim=1)
        rows = lay.noisy.start   # the context rows come first
        # the noisy groups' times: no context row reads them
        t_groups, r_groups = self._groups(B, frames, torch.ones(B, frames, device=device), None, 1.0, audio_t, device)
        window = self.cfg.max_prior_clean_chunks
        cache = KVCache([LayerCache() for _ in self.transformer_blocks], prompt_embeds.shape[1],
                        L.frame_grid(H, W, self.cfg.dims.patch_size)[0], window)
        self._stack(hidden, self.time_embedding(t_groups, r_groups), lay.slice_rows(slice(0, rows)),
                    self._cams(cameras, frames, B),
                    layout_mask((id(lay), rows, window), lay.kinds[:rows], lay.chunks[:rows], window, lay), cache,
                    "prefix", sharded=True)
        full = layout_mask((id(lay), None, window), lay.kinds, lay.chunks, window, lay)
        return TeacherContext(cache, lay, full.queries_from(rows), (frames, H, W), audio_t, hidden.dtype,
                              _sp_place(self.sp))

    def _noisy_rows(self, x, timestep, context: TeacherContext, cameras, r_timestep, return_audio: bool):
        if torch.is_grad_enabled():
            raise ValueError("a teacher-forcing context serves forwards without grad (the context rows' "
                             "gradients would be lost)")
        if return_audio:
            raise ValueError("the audio rows' outputs come from the whole teacher-forcing sequence; call "
                             "without the context for return_audio")
        B, _, frames, H, W = x.shape
        if (frames, H, W) != context.shape:
            raise ValueError(f"the teacher-forcing context holds latents of (frames, height, width) {context.shape}, "
                             f"got {(frames, H, W)}")
        if context.sp != _sp_place(self.sp):
            raise ValueError(f"the teacher-forcing context was built as sequence-parallel rank/size {context.sp}, "
                             f"this forward runs as {_sp_place(self.sp)}")
        device = x.device
        t = self._frame_time(timestep, B, frames, device)
        r = None if r_timestep is None else self._frame_time(r_timestep, B, frames, device)
        lay = context.layout
        hidden = self.proj_in(self.patchify(x)).to(context.dtype)
        t_groups, r_groups = self._groups(B, frames, t, r, 1.0, context.audio_timestep, device)
        video, _ = self._stack(hidden, self.time_embedding(t_groups, r_groups), lay.slice_rows(lay.noisy),
                               self._cams(cameras, frames, B), context.mask, context.cache, "chunk", sharded=True)
        return self.unpatchify(video, frames, H, W)

    def _layout(self, prompt_embeds, frames: int, H: int, W: int, audio, anchor, tf: bool, device) -> L.Layout:
        """The row layout of a call's shape, built (on the host, then copied) once per shape and kept:
        the same object every step, so its masks are too (``layout_mask``)."""
        options = dict(text_tokens=prompt_embeds.shape[1], frames=frames, height=H, width=W,
                       audio_latents=0 if audio is None else audio.shape[2], patch=self.cfg.dims.patch_size,
                       teacher_forcing=tf, chunk=self.cfg.chunk_latents, anchor=anchor is not None)
        key = (*options.values(), str(device))
        lay = self._layouts.get(key)
        if lay is None:
            if len(self._layouts) >= 8:
                self._layouts.pop(next(iter(self._layouts)))
            lay = self._layouts[key] = _to(L.build(**options), device)
        return lay

    def _full(self, clean, x, timestep, prompt_embeds, anchor, audio, audio_timestep, text_timestep,
              cameras, r_timestep, return_audio):
        B, _, frames, H, W = x.shape
        device = x.device
        tf = clean is not None
        t = self._frame_time(timestep, B, frames, device)
        r = None if r_timestep is None else self._frame_time(r_timestep, B, frames, device)
        default_t = t[:, 0] if not tf else 1.0
        text_t = default_t if text_timestep is None else text_timestep
        audio_t = default_t if audio_timestep is None else audio_timestep
        lay = self._layout(prompt_embeds, frames, H, W, audio, anchor, tf, device)
        pieces = self._prefix_rows(prompt_embeds, anchor, audio)
        if tf:
            pieces.append(self.proj_in(self.patchify(clean)).to(pieces[0].dtype))
        pieces.append(self.proj_in(self.patchify(x)).to(pieces[0].dtype))
        hidden = torch.cat(pieces, dim=1)
        t_groups, r_groups = self._groups(B, frames, t, r, text_t, audio_t, device)
        temb = self.time_embedding(t_groups, r_groups)
        mask = None
        if tf:
            window = self.cfg.max_prior_clean_chunks
            mask = layout_mask((id(lay), None, window), lay.kinds, lay.chunks, window, lay)
        video, audio_out = self._stack(hidden, temb, lay.slice_rows(slice(0, lay.length)),
                                       self._cams(cameras, frames, B), mask)
        video = self.unpatchify(video[:, lay.noisy], frames, H, W)
        return (video, audio_out[:, lay.audio]) if return_audio else video

    # --- chunk-by-chunk generation -----------------------------------------------------------
    @torch.no_grad()
    def new_cache(self, prompt_embeds, *, anchor=None, audio=None, audio_timestep=1.0, anchor_camera=None,
                  height: int, width: int) -> KVCache:
        """Run the prefix ``[text | anchor | audio]`` once and keep every layer's keys/values."""
        B = prompt_embeds.shape[0]
        device = prompt_embeds.device
        lay = _to(L.build(text_tokens=prompt_embeds.shape[1], frames=0, height=height, width=width,
                          audio_latents=0 if audio is None else audio.shape[2], patch=self.cfg.dims.patch_size,
                          teacher_forcing=False, anchor=anchor is not None), device)
        grid, _ = L.frame_grid(height, width, self.cfg.dims.patch_size)
        cache = KVCache([LayerCache() for _ in self.transformer_blocks], prompt_embeds.shape[1], grid,
                        self.cfg.max_prior_clean_chunks)
        hidden = torch.cat(self._prefix_rows(prompt_embeds, anchor, audio), dim=1)
        t_groups, r_groups = self._groups(B, 0, torch.zeros(B, 0, device=device), None, 1.0, audio_timestep, device)
        cams = self._cams(anchor_camera, 1, B) if anchor_camera is not None else None
        self._stack(hidden, self.time_embedding(t_groups, r_groups), lay.slice_rows(slice(0, lay.length)), cams,
                    None, cache, "prefix")
        return cache

    def _chunk(self, x, timestep, cache: KVCache, cameras, r_timestep, commit: bool):
        B, _, frames, H, W = x.shape
        device = x.device
        start = cache.committed_frames
        n = cache.grid.shape[0]
        positions = L.video_positions(frames, cache.grid, float(cache.text_tokens), start)
        # through pinned memory on a GPU: a pageable copy would wait for the queued chunks (what
        # launch.batch.to_device does, which this layer cannot import)
        positions = positions.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else \
            positions.to(device)
        t = self._frame_time(timestep, B, frames, device)
        r = None if r_timestep is None else self._frame_time(r_timestep, B, frames, device)
        groups = torch.arange(frames, device=device).repeat_interleave(n) + L.NOISY_BASE
        rows = L.RowSlice(positions, torch.full((frames * n,), L.VIDEO_TAG, device=device), groups,
                          torch.arange(frames, device=device).repeat_interleave(n))
        t_groups, r_groups = self._groups(B, frames, t, r, 1.0, 1.0, device)
        if r_groups is not None and r is None:
            r_groups[:, L.NOISY_BASE:] = t
        hidden = self.proj_in(self.patchify(x))
        video, _ = self._stack(hidden, self.time_embedding(t_groups, r_groups), rows,
                               self._cams(cameras, frames, B), None, cache, "commit" if commit else "chunk")
        if commit:
            cache.committed_frames += frames
            for layer in cache.layers:
                layer.rows.append(frames * n)
                while len(layer.rows) > cache.window_chunks:
                    drop = layer.rows.pop(0)
                    layer.k, layer.v = layer.k[:, :, drop:], layer.v[:, :, drop:]
        return self.unpatchify(video, frames, H, W)

    def forward_chunk(self, noisy, timestep, cache: KVCache, *, cameras=None, r_timestep=None):
        return self._chunk(noisy, timestep, cache, cameras, r_timestep, commit=False)

    @torch.no_grad()
    def commit_chunk(self, clean, cache: KVCache, *, cameras=None) -> None:
        ones = torch.ones(clean.shape[0], device=clean.device)
        self._chunk(clean, ones, cache, cameras, ones if self.delta_embedding is not None else None, commit=True)


def _to(lay: L.Layout, device) -> L.Layout:
    from dataclasses import replace

    return replace(lay, positions=lay.positions.to(device), tags=lay.tags.to(device), groups=lay.groups.to(device),
                   camera_frame=lay.camera_frame.to(device), kinds=lay.kinds.to(device), chunks=lay.chunks.to(device))


def _sp_place(sp: SPGroup | None) -> tuple[int, int]:
    return (0, 1) if sp is None else (sp.rank, sp.size)
