"""GPU memory forecast of a resolved training config, per GPU, before any pod exists (no torch).

What one GPU holds during a step, per role (``model``; Stage2: ``student``, ``critic``,
``teacher``) and per kind:

- ``parameters``: trainable fp32 master weights (LoRA: the adapters), ``frozen``: weights that do not
  train (a LoRA base, Stage2's teacher) in their storage dtype (Stage2's LoRA roles share one base,
  counted once under ``teacher``: the trainer shares it when the roles' bases are the same bytes, as
  they are on a released base; a role whose base differs holds its own copy, not forecast here);
  ``gradients`` (fp32), ``optimizer`` (AdamW's two fp32 moments), ``ema`` (fp32 shadow of the
  trainable weights). Sharded runs divide each by the shard group: every rank for ``full_shard``,
  the GPUs of a node for ``hybrid_shard``.
- ``working``: under FSDP2, the gathered bf16 weights of the running block and the next one, and a
  block's fp32 gradients before they are reduced (Stage2: within the updating role's update).
- ``activations``: what an update holds beyond its role's states (its gradients included), the
  largest of three moments (``Activations``): the end of the forward (saved activations under the
  checkpointing policy and kept blocks, the head's transient, and eager unsharded, autocast's bf16
  cast of every trainable weight), the start of the backward (the saved activations and one block
  recomputed) and the end of the backward (every gradient and what the first block's backward still
  holds), at the config's tokens per GPU (micro-batch and sequence length divided by SP) from the
  measured per-token table ``ACTIVATIONS``; less the role's gradients. Stage2 adds the rollout's
  KV cache.

The peak is every state but the gradients plus the largest update (its gradients and activations):
the trainer frees gradients before each forward (``zero_grad(set_to_none=True)``) and Stage2 frees
a role's after its update, so one role's gradients are held at a time. AdamW is torch's fused kernel
on GPUs: its step adds nothing (measured). A config ``fits`` when the peak leaves ``RESERVE`` of the
GPU free (CUDA context, NCCL buffers, allocator fragmentation). The forecast against measured peaks
is in docs/memory.md (bench/gpu/memory_calibration.py; tests/unit/config/test_memory_calibration.py
holds it to the recorded peaks).

Host memory (CPU RAM) per rank, ``Forecast.host`` (``host_forecast``), from the same parameter counts:

- steady: ``HOST_BASELINE`` for the process (Python, torch, the CUDA runtime; a stated assumption,
  not a measurement; on ``runtime.device: cpu`` ``HOST_BASELINE_CPU`` plus the GPU forecast's peak,
  whose states then live on the host), the data loader's clips (the one read ahead, the batch in use
  and its pinned copy: fp32 latents and prompt rows), and with ``runtime.async_checkpoint`` the
  staging buffers a save fills, kept between saves.
- save, two paths: *whole-file* (today's; every unsharded run, and the format of every checkpoint
  written before the sharded path): rank 0 receives every trained role's whole state, fp32 weights
  (LoRA on a released base: the adapters), AdamW's two moments and the EMA; under FSDP2 every other
  rank also gathers the whole EMA to its host. *sharded* (every rank writes its own shards through
  torch.distributed.checkpoint): every rank holds the same bytes divided by the shard degree. Not
  counted: DCP's safetensors writer builds the file it writes in memory and copies it once, so a
  save also holds up to two files of ``solar.train.checkpoint_shards.FILE_BYTES`` (2 x 256 MiB)
  beside the staged shards.
  Unsharded runs hold the whole state on rank 0 in both. With ``async_checkpoint`` the whole-file
  capture on rank 0 also holds the gathered weights and moments beside the staging buffers.
- load: the loader reads a file tensor by tensor into the rank's own rows, so a start (released
  base, checkpoint, resume) needs the steady figure before any save plus the largest tensor in fp32;
  a run from seeded random weights (no base, no checkpoint) builds the whole model on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from solar.config import families
from solar.config.contracts import effective_dims, latent_frames
from solar.config.parameters import layout, lora_pattern
from solar.errors import ConfigError

GIB = 1 << 30
RESERVE_FRACTION, RESERVE_MIN = 0.05, 3 * GIB
# What ``activation_checkpointing_skip_blocks: auto`` leaves free beyond the usable limit: the forecast's
# error against measured peaks (docs/memory.md: 1.00-1.09x the measured peak).
AUTO_MARGIN = 0.05
HOST_BASELINE = 6 * GIB          # one rank's process on a GPU: Python, torch, the CUDA runtime (assumed, not measured)
HOST_BASELINE_CPU = 2 * GIB      # the same on runtime.device cpu (no CUDA runtime)
CLIP_COPIES = 3                  # the clip read ahead, the batch in use, its pinned copy on the way to the GPU
PROMPT_TOKENS = 512               # text rows in MiniMax-H3's packed sequence (its text encoder's length)

@dataclass(frozen=True)
class Activations:
    """Bytes per token (bf16 compute) of one family's training step at its released width; other
    widths scale linearly. What a step holds beyond its states, at the three moments that can set the
    peak (module docstring):

    - the end of the forward: ``outside`` (what the forward saves outside the blocks), each
      checkpointed block's saved input (``checkpointed[policy]``), each block that keeps its
      activations (``kept``, without eager autocast's weight casts, counted apart), plus ``head``,
      the loss and output head's transient;
    - the start of the backward: the same saved activations plus one checkpointed block recomputed
      (``kept``);
    - the end of the backward: every gradient plus ``tail``, what the backward of the first
      block still holds beside them.

    ``kept`` and ``tail`` differ compiled and eager (``runtime.compile``)."""
    checkpointed: dict[str, float]
    kept_eager: float
    kept_compiled: float
    outside: float
    head: float
    tail_eager: float
    tail_compiled: float

    def kept(self, compiled: bool) -> float:
        return self.kept_compiled if compiled else self.kept_eager

    def tail(self, compiled: bool) -> float:
        return self.tail_compiled if compiled else self.tail_eager


# Wan TI2V-5B, measured: ``solar train`` at world 1, unsharded, 15 of 30 blocks, on one H100 with the
# phase probe (bench/gpu/memory_calibration.py, 2026-12-07: Stage1 TF-AnyFlow compiled with 0, 6 and
# 10 kept blocks and eager with 0 and 6, Stage0.5 compiled with 0 and 8, Stage2's critic update at 5
# blocks with 0 and 5); ``kept_eager`` is the H200 table of 2026-12-04 (bench/gpu/memory.py, eager:
# 224,101; the H100's eager Stage1 gave 226,400). Compiled kept blocks measured 183,400 (Stage1),
# 203,000 (Stage0.5) and 215,000 (Stage2's critic), ``head`` 28,500-51,700, ``tail_compiled``
# 158,000-171,100, the eager tail 2,400: the table holds the largest or a middle figure.
_WAN5B = Activations({"full": 2 * 3072, "save_attention": 4 * 3072}, kept_eager=224101, kept_compiled=205000,
                     outside=55000, head=52000, tail_eager=2400, tail_compiled=171000)


def _eager_only(full: tuple[float, float], save_attention: tuple[float, float], none: tuple[float, float],
                *, compiled_ratio: float = 1.0) -> Activations:
    """A family measured eager only (the H200 table of 2026-12-04, bench/gpu/memory.py: per block and
    outside the blocks, per policy): ``outside`` is what stays outside the blocks without
    checkpointing (the head's transient within it); one block's recomputation stands for the tail.
    ``compiled_ratio``: a compiled kept block against an eager one, where the block is Wan TI2V-5B's
    code (its measured ratio); elsewhere 1 (compiled is then forecast as eager: over, never under)."""
    kept = none[0]
    return Activations({"full": full[0], "save_attention": save_attention[0]}, kept_eager=kept,
                       kept_compiled=kept * compiled_ratio, outside=none[1], head=0, tail_eager=kept,
                       tail_compiled=kept * compiled_ratio)


ACTIVATIONS: dict[str, Activations] = {
    "wan22_ti2v_5b": _WAN5B,
    # A14B's blocks are TI2V-5B's at another width: its eager table, 5B's compiled ratio and 5B's
    # measured outside, head and tails scaled by its own table's outside figure
    "wan22_i2v_a14b": Activations({"full": 2 * 5120, "save_attention": 4 * 5120}, kept_eager=332683,
                                  kept_compiled=332683 * _WAN5B.kept_compiled / _WAN5B.kept_eager,
                                  outside=55000 * 107418 / 64362, head=52000 * 107418 / 64362,
                                  tail_eager=2400 * 332683 / 224101, tail_compiled=171000 * 332683 / 224101),
    "ltx25_video": _eager_only((41099, 522775), (57869, 506222), (515557, 41881)),
    "minimax_h3": _eager_only((10032, 537453), (25334, 522102), (428176, 117387)),
}


@dataclass
class Forecast:
    gpu_memory_bytes: int
    peak_bytes: int
    fits: bool
    roles: dict[str, dict[str, int]]
    shard_degree: int
    tokens_per_gpu: dict[str, int]
    usable_bytes: int
    suggestions: list[str] = field(default_factory=list)
    faster: str | None = None   # a config that fits: fewer blocks recomputed that still fit, if any
    auto: int | None = None     # activation_checkpointing_skip_blocks: auto -> the blocks it keeps
    host: HostForecast | None = None   # host memory per rank (forecast() always sets it)

    def as_dict(self) -> dict:
        return {"gpu_memory_bytes": self.gpu_memory_bytes, "peak_bytes": self.peak_bytes, "fits": self.fits,
                "usable_bytes": self.usable_bytes, "shard_degree": self.shard_degree,
                "tokens_per_gpu": self.tokens_per_gpu, "roles": self.roles, "suggestions": self.suggestions,
                "faster": self.faster, "auto_kept_blocks": self.auto,
                "host": self.host.as_dict() if self.host else None}


@dataclass
class HostPhases:
    """One rank's host bytes: between saves, during a save, during a load; the peak is the largest."""
    steady: int
    save: int
    load: int

    @property
    def peak(self) -> int:
        return max(self.steady, self.save, self.load)

    def as_dict(self) -> dict:
        return {"steady_bytes": self.steady, "save_bytes": self.save, "load_bytes": self.load,
                "peak_bytes": self.peak}


@dataclass
class HostForecast:
    """Host memory (CPU RAM) per rank of the config at its topology; ``path`` is the checkpoint path
    the config uses (``sharded`` under FSDP2 with world > 1, else ``whole-file``)."""
    path: str
    shard_degree: int
    gpus_per_node: int
    baseline: int                      # the process (HOST_BASELINE, or on the CPU its states too)
    prefetch: int                      # the data loader's clips
    largest_tensor: int                # fp32 bytes of the largest tensor a load reads at once
    seeded: bool                       # no base, no checkpoint: every rank builds the whole model
    saved: dict[str, dict[str, int]]   # trained role -> {weights, optimizer, ema}: whole bytes a checkpoint holds
    sharded: dict[str, HostPhases]     # "rank0", "other": the sharded path (equal when sharded)
    whole_file: dict[str, HostPhases]  # "rank0", "other": today's whole-file path

    @property
    def used(self) -> dict[str, HostPhases]:
        return self.sharded if self.path == "sharded" else self.whole_file

    @property
    def peak(self) -> int:
        """The peak of the rank that holds the most (rank 0) on the path the config uses."""
        return self.used["rank0"].peak

    def pod_bytes(self, ranks: int | None = None, *, whole_file: bool = False) -> int:
        """The pod that holds rank 0: its peak plus ``ranks - 1`` (default gpus_per_node) other ranks',
        on the path the config uses (``whole_file``: on today's whole-file path)."""
        ranks = self.gpus_per_node if ranks is None else ranks
        phases = self.whole_file if whole_file else self.used
        return phases["rank0"].peak + (ranks - 1) * phases["other"].peak

    def as_dict(self) -> dict:
        gib = lambda n: round(n / GIB, 2)  # noqa: E731
        used, whole = self.used["rank0"], self.whole_file["rank0"]
        return {"path": self.path, "shard_degree": self.shard_degree, "gpus_per_node": self.gpus_per_node,
                "baseline_bytes": self.baseline, "prefetch_bytes": self.prefetch,
                "largest_tensor_bytes": self.largest_tensor, "seeded": self.seeded, "saved": self.saved,
                **used.as_dict(), "pod_bytes": self.pod_bytes(),
                "whole_file_pod_bytes": self.pod_bytes(whole_file=True),
                "sharded": {k: v.as_dict() for k, v in self.sharded.items()},
                "whole_file": {k: v.as_dict() for k, v in self.whole_file.items()},
                "gib": {"steady": gib(used.steady), "save": gib(used.save), "load": gib(used.load),
                        "peak": gib(used.peak), "pod": gib(self.pod_bytes()),
                        "whole_file_rank0_save": gib(whole.save), "whole_file_rank0_peak": gib(whole.peak),
                        "whole_file_other_save": gib(self.whole_file["other"].save),
                        "whole_file_pod": gib(self.pod_bytes(whole_file=True))}}


def shard_degree(cfg, gpus_per_node: int) -> int:
    """The GPUs one role's states are divided over."""
    world, strategy = cfg.distributed.world_size, cfg.distributed.sharding
    if strategy == "none" or world == 1:
        return 1
    if strategy == "hybrid_shard" and gpus_per_node < world and world % gpus_per_node == 0:
        return gpus_per_node
    return world


def _tokens_per_frame(cfg) -> int:
    spec, dims = families.spec(cfg.model.family), effective_dims(cfg)
    h, w = cfg.data.height // spec.vae.spatial, cfg.data.width // spec.vae.spatial
    return (h // dims.patch_size[1]) * (w // dims.patch_size[2])


def _sequence(cfg, latents: int) -> int:
    """Rows of one sample's forward over ``latents`` latent frames (H3: + text, anchor, audio rows)."""
    n = _tokens_per_frame(cfg)
    rows = latents * n
    if cfg.model.family == "minimax_h3":
        rows += PROMPT_TOKENS + n + 2 * latents
    return rows


def _transient(cfg, tokens: int, *, gradients: int, trainable: int, sharded: bool) -> int:
    """What one update of ``tokens`` rows (on this GPU) holds beyond its role's states, its own
    ``gradients`` included (freed before the forward, back by the end of the backward): the largest of
    the end of the forward, the start of the backward and the end of the backward (``Activations``),
    policy, kept blocks and ``runtime.compile`` applied. Unsharded eager runs also hold autocast's
    bf16 cast of every ``trainable`` weight through the forward, and the casts a kept block saves."""
    family, dims = cfg.model.family, effective_dims(cfg)
    released = families.spec(family).dims("released")
    width = (dims.num_heads * dims.head_dim if family != "minimax_h3" else dims.hidden_size)
    ref = released.num_heads * released.head_dim if family != "minimax_h3" else released.hidden_size
    per_token = tokens * width / ref
    table, dist, layers = ACTIVATIONS[family], cfg.distributed, dims.num_layers
    compiled = bool(cfg.runtime.compile)
    kept = min(dist.activation_checkpointing_skip_blocks, layers) if dist.activation_checkpointing else layers
    checkpointed = layers - kept
    saved = per_token * (table.outside + kept * table.kept(compiled)
                         + (checkpointed * table.checkpointed[dist.activation_checkpointing_policy]
                            if checkpointed else 0))
    casts = 0 if sharded or compiled else 2 * trainable     # autocast's cache, eager and unsharded only
    block_casts = casts / max(layers, 1)
    recompute = per_token * table.kept(compiled) + block_casts if checkpointed else 0
    end_of_forward = saved + per_token * table.head + casts
    start_of_backward = saved + kept * block_casts + recompute
    end_of_backward = gradients + per_token * table.tail(compiled)
    return int(max(end_of_forward, start_of_backward, end_of_backward))


def _kv_cache(cfg, dims) -> int:
    """The rollout's bf16 KV cache: the window of clean chunks (plus H3's prefix rows), every layer."""
    spec = families.spec(cfg.model.family)
    window = (spec.max_prior_clean_chunks + 1) * spec.chunk_latents * _tokens_per_frame(cfg)
    if cfg.model.family == "minimax_h3":
        window += PROMPT_TOKENS + _tokens_per_frame(cfg)
    return 2 * dims.num_layers * window * dims.num_heads * dims.head_dim * 2 * cfg.train.micro_batch_size


def _states(cfg, *, trainable_role: bool, ema: bool, degree: int, bf16: bool, frozen_bf16: bool,
            shared_base: bool = False) -> dict[str, int]:
    """One role's states; ``shared_base``: Stage2's LoRA roles hold one base, counted under the
    teacher (with the teacher's frozen adapter), none under the trained roles."""
    dims = effective_dims(cfg)
    lay = layout(cfg.model.family, dims, anyflow=cfg.train.objective == "anyflow_forward_map" and trainable_role)
    total = lay.total
    if cfg.model.training_mode == "lora":
        lora = cfg.model.lora
        adapter = lay.lora(lora_pattern(list(lora.targets)), lora.rank)
        trainable = adapter if trainable_role else 0
        frozen = (0 if trainable_role else total + adapter) if shared_base else total
    else:
        trainable, frozen = (total, 0) if trainable_role else (0, total)
    share = lambda n: -(-n // degree)  # noqa: E731  (ceil: FSDP pads the last shard)
    frozen_bytes = 2 if frozen_bf16 else 4
    out = {"parameters": 4 * share(trainable), "frozen": frozen_bytes * share(frozen),
           "gradients": 4 * share(trainable), "optimizer": 8 * share(trainable),
           "ema": 4 * share(trainable) if ema else 0}
    if bf16 and degree > 1:  # two gathered bf16 blocks, one block's unreduced fp32 gradients, the root's own
        block = lay.per_block
        out["working"] = 2 * 2 * block + (4 * block if trainable else 0) + 2 * lay.outside
    return {k: v for k, v in out.items() if v}


def peak_of(roles: dict[str, dict[str, int]]) -> int:
    """Every state but the gradients, plus the largest update: one role updates at a time, holding
    its gradients and its activations (Stage2 frees a role's gradients after its update)."""
    states = sum(v for r in roles.values() for k, v in r.items() if k not in ("gradients", "activations"))
    return states + max(r.get("gradients", 0) + r.get("activations", 0) for r in roles.values())


def blocks_keep(n: int) -> str:
    """``1 block keeps its activations`` / ``N blocks keep their activations``."""
    return f"{n} block keeps its activations" if n == 1 else f"{n} blocks keep their activations"


def with_kept_blocks(resolved, skip: int):
    """``resolved`` with ``skip`` blocks keeping their activations (all of them: checkpointing off)."""
    cfg = resolved.config
    dist, layers = cfg.distributed, effective_dims(cfg).num_layers
    change = {"activation_checkpointing": False, "activation_checkpointing_skip_blocks": 0} if skip >= layers else \
        {"activation_checkpointing": True, "activation_checkpointing_skip_blocks": skip}
    return _Resolved(cfg.model_copy(update={"distributed": dist.model_copy(update=change)}), resolved.route)


def _most_kept(resolved, *, gpu_memory_bytes: int, gpus_per_node: int, margin: int, fewest: int):
    """The most blocks (from all of them down to ``fewest``) that may keep their activations with the
    forecast peak ``margin`` under the usable limit, and that forecast; (None, the last forecast tried)
    when none fits. Activations grow with every kept block: the first fit is the most."""
    fc = None
    for skip in range(effective_dims(resolved.config).num_layers, fewest - 1, -1):
        fc = forecast(with_kept_blocks(resolved, skip), gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node,
                      look_faster=False)
        if fc.peak_bytes + margin <= fc.usable_bytes:
            return skip, fc
    return None, fc


def auto_kept_blocks(resolved, *, gpu_memory_bytes: int, gpus_per_node: int) -> tuple[int, "Forecast"]:
    """``distributed.activation_checkpointing_skip_blocks: auto``: the most blocks that may keep their
    activations (the rest recomputed in backward; all of them: checkpointing off) with the forecast
    peak leaving ``AUTO_MARGIN`` of the GPU free beyond the usable limit, and that forecast. A config
    that does not fit even recomputing every block is a ConfigError naming the need and the fixes."""
    skip, fc = _most_kept(resolved, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node,
                          margin=int(AUTO_MARGIN * gpu_memory_bytes), fewest=0)
    if skip is not None:
        return skip, fc
    fixes = "; ".join(fc.suggestions) or "more GPUs (sharding) or a shorter sequence"
    raise ConfigError(f"distributed.activation_checkpointing_skip_blocks=auto: even recomputing every block the "
                      f"forecast is {fc.peak_bytes / GIB:.1f} GiB per GPU, over {fc.usable_bytes / GIB:.1f} GiB "
                      f"usable of {gpu_memory_bytes / GIB:.0f} GiB less the {AUTO_MARGIN:.0%} margin; try {fixes}")


def forecast(resolved, *, gpu_memory_bytes: int, gpus_per_node: int = 8, look_faster: bool = True) -> Forecast:
    """The per-GPU forecast of a resolved ``train`` config (``solar config memory``); ``look_faster``:
    when it fits, also look for fewer recomputed blocks that still fit (``Forecast.faster``). With
    ``activation_checkpointing_skip_blocks: auto`` the forecast is of what ``auto`` chooses for this
    GPU and topology (``Forecast.auto``), or of every block recomputed when nothing fits."""
    cfg, route = resolved.config, resolved.route
    if cfg.action != "train":
        raise ConfigError("solar config memory forecasts training configs (action: train); this one is "
                          f"action: {cfg.action}")
    if cfg.distributed.activation_checkpointing_skip_blocks == "auto":   # what auto chooses, else every block recomputed
        skip, result = _most_kept(resolved, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node,
                                  margin=int(AUTO_MARGIN * gpu_memory_bytes), fewest=0)
        result.auto = skip or 0
        return result
    dims = effective_dims(cfg)
    degree = shard_degree(cfg, gpus_per_node)
    bf16 = cfg.model.dtype != "float32"
    sp, micro = cfg.distributed.sequence_parallel_size, cfg.train.micro_batch_size
    latents = latent_frames(cfg)
    roles: dict[str, dict[str, int]] = {}
    tokens: dict[str, int] = {}
    ema = cfg.train.ema.enabled
    if route.stage == "stage2":
        sgf = cfg.train.sgf
        cache = _kv_cache(cfg, dims)
        shared = cfg.model.training_mode == "lora"  # the trainer shares a base that is the same bytes
        roles["student"] = _states(cfg, trainable_role=True, ema=ema, degree=degree, bf16=bf16, frozen_bf16=False,
                                   shared_base=shared)
        roles["critic"] = _states(cfg, trainable_role=True, ema=False, degree=degree, bf16=bf16, frozen_bf16=False,
                                  shared_base=shared)
        roles["teacher"] = _states(cfg, trainable_role=False, ema=False, degree=degree, bf16=False,
                                   frozen_bf16=bf16, shared_base=shared)
        tokens["student"] = micro * -(-_sequence(cfg, 2 * sgf.rollout_latents) // sp)  # [committed | at exit]
        tokens["critic"] = micro * -(-_sequence(cfg, sgf.supervised_latents) // sp)
        # One role updates at a time (with the rollout's KV cache beside it), gathering only its own
        # blocks under FSDP2: its working copies belong to its update, not beside the other's
        for role in ("student", "critic"):
            parts = roles[role]
            step = _transient(cfg, tokens[role], gradients=parts.get("gradients", 0),
                              trainable=parts.get("parameters", 0) // 4 if bf16 else 0, sharded=degree > 1) + cache
            step += parts.pop("working", 0)
            parts["activations"] = max(step - parts.get("gradients", 0), 0)
    else:
        roles["model"] = parts = _states(cfg, trainable_role=True, ema=ema, degree=degree, bf16=bf16,
                                         frozen_bf16=False)
        rows = _sequence(cfg, 2 * latents if route.stage == "stage1" else latents)  # Stage1: [clean | noisy]
        tokens["model"] = micro * -(-rows // sp)
        step = _transient(cfg, tokens["model"], gradients=parts.get("gradients", 0),
                          trainable=parts.get("parameters", 0) // 4 if bf16 else 0, sharded=degree > 1)
        parts["activations"] = max(step - parts.get("gradients", 0), 0)
    peak = peak_of(roles)
    usable = gpu_memory_bytes - max(RESERVE_MIN, int(RESERVE_FRACTION * gpu_memory_bytes))
    result = Forecast(gpu_memory_bytes, peak, peak <= usable, roles, degree, tokens, usable,
                      host=host_forecast(resolved, gpus_per_node=gpus_per_node, device_peak=peak))
    if not result.fits:
        result.suggestions = _suggestions(resolved, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node,
                                          peak=peak)
    elif cfg.distributed.activation_checkpointing and look_faster:
        result.faster = _faster(resolved, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node)
    return result


def _saved(cfg, *, ema: bool) -> dict[str, int]:
    """The whole bytes one trained role's checkpoint holds: fp32 weights (LoRA on a released base: the
    adapters only), AdamW's two fp32 moments and the fp32 EMA of the trainable weights."""
    lay = layout(cfg.model.family, effective_dims(cfg), anyflow=cfg.train.objective == "anyflow_forward_map")
    if cfg.model.training_mode == "lora":
        lora = cfg.model.lora
        trainable = lay.lora(lora_pattern(list(lora.targets)), lora.rank)
        weights = trainable if cfg.model.pretrained_path else lay.total + trainable
    else:
        trainable = weights = lay.total
    return {"weights": 4 * weights, "optimizer": 8 * trainable, "ema": 4 * trainable if ema else 0}


def _largest_tensor(cfg) -> int:
    """fp32 bytes of the largest single tensor: a block's (or H3 refiner's) largest linear, or the
    largest projection outside the blocks (Wan's 6D x D and LTX's 9D x D timestep projections, the
    text embedder, H3's output modulation)."""
    family, dims = cfg.model.family, effective_dims(cfg)
    lay = layout(family, dims, anyflow=cfg.train.objective == "anyflow_forward_map")
    inside = max(x.fan_in * x.fan_out for x in lay.block + lay.refiner)
    if family == "minimax_h3":
        width = dims.hidden_size
        outside = max(dims.text_dim * width, width * width)
    else:
        width = dims.num_heads * dims.head_dim
        outside = max((9 if family == "ltx25_video" else 6) * width * width, dims.text_dim * width)
    return 4 * max(inside, outside)


def _prefetch(cfg) -> int:
    """The data loader's clips on the host: ``CLIP_COPIES`` micro-batches of fp32 latents and prompt rows."""
    spec, dims = families.spec(cfg.model.family), effective_dims(cfg)
    latents = spec.vae.channels * latent_frames(cfg) * (cfg.data.height // spec.vae.spatial) * \
        (cfg.data.width // spec.vae.spatial)
    return CLIP_COPIES * cfg.train.micro_batch_size * 4 * (latents + PROMPT_TOKENS * dims.text_dim)


def host_forecast(resolved, *, gpus_per_node: int = 8, device_peak: int = 0) -> HostForecast:
    """Host memory per rank of a resolved ``train`` config at its topology (module docstring);
    ``device_peak``: the GPU forecast's peak, held on the host instead when ``runtime.device`` is cpu."""
    cfg, route = resolved.config, resolved.route
    degree = shard_degree(cfg, gpus_per_node)
    fsdp = cfg.distributed.sharding != "none" and cfg.distributed.world_size > 1
    ema = cfg.train.ema.enabled
    if route.stage == "stage2":   # the frozen teacher is not saved; only the student keeps an EMA
        saved = {"student": _saved(cfg, ema=ema), "critic": _saved(cfg, ema=False)}
    else:
        saved = {"model": _saved(cfg, ema=ema)}
    saved = {role: {k: v for k, v in parts.items() if v} for role, parts in saved.items()}
    whole = sum(v for parts in saved.values() for v in parts.values())
    gathered = sum(parts.get("weights", 0) + parts.get("optimizer", 0) for parts in saved.values())
    ema_bytes = sum(parts.get("ema", 0) for parts in saved.values())
    baseline = HOST_BASELINE_CPU + device_peak if cfg.runtime.device == "cpu" else HOST_BASELINE
    prefetch = _prefetch(cfg)
    base = baseline + prefetch
    staged = cfg.runtime.async_checkpoint
    seeded = not cfg.model.pretrained_path and cfg.checkpoint.mode in (None, "none")
    largest = _largest_tensor(cfg)
    # before any save (the staging buffers come with the first): one tensor at a time, or the whole model
    load = base + (sum(parts.get("weights", 0) for parts in saved.values()) if seeded else largest)
    if fsdp:
        # whole files: rank 0 receives every role's whole state, every rank gathers the whole EMA; with
        # staging, rank 0's buffers keep the whole state and the capture adds the gathered weights and moments
        whole_file = {"rank0": HostPhases(base + (whole if staged else 0), base + whole + (gathered if staged else 0),
                                          load),
                      "other": HostPhases(base + (ema_bytes if staged else 0), base + ema_bytes, load)}
        share = sum(-(-v // degree) for parts in saved.values() for v in parts.values())
        rank = HostPhases(base + (share if staged else 0), base + share, load)
        sharded = {"rank0": rank, "other": rank}
    else:   # one rank saves: rank 0 holds the whole state on either path, the others nothing
        whole_file = {"rank0": HostPhases(base + (whole if staged else 0), base + whole, load),
                      "other": HostPhases(base, base, load)}
        sharded = dict(whole_file)
    return HostForecast("sharded" if fsdp else "whole-file", degree, gpus_per_node, baseline, prefetch, largest,
                        seeded, saved, sharded, whole_file)


def _faster(resolved, *, gpu_memory_bytes: int, gpus_per_node: int) -> str | None:
    """For a config that fits with blocks recomputed in backward: the most blocks whose activations
    could be kept instead (``activation_checkpointing_skip_blocks``; all of them: checkpointing off)
    with the forecast still fitting, or None. Keeping a block's activations skips its recomputation:
    less work per step, never more (bench/RESULTS.md: 2026-12-03's checkpointing table)."""
    layers = effective_dims(resolved.config).num_layers
    current = min(resolved.config.distributed.activation_checkpointing_skip_blocks, layers)
    skip, fc = _most_kept(resolved, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node, margin=0,
                          fewest=current + 1)
    if skip is None:
        return None
    text = "distributed.activation_checkpointing=false" if skip == layers else \
        f"distributed.activation_checkpointing_skip_blocks={skip}"
    return f"{text} (forecast {fc.peak_bytes / GIB:.1f} GiB): {skip - current} fewer of {layers} blocks recomputed"


def _suggestions(resolved, *, gpu_memory_bytes: int, gpus_per_node: int, peak: int) -> list[str]:
    """Edits within the config's family rules that bring the forecast under the GPU, cheapest first."""
    cfg = resolved.config
    dist = cfg.distributed
    edits: list[tuple[str, dict]] = []
    if dist.world_size > 1 and dist.sharding != "full_shard":
        edits.append(("distributed.sharding=full_shard", {"sharding": "full_shard"}))
    if not dist.activation_checkpointing or dist.activation_checkpointing_skip_blocks:
        edits.append(("distributed.activation_checkpointing=true distributed.activation_checkpointing_skip_blocks=0",
                      {"activation_checkpointing": True, "activation_checkpointing_skip_blocks": 0}))
    if dist.activation_checkpointing_policy != "full":
        edits.append(("distributed.activation_checkpointing_policy=full", {"activation_checkpointing_policy": "full"}))
    found = []
    for text, change in edits:
        edited = cfg.model_copy(update={"distributed": dist.model_copy(update=change)})
        trial = forecast(_Resolved(edited, resolved.route), gpu_memory_bytes=gpu_memory_bytes,
                         gpus_per_node=gpus_per_node, look_faster=False)
        if trial.fits:
            found.append(f"{text} (forecast {trial.peak_bytes / GIB:.1f} GiB)")
    if not found:
        found.append("more GPUs per shard group, a larger distributed.sequence_parallel_size where the family "
                     "allows it, or a GPU with more memory")
    return found


@dataclass
class _Resolved:
    config: object
    route: object


def table(fc: Forecast) -> str:
    """The forecast as text: one row per role and kind, then the peak and the verdict."""
    kinds = ("parameters", "frozen", "gradients", "optimizer", "ema", "working", "activations")
    lines = [f"{'role':<8} " + " ".join(f"{k:>11}" for k in kinds) + "    (GiB per GPU)"]
    for role, parts in fc.roles.items():
        lines.append(f"{role:<8} " + " ".join(f"{parts.get(k, 0) / GIB:>11.2f}" for k in kinds))
    verdict = "fits" if fc.fits else "does NOT fit"
    lines.append(f"peak {fc.peak_bytes / GIB:.1f} GiB of {fc.gpu_memory_bytes / GIB:.0f} GiB "
                 f"({fc.usable_bytes / GIB:.1f} usable): {verdict}; states divided over {fc.shard_degree} GPU(s), "
                 + ", ".join(f"{r} {t:,} tokens" for r, t in fc.tokens_per_gpu.items()))
    lines += [f"to fit: {s}" for s in fc.suggestions]
    if fc.auto is not None:
        lines.append(f"activation_checkpointing_skip_blocks auto: {blocks_keep(fc.auto)} "
                     f"(with {AUTO_MARGIN:.0%} of the GPU left free beyond the usable limit)")
    if fc.faster:
        lines.append(f"faster, still fits: {fc.faster}")
    if fc.host is not None:
        lines += host_lines(fc.host)
    return "\n".join(lines)


def host_lines(host: HostForecast) -> list[str]:
    """The host forecast as two lines: per rank on the path the config uses (beside today's whole
    files), then the whole checkpoint state per trained role."""
    g = lambda n: f"{n / GIB:.1f}"  # noqa: E731
    used, whole = host.used["rank0"], host.whole_file["rank0"]
    load = f"load {g(used.load)} GiB" + (" (seeded: the whole model on every rank)" if host.seeded else "")
    if host.path == "sharded":
        head = f"host memory per rank (sharded checkpoints, 1/{host.shard_degree} of the state each)"
        save = f"save {g(used.save)} GiB (rank 0 {g(whole.save)} GiB with whole files, today's path)"
    else:
        head = "host memory per rank (whole-file checkpoints: rank 0 holds the state)"
        save = f"save {g(used.save)} GiB on rank 0 ({g(host.used['other'].save)} GiB on the others)"
    parts = ", ".join(f"{role} {g(sum(p.values()))} GiB ("
                      + ", ".join(f"{NAMES[k]} {g(v)}" for k, v in p.items()) + ")" for role, p in host.saved.items())
    return [f"{head}: steady {g(used.steady)} GiB, {save}, {load}; peak {g(host.peak)} GiB, "
            f"{g(host.pod_bytes())} GiB per {host.gpus_per_node}-GPU pod",
            f"checkpoint state on the host (whole, fp32): {parts}"]


NAMES = {"weights": "weights", "optimizer": "AdamW moments", "ema": "EMA"}


def size_text(n: float) -> str:
    """Bytes as GiB, or MiB under one GiB (a tiny config's forecast reads ``4.2 MiB``, not ``0.0 GiB``)."""
    if n <= 0:
        return "0 GiB"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{max(n / 2**20, 0.1):.1f} MiB"


def _gib(n: float) -> int:
    return int(math.ceil(n * GIB))
