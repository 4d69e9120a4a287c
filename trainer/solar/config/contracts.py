"""Route and family contracts over a schema-valid config.

Three steps, in order, each a pure function of the config:

1. ``derive_route`` — the route key from model/train fields, checked against the supported table
   and the action.
2. ``check_applicability`` — values the route or action would silently ignore are rejected
   (an AnyFlow block on a Stage0.5 run, a training batch field on an inference run, ...).
3. ``fill_defaults`` then ``check_values`` — the route's defaults are written into the config so
   the resolved document is explicit, then the values are checked against the family.
"""

from __future__ import annotations

from typing import Any

from solar.config import families, routes
from solar.config.families import Dims, FamilySpec
from solar.config.routes import Route
from solar.config.schema import (
    AnyFlowBlock,
    CausalBlock,
    EmaBlock,
    FlowMatchingBlock,
    InferenceBlock,
    LoraBlock,
    RunConfig,
    SgfBlock,
    validate_tree,
)
from solar.errors import ConfigError

# Flow-matching fields each family reads, with the released recipe's defaults.
FM_FIELDS: dict[str, dict[str, Any]] = {
    "wan22_ti2v_5b": {"weighting": "gaussian", "image_condition_dropout": 0.1},
    "wan22_i2v_a14b": {"weighting": "gaussian", "image_condition_dropout": 0.1},
    "ltx25_video": {"weighting": "uniform", "image_condition_dropout": 0.0,
                    "timestep_sampling": "shifted_logit_normal", "logit_normal_std": 1.0,
                    "logit_normal_eps": 1e-3, "uniform_probability": 0.1},
    "minimax_h3": {"weighting": "uniform", "keyframe_anchor_t": 0.999, "audio_loss_weight": 0.0},
}

# Flow-matching values a family's objective implements; anything else would be accepted and ignored.
FM_ONLY: dict[str, dict[str, tuple[Any, str]]] = {
    "ltx25_video": {"weighting": ("uniform", "LTX-2.5 weights every timestep alike"),
                    "timestep_sampling": ("shifted_logit_normal", "LTX-2.5 draws shifted logit-normal timesteps")},
    "minimax_h3": {"weighting": ("uniform", "MiniMax-H3 weights every timestep alike"),
                   "keyframe_anchor_t": (0.999, "the MiniMax-H3 model embeds its keyframe anchor at t = 0.999"),
                   "audio_loss_weight": (0.0, "MiniMax-H3 training has no audio loss (the encoded silence only "
                                              "conditions)")},
}

# Solvers each route's generation path implements.
SOLVERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("stage0p5", "flow_matching"): ("unipc", "euler"),
    ("stage0p5", "native_rectified_flow"): ("unipc", "euler"),
    ("stage1", "flow_matching"): ("unipc",),
    ("stage1", "anyflow_forward_map"): ("flowmap",),
    ("stage2", "flow_matching"): ("self_forcing",),
}

_TRAIN_ONLY = ("micro_batch_size", "gradient_accumulation", "global_batch_size", "max_steps", "seed",
               "optimizer", "ema", "fm", "anyflow", "sgf")


def derive_route(cfg: RunConfig, expected_action: str | None = None) -> Route:
    if expected_action is not None and cfg.action != expected_action:
        article = "an" if expected_action[:1] in "aeiou" else "a"
        raise ConfigError(
            f"action: the config says action {cfg.action!r} but the command is "
            f"`solar {expected_action}`; use `solar {cfg.action}` or {article} {expected_action} config"
        )
    t = cfg.train
    route = Route(cfg.model.family, t.stage, t.causal_mode, t.objective, t.objective_variant)
    info = routes.lookup(route)
    if info is None:
        allowed = ", ".join(routes.allowed_for(route.family))
        raise ConfigError(
            f"unsupported route {route.key} (from model.family, train.stage, train.causal_mode, "
            f"train.objective, train.objective_variant); {route.family} supports: {allowed}"
        )
    if cfg.action not in info.actions:
        raise ConfigError(
            f"action: route {route.key} supports only {', '.join(info.actions)}, not {cfg.action}"
        )
    return route


