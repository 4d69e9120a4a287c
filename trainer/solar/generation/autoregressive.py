"""Stage1 / Stage2 generation: chunk by chunk (causal, KV cache) for Wan TI2V-5B and MiniMax-H3.

A rollout of R latent frames is cut into chunks of ``model.cfg.chunk_latents`` (Wan 3, H3 5). Each
chunk starts from its slice of the rollout's initial noise, is solved with
``model.forward_chunk`` against the cache of the committed clean chunks (within the model's window),
and is then committed with ``model.commit_chunk``; the result is the concatenation of the chunks.

Conventions (sigma in [0, 1]: 1 = noise, 0 = clean; every solver here works on one velocity in
sigma, v = dx/dsigma, or on its average over [sigma_r, sigma_t] for an AnyFlow flow map):

- Wan: fed 1000 * sigma per latent frame ([B, k]); returns dx/dsigma = eps - x0. The first latent
  of the rollout is the clean image condition ``batch.latents[:, :, 0]``, fed at timestep 0 (and r 0)
  and restored after every update, as in ``generate.py``.
- H3: reversed time t = 1 - sigma ([B, k]); returns dx/dt = x0 - eps, so v = -output. The keyframe
  anchor (``model.cfg.anchor_timestep``) and the noised encoded silence live in the cache prefix;
  every video chunk is generated from noise.

Solvers, with the grid sigma_i = shift(s) = S s / (1 + (S - 1) s), S = ``cfg.model.timestep_shift``:

- ``flowmap`` (Stage1 AnyFlow, needs the delta embedding): sigma_i = shift(1 - i / steps); step
  x <- x - (sigma_i - sigma_{i+1}) u with u the model's average velocity from sigma_i to sigma_{i+1}.
- ``unipc`` (Stage1 TF-FM baseline, Wan only): a fresh ``solvers.build("unipc", ...)`` per chunk on
  the instantaneous velocity.
- ``self_forcing`` (Stage2): levels sigma_k = shift(d_k / 1000) of ``denoising_steps``; x0 = x -
  sigma_k v; before the next level x <- (1 - sigma_{k+1}) x0 + sigma_{k+1} eps_new; the chunk is
  the last x0.

An AnyFlow model asked for an instantaneous velocity (``unipc``, ``self_forcing``) gets r = t.

Randomness: one CPU ``torch.Generator`` seeded with ``noise_seed``; every tensor is drawn on the CPU
and then moved to the latents' device. Draw order:

1. H3 only, as ``generate.py``: the anchor noise [B, C, 1, h, w]; with ``audio_silence``, the audio
   time (``sample_h3_times``) and then the audio noise;
2. the initial noise of the whole rollout [B, C, R, h, w], at once;
3. ``self_forcing`` only: the re-noising noise [B, C, k, h, w], chunk by chunk, level by level.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from solar.config.schema import RunConfig
from solar.generation import solvers
from solar.launch.batch import Batch, host_noise, to_device
from solar.objectives.fm import noisy_h3, sample_h3_times

WAN, H3 = "wan22_ti2v_5b", "minimax_h3"
SOLVERS = ("flowmap", "unipc", "self_forcing")
DEFAULT_DENOISING_STEPS = (1000, 750, 500, 250)

# (x, sigma_t, sigma_r or None) -> velocity in sigma (averaged to sigma_r when given)
Velocity = Callable[[torch.Tensor, float, float | None], torch.Tensor]


class ChunkModel(Protocol):
    """What chunk-by-chunk generation needs of a model (``WanDiT``, ``H3DiT``)."""

    cfg: Any

    def new_cache(self, prompt_embeds: torch.Tensor, **kwargs: Any) -> Any: ...

    def forward_chunk(self, noisy: torch.Tensor, timestep: torch.Tensor, cache: Any, *,
                      cameras: torch.Tensor | None = None, r_timestep: torch.Tensor | None = None) -> torch.Tensor: ...

    def commit_chunk(self, clean: torch.Tensor, cache: Any, *, cameras: torch.Tensor | None = None) -> None: ...


def has_delta_embedding(model: Any) -> bool:
    """Whether the model takes the AnyFlow endpoint ``r_timestep`` (Wan: on its condition embedder)."""
    holder = getattr(model, "condition_embedder", model)
    return getattr(holder, "delta_embedding", None) is not None


def _restore(x: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
    """Put Wan's clean image condition back on frame 0 (no-op for other chunks and for H3)."""
    if condition is not None:
        x[:, :, 0] = condition
    return x


