"""Building a training run from a resolved config: model (with its initialisation mode), optimizer,
EMA and data stream. Initialisation modes are distinct and checked (semantics.md §5):

- ``none``: base weights from ``model.pretrained_path`` (a Solar directory from ``solar model
  convert``, a Solar checkpoint or export or one of its weight files, or a diffusers folder:
  ``solar.launch.base_weights``), or a seeded random init when it is null;
- ``weights_only``: live or EMA weights of a verified checkpoint of a compatible route; a new
  optimisation run (fresh optimizer, step 0);
- ``full_resume``: everything (weights, EMA, optimizer, step, every rank's RNG and data stream)
  from a verified checkpoint of this very run.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from solar.config.contracts import checkpoint_contract, source_problem
from solar.config.resolve import Resolved
from solar.launch.base_weights import note, record as base_record, solar_source, with_hint
from solar.data.from_config import train_stream
from solar.data.prefetch import Prefetched
from solar.launch.materialize import checkpoint, materialize, module_tensors, released, role_tensors
from solar.launch.weights import require_base
from solar.models.lora import LoRALinear
from solar.models.registry import model_from_config
from solar.models.weights import WeightsError
from solar.storage.checkpoints import CheckpointError, read_manifest, require_valid
from solar.train import checkpoint_io as io
from solar.train.ema import EMA
from solar.train.optimizer import adamw


@dataclass
class Parts:
    model: torch.nn.Module
    names: list[str]                       # trainable parameter names, optimizer order
    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    ema: EMA
    stream: object
    start_step: int
    init: dict
    adapter_only: bool
    sharded: bool = False
    fp8_linears: int = 0                   # linear layers computing in FP8 (model.fp8_linear), 0 when off


def _is_lora(model) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def initial_weights(cfg, model: torch.nn.Module, source_manifest: dict | None) -> tuple[dict, str]:
    """(lazy tensors, where they come from) for a single-model run's initialisation mode: the
    seeded random init (built whole on the host as before, the same parameters), released base
    weights, a checkpoint, or a LoRA checkpoint's adapters over their base."""
    ck = cfg.checkpoint
    if ck.mode == "none" and not cfg.model.pretrained_path:
        return module_tensors(model_from_config(cfg, device="cpu")), "the seeded random initialisation"
    tensors, where = {}, f"model.pretrained_path {cfg.model.pretrained_path}"
    if cfg.model.pretrained_path and (ck.mode == "none" or _is_lora(model)):
        tensors = released(cfg.model.family, cfg.model.pretrained_path)
    if ck.mode in ("weights_only", "full_resume"):
        which = "live" if ck.mode == "full_resume" else ck.weights
        members = checkpoint(Path(ck.path), "model", which)
        adapter_only = source_manifest.get("trainer_state", {}).get("adapter_only")
        tensors = {**tensors, **members} if adapter_only else members
        where = f"checkpoint.path {ck.path}"
    return tensors, where


def preflight_weights(resolved: Resolved) -> None:
    """Before a launch writes anything: a single-model run's initial weights (released base weights,
    a checkpoint, a LoRA checkpoint over its base) exist and fit the model as configured, read from
    the sources' headers against a model on the meta device (Stage2's roles: ``check_roles``). The
    seeded random initialisation has nothing to check."""
    cfg, ck = resolved.config, resolved.config.checkpoint
    if resolved.route.stage == "stage2":   # its LoRA base: what the path is and its headers (roles: check_roles)
        if cfg.model.pretrained_path and cfg.model.training_mode == "lora":
            released(cfg.model.family, cfg.model.pretrained_path)
        return
    if ck.mode == "none" and not cfg.model.pretrained_path:
        return
    from solar.launch.materialize import completed

    # the checkpoint itself was verified just before (``sources.preflight_sources``)
    manifest = read_manifest(ck.path) if ck.mode in ("weights_only", "full_resume") else None
    model = model_from_config(cfg, device="meta")
    try:
        tensors, where = initial_weights(cfg, model, manifest)
        completed(model.state_dict(), tensors, where=where, init_delta_from_time=True, lora_seed=cfg.train.seed,
                  values=False)
    except (WeightsError, CheckpointError) as exc:
        raise _refused(cfg, exc) from None


def _refused(cfg, exc: Exception) -> Exception:
    """A problem of the initial weights as the launch reports it: a base model's (checkpoint.mode none)
    in one line that also names checkpoint.mode (``base_weights.with_hint``); a checkpoint's as a
    CheckpointError."""
    if cfg.checkpoint.mode == "none":
        return with_hint(exc, cfg.model.pretrained_path)
    return exc if isinstance(exc, CheckpointError) else CheckpointError(str(exc))