def effective_dims(cfg: RunConfig) -> Dims:
    base = families.spec(cfg.model.family).dims(cfg.model.profile)
    if cfg.model.dims is None:
        return base
    overrides = {k: v for k, v in cfg.model.dims.model_dump().items() if v is not None}
    values = {**base.__dict__, **overrides}
    return Dims(**values)


def latent_frames(cfg: RunConfig) -> int:
    spec = families.spec(cfg.model.family)
    frames = spec.vae.latent_frames(cfg.data.pixel_frames)
    if frames is None:
        raise ConfigError(
            f"data.pixel_frames={cfg.data.pixel_frames} is not a frame count the {spec.vae.name} VAE "
            f"encodes ({spec.vae.describe_frames()})"
        )
    return frames


def _reject(key: str, why: str) -> None:
    raise ConfigError(f"{key}: {why}; remove it")


def check_applicability(cfg: RunConfig, route: Route) -> None:
    spec = families.spec(route.family)
    model, train, run = cfg.model, cfg.train, cfg.runtime
    if cfg.action == "infer":
        for name in _TRAIN_ONLY:
            if getattr(train, name) is not None:
                _reject(f"train.{name}",
                        "a training setting that an inference run does not read (the inference "
                        f"sample count is {spec.infer_sample_count_field})")
        for name in ("save_every", "save_every_seconds", "save_steps", "exit_after_step"):
            if getattr(run, name):
                _reject(f"runtime.{name}", "inference runs save no checkpoints")
        if cfg.checkpoint.roles is not None:
            _reject("checkpoint.roles", "inference loads one model from checkpoint.path")
        other = ("inference.sample_count" if spec.infer_sample_count_field == "validation.sample_count"
                 else "validation.sample_count")
        set_other = (cfg.inference is not None and cfg.inference.sample_count is not None
                     if other == "inference.sample_count" else cfg.validation.sample_count is not None)
        if set_other:
            _reject(other, f"{route.family} inference reads {spec.infer_sample_count_field}; "
                           "set that field instead")
    elif cfg.inference is not None:
        _reject("inference", "read only by action infer (periodic validation settings live under "
                             "validation)")
    if train.anyflow is not None and route.objective != "anyflow_forward_map":
        _reject("train.anyflow", f"route {route.key} is not an AnyFlow route")
    if train.sgf is not None and route.stage != "stage2":
        _reject("train.sgf", f"route {route.key} is not a Stage2 route")
    if model.causal is not None and not route.causal:
        _reject("model.causal", f"route {route.key} is bidirectional")
    if model.anyflow_gate is not None and route.objective != "anyflow_forward_map":
        _reject("model.anyflow_gate", f"route {route.key} is not an AnyFlow route")
    training_mode = model.training_mode or spec.training_mode
    if model.lora is not None and training_mode != "lora":
        _reject("model.lora", "model.training_mode is full")
    if model.audio_timestep_shift is not None and spec.audio_timestep_shift is None:
        _reject("model.audio_timestep_shift", f"{route.family} has no audio branch")
    if model.timestep_shift is not None and spec.timestep_shift is None:
        _reject("model.timestep_shift",
                f"{route.family} draws shifted logit-normal timesteps (train.fm) instead")
    if train.fm is not None:
        allowed = FM_FIELDS[route.family]
        for name, value in train.fm.model_dump().items():
            if value is not None and name not in allowed:
                _reject(f"train.fm.{name}",
                        f"not a {route.family} setting (it reads {', '.join(sorted(allowed))})")
            only = FM_ONLY.get(route.family, {}).get(name)
            if value is not None and only is not None and value != only[0]:
                raise ConfigError(f"train.fm.{name}={value!r}: {only[1]}; use {only[0]!r} or leave it unset")
    if train.anyflow is not None and route.family == "minimax_h3" and train.anyflow.guidance_scale:
        _reject("train.anyflow.guidance_scale", "MiniMax-H3 AnyFlow is unguided")
    if train.sgf is not None and route.family == "minimax_h3" and train.sgf.real_guidance_scale:
        _reject("train.sgf.real_guidance_scale", "MiniMax-H3 SGF is unguided")
    if cfg.inference is not None and cfg.inference.length == "camera" and not (
            route.family == "wan22_ti2v_5b" and route.stage == "stage2"):
        raise ConfigError("inference.length=camera: camera-length inference is the Wan TI2V-5B "
                          "Stage2 route only; use inference.length=fixed")