def _levels(solver: str, steps: int, shift: float, *, h3: bool, anyflow: bool,
            denoising_steps: list[int] | None) -> list[float]:
    """The sigma levels of ``flowmap`` / ``self_forcing`` (``unipc`` builds its own); validates."""
    if solver not in SOLVERS:
        raise ValueError(f"solver {solver!r} is not an autoregressive solver {SOLVERS}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if solver == "flowmap":
        if not anyflow:
            raise ValueError("flowmap needs an AnyFlow model (delta embedding for r_timestep)")
        return [solvers.shifted(1.0 - i / steps, shift) for i in range(steps + 1)]
    if solver == "unipc":
        if h3:
            raise ValueError("unipc is the Wan TF-FM baseline; H3 uses flowmap or self_forcing")
        return []
    ds = list(DEFAULT_DENOISING_STEPS if denoising_steps is None else denoising_steps)
    if steps != len(ds):
        raise ValueError(f"self_forcing: steps={steps} must equal len(denoising_steps)={len(ds)} ({ds})")
    if any(not 0 < d <= 1000 for d in ds):
        raise ValueError(f"denoising_steps must lie in (0, 1000], got {ds}")
    return [solvers.shifted(d / 1000.0, shift) for d in ds]


def rollout_cameras(cameras: torch.Tensor | None, rollout: int) -> torch.Tensor | None:
    """[B, R, 4, 4]: the clip's cameras, the last one repeated beyond the clip."""
    if cameras is None:
        return None
    frames = cameras.shape[1]
    if rollout <= frames:
        return cameras[:, :rollout]
    tail = cameras[:, -1:].expand(-1, rollout - frames, -1, -1)
    return torch.cat([cameras, tail], dim=1)


def _chunk_velocity(model: ChunkModel, cache: Any, cameras: torch.Tensor | None, *, h3: bool,
                    first_clean: bool, batch: int, frames: int, device: torch.device) -> Velocity:
    """The model's velocity in sigma for one chunk, in either family's convention."""
    def level(sigma: float) -> torch.Tensor:
        t = torch.full((batch, frames), 1.0 - sigma if h3 else 1000.0 * sigma, device=device)
        if first_clean:
            t[:, 0] = 0.0  # Wan's image condition frame
        return t

    def velocity(x: torch.Tensor, sigma: float, r_sigma: float | None) -> torch.Tensor:
        r = None if r_sigma is None else level(r_sigma)
        out = model.forward_chunk(x, level(sigma), cache, cameras=cameras, r_timestep=r).to(x.dtype)
        return -out if h3 else out  # H3: dx/dt = x0 - eps = -dx/dsigma
    return velocity


@torch.no_grad()
def sample_autoregressive(model: ChunkModel, cfg: RunConfig, batch: Batch, *, noise_seed: int, solver: str,
                          steps: int, rollout_latents: int | None = None,
                          audio_silence: torch.Tensor | None = None,
                          denoising_steps: list[int] | None = None) -> torch.Tensor:
    """Generate [B, C, R, h, w] latents chunk by chunk (R = ``rollout_latents``, default the clip's T).

    ``batch.latents`` supplies only the shape and the image condition (Wan frame 0, H3 anchor);
    ``audio_silence`` [2, T_a, A] is H3's encoded silence (None: no audio rows)."""
    family = cfg.model.family
    if family not in (WAN, H3):
        raise ValueError(f"autoregressive generation supports {WAN} and {H3}, not {family!r}")
    h3 = family == H3
    x0 = batch.latents
    B, C, frames, h, w = x0.shape
    k = model.cfg.chunk_latents
    rollout = frames if rollout_latents is None else rollout_latents
    if rollout < 1 or rollout % k:
        raise ValueError(f"rollout_latents={rollout} must be a positive multiple of the chunk ({k} latents)")
    shift = cfg.model.timestep_shift
    anyflow = has_delta_embedding(model)
    sigmas = _levels(solver, steps, shift, h3=h3, anyflow=anyflow, denoising_steps=denoising_steps)
    device = x0.device
    gen = torch.Generator().manual_seed(noise_seed)
    cameras = rollout_cameras(batch.cameras, rollout)

    # 1. Prefix (H3: keyframe anchor, noised silence) and the cache
    if h3:
        a = model.cfg.anchor_timestep
        anchor = a * x0[:, :, :1] + (1 - a) * host_noise(x0[:, :, :1].shape, gen, device)
        audio = t_audio = None
        if audio_silence is not None:
            silence = to_device(audio_silence, device).expand(B, *audio_silence.shape)
            t_audio = to_device(sample_h3_times(B, cfg.model.audio_timestep_shift, gen), device)
            audio = noisy_h3(silence, host_noise(silence.shape, gen, device), t_audio)
        cache = model.new_cache(batch.prompt, anchor=anchor, audio=audio,
                                audio_timestep=1.0 if t_audio is None else t_audio,
                                anchor_camera=None if cameras is None else cameras[:, :1], height=h, width=w)
    else:
        cache = model.new_cache(batch.prompt)

    # 2. The whole rollout's initial noise, then chunk after chunk
    noise = host_noise((B, C, rollout, h, w), gen, device)   # pinned, copied without waiting
    chunks = []
    for c in range(rollout // k):
        span = slice(c * k, (c + 1) * k)
        chunk_cams = None if cameras is None else cameras[:, span]
        cond = x0[:, :, 0] if not h3 and c == 0 else None  # Wan: the rollout's first latent is clean
        velocity = _chunk_velocity(model, cache, chunk_cams, h3=h3, first_clean=cond is not None, batch=B,
                                   frames=k, device=device)
        x = _restore(noise[:, :, span].clone(), cond)
        if solver == "flowmap":
            for i in range(steps):
                x = _restore(x - (sigmas[i] - sigmas[i + 1]) * velocity(x, sigmas[i], sigmas[i + 1]), cond)
        elif solver == "unipc":
            grid = solvers.build("unipc", steps, shift=shift, reversed_time=False)
            for i in range(grid.steps):
                sigma = grid.level(i) / 1000.0
                x = _restore(grid.step(velocity(x, sigma, sigma if anyflow else None), i, x), cond)
        else:  # self_forcing
            for j, sigma in enumerate(sigmas):
                pred = _restore(x - sigma * velocity(x, sigma, sigma if anyflow else None), cond)
                if j + 1 < len(sigmas):
                    eps = host_noise(x.shape, gen, device)
                    x = _restore((1 - sigmas[j + 1]) * pred + sigmas[j + 1] * eps, cond)
                else:
                    x = pred
        model.commit_chunk(x, cache, cameras=chunk_cams)
        chunks.append(x)
    return torch.cat(chunks, dim=2)


__all__ = ["DEFAULT_DENOISING_STEPS", "SOLVERS", "has_delta_embedding", "rollout_cameras", "sample_autoregressive"]
