"""Attention behind one small interface, chosen once at build time.

``attend(q_BHSD, k_BHSD, v_BHSD, mask)`` with ``mask`` a ``TokenMask`` or None. Backends:

- ``reference``: explicit masked softmax (fp32 accumulation); the CPU ground truth.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with an optional pinned kernel
  (``flash``, ``efficient``, ``cudnn``, ``math``); masks become dense boolean matrices.
- ``flex``: FlexAttention with a block mask built from the same rule (teacher forcing on GPU).

``TokenMask`` describes the teacher-forcing layout per token (kind prefix/clean/noisy/pad and
chunk index) and answers "may query i see key j" with tensor ops, so the dense matrix and the flex
``mask_mod`` come from one rule::

    prefix         -> prefix (request-constant rows: H3's text, keyframe anchor, audio)
    clean chunk i  -> prefix and clean chunks [i - W, i]
    noisy chunk i  -> prefix, clean chunks [i - W, i - 1] and noisy chunk i (never clean chunk i)
    pad            -> only itself; no real token sees a pad
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

CLEAN, NOISY, PAD, PREFIX = 0, 1, 2, 3
BACKENDS = ("reference", "sdpa", "flex")
SDPA_KERNELS = ("flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class TokenMask:
    kind: torch.Tensor   # [S] int: CLEAN / NOISY / PAD
    chunk: torch.Tensor  # [S] int: chunk index of the token's frame
    window: int          # prior clean chunks a chunk may see
    q_offset: int = 0    # queries are the tokens from here on (keys: all S), e.g. the noisy half alone

    def allowed(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Boolean "query q may see key k" for (broadcastable) index tensors."""
        q = q + self.q_offset
        kq, kk = self.kind[q], self.kind[k]
        cq, ck = self.chunk[q], self.chunk[k]
        lag = cq - ck
        clean_q = (kq == CLEAN) & (kk == CLEAN) & (lag >= 0) & (lag <= self.window)
        noisy_ctx = (kq == NOISY) & (kk == CLEAN) & (lag >= 1) & (lag <= self.window)
        noisy_self = (kq == NOISY) & (kk == NOISY) & (lag == 0)
        prefix = (kk == PREFIX) & (kq != PAD)
        pad_self = (kq == PAD) & (q == k)
        return clean_q | noisy_ctx | noisy_self | prefix | pad_self

    def dense(self) -> torch.Tensor:
        """[S - q_offset, S]."""
        idx = torch.arange(self.kind.numel(), device=self.kind.device)
        return self.allowed(idx[:self.kind.numel() - self.q_offset, None], idx[None, :])

    def queries_from(self, offset: int) -> TokenMask:
        """The same rule for the queries from token ``offset`` on against every key."""
        return _memo(("rows", id(self), offset), lambda: TokenMask(self.kind, self.chunk, self.window, offset), self)


_MASKS: dict[tuple, tuple] = {}


def _memo(key: tuple, build: Callable[[], TokenMask], *keep) -> TokenMask:
    """One TokenMask object per layout, so the block masks built from it (keyed by the object) are
    built once and a compiled block sees the same mask every step; ``keep`` holds what ``key``
    names by identity."""
    hit = _MASKS.get(key)
    if hit is None:
        if len(_MASKS) >= 32:
            _MASKS.pop(next(iter(_MASKS)))
        hit = _MASKS[key] = (build(), keep)
    return hit[0]


def layout_mask(key: tuple, kind: torch.Tensor, chunk: torch.Tensor, window: int, *keep) -> TokenMask:
    """The one TokenMask of a layout named by ``key`` (its tensors held by ``keep``): the same object
    for every call with that layout, so its block mask is built once and a compiled block guarding
    on the mask sees it unchanged (a new object per call compiled the block again every call)."""
    return _memo(("layout", *key), lambda: TokenMask(kind, chunk, window), *keep)