def fill_defaults(cfg: RunConfig, route: Route) -> RunConfig:
    """The same config with every default the route reads written out."""
    spec = families.spec(route.family)
    data = cfg.model_dump(by_alias=True)
    m, t, c, r = data["model"], data["train"], data["checkpoint"], data["runtime"]
    m["training_mode"] = m["training_mode"] or spec.training_mode
    if m["training_mode"] == "lora" and m["lora"] is None:
        m["lora"] = LoraBlock().model_dump()
    if spec.timestep_shift is not None and m["timestep_shift"] is None:
        m["timestep_shift"] = spec.timestep_shift
    if spec.audio_timestep_shift is not None and m["audio_timestep_shift"] is None:
        m["audio_timestep_shift"] = spec.audio_timestep_shift
    if route.objective == "anyflow_forward_map" and m["anyflow_gate"] is None:
        m["anyflow_gate"] = 0.25
    if route.causal:
        causal = m["causal"] or CausalBlock().model_dump()
        causal["chunk_latents"] = causal["chunk_latents"] or spec.chunk_latents
        causal["max_prior_clean_chunks"] = causal["max_prior_clean_chunks"] or spec.max_prior_clean_chunks
        causal["kv_cache_latents"] = causal["kv_cache_latents"] or spec.kv_cache_latents
        m["causal"] = causal
    if cfg.action == "train":
        t["micro_batch_size"] = t["micro_batch_size"] or 1
        t["gradient_accumulation"] = t["gradient_accumulation"] or 1
        t["seed"] = 42 if t["seed"] is None else t["seed"]
        t["ema"] = t["ema"] or EmaBlock(enabled=False).model_dump()
        fm = t["fm"] or FlowMatchingBlock().model_dump()
        for name, default in FM_FIELDS[route.family].items():
            if fm[name] is None:
                fm[name] = default
        t["fm"] = fm
        if route.objective == "anyflow_forward_map":
            anyflow = t["anyflow"] or AnyFlowBlock().model_dump()
            if route.family == "wan22_ti2v_5b" and anyflow["guidance_scale"] is None:
                anyflow["guidance_scale"] = 3.0
            if route.family == "minimax_h3" and anyflow["trained_latents"] is None:
                anyflow["trained_latents"] = 45
            t["anyflow"] = anyflow
        if route.stage == "stage2":
            sgf = t["sgf"] or SgfBlock().model_dump()
            if route.family == "wan22_ti2v_5b" and sgf["real_guidance_scale"] is None:
                sgf["real_guidance_scale"] = 3.0
            lat = latent_frames(cfg)
            default_rollout = 50 if route.family == "minimax_h3" else lat
            sgf["rollout_latents"] = sgf["rollout_latents"] or default_rollout
            sgf["supervised_latents"] = sgf["supervised_latents"] or min(lat, sgf["rollout_latents"])
            t["sgf"] = sgf
        c["mode"] = c["mode"] or "none"
        r["checkpoint_on_stop"] = True if r["checkpoint_on_stop"] is None else r["checkpoint_on_stop"]
        if data["data"]["seed"] is None:
            data["data"]["seed"] = t["seed"]
    else:
        c["mode"] = c["mode"] or "weights_only"
        r["checkpoint_on_stop"] = False if r["checkpoint_on_stop"] is None else r["checkpoint_on_stop"]
        data["inference"] = data["inference"] or InferenceBlock().model_dump()
        if data["data"]["seed"] is None:
            data["data"]["seed"] = data["validation"]["noise_seed"]
    return validate_tree(data)


