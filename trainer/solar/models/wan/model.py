"""The Wan DiT (TI2V-5B and I2V-A14B) with camera PRoPE, teacher forcing and a KV cache.

Parameter names follow diffusers' ``WanTransformer3DModel``, so diffusers checkpoints load as they
are (see ``convert.py`` for the official Wan layout). What differs from the reference is written
down where it happens:

- modulation is per latent frame ([B, F, 6, D]) rather than per token: the same numbers, without
  materialising [B, S, 6, D];
- camera PRoPE acts on head channels [prope_start, D) after RoPE (``prope.py``);
- the teacher-forcing layout ``[clean frames | noisy frames]`` shares frame positions and cameras
  between the two copies and attends through ``TokenMask``; chunk-by-chunk generation keeps each
  layer's transformed keys/values of committed clean chunks in the fixed buffers of ``ChunkCache``
  (one shape for every chunk, so compiled blocks compile once);
- AnyFlow adds ``condition_embedder.delta_embedding`` (a copy of the time embedder) for the endpoint
  r, mixed as (1 - gate) * emb(t) + gate * emb(r).

Legend: B batch, S tokens, F frames, N tokens per frame, H heads, D head dim, C channels.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solar.config.families import Dims
from solar.models.attention import TokenMask, build_attention, clean_mask, prepare_mask, teacher_forcing_mask
from solar.models.prope import CameraMatrices, apply_blocks, camera_matrices
from solar.models.rope import apply_rope, rope_tables
from solar.models.sequence_parallel import HeadExchange, SPGroup, frame_splits, gather_frames


@dataclass(frozen=True)
class WanConfig:
    dims: Dims
    eps: float = 1e-6
    rope_theta: float = 10000.0
    camera_transform: str | None = "linear"     # None: no camera conditioning
    chunk_latents: int = 3
    max_prior_clean_chunks: int = 5
    anyflow: bool = False
    anyflow_gate: float = 0.25
    attention_backend: str = "auto"
    sdpa_kernel: str | None = None


def timestep_sinusoid(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """diffusers' Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0): [..] -> [.., dim]."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    angles = t.float()[..., None] * torch.exp(exponent)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class FP32LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class MLP2(nn.Module):
    """linear_1 -> activation -> linear_2 (diffusers' TimestepEmbedding / PixArt text projection)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, act: str) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(d_in, d_hidden)
        self.linear_2 = nn.Linear(d_hidden, d_out)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_1(x)
        h = F.silu(h) if self.act == "silu" else F.gelu(h, approximate="tanh")
        return self.linear_2(h)


class ConditionEmbedder(nn.Module):
    def __init__(self, dim: int, freq_dim: int, text_dim: int) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_embedder = MLP2(freq_dim, dim, dim, "silu")
        self.time_proj = nn.Linear(dim, 6 * dim)
        self.text_embedder = MLP2(text_dim, dim, dim, "gelu_tanh")
        self.delta_embedding: MLP2 | None = None

    def time(self, t_BF: torch.Tensor, r_BF: torch.Tensor | None, gate: float) -> torch.Tensor:
        param = self.time_embedder.linear_1.weight
        temb = self.time_embedder(timestep_sinusoid(t_BF, self.freq_dim).to(param.dtype))
        if self.delta_embedding is not None:
            if r_BF is None:
                raise ValueError("an AnyFlow model needs the endpoint r_timestep")
            remb = self.delta_embedding(timestep_sinusoid(r_BF, self.freq_dim).to(param.dtype))
            temb = (1.0 - gate) * temb + gate * remb
        elif r_BF is not None:
            raise ValueError("r_timestep given to a model without AnyFlow conditioning")
        return temb  # [B, F, D]


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, eps: float, kv_dim: int | None = None) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(kv_dim or dim, inner)
        self.to_v = nn.Linear(kv_dim or dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])
        self.norm_q = nn.RMSNorm(inner, eps=eps)
        self.norm_k = nn.RMSNorm(inner, eps=eps)

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim))

    @staticmethod
    def rms(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm with its weight in the activations' dtype: under bf16 autocast over fp32 master
        weights this keeps the fused kernel (a mixed-dtype call falls back to the unfused one)."""
        return F.rms_norm(x, norm.normalized_shape, norm.weight.to(x.dtype), norm.eps)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        proj = nn.Module()
        proj.proj = nn.Linear(dim, hidden)
        self.net = nn.ModuleList([proj, nn.Identity(), nn.Linear(hidden, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](F.gelu(self.net[0].proj(x), approximate="tanh"))


@dataclass
class LayerCache:
    k: torch.Tensor | None = None       # [B, H, S, D] transformed keys (a context's, or a ChunkCache ring)
    v: torch.Tensor | None = None
    ctx_k: torch.Tensor | None = None   # cross-attention keys/values of the prompt
    ctx_v: torch.Tensor | None = None


@dataclass
class KVCache:
    """Per-layer keys/values of a clean token run (the teacher-forcing context)."""

    layers: list[LayerCache]
    context: torch.Tensor              # embedded prompt [B, L, D]
    tokens_per_frame: int = 0


@dataclass
class ChunkCache:
    """Chunk-by-chunk generation's keys/values in fixed buffers: each layer's ``k``/``v`` holds a
    ring of W + 1 slots of m tokens (W = ``window_chunks``, m tokens per chunk), chunk c in slot
    c mod (W + 1). A chunk forward writes its own keys and values into its slot and attends
    to the first ``keys`` positions: while the ring fills, the slots of chunks 0..c (a prefix); once
    it is full, all of it (the W committed chunks of the window and itself: the slot it overwrote
    held the chunk that just left the window). Attention does not depend on the order of its keys,
    so this equals attending to ``[window chunks | current]`` in order. Committing is bookkeeping only.

    So the buffers never grow or move and the query side has one shape; the key length takes W + 1
    values, which a compiled block handles as one dynamic dimension (two graphs: the first chunk's,
    then the dynamic one) instead of a recompile per cache length and mode (the growing cache hit
    dynamo's recompile limit). The buffers hold one spare slot beyond the ring so that the keys are
    always a strict prefix (a view of one layout; the whole buffer would be a third graph). Every
    call for chunk 0 (its forwards and its commit, one graph) allocates them inside the block, in the
    dtype its projections produce (bf16 under autocast or FSDP2's policy), and computes the prompt's
    cross-attention keys/values there, where a sharded block's parameters are gathered; later chunks
    read both."""

    layers: list[LayerCache]           # k/v: [B, H, (W + 2) * m, D], the last slot spare
    context: torch.Tensor              # embedded prompt [B, L, D]
    window_chunks: int
    chunk_frames: int = 0              # set by the first chunk; every chunk has this many frames
    tokens_per_frame: int = 0
    committed_frames: int = 0
    keys: int = 0                      # key positions the current chunk attends to (a prefix of the ring)
    first: bool = True                 # the current chunk is chunk 0
    slot: torch.Tensor | None = None   # [m] token indices of the current chunk's slot
    positions: torch.Tensor | None = None  # [m] 0..m-1, the slot's offsets

    @property
    def capacity(self) -> int:
        """Token positions of each ring buffer: W + 1 slots and the spare."""
        return (self.window_chunks + 2) * self.chunk_frames * self.tokens_per_frame

    def prepare(self, frames: int, tokens_per_frame: int, device: torch.device) -> None:
        """Check the chunk's shape and point ``slot``/``keys`` at the next chunk."""
        if self.chunk_frames == 0:
            self.chunk_frames, self.tokens_per_frame = frames, tokens_per_frame
        elif (frames, tokens_per_frame) != (self.chunk_frames, self.tokens_per_frame):
            raise ValueError(f"chunks of one generation must have one shape: the cache holds chunks of "
                             f"{self.chunk_frames} frames of {self.tokens_per_frame} tokens, got {frames} "
                             f"of {tokens_per_frame}")
        m, slots = frames * tokens_per_frame, self.window_chunks + 1
        chunk = self.committed_frames // frames
        self.first = chunk == 0
        self.keys = (min(chunk, self.window_chunks) + 1) * m
        if self.slot is None:
            self.slot = torch.arange(m, device=device)
            self.positions = self.slot.clone()
        # in place, on the device: a compiled block sees the same tensor every chunk, no host copy
        torch.add(self.positions, (chunk % slots) * m, out=self.slot)


@dataclass
class TeacherContext:
    """The clean half of a teacher-forcing sequence, run once: its per-layer keys/values (and the
    prompt's cross-attention keys/values). The clean half (t = r = 0) attends only to clean tokens,
    so forwards over ``[clean | noisy]`` with the same clean latents, prompt and cameras see exactly
    these; a forward without grad given this context runs the noisy half alone. Under Ulysses SP
    each rank keeps its heads of every clean token (the layout attention sees after the exchange),
    so a rank's noisy frames, once exchanged, attend to them as the full sequence would."""

    cache: KVCache                     # its tokens_per_frame: the clean half's
    frames: int
    with_r: bool                       # built for calls that pass r_timestep (AnyFlow) or not
    mask: TokenMask                    # the teacher-forcing rule, queries = the noisy half
    sp: tuple[int, int] = (0, 1)       # (rank, size) of the SP group it was built in


@dataclass
class _Step:
    """What one forward over a token run needs besides the hidden states."""

    mod_BF6D: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    cams: CameraMatrices | None
    mask: TokenMask | None
    tokens_per_frame: int
    attend: object
    cache: KVCache | None = None
    commit: bool = False
    ring: ChunkCache | None = None     # chunk generation: write the slot, attend to the ring's prefix
    exchange: HeadExchange | None = None   # Ulysses SP: attention runs on this rank's heads, all tokens


class Block(nn.Module):
    def __init__(self, d: Dims, eps: float) -> None:
        super().__init__()
        dim = d.num_heads * d.head_dim
        # 1. Self-attention
        self.norm1 = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.attn1 = Attention(dim, d.num_heads, d.head_dim, eps)
        # 2. Cross-attention
        self.attn2 = Attention(dim, d.num_heads, d.head_dim, eps)
        self.norm2 = FP32LayerNorm(dim, eps, elementwise_affine=True)
        # 3. Feed-forward
        self.ffn = FeedForward(dim, d.ffn_dim)
        self.norm3 = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)
        self.prope_start = d.prope_start

    @staticmethod
    def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
        B, S, D = x.shape
        framed = x.float().view(B, S // n, n, D)
        return (framed * (1 + scale[:, :, None]) + shift[:, :, None]).view(B, S, D)

    @staticmethod
    def _gated(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, n: int) -> torch.Tensor:
        B, S, D = x.shape
        out = x.float().view(B, S // n, n, D) + y.float().view(B, S // n, n, D) * gate[:, :, None]
        return out.view(B, S, D).to(x.dtype)

    def self_attention(self, h: torch.Tensor, step: _Step, layer: LayerCache | None) -> torch.Tensor:
        a, n = self.attn1, step.tokens_per_frame
        q = apply_rope(a.heads_of(a.rms(a.norm_q, a.to_q(h))), step.cos, step.sin)
        k = apply_rope(a.heads_of(a.rms(a.norm_k, a.to_k(h))), step.cos, step.sin)
        v = a.heads_of(a.to_v(h))
        if step.cams is not None:
            q = apply_blocks(q, step.cams.query, n, self.prope_start)
            k = apply_blocks(k, step.cams.key, n, self.prope_start)
            v = apply_blocks(v, step.cams.key, n, self.prope_start)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        if step.exchange is not None:  # [B, H/sp, S_all, D], the layout a teacher context keeps
            q, k, v = (step.exchange.to_heads(t) for t in (q, k, v))
        if step.ring is not None:
            if step.ring.first:  # chunk 0 (each of its calls) allocates the rings, in the projections' dtype
                shape = (k.shape[0], k.shape[1], step.ring.capacity, k.shape[3])
                layer.k, layer.v = k.new_zeros(shape), v.new_zeros(shape)
            layer.k.index_copy_(2, step.ring.slot, k)
            layer.v.index_copy_(2, step.ring.slot, v)
            keys = step.ring.keys
            out = step.attend(q, layer.k[:, :, :keys], layer.v[:, :, :keys], None)
        elif layer is not None:
            keys = k if layer.k is None else torch.cat([layer.k, k], dim=2)
            values = v if layer.v is None else torch.cat([layer.v, v], dim=2)
            out = step.attend(q, keys, values, step.mask)
            if step.commit:
                layer.k, layer.v = keys, values
        else:
            out = step.attend(q, k, v, step.mask)
        if step.exchange is not None:
            out = step.exchange.to_sequence(out)
        out = out.transpose(1, 2)  # [B, S, H, D]
        if step.cams is not None:
            out = apply_blocks(out, step.cams.output, n, self.prope_start)
        return a.to_out[0](out.flatten(2))

    def cross_attention(self, h: torch.Tensor, context: torch.Tensor, layer: LayerCache | None,
                        fresh: bool = False) -> torch.Tensor:
        """``fresh``: compute (and keep) the prompt's keys/values even if the layer holds some."""
        a = self.attn2
        q = a.heads_of(a.rms(a.norm_q, a.to_q(h))).transpose(1, 2)
        if layer is not None and not fresh and layer.ctx_k is not None:
            k, v = layer.ctx_k, layer.ctx_v
        else:
            k, v = self.context_kv(context)
            if layer is not None:
                layer.ctx_k, layer.ctx_v = k, v
        out = F.scaled_dot_product_attention(q, k, v)
        return a.to_out[0](out.transpose(1, 2).flatten(2))

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's cross-attention keys and values [B, H, L, D]."""
        a = self.attn2
        return (a.heads_of(a.rms(a.norm_k, a.to_k(context))).transpose(1, 2),
                a.heads_of(a.to_v(context)).transpose(1, 2))

    def forward(self, x: torch.Tensor, context: torch.Tensor, step: _Step,
                layer: LayerCache | None = None) -> torch.Tensor:
        n = step.tokens_per_frame
        mod = (self.scale_shift_table.float()[:, None] + step.mod_BF6D.float())  # [B, F, 6, D]
        shift, scale, gate, c_shift, c_scale, c_gate = mod.unbind(dim=2)
        # 1. Self-attention
        h = self._modulate(self.norm1(x.float()), shift, scale, n).to(x.dtype)
        x = self._gated(x, self.self_attention(h, step, layer), gate, n)
        # 2. Cross-attention
        h = self.norm2(x.float()).to(x.dtype)
        x = x + self.cross_attention(h, context, layer, fresh=step.ring is not None and step.ring.first)
        # 3. Feed-forward
        h = self._modulate(self.norm3(x.float()), c_shift, c_scale, n).to(x.dtype)
        return self._gated(x, self.ffn(h), c_gate, n)


class WanDiT(nn.Module):
    def __init__(self, cfg: WanConfig) -> None:
        super().__init__()
        d = cfg.dims
        dim = d.num_heads * d.head_dim
        self.cfg = cfg
        # 1. Patch embedding (positions are RoPE, applied in attention)
        self.patch_embedding = nn.Conv3d(d.in_channels, dim, kernel_size=d.patch_size, stride=d.patch_size)
        # 2. Condition embeddings
        self.condition_embedder = ConditionEmbedder(dim, d.freq_dim, d.text_dim)
        # 3. Transformer blocks
        self.blocks = nn.ModuleList([Block(d, cfg.eps) for _ in range(d.num_layers)])
        # 4. Output norm & projection
        self.norm_out = FP32LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.proj_out = nn.Linear(dim, d.out_channels * math.prod(d.patch_size))
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        if cfg.anyflow:
            self.enable_anyflow()
        self.sp: SPGroup | None = None
        self._attend = None

    # --- set-up -----------------------------------------------------------------------------
    def enable_anyflow(self) -> None:
        """Add the endpoint embedding as a copy of the (loaded) time embedding."""
        emb = self.condition_embedder
        emb.delta_embedding = copy.deepcopy(emb.time_embedder)

    def init_delta_from_time(self) -> None:
        emb = self.condition_embedder
        emb.delta_embedding.load_state_dict(emb.time_embedder.state_dict())

    def set_sequence_parallel(self, sp: SPGroup | None) -> None:
        self.sp = sp if sp is not None and sp.size > 1 else None

    def attention_fn(self):
        if self._attend is None:
            device = next(self.parameters()).device.type
            self._attend = build_attention(self.cfg.attention_backend, device=device,
                                           sdpa_kernel=self.cfg.sdpa_kernel)
        return self._attend

    # --- shared pieces ----------------------------------------------------------------------
    def _patchify(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        h = self.patch_embedding(x)  # [B, D, F, h, w]
        grid = tuple(h.shape[2:])
        return h.flatten(2).transpose(1, 2).contiguous(), grid

    def _unpatchify(self, tokens: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        pt, ph, pw = self.cfg.dims.patch_size
        f, h, w = grid
        B = tokens.shape[0]
        x = tokens.reshape(B, f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)

    def _frame_time(self, timestep: torch.Tensor, frames: int, batch: int) -> torch.Tensor:
        t = torch.as_tensor(timestep, device=self.proj_out.weight.device)
        if t.dim() == 0:
            t = t.expand(batch)
        if t.dim() == 1:
            t = t[:, None].expand(batch, frames)
        if tuple(t.shape) != (batch, frames):
            raise ValueError(f"timestep must be [B] or [B, F] = [{batch}, {frames}], got {list(t.shape)}")
        return t

    def _cameras(self, cameras: torch.Tensor | None, frames: int, batch: int) -> CameraMatrices | None:
        if self.cfg.camera_transform is None or cameras is None:
            return None
        if tuple(cameras.shape) != (batch, frames, 4, 4):
            raise ValueError(f"cameras must be [B, F, 4, 4] = [{batch}, {frames}, 4, 4], "
                             f"got {list(cameras.shape)}")
        return camera_matrices(cameras, self.cfg.camera_transform)

    def _run(self, tokens: torch.Tensor, context: torch.Tensor, *, t_BF: torch.Tensor,
             r_BF: torch.Tensor | None, positions: torch.Tensor, grid_hw: tuple[int, int],
             cams: CameraMatrices | None, mask: TokenMask | None, cache: KVCache | ChunkCache | None = None,
             commit: bool = False, head: bool = True) -> torch.Tensor | None:
        """Blocks over a token run of whole frames; returns final-normed, projected tokens (None
        without ``head``: a run kept only for its keys/values). Under SP each rank runs its own
        frames; a ``KVCache`` then holds this rank's heads of every token (``HeadExchange``)."""
        h, w = grid_hw
        n = h * w
        frames = positions.numel()
        emb = self.condition_embedder
        temb = emb.time(t_BF, r_BF, self.cfg.anyflow_gate)                       # [B, F, D]
        mod = emb.time_proj(F.silu(temb)).unflatten(-1, (6, -1))                  # [B, F, 6, D]
        rope_dims = self.cfg.dims.head_dim
        attend = self.attention_fn()
        prepare_mask(attend, mask)
        sp, exchange = self.sp, None
        if sp is not None:
            if isinstance(cache, ChunkCache):
                raise ValueError("KV-cache generation runs without sequence parallelism")
            splits = frame_splits(frames, sp.size)
            lo, hi = sp.frame_range(frames)
            tokens, temb, mod, positions = tokens[:, lo * n:hi * n], temb[:, lo:hi], mod[:, lo:hi], positions[lo:hi]
            cams = None if cams is None else cams.select(slice(lo, hi))
            exchange = HeadExchange(sp, [s * n for s in splits])
        cos, sin = rope_tables(positions, h, w, rope_dims, self.cfg.rope_theta)
        ring = cache if isinstance(cache, ChunkCache) else None
        step = _Step(mod, cos.to(tokens.device), sin.to(tokens.device), cams, mask, n, attend, cache, commit, ring,
                     exchange)
        x = tokens
        for i, block in enumerate(self.blocks):
            x = block(x, context, step, None if cache is None else cache.layers[i])
        if not head:
            return None
        # 5. Output norm, projection (per-frame modulation by the time embedding)
        shift, scale = (self.scale_shift_table.float()[:, None] + temb.float()[:, :, None]).unbind(dim=2)
        B, S, D = x.shape
        x = (self.norm_out(x.float()).view(B, -1, n, D) * (1 + scale[:, :, None]) + shift[:, :, None])
        out = self.proj_out(x.view(B, S, D).to(tokens.dtype))
        if sp is not None:
            out = gather_frames(out.view(B, -1, n, out.shape[-1]), sp, splits).flatten(1, 2)
        return out

    # --- public forwards --------------------------------------------------------------------
    def forward(self, x: torch.Tensor, timestep: torch.Tensor, prompt_embeds: torch.Tensor, *,
                cameras: torch.Tensor | None = None, r_timestep: torch.Tensor | None = None,
                condition: torch.Tensor | None = None) -> torch.Tensor:
        """Bidirectional full-clip prediction: x [B, C, F, H, W] -> [B, C_out, F, H, W].

        ``timestep`` [B] or per latent frame [B, F] (TI2V: frame 0 at 0 for the image condition);
        ``cameras`` [B, F, 4, 4] rebased viewmats; ``condition`` channels are concatenated (A14B)."""
        if condition is not None:
            x = torch.cat([x, condition], dim=1)
        tokens, grid = self._patchify(x)
        B, frames = x.shape[0], grid[0]
        t = self._frame_time(timestep, frames, B)
        r = None if r_timestep is None else self._frame_time(r_timestep, frames, B)
        context = self.condition_embedder.text_embedder(prompt_embeds)
        positions = torch.arange(frames, device=x.device)
        out = self._run(tokens, context, t_BF=t, r_BF=r, positions=positions, grid_hw=grid[1:],
                        cams=self._cameras(cameras, frames, B), mask=None)
        return self._unpatchify(out, grid)

    def forward_teacher_forcing(self, clean: torch.Tensor, noisy: torch.Tensor, timestep: torch.Tensor,
                                prompt_embeds: torch.Tensor, *, cameras: torch.Tensor | None = None,
                                r_timestep: torch.Tensor | None = None,
                                condition: torch.Tensor | None = None,
                                context: TeacherContext | None = None) -> torch.Tensor:
        """``[clean | noisy]`` in one sequence with the chunked causal mask; returns the prediction
        for the noisy frames. ``timestep``/``r_timestep`` [B, F] for the noisy frames (clean: 0).
        With ``context`` (``teacher_context`` of the same clean latents, prompt and cameras) only
        the noisy half runs, against the clean half's stored keys/values: the same prediction."""
        if context is not None:
            return self._noisy_half(noisy, timestep, context, cameras, r_timestep, condition)
        if condition is not None:
            clean, noisy = torch.cat([clean, condition], dim=1), torch.cat([noisy, condition], dim=1)
        clean_tokens, grid = self._patchify(clean)
        noisy_tokens, _ = self._patchify(noisy)
        B, frames = clean.shape[0], grid[0]
        n = grid[1] * grid[2]
        t = self._frame_time(timestep, frames, B)
        zeros = torch.zeros_like(t)
        t_all = torch.cat([zeros, t], dim=1)
        r_all = None if r_timestep is None else torch.cat([zeros, self._frame_time(r_timestep, frames, B)], 1)
        cams = self._cameras(cameras, frames, B)
        positions = torch.arange(frames, device=clean.device).repeat(2)
        mask = teacher_forcing_mask(frames, n, self.cfg.chunk_latents, self.cfg.max_prior_clean_chunks,
                                    device=clean.device)
        context = self.condition_embedder.text_embedder(prompt_embeds)
        out = self._run(torch.cat([clean_tokens, noisy_tokens], dim=1), context, t_BF=t_all, r_BF=r_all,
                        positions=positions, grid_hw=grid[1:],
                        cams=None if cams is None else cams.repeat_frames(2), mask=mask)
        return self._unpatchify(out[:, frames * n:], grid)

    @torch.no_grad()
    def teacher_context(self, clean: torch.Tensor, prompt_embeds: torch.Tensor, *,
                        cameras: torch.Tensor | None = None, with_r: bool = False,
                        condition: torch.Tensor | None = None) -> TeacherContext:
        """Run the clean half of the teacher-forcing sequence once (without grad) and keep what the
        noisy half reads from it; ``with_r`` for forwards that pass ``r_timestep`` (clean: r = 0).
        Under SP every rank of the group calls it with the same inputs, as for the full forward."""
        if condition is not None:
            clean = torch.cat([clean, condition], dim=1)
        tokens, grid = self._patchify(clean)
        B, frames = clean.shape[0], grid[0]
        n = grid[1] * grid[2]
        zeros = torch.zeros(B, frames, device=clean.device)
        cache = KVCache([LayerCache() for _ in self.blocks], self.condition_embedder.text_embedder(prompt_embeds), n)
        chunk, window = self.cfg.chunk_latents, self.cfg.max_prior_clean_chunks
        self._run(tokens, cache.context, t_BF=zeros, r_BF=zeros if with_r else None,
                  positions=torch.arange(frames, device=clean.device), grid_hw=grid[1:],
                  cams=self._cameras(cameras, frames, B), mask=clean_mask(frames, n, chunk, window, clean.device),
                  cache=cache, commit=True, head=False)
        full = teacher_forcing_mask(frames, n, chunk, window, device=clean.device)
        return TeacherContext(cache, frames, with_r, full.queries_from(frames * n), _sp_place(self.sp))

    def _noisy_half(self, noisy, timestep, context: TeacherContext, cameras, r_timestep, condition):
        if torch.is_grad_enabled():
            raise ValueError("a teacher-forcing context serves forwards without grad (the clean half's "
                             "gradients would be lost)")
        if (r_timestep is not None) != context.with_r:
            raise ValueError("the teacher-forcing context was built for the other r_timestep convention")
        if context.sp != _sp_place(self.sp):
            raise ValueError(f"the teacher-forcing context was built as sequence-parallel rank/size {context.sp}, "
                             f"this forward runs as {_sp_place(self.sp)}")
        if condition is not None:
            noisy = torch.cat([noisy, condition], dim=1)
        tokens, grid = self._patchify(noisy)
        B, frames = noisy.shape[0], grid[0]
        if (frames, grid[1] * grid[2]) != (context.frames, context.cache.tokens_per_frame):
            raise ValueError(f"the teacher-forcing context holds {context.frames} frames of "
                             f"{context.cache.tokens_per_frame} tokens, got {frames} of {grid[1] * grid[2]}")
        t = self._frame_time(timestep, frames, B)
        r = None if r_timestep is None else self._frame_time(r_timestep, frames, B)
        out = self._run(tokens, context.cache.context, t_BF=t, r_BF=r,
                        positions=torch.arange(frames, device=noisy.device), grid_hw=grid[1:],
                        cams=self._cameras(cameras, frames, B), mask=context.mask, cache=context.cache)
        return self._unpatchify(out, grid)

    # --- chunk-by-chunk generation -----------------------------------------------------------
    def new_cache(self, prompt_embeds: torch.Tensor) -> ChunkCache:
        return ChunkCache([LayerCache() for _ in self.blocks],
                          self.condition_embedder.text_embedder(prompt_embeds), self.cfg.max_prior_clean_chunks)

    def _chunk(self, x: torch.Tensor, timestep, cache: ChunkCache, cameras, r_timestep, condition,
               commit: bool) -> torch.Tensor:
        if condition is not None:
            x = torch.cat([x, condition], dim=1)
        tokens, grid = self._patchify(x)
        B, frames = x.shape[0], grid[0]
        cache.prepare(frames, grid[1] * grid[2], tokens.device)
        t = self._frame_time(timestep, frames, B)
        r = None if r_timestep is None else self._frame_time(r_timestep, frames, B)
        start = cache.committed_frames
        positions = torch.arange(start, start + frames, device=x.device)
        cams = self._cameras(cameras, frames, B)
        out = self._run(tokens, cache.context, t_BF=t, r_BF=r, positions=positions, grid_hw=grid[1:],
                        cams=cams, mask=None, cache=cache)
        if commit:
            cache.committed_frames += frames
        return self._unpatchify(out, grid)

    @torch.no_grad()
    def forward_chunk(self, noisy: torch.Tensor, timestep, cache: ChunkCache, *, cameras=None,
                      r_timestep=None, condition=None) -> torch.Tensor:
        """Predict for the next chunk from the cache (without grad); the committed chunks are not
        changed."""
        return self._chunk(noisy, timestep, cache, cameras, r_timestep, condition, commit=False)

    @torch.no_grad()
    def commit_chunk(self, clean: torch.Tensor, cache: ChunkCache, *, cameras=None, condition=None) -> None:
        """Run a finished chunk at t = 0 and keep its keys/values (oldest beyond the window evicted)."""
        zeros = torch.zeros(clean.shape[0], device=clean.device)
        r = zeros if self.condition_embedder.delta_embedding is not None else None
        self._chunk(clean, zeros, cache, cameras, r, condition, commit=True)


def _sp_place(sp: SPGroup | None) -> tuple[int, int]:
    return (0, 1) if sp is None else (sp.rank, sp.size)
