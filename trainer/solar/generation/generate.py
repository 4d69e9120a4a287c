"""Stage0.5 (bidirectional) generation of one slot, per family convention.

The noise comes from a generator seeded by the slot's noise seed, so the same plan and seeds give
the same latents in periodic validation and in ``solar infer``. Image conditions are the sample's:
Wan TI2V-5B and LTX keep the clean first latent at t = 0; A14B takes the 20-channel condition;
H3 gets the keyframe anchor at t = 0.999 and the noised encoded silence. Classifier-free guidance
uses the dataset's negative prompt when ``validation.guidance_scale`` > 1.
"""

from __future__ import annotations

import torch

from solar.config.schema import RunConfig
from solar.generation import solvers
from solar.launch.batch import Batch
from solar.objectives.fm import ltx_mu, noisy_h3, sample_h3_times


def _shift(cfg: RunConfig, tokens: int) -> float:
    if cfg.model.family == "ltx25_video":
        import math

        return math.exp(ltx_mu(tokens))
    return cfg.model.timestep_shift


@torch.no_grad()
def sample_bidirectional(model, cfg: RunConfig, batch: Batch, *, noise_seed: int, solver: str, steps: int,
                         negative: torch.Tensor | None = None, audio_silence: torch.Tensor | None = None) -> torch.Tensor:
    family = cfg.model.family
    x0 = batch.latents
    B, C, frames, h, w = x0.shape
    gen = torch.Generator().manual_seed(noise_seed)
    noise = torch.randn(x0.shape, generator=gen).to(x0.device)
    h3 = family == "minimax_h3"
    grid = solvers.build(solver, steps, shift=_shift(cfg, frames * h * w), reversed_time=h3)
    guidance = cfg.validation.guidance_scale or 1.0
    use_cfg = guidance > 1.0 and negative is not None
    x = noise.clone()
    anchor = audio = None
    t_audio = None
    if h3:
        k = model.cfg.anchor_timestep  # the keyframe anchor level (0.999)
        anchor = k * x0[:, :, :1] + (1 - k) * torch.randn(x0[:, :, :1].shape, generator=gen).to(x0.device)
        if audio_silence is not None:
            # Encoded silence, noised once per rollout at a level drawn like training's (audio shift).
            silence = audio_silence.to(x0.device).expand(B, *audio_silence.shape)
            t_audio = sample_h3_times(B, cfg.model.audio_timestep_shift, gen).to(x0.device)
            audio = noisy_h3(silence, torch.randn(silence.shape, generator=gen).to(x0.device), t_audio)
    first_clean = family in ("wan22_ti2v_5b", "ltx25_video")
    if first_clean:
        x[:, :, 0] = x0[:, :, 0]

    def predict(x_in, level, prompt, mask):
        if h3:
            return model(x_in, torch.full((B,), level, device=x0.device), prompt, anchor=anchor,
                         audio=audio, audio_timestep=t_audio, cameras=batch.cameras)
        t = torch.full((B, frames), level, device=x0.device)
        if first_clean:
            t[:, 0] = 0.0
        if family == "wan22_i2v_a14b":
            return model(x_in, t[:, 0], prompt, cameras=batch.cameras, condition=batch.image_condition)
        if family == "ltx25_video":
            return model(x_in, t, prompt, prompt_mask=mask, cameras=batch.cameras, fps=cfg.data.fps or 24.0)
        return model(x_in, t, prompt, cameras=batch.cameras)

    neg_prompt = neg_mask = None
    if use_cfg:
        neg_prompt = negative.to(x0.device, x0.dtype)[None].expand(B, -1, -1)
        neg_mask = torch.ones(B, neg_prompt.shape[1], device=x0.device)
    for i in range(grid.steps):
        level = grid.level(i)
        v = predict(x, level, batch.prompt, batch.prompt_mask)
        if use_cfg:
            v_neg = predict(x, level, neg_prompt, neg_mask)
            v = v_neg + guidance * (v - v_neg)
        x = grid.step(v, i, x)
        if first_clean:
            x[:, :, 0] = x0[:, :, 0]
    return x


def sample(model, cfg: RunConfig, batch: Batch, *, noise_seed: int, solver: str, steps: int,
           negative: torch.Tensor | None = None, audio_silence: torch.Tensor | None = None) -> torch.Tensor:
    """The route's generation of one slot: bidirectional for Stage0.5, chunk by chunk (KV cache) for
    the causal Stage1/Stage2 routes, over ``validation.rollout_latents`` latents."""
    if cfg.train.causal_mode == "bidirectional":
        return sample_bidirectional(model, cfg, batch, noise_seed=noise_seed, solver=solver, steps=steps,
                                    negative=negative, audio_silence=audio_silence)
    from solar.generation.autoregressive import sample_autoregressive

    denoising = cfg.train.sgf.denoising_steps if cfg.train.sgf is not None else None
    camera_length = getattr(cfg, "inference", None) is not None and cfg.inference.length == "camera"
    rollout = batch.latents.shape[2] if camera_length else cfg.validation.rollout_latents
    return sample_autoregressive(model, cfg, batch, noise_seed=noise_seed, solver=solver, steps=steps,
                                 rollout_latents=rollout, audio_silence=audio_silence,
                                 denoising_steps=list(denoising) if denoising else None)