def validation_active(cfg: RunConfig) -> bool:
    if cfg.action == "infer":
        return True
    schedule = cfg.runtime.validate_every > 0 or bool(cfg.runtime.validation_steps)
    return bool(cfg.validation.passes) and schedule


def _need(value: Any, key: str, why: str) -> None:
    if value is None or value == "":
        raise ConfigError(f"{key}: required {why}")


def check_values(cfg: RunConfig, route: Route) -> None:
    spec = families.spec(route.family)
    _check_frames(cfg, route, spec)
    _check_model(cfg, route, spec)
    if cfg.action == "train":
        _check_training(cfg, route)
    _check_validation(cfg, route, spec)
    _check_checkpoint(cfg, route)


def _check_frames(cfg: RunConfig, route: Route, spec: FamilySpec) -> None:
    allowed = spec.frame_profiles[route.stage]
    if cfg.data.pixel_frames not in allowed:
        choices = " or ".join(str(f) for f in allowed)
        raise ConfigError(
            f"data.pixel_frames={cfg.data.pixel_frames} is outside the {route.family} {route.stage} "
            f"frame profile; use {choices}"
        )
    latent_frames(cfg)
    dims = effective_dims(cfg)
    for key, pixels, patch in (("data.height", cfg.data.height, dims.patch_size[1]),
                               ("data.width", cfg.data.width, dims.patch_size[2])):
        multiple = spec.vae.spatial * patch
        if pixels % multiple:
            raise ConfigError(
                f"{key}={pixels} must be a multiple of {multiple} for {route.family} "
                f"(VAE x{spec.vae.spatial}, patch {patch})"
            )


def _check_model(cfg: RunConfig, route: Route, spec: FamilySpec) -> None:
    model = cfg.model
    if model.camera_translation_transform not in spec.camera_transforms:
        raise ConfigError(
            f"model.camera_translation_transform={model.camera_translation_transform}: "
            f"{route.family} requires {' or '.join(spec.camera_transforms)}"
        )
    dims = effective_dims(cfg)
    if dims.head_dim % 4:
        raise ConfigError(f"model.dims.head_dim={dims.head_dim} must be a multiple of 4 "
                          "(camera PRoPE acts on 4-channel blocks)")
    if dims.prope_start >= dims.head_dim or dims.prope_start % 4:
        raise ConfigError(f"model.dims.head_dim={dims.head_dim} leaves no camera PRoPE channels after "
                          f"the {dims.prope_start} RoPE channels of {route.family}")
    if model.lora is not None and len(set(model.lora.targets)) != len(model.lora.targets):
        raise ConfigError("model.lora.targets: each target may appear once")
    _check_fp8(cfg)
    if model.causal is not None:
        causal = model.causal
        if causal.chunk_latents != spec.chunk_latents:
            raise ConfigError(
                f"model.causal.chunk_latents={causal.chunk_latents}: {route.family} chunks are "
                f"{spec.chunk_latents} latents"
            )
        if causal.kv_cache_latents % causal.chunk_latents:
            raise ConfigError(
                f"model.causal.kv_cache_latents={causal.kv_cache_latents} must be a whole number of "
                f"{causal.chunk_latents}-latent chunks"
            )


