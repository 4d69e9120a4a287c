"""Stage1 losses on one micro-batch, through the teacher-forcing layout ``[clean | noisy]``.

- TF-AnyFlow v1_5 (Wan TI2V-5B, MiniMax-H3): ``solar.objectives.anyflow`` with the model as the
  average-velocity callable. Wan: guided target (negative prompt, g = 3), first latent kept clean at
  t = r = 0 and outside the loss unless the sample's image condition is dropped. H3: unguided, in
  reversed time, the first ``train.anyflow.trained_latents`` (45) latents, keyframe anchor and
  noised encoded silence in the prefix.
- TF-FM baseline (Wan): one shifted grid sigma per 3-latent chunk, FM target, the chunk's Gaussian
  weight, the same anchoring.

Sample kinds (diffusion / consistency / flow-map) follow the sample's position in the logical-global
batch of the step: ``fm.first_position(dp_rank, dp_world, micro, micro_batch) + i`` of
``dp_world * accumulation * micro_batch``. Randomness belongs to the clip (issue 39): one generator
per clip, keyed by (seed, step, that position) (``fm.ClipDraws``), so a clip draws the same values at
any topology with the same global batch, and SP peers (one dp rank) draw the same. Draw order of a
clip's generator: Wan AnyFlow — u1, u2, noise; H3 — anchor noise, audio noise, audio time, video
noise, u1, u2; TF-FM — chunk grid indices, noise. The image-condition drop is a hash of (seed, step,
position) (``fm.drop_decision`` with dp rank 0 and the position as index): it draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from solar.config.schema import RunConfig
from solar.launch.batch import Batch, to_device
from solar.objectives import anyflow as af
from solar.objectives import fm

Gather = Callable[[list], list]  # every logical-global sample's (loss, is_diffusion) from this micro-batch's


def _drops(cfg: RunConfig, step: int, first: int, batch: int) -> list[bool]:
    """Each clip's image-condition drop, keyed by its global-batch position (``first`` + i) in place of
    ``drop_decision``'s (dp rank, index): dp rank 0 and the position, the same at any topology."""
    p = cfg.train.fm.image_condition_dropout or 0.0
    return [fm.drop_decision(cfg.train.seed, step, 0, first + i, p) for i in range(batch)]


def _draws(cfg: RunConfig, step: int, dp_rank: int, micro: int, batch: int) -> tuple[fm.ClipDraws, int]:
    """The micro-batch's per-clip generators and its first clip's global-batch position."""
    dp_world = cfg.distributed.world_size // cfg.distributed.sequence_parallel_size
    first = fm.first_position(dp_rank, dp_world, micro, batch)
    return fm.ClipDraws(cfg.train.seed, step, first, batch), first


def _time_pairs(draws: fm.ClipDraws, first: int, size: int, a) -> af.TimePairs:
    """AnyFlow's (t, r) pairs, each clip's u1 then u2 from its own generator, kinds by position."""
    pairs = [af.sample_time_pairs(1, global_offset=first + i, global_size=size, diffusion_ratio=a.diffusion_ratio,
                                  consistency_ratio=a.consistency_ratio, generator=g)
             for i, g in enumerate(draws.gens)]
    return af.TimePairs(*(torch.cat([getattr(p, f) for p in pairs]) for f in ("t", "r", "kind")))


