"""Which single-model loss a route trains with, bound to the run: (model, batch, step, micro) ->
(loss, per-sample records), plus the loss term's name for events and metrics."""

from __future__ import annotations

import torch

from solar.errors import SolarError
from solar.launch.conditions import negative_prompt
from solar.train.fm_step import fm_loss


def objective_for(resolved, dist, audio_silence: torch.Tensor | None):
    cfg, route = resolved.config, resolved.route
    if route.stage == "stage0p5":
        def run(model, batch, step, micro):
            return fm_loss(model, cfg, batch, step=step, dp_rank=dist.dp_rank, micro=micro,
                           audio_silence=audio_silence)
        return run, "fm"
    if route.stage == "stage1" and route.objective == "anyflow_forward_map":
        from solar.train.stage1_step import anyflow_loss

        guided = (cfg.train.anyflow.guidance_scale or 1.0) != 1.0
        negative = negative_prompt(cfg, "train.anyflow.guidance_scale != 1") if guided else None

        earlier: list = []   # every rank's (loss, is_diffusion) of the step's earlier micro-batches

        def gather(entries: list) -> list:
            """The logical-global batch's entries seen so far this step: this micro-batch's of every rank
            and the earlier micro-batches' (a non-diffusion sample is rescaled by every diffusion loss
            computed before or with it, so with gradient accumulation the reference is not limited to
            one micro-batch: world 1 x accumulation 2 rescales as world 2 x 1 does)."""
            earlier.extend(e for part in dist.all_gather_object(entries, "anyflow-rescale") for e in part)
            return list(earlier)

        def run(model, batch, step, micro):
            if micro == 0:
                earlier.clear()
            return anyflow_loss(model, cfg, batch, step=step, dp_rank=dist.dp_rank, dp_world=dist.dp_world,
                                micro=micro, gather=gather, negative=negative, audio_silence=audio_silence)
        return run, "anyflow"
    if route.stage == "stage1":
        from solar.train.stage1_step import tf_fm_loss

        def run(model, batch, step, micro):
            return tf_fm_loss(model, cfg, batch, step=step, dp_rank=dist.dp_rank, micro=micro)
        return run, "tf_fm"
    raise SolarError(f"route {route.key} has no single-model objective (Stage2 trains three roles)")