def _check_fp8(cfg: RunConfig) -> None:
    """``model.fp8_linear`` where it cannot apply (the torchao and GPU checks are the launch's,
    ``solar.train.fp8.launch_problem``)."""
    recipe = cfg.model.fp8_linear
    if recipe == "off":
        return
    key = f"model.fp8_linear={recipe}"
    if cfg.action == "infer":
        raise ConfigError(f"{key}: solar infer computes in bf16 (FP8 is a training recipe); set model.fp8_linear=off")
    if cfg.model.dtype == "float32":
        raise ConfigError(f"{key} needs bf16 compute; set model.dtype=auto or bfloat16, or model.fp8_linear=off")
    if cfg.model.training_mode == "lora":
        raise ConfigError(f"{key} does not apply to LoRA routes (torchao's float8 swaps plain nn.Linear layers; a "
                          "LoRA layer computes its frozen base product itself); set model.fp8_linear=off or "
                          "model.training_mode=full")


def _check_training(cfg: RunConfig, route: Route) -> None:
    train, run = cfg.train, cfg.runtime
    _need(cfg.data.root, "data.root", "for training")
    _need(cfg.data.train_index, "data.train_index", "for training")
    _need(train.max_steps, "train.max_steps", "for training (the last optimizer step)")
    _need(train.optimizer, "train.optimizer", "for training (at least train.optimizer.lr)")
    for key in ("save_steps", "validation_steps"):
        late = [s for s in getattr(run, key) if s > train.max_steps]
        if late:
            raise ConfigError(f"runtime.{key} contains {late[0]} > train.max_steps={train.max_steps}; "
                              "that step never runs")
    if run.exit_after_step is not None and run.exit_after_step > train.max_steps:
        raise ConfigError(f"runtime.exit_after_step={run.exit_after_step} > train.max_steps="
                          f"{train.max_steps}; that step never runs")
    if train.optimizer.warmup_steps > train.max_steps:
        raise ConfigError(f"train.optimizer.warmup_steps={train.optimizer.warmup_steps} exceeds "
                          f"train.max_steps={train.max_steps}")
    if train.anyflow is not None:
        a = train.anyflow
        if a.diffusion_ratio + a.consistency_ratio > 1.0:
            raise ConfigError(
                f"train.anyflow.diffusion_ratio + consistency_ratio = "
                f"{a.diffusion_ratio + a.consistency_ratio:g} exceeds 1; the rest are flow-map samples"
            )
        if a.trained_latents is not None and a.trained_latents > latent_frames(cfg):
            raise ConfigError(f"train.anyflow.trained_latents={a.trained_latents} exceeds the "
                              f"{latent_frames(cfg)} latents of a clip")
    if train.sgf is not None:
        s = train.sgf
        if any(a <= b for a, b in zip(s.denoising_steps, s.denoising_steps[1:])):
            raise ConfigError("train.sgf.denoising_steps must be strictly descending, e.g. "
                              "[1000, 750, 500, 250]")
        if s.score_timestep_min >= s.score_timestep_max:
            raise ConfigError("train.sgf.score_timestep_min must be below score_timestep_max")
        chunk = cfg.model.causal.chunk_latents
        if s.rollout_latents % chunk:
            raise ConfigError(f"train.sgf.rollout_latents={s.rollout_latents} must be a whole number "
                              f"of {chunk}-latent chunks")
        if s.supervised_latents > s.rollout_latents:
            raise ConfigError("train.sgf.supervised_latents exceeds train.sgf.rollout_latents")
        _need(s.critic_optimizer, "train.sgf.critic_optimizer", "for Stage2 (the critic's optimizer)")