def anyflow_loss(model, cfg: RunConfig, batch: Batch, *, step: int, dp_rank: int, dp_world: int, micro: int,
                 gather: Gather, negative: torch.Tensor | None = None,
                 audio_silence: torch.Tensor | None = None,
                 clean_context: bool = True) -> tuple[torch.Tensor, list[dict]]:
    """The step's AnyFlow loss and per-sample records. ``clean_context``: the forwards without grad
    reuse the keys/values of the rows before the noisy ones (Wan: the clean half, ``_wan_velocity``;
    H3: text, anchor, audio and clean, ``_h3_output``); False runs every forward over the whole
    sequence (the same numbers; kept for the equality tests and benchmarks)."""
    a, family = cfg.train.anyflow, cfg.model.family
    accum = cfg.train.gradient_accumulation
    x0 = batch.latents
    B = x0.shape[0]
    device = x0.device
    draws, offset = _draws(cfg, step, dp_rank, micro, B)
    size = dp_world * accum * B
    shift = cfg.model.timestep_shift
    drops = [False] * B
    if family == "minimax_h3":
        keep_latents = a.trained_latents or x0.shape[2]
        x0 = x0[:, :, :keep_latents]
        cameras = batch.cameras[:, :keep_latents]
        k = cfg.train.fm.keyframe_anchor_t
        anchor_eps = draws.noise(x0[:, :, :1].shape, device)
        anchor = k * batch.latents[:, :, :1] + (1 - k) * anchor_eps
        audio = t_audio = None
        if audio_silence is not None:
            silence = to_device(audio_silence, device).expand(B, *audio_silence.shape)
            audio_eps = draws.noise(silence.shape, device)
            t_audio = to_device(draws.each(lambda g: fm.sample_h3_times(1, cfg.model.audio_timestep_shift, g)),
                                device)
            audio = fm.noisy_h3(silence, audio_eps, t_audio)
        eps = draws.noise(x0.shape, device)
        pairs = _time_pairs(draws, offset, size, a)

        velocity = af.reversed_time_velocity(_h3_output(model, x0, batch, anchor, audio, t_audio, cameras,
                                                        clean_context))
        guidance, keep = 1.0, None
        mask = torch.ones(B, x0.shape[2], device=device)
    else:
        pairs = _time_pairs(draws, offset, size, a)
        eps = draws.noise(x0.shape, device)
        drops = _drops(cfg, step, offset, B)
        guidance = a.guidance_scale or 1.0
        if guidance != 1.0 and negative is None:
            raise ValueError("a guided AnyFlow target needs the negative prompt (data.negative_prompt)")
        neg = None if negative is None else to_device(negative.to(batch.prompt.dtype), device)[None].expand(B, -1, -1)
        velocity = _wan_velocity(model, x0, batch, neg, clean_context)

        keep = torch.zeros(B, x0.shape[2], dtype=torch.bool)   # built on the host, copied without waiting
        keep[:, 0] = torch.tensor([not d for d in drops])
        keep = to_device(keep, device)
        mask = (~keep).float()
    t_raw, r_raw = af.raw_levels(pairs, shift)
    frames = x0.shape[2]
    t_f = to_device(t_raw, device)[:, None].expand(B, frames).clone()
    r_f = to_device(r_raw, device)[:, None].expand(B, frames).clone()
    if keep is not None:  # masked_fill: a boolean index on a GPU tensor waits for the device (nonzero)
        t_f, r_f = t_f.masked_fill(keep, 0.0), r_f.masked_fill(keep, 0.0)
    terms = af.flow_map_terms(velocity, x0, eps, t_f, r_f, mask, guidance=guidance,
                              epsilon=a.central_difference_epsilon, keep=keep)
    losses = terms.losses
    if a.rescale_non_diffusion:
        everyone = gather([(float(v), bool(d)) for v, d in zip(losses.detach(), pairs.is_diffusion)])
        global_losses = torch.tensor([v for v, _ in everyone], device=device)
        global_diffusion = torch.tensor([d for _, d in everyone], device=device)
        losses = af.adaptive_rescale(losses, to_device(pairs.is_diffusion, device), global_losses, global_diffusion)
    weights = to_device(af.gaussian_weight_at(t_raw, shift), device)
    losses = losses * weights
    kept = losses.detach()
    records = []
    for i, ident in enumerate(batch.identities):
        records.append({**ident, "timestep": float(t_raw[i]), "r_timestep": float(r_raw[i]),
                        "kind": af.KIND_NAMES[int(pairs.kind[i])], "image_condition_dropped": drops[i],
                        "loss": kept[i]})   # read with the step's other records (engine.read_records)
    return losses.mean(), records


def _wan_velocity(model, x0: torch.Tensor, batch: Batch, neg: torch.Tensor | None, clean_context: bool):
    """The model as AnyFlow's velocity over ``[clean | noisy]``. The clean half sits at t = r = 0
    with the same latents in every forward of the step and attends only to clean tokens, so the
    forwards without grad run it once per prompt (``teacher_context``) and then the noisy half
    alone; the forward with grad runs the whole sequence (the clean half's activations get
    gradients). When: ``_reuses_context``."""
    from solar.train.profiling import phase

    reuse = _reuses_context(model, clean_context)
    held: dict[bool, object] = {}    # one context at a time: the negative prompt's, then the prompt's

    def velocity(z, t_raw, r_raw, negative_prompt):
        prompt = neg if negative_prompt else batch.prompt
        grad = torch.is_grad_enabled()
        if not reuse or grad:
            held.clear()
            with phase("forward/" + ("with-grad" if grad else "without-grad-full")):
                return model.forward_teacher_forcing(x0, z, t_raw, prompt, cameras=batch.cameras, r_timestep=r_raw)
        if negative_prompt not in held:
            held.clear()
            with phase("forward/clean-context"):
                held[negative_prompt] = model.teacher_context(x0, prompt, cameras=batch.cameras,
                                                              with_r=r_raw is not None)
        with phase("forward/without-grad-noisy-half"):
            return model.forward_teacher_forcing(x0, z, t_raw, prompt, cameras=batch.cameras, r_timestep=r_raw,
                                                 context=held[negative_prompt])

    return velocity