def base_note(cfg) -> str | None:
    """The line naming which weights of a Solar checkpoint or export ``model.pretrained_path`` starts
    the run from (None for any other base, or none)."""
    path = cfg.model.pretrained_path
    if not path or (cfg.checkpoint.mode != "none" and cfg.model.training_mode != "lora"):
        return None
    source = solar_source(path)
    return note(path, source) if source is not None else None


def build_parts(resolved: Resolved, rank: int, device: torch.device, *, world: int = 1, local_world: int = 1,
                sp=None) -> Parts:
    cfg, route = resolved.config, resolved.route
    ck = cfg.checkpoint
    source_manifest = None
    if ck.mode in ("weights_only", "full_resume"):
        source_manifest = require_valid(ck.path, "checkpoint.path")
        problem = source_problem(route, source_manifest.get("contract", {}), cfg, resume=ck.mode == "full_resume")
        if problem:
            raise CheckpointError(f"checkpoint.path {ck.path} cannot initialise this run: {problem}")
        require_base(cfg, ck.path, source_manifest)
    torch.manual_seed(cfg.train.seed)  # the same random init on every rank
    random.seed(cfg.train.seed * 1_000_003 + rank)  # Python's RNG would otherwise start from OS entropy
    # Built on the meta device; parallelism applied there; each rank then materialises its own shards
    # and reads only its rows of every source tensor (solar.launch.materialize).
    model = model_from_config(cfg, device="meta")
    try:
        tensors, where = initial_weights(cfg, model, source_manifest)
    except (WeightsError, CheckpointError) as exc:
        raise _refused(cfg, exc) from None
    if rank == 0 and (line := base_note(cfg)):
        print(line, file=sys.stderr)
    from solar.train import fp8, parallelize

    fp8_linears = fp8.convert(model, cfg.model.fp8_linear)  # before SP, checkpointing, compile and FSDP2
    if sp is not None and sp.size > 1:
        model.set_sequence_parallel(sp)

    if cfg.distributed.activation_checkpointing:
        parallelize.apply_activation_checkpointing(model, policy=cfg.distributed.activation_checkpointing_policy,
                                                   skip_blocks=cfg.distributed.activation_checkpointing_skip_blocks)
    if cfg.runtime.compile and device.type == "cuda":  # on CPU the eager blocks are what the tests compare
        parallelize.apply_compile(model)
    sharded = cfg.distributed.sharding != "none" and world > 1
    if sharded:
        from solar.launch.precision import fsdp_policy

        mesh = parallelize.device_mesh(world=world, local_world=local_world, strategy=cfg.distributed.sharding,
                                       device=device)
        parallelize.apply_fsdp(model, mesh, policy=fsdp_policy(cfg, device))
    try:
        materialize(model, device, tensors, where=where, init_delta_from_time=True, lora_seed=cfg.train.seed)
    except (WeightsError, CheckpointError) as exc:
        raise _refused(cfg, exc) from None
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    names = list(params)
    opt = cfg.train.optimizer
    optimizer = adamw(params, opt)
    e = cfg.train.ema
    ema = EMA(params, decay=e.decay, start_step=e.start_step, warmup_steps=e.warmup_steps, enabled=e.enabled)
    start_step, data_state = 0, None
    init = {"mode": ck.mode, "sources": []}
    if ck.mode == "none":
        init["sources"] = [base_record(cfg.model.pretrained_path)] if cfg.model.pretrained_path else []
    else:
        init["sources"] = [{"role": "model", "path": ck.path, "weights": ck.weights or "live+ema",
                            "step": source_manifest["step"]}]
    if ck.mode == "full_resume":
        path = Path(ck.path)
        io.load_optimizer(path, "model", optimizer, names, params)
        import json

        trainer = json.loads((path / "trainer.json").read_text())
        if trainer["ema"].get("exists"):
            ema.load(io.local_tensors(role_tensors(path, "model", "ema"), params, f"{path} EMA"), trainer["ema"])
        start_step = trainer["step"]
        data_state = io.load_rank_state(path, rank)
    if start_step > cfg.train.max_steps:  # == max_steps: the loop only finishes that step's validation
        raise CheckpointError(f"checkpoint.path {ck.path} is at step {start_step}, beyond train.max_steps="
                              f"{cfg.train.max_steps}")
    stream = Prefetched(train_stream(cfg, rank, data_state))  # the next clip read during the step
    adapter_only = _is_lora(model) and bool(cfg.model.pretrained_path)
    return Parts(model, names, params, optimizer, ema, stream, start_step, init, adapter_only, sharded, fp8_linears)


def contract_of(resolved: Resolved) -> dict:
    return checkpoint_contract(resolved.config, resolved.route)


def source_step(path: str) -> int:
    return read_manifest(path)["step"]