def teacher_forcing_mask(frames: int, tokens_per_frame: int, chunk: int, window: int,
                         pad: int = 0, device: torch.device | str = "cpu") -> TokenMask:
    """The mask of ``[clean frames 0..F-1 | noisy frames 0..F-1 | pad]``."""
    def build() -> TokenMask:
        frame = torch.arange(frames, device=device).repeat_interleave(tokens_per_frame)
        chunk_ids = torch.cat([frame // chunk, frame // chunk, torch.zeros(pad, dtype=torch.long, device=device)])
        kind = torch.cat([torch.full_like(frame, CLEAN), torch.full_like(frame, NOISY),
                          torch.full((pad,), PAD, dtype=torch.long, device=device)])
        return TokenMask(kind, chunk_ids, window)
    return _memo(("tf", frames, tokens_per_frame, chunk, window, pad, str(device)), build)


def clean_mask(frames: int, tokens_per_frame: int, chunk: int, window: int,
               device: torch.device | str = "cpu") -> TokenMask:
    """The clean half of ``teacher_forcing_mask`` alone (it never sees the noisy half)."""
    def build() -> TokenMask:
        frame = torch.arange(frames, device=device).repeat_interleave(tokens_per_frame)
        return TokenMask(torch.full_like(frame, CLEAN), frame // chunk, window)
    return _memo(("clean", frames, tokens_per_frame, chunk, window, str(device)), build)


def _reference(q, k, v, mask: TokenMask | None):
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask.dense().to(scores.device), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)


def _kernel_context(kernel: str | None):
    if kernel is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[kernel]
    return sdpa_kernel([backend])


def make_sdpa(kernel: str | None = None) -> Callable:
    if kernel is not None and kernel not in SDPA_KERNELS:
        raise ValueError(f"unknown SDPA kernel {kernel!r}; use one of {SDPA_KERNELS}")

    def sdpa(q, k, v, mask: TokenMask | None):
        attn_mask = None if mask is None else mask.dense().to(q.device)
        with _kernel_context(kernel):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return sdpa


def make_flex(compile_kernel: bool | None = None) -> Callable:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = flex_attention
    if compile_kernel if compile_kernel is not None else torch.cuda.is_available():
        compiled = torch.compile(flex_attention, dynamic=False)
    cache: dict[tuple, tuple] = {}   # a few layouts (the teacher-forcing step alternates three)

    def block_mask(mask: TokenMask, queries: int, keys: int, device: torch.device):
        key = (id(mask), queries, keys, device)
        hit = cache.get(key)
        if hit is None:
            def mask_mod(b, h, q_idx, kv_idx):
                return mask.allowed(q_idx, kv_idx)
            block = create_block_mask(mask_mod, None, None, queries, keys, device=device)
            if len(cache) >= 4:
                cache.pop(next(iter(cache)))
            hit = cache[key] = (mask, block)  # the mask is held so its id is not reused while cached
        return hit[1]

    def flex(q, k, v, mask: TokenMask | None):
        if mask is None:
            return compiled(q, k, v)
        return compiled(q, k, v, block_mask=block_mask(mask, q.shape[-2], k.shape[-2], q.device))

    def prepare(mask: TokenMask) -> None:
        """Build ``mask``'s block mask now, outside any compiled block: inside one, the first call
        would trace its construction into the block's graph and the next call (the cache then
        holding it) compile the block again."""
        total = mask.kind.numel()
        block_mask(mask, total - mask.q_offset, total, mask.kind.device)

    flex.prepare = prepare
    return flex


def prepare_mask(attend: Callable, mask: TokenMask | None) -> None:
    """Before a run's blocks: let ``attend`` build what it derives from ``mask`` once (flex: the
    block mask); the blocks then find it built. A backend without such a step does nothing."""
    prepare = getattr(attend, "prepare", None)
    if mask is not None and prepare is not None:
        prepare(mask)


def build_attention(backend: str = "auto", *, device: str = "cpu", sdpa_kernel: str | None = None) -> Callable:
    """The attention function for a model, picked once: ``auto`` is sdpa without masks and flex for
    masks on CUDA, sdpa (dense masks) on CPU."""
    if backend == "reference":
        return _reference
    if backend == "sdpa":
        return make_sdpa(sdpa_kernel)
    if backend == "flex":
        return make_flex()
    if backend != "auto":
        raise ValueError(f"unknown attention backend {backend!r}; use auto or one of {BACKENDS}")
    sdpa = make_sdpa(sdpa_kernel)
    if device != "cuda":
        return sdpa
    flex = make_flex()

    def auto(q, k, v, mask):
        return sdpa(q, k, v, None) if mask is None else flex(q, k, v, mask)
    auto.prepare = flex.prepare
    return auto