def _check_validation(cfg: RunConfig, route: Route, spec: FamilySpec) -> None:
    v = cfg.validation
    names = [p.name for p in v.passes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"validation.passes: duplicate pass name {dupes[0]!r}")
    solvers = SOLVERS[(route.stage, route.objective)]
    for i, p in enumerate(v.passes):
        if p.solver not in solvers:
            raise ConfigError(
                f"validation.passes.{i}.solver={p.solver}: route {route.key} generates with "
                f"{' or '.join(solvers)}"
            )
        if cfg.action == "train":
            if p.weights == "model":
                raise ConfigError(f"validation.passes.{i}.weights=model: training validation uses "
                                  "live or ema weights")
            if p.weights == "ema" and not cfg.train.ema.enabled:
                raise ConfigError(f"validation.passes.{i}.weights=ema but train.ema.enabled is false; "
                                  "enable train.ema or validate live weights")
    shown = v.decode_latents
    if shown is not None and spec.vae.temporal == "h3" and (shown < 7 or (shown - 2) % 5):
        raise ConfigError(f"validation.decode_latents={shown}: the {spec.vae.name} codec decodes 5n+2 latents with "
                          "n >= 1; set 7, 12, 17, ...")
    if not validation_active(cfg):
        return
    if cfg.action == "infer":
        if not v.passes:
            raise ConfigError("validation.passes: an inference run needs at least one pass")
        _need(cfg.data.root, "data.root", "for inference")
        count = (v.sample_count if spec.infer_sample_count_field == "validation.sample_count"
                 else cfg.inference.sample_count)
        _need(count, spec.infer_sample_count_field, f"for {route.family} inference")
    else:
        _need(v.sample_count, "validation.sample_count", "when validation is scheduled")
    _need(cfg.data.test_index, "data.test_index", "for validation and inference")
    if cfg.inference is not None and cfg.inference.length == "camera":
        for i, p in enumerate(v.passes):
            if p.weights != "model":
                raise ConfigError(
                    f"validation.passes.{i}.weights={p.weights}: camera-length inference loads the "
                    "released checkpoint as one model; use weights: model"
                )


def _check_checkpoint(cfg: RunConfig, route: Route) -> None:
    ck = cfg.checkpoint
    if cfg.action == "infer":
        if ck.mode != "weights_only":
            raise ConfigError(f"checkpoint.mode={ck.mode}: inference loads weights from "
                              "checkpoint.path; leave checkpoint.mode unset")
        _need(ck.path, "checkpoint.path", "for inference (the checkpoint or released package)")
        if ck.weights is not None and not any(p.weights == "model" for p in cfg.validation.passes):
            _reject("checkpoint.weights", "read only by passes with weights: model (the others "
                                          "name their weights)")
        if cfg.inference.length == "camera" and ck.weights is not None:
            raise ConfigError("checkpoint.weights: camera-length inference takes the weight role "
                              "from release-manifest.json; remove checkpoint.weights")
        return
    mode = ck.mode
    if mode == "none":
        for key in ("path", "weights", "roles"):
            if getattr(ck, key) is not None:
                _reject(f"checkpoint.{key}", "checkpoint.mode is none (fresh start); set "
                                             "checkpoint.mode to use a source")
    elif mode in ("weights_only", "full_resume"):
        _need(ck.path, "checkpoint.path", f"for checkpoint.mode={mode}")
        if ck.roles is not None:
            _reject("checkpoint.roles", f"checkpoint.mode={mode} loads one checkpoint.path")
        if mode == "weights_only":
            _need(ck.weights, "checkpoint.weights", "for checkpoint.mode=weights_only (live or ema)")
            if route.stage == "stage2":
                raise ConfigError("checkpoint.mode=weights_only: Stage2 initialises three roles; use "
                                  "checkpoint.mode=roles with checkpoint.roles.{student,teacher,critic}")
        elif ck.weights is not None:
            _reject("checkpoint.weights", "full resume restores live and EMA weights together")
    elif mode == "roles":
        if route.stage != "stage2":
            raise ConfigError(f"checkpoint.mode=roles: only Stage2 has roles; route {route.key} uses "
                              "weights_only or full_resume")
        for key in ("path", "weights"):
            if getattr(ck, key) is not None:
                _reject(f"checkpoint.{key}", "checkpoint.mode=roles reads checkpoint.roles.<role>")
        roles = ck.roles
        for role in ("student", "teacher", "critic"):
            if roles is None or getattr(roles, role) is None:
                raise ConfigError(f"checkpoint.roles.{role}: required for checkpoint.mode=roles "
                                  "(student, teacher and critic)")
        if roles.teacher.path != roles.critic.path:
            raise ConfigError("checkpoint.roles.critic.path must equal checkpoint.roles.teacher.path: "
                              "teacher and critic start from the same Stage0.5 source")