def _reuses_context(model, clean_context: bool) -> bool:
    """Whether the forwards without grad run against a teacher-forcing context: asked for, the model
    has one, with or without sequence parallelism (each rank keeps its heads of the context's
    keys/values), but not with compiled blocks: on the H200 a compiled 5B Stage1 step with the
    context had not finished its first step after 395 s, nor 205 s after its launch with every
    forward shape compiled as a fixed shape (no automatic dynamic shapes; bench/RESULTS.md), so
    compiled runs keep the full-sequence forwards. ``SOLAR_COMPILED_CONTEXT=1`` runs the context
    with compiled blocks anyway: the benchmark's switch for measuring it again (the same numbers)."""
    import os

    from solar.train.parallelize import is_compiled

    compiled_ok = os.environ.get("SOLAR_COMPILED_CONTEXT") == "1" or not is_compiled(model)
    return clean_context and hasattr(model, "teacher_context") and compiled_ok


def _h3_output(model, x0: torch.Tensor, batch: Batch, anchor, audio, t_audio, cameras, clean_context: bool):
    """The H3 model over ``[text | anchor | audio | clean | noisy]`` in data-ward time, for
    ``reversed_time_velocity``. Within a step the rows before the noisy ones are the same in every
    forward (one prompt, the step's anchor and noised silence at its audio time, clean latents at
    t = r = 1) and never attend to a noisy row, so the forwards without grad (diagonal, plus,
    minus; H3's target is unguided) run them once (``teacher_context``) and then the noisy rows
    alone; the forward with grad runs the whole sequence."""
    from solar.train.profiling import phase

    reuse = _reuses_context(model, clean_context)
    held = []

    def output(z, t_data, r_data, negative_prompt):
        grad = torch.is_grad_enabled()
        if not reuse or grad:
            held.clear()
            with phase("forward/" + ("with-grad" if grad else "without-grad-full")):
                return model.forward_teacher_forcing(x0, z, t_data, batch.prompt, anchor=anchor, audio=audio,
                                                     audio_timestep=t_audio, cameras=cameras, r_timestep=r_data)
        if not held:
            with phase("forward/clean-context"):
                held.append(model.teacher_context(x0, batch.prompt, anchor=anchor, audio=audio,
                                                  audio_timestep=t_audio, cameras=cameras))
        with phase("forward/without-grad-noisy-half"):
            return model.forward_teacher_forcing(x0, z, t_data, batch.prompt, cameras=cameras, r_timestep=r_data,
                                                 context=held[0])

    return output


def tf_fm_loss(model, cfg: RunConfig, batch: Batch, *, step: int, dp_rank: int, micro: int
               ) -> tuple[torch.Tensor, list[dict]]:
    """Teacher-forcing FM (Wan): per-chunk grid sigma and Gaussian weight; anchored first latent."""
    x0 = batch.latents
    B, _, frames, _, _ = x0.shape
    device = x0.device
    chunk = cfg.model.causal.chunk_latents
    chunks = -(-frames // chunk)
    draws, first = _draws(cfg, step, dp_rank, micro, B)
    table = fm.sigma_table(cfg.model.timestep_shift)
    grid_weights = fm.gaussian_weights(table * fm.NUM_TRAIN_TIMESTEPS)
    index = draws.each(lambda g: torch.randint(0, table.numel(), (1, chunks), generator=g))   # [B, chunks]
    eps = draws.noise(x0.shape, device)
    sigma = to_device(table[index].float().repeat_interleave(chunk, dim=1)[:, :frames], device)   # [B, F]
    weight = to_device(grid_weights[index].float().repeat_interleave(chunk, dim=1)[:, :frames], device)
    if cfg.train.fm.weighting != "gaussian":
        weight = torch.ones_like(weight)
    drops = _drops(cfg, step, first, B)
    mask = torch.ones(B, frames, device=device)
    for i, dropped in enumerate(drops):
        if not dropped:
            sigma[i, 0].fill_(0.0)  # not ``= 0.0``: one element from a Python number syncs on a GPU
            mask[i, 0].fill_(0.0)
    s = sigma[:, None, :, None, None]
    x = (1 - s) * x0 + s * eps
    pred = model.forward_teacher_forcing(x0, x, sigma * fm.NUM_TRAIN_TIMESTEPS, batch.prompt, cameras=batch.cameras)
    err = (pred.float() - (eps - x0).float()).square().mean(dim=(1, 3, 4))   # [B, F]
    losses = (err * mask * weight).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    kept = losses.detach()
    records = []
    for i, ident in enumerate(batch.identities):
        records.append({**ident, "timestep": sigma[i].max() * fm.NUM_TRAIN_TIMESTEPS,   # read with the step's
                        "image_condition_dropped": drops[i], "loss": kept[i]})         # records, at once
    return losses.mean(), records
