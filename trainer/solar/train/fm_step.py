"""The Stage0.5 flow-matching loss of each family on one micro-batch (semantics.md §4).

Noise and timesteps come from each clip's own generator (``fm.ClipDraws``: the run's seed, the
step and the clip's position in the step's global batch), so SP peers draw the same values, a resumed
run draws what the uninterrupted one would have, and any topology with the same global batch draws the
same values for the same clip (issue 39). Per clip, in order: Wan its sigma, then its noise; LTX its
sigma (normal, uniform, choice), then its noise; H3 its time, noise, anchor noise, audio time, audio
noise. The image-condition drop is a hash of (seed, step, position) (no RNG). Returns the mean weighted loss and per-sample records
(each record's ``loss`` a 0-d tensor until ``engine.read_records`` reads them all at once).
"""

from __future__ import annotations

import torch

from solar.config.schema import RunConfig
from solar.launch.batch import Batch, to_device
from solar.objectives import fm


def _frames_time(value_B: torch.Tensor, frames: int) -> torch.Tensor:
    return value_B[:, None].expand(-1, frames).clone()


def fm_loss(model, cfg: RunConfig, batch: Batch, *, step: int, dp_rank: int, micro: int,
            audio_silence: torch.Tensor | None = None) -> tuple[torch.Tensor, list[dict]]:
    family = cfg.model.family
    x0 = batch.latents
    B, _, frames, _, _ = x0.shape
    device = x0.device
    dp_world = cfg.distributed.world_size // cfg.distributed.sequence_parallel_size
    first = fm.first_position(dp_rank, dp_world, micro, B)
    draws = fm.ClipDraws(cfg.train.seed, step, first, B)
    settings = cfg.train.fm
    drops = [fm.drop_decision(cfg.train.seed, step, 0, first + i, settings.image_condition_dropout or 0.0)
             for i in range(B)]
    mask = torch.ones(B, frames, device=device)
    records = []
    if family == "minimax_h3":
        t = draws.each(lambda g: fm.sample_h3_times(1, cfg.model.timestep_shift, g))
        eps = draws.noise(x0.shape, device)
        anchor_eps = draws.noise(x0[:, :, :1].shape, device)
        t_audio = draws.each(lambda g: fm.sample_h3_times(1, cfg.model.audio_timestep_shift, g))
        k = settings.keyframe_anchor_t
        anchor = k * x0[:, :, :1] + (1 - k) * anchor_eps
        t_d, t_audio_d = to_device(t, device), to_device(t_audio, device)
        x_t = fm.noisy_h3(x0, eps, t_d)
        audio = None
        if audio_silence is not None:
            silence = to_device(audio_silence, device).expand(B, *audio_silence.shape)
            audio_eps = draws.noise(silence.shape, device)
            audio = fm.noisy_h3(silence, audio_eps, t_audio_d)
        pred = model(x_t, t_d, batch.prompt, anchor=anchor, audio=audio, audio_timestep=t_audio_d,
                     cameras=batch.cameras)
        losses = fm.masked_mse(pred, x0 - eps, mask)
        shown = t
    else:
        if family == "ltx25_video":
            d = settings
            tokens = frames * x0.shape[3] * x0.shape[4]
            sigma = draws.each(lambda g: fm.sample_ltx_sigmas(1, tokens, g, std=d.logit_normal_std,
                                                              eps=d.logit_normal_eps,
                                                              uniform_probability=d.uniform_probability))
            weight = torch.ones(B)
        else:
            pairs = [fm.sample_wan_sigmas(1, cfg.model.timestep_shift, g) for g in draws.gens]
            sigma, weight = torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])
            if settings.weighting != "gaussian":
                weight = torch.ones(B)
        eps = draws.noise(x0.shape, device)
        sigma_d = to_device(sigma, device)
        x = fm.noisy_sigma(x0, eps, sigma_d)
        t_frames = _frames_time(sigma_d * fm.NUM_TRAIN_TIMESTEPS, frames)
        condition = None
        if family == "wan22_i2v_a14b":
            condition = batch.image_condition.clone()
            for i, dropped in enumerate(drops):
                if dropped:
                    condition[i].zero_()
            pred = model(x, t_frames[:, 0], batch.prompt, cameras=batch.cameras, condition=condition)
        else:
            # The first latent is the clean image condition (t = 0, outside the loss) unless dropped.
            for i, dropped in enumerate(drops):
                if not dropped:
                    x[i, :, 0] = x0[i, :, 0]
                    t_frames[i, 0].fill_(0.0)  # not ``= 0.0``: one element from a Python number syncs on a GPU
                    mask[i, 0].fill_(0.0)
            if family == "ltx25_video":
                pred = model(x, t_frames, batch.prompt, prompt_mask=batch.prompt_mask, cameras=batch.cameras,
                             fps=cfg.data.fps or 24.0)
            else:
                pred = model(x, t_frames, batch.prompt, cameras=batch.cameras)
        losses = fm.masked_mse(pred, eps - x0, mask) * to_device(weight, device)
        shown = sigma * fm.NUM_TRAIN_TIMESTEPS
    # The per-sample losses stay on the device: the engine reads every record's value in one copy after
    # the step's loss (``engine.read_records``); reading each here waited for the forward before the
    # backward could be launched (issue 18).
    kept = losses.detach()
    for i, ident in enumerate(batch.identities):
        records.append({**ident, "timestep": float(shown[i]), "image_condition_dropped": drops[i],
                        "loss": kept[i]})
    return losses.mean(), records