def unread_prefixes(cfg: RunConfig, route: Route) -> list[str]:
    """Dotted key prefixes the action does not read (placeholders there are harmless)."""
    unread = ["metadata"]
    ck, model = cfg.checkpoint, cfg.model
    lora = model.training_mode == "lora"
    # Wan's AnyFlow target and its Stage2 real score are guided by the negative prompt.
    guided = route.family == "wan22_ti2v_5b" and (
        route.objective == "anyflow_forward_map" or route.stage == "stage2")
    if cfg.action == "train":
        unread.append("inference")
        if ck.mode in ("none", "roles"):
            unread += ["checkpoint.path", "checkpoint.weights"]
        if ck.mode != "roles":
            unread.append("checkpoint.roles")
        if ck.mode != "none" and not lora:
            unread.append("model.pretrained_path")
        if not validation_active(cfg):
            unread += ["data.test_index", "model.vae_path", "validation"]
        cfg_guidance = validation_active(cfg) and (cfg.validation.guidance_scale or 1.0) > 1.0
        if not (guided or cfg_guidance):
            unread.append("data.negative_prompt")
    else:
        unread += ["data.train_index", "checkpoint.roles"]
        if not lora:
            unread.append("model.pretrained_path")
        if not (guided or (cfg.validation.guidance_scale or 1.0) > 1.0):
            unread.append("data.negative_prompt")
    return unread


def is_read_by(cfg: RunConfig, route: Route):
    unread = unread_prefixes(cfg, route)

    def is_read(dotted: str) -> bool:
        return not any(dotted == p or dotted.startswith(p + ".") for p in unread)

    return is_read


def checkpoint_contract(cfg: RunConfig, route: Route) -> dict:
    """What a checkpoint records about the route it was trained for (and loaders check)."""
    return {"family": route.family, "stage": route.stage, "causal_mode": route.causal_mode,
            "objective": route.objective, "objective_variant": route.variant,
            "camera_translation_transform": cfg.model.camera_translation_transform,
            "parameterization": families.spec(route.family).parameterization,
            "sequence_parallel_size": cfg.distributed.sequence_parallel_size,
            "data_generation": "solar.latent-sample.v1"}


# Which source stage/objective each target may initialise from (semantics.md §1, §5).
INIT_SOURCES = {
    "stage0p5": {("stage0p5", None)},
    "stage1": {("stage0p5", None)},
}


def source_problem(target: Route, source: dict, cfg: RunConfig, *, resume: bool) -> str | None:
    """Why a checkpoint's contract cannot feed this route, or None."""
    if source.get("family") != target.family:
        return f"it is a {source.get('family')} checkpoint, this run is {target.family}"
    if source.get("camera_translation_transform") != cfg.model.camera_translation_transform:
        return (f"its camera translation transform is {source.get('camera_translation_transform')}, this run uses "
                f"{cfg.model.camera_translation_transform}")
    if source.get("parameterization") != families.spec(target.family).parameterization:
        return f"its parameterization is {source.get('parameterization')}"
    if resume:
        # not the SP degree: a resume may change the topology, keeping the global batch (issue 39;
        # ``train.sources.preflight_sources`` compares that with the checkpoint's data/position.json)
        for key in ("stage", "causal_mode", "objective", "objective_variant"):
            expected = checkpoint_contract(cfg, target)[key]
            if source.get(key) != expected:
                return f"a full resume needs {key} {expected!r}, the checkpoint has {source.get(key)!r}"
        return None
    allowed = INIT_SOURCES.get(target.stage, set())
    if (source.get("stage"), None) not in allowed:
        stages = " or ".join(sorted(s for s, _ in allowed)) or "no single checkpoint (use roles)"
        return f"route {target.key} initialises from {stages} weights, the checkpoint is {source.get('stage')}"
    return None
