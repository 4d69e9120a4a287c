"""``solar train``: resolve, join the process group, check the run directory, build, loop, report.

Rank 0 writes ``resolved-config.json`` and ``launch-manifest.json`` before any model is allocated
and ``run-result.json`` at the end (complete, stopped or failed, with the error type and message
every rank agreed on) through ``solar.launch.session``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from solar.config.resolve import resolve_file
from solar.errors import SolarError
from solar.storage import run_dir


def train(config: str, sets: Sequence[str]) -> int:
    resolved = resolve_file(config, sets, expected_action="train")
    cfg = resolved.config
    import torch

    from solar.launch import distributed
    from solar.launch.conditions import audio_silence
    from solar.launch.session import Session
    from solar.train import faults
    from solar.train.engine import Loop
    from solar.train.metrics import maybe_start

    out = Path(cfg.runtime.output_dir)
    resuming = cfg.checkpoint.mode == "full_resume"
    if resuming and Path(cfg.checkpoint.path).resolve().parent.parent != out.resolve():
        raise SolarError(f"checkpoint.path {cfg.checkpoint.path} is not a checkpoint of runtime.output_dir {out}; a "
                         "full resume continues the same run directory")
    fault = faults.from_environment()
    d = distributed.from_environment(expected_world=cfg.distributed.world_size,
                                     sp=cfg.distributed.sequence_parallel_size, backend=cfg.distributed.backend,
                                     device=cfg.runtime.device, timeout_seconds=cfg.distributed.timeout_seconds)
    if cfg.runtime.deterministic:
        torch.use_deterministic_algorithms(True)
    built, kept = _auto_kept_blocks(resolved, d)   # the run's files keep `auto`; the model is built with the choice
    session = Session(resolved, d, out, verb="training")
    session.check(lambda: _check(resolved, out, resuming, d.device))  # nothing is written on a refusal
    status, loop = "failed", None
    try:
        session.open()
        if kept is not None:
            session.events.write("activation_checkpointing", rank=d.rank, **kept)
            if d.rank == 0:
                keep = "keeps its" if kept["skip_blocks"] == 1 else "keep their"
                print(f"solar: activation_checkpointing_skip_blocks auto -> {kept['skip_blocks']} of {kept['blocks']} "
                      f"blocks {keep} activations ({kept['why']})", file=sys.stderr)
        resolved = built
        from solar.models.sequence_parallel import SPGroup
        from solar.train.setup import build_parts

        sp = SPGroup(d.sp_group, d.sp_rank, d.sp) if d.sp > 1 else None
        silence = audio_silence(cfg)
        common = (session.events, session.heartbeat, maybe_start(d.rank), fault, silence)  # Loop's I/O
        if resolved.route.stage == "stage2":
            from solar.train.stage2 import build_stage2

            parts, stage2 = build_stage2(resolved, d.rank, d.device, world=d.world, local_world=d.local_world, sp=sp)
            session.events.write("models", rank=d.rank, models=stage2.models)
            shared = [m["roles"] for m in stage2.models if len(m["roles"]) > 1]
            if shared and d.rank == 0:
                print(f"solar: Stage2 roles {', '.join(shared[0])} share one LoRA base (the same bytes); each has "
                      "its own adapter", file=sys.stderr)
            loop = Loop(resolved, d, parts, out, *common, stage2=stage2, term="critic")
        else:
            from solar.train.objective import objective_for

            parts = build_parts(resolved, d.rank, d.device, world=d.world, local_world=d.local_world, sp=sp)
            objective, term = objective_for(resolved, d, silence)
            loop = Loop(resolved, d, parts, out, *common, objective=objective, term=term)
        if cfg.model.fp8_linear != "off":
            session.events.write("fp8", rank=d.rank, recipe=cfg.model.fp8_linear, linears=parts.fp8_linears)
            if d.rank == 0:
                print(f"solar: FP8 linear layers on ({cfg.model.fp8_linear}, torchao): {parts.fp8_linears} converted",
                      file=sys.stderr)
        from solar.train.tracking import open_tracking

        loop.tracking = open_tracking(resolved, out, rank=d.rank, start=parts.start_step, dp_world=d.dp_world,
                                      world=d.world, tokens_per_clip=loop.tokens_per_sample,
                                      flops_per_clip=loop.flops_per_clip if loop.peak_flops else 0.0,
                                      peak_flops=loop.peak_flops, started=session.started)
        status = loop.run()
    except BaseException as exc:  # noqa: BLE001 - every failure ends in run-result.json
        session.failed(exc)
    finally:
        if loop is not None and loop.metrics is not None:
            loop.metrics.close()
        if loop is not None:
            loop.parts.stream.close()   # the clip read ahead (solar.data.prefetch)
        tracking = loop.tracking if loop is not None else None
        if tracking is not None:
            tracking.finish(status if session.error is None else "failed")
        session.close(status, final=loop.last if loop and loop.last else None,
                      checkpoints=loop.checkpoints if loop else [], validations=loop.validations if loop else [])
        if tracking is not None:
            tracking.upload_result(out)   # the completion report, once written
    session.raise_failure()
    if d.rank == 0:
        print(f"solar: {_summary(status, loop, cfg.train.max_steps)} -> {out}", file=sys.stderr)
    return loop.stop.exit_code() if status == "stopped" else 0


def _summary(status: str, loop, max_steps: int) -> str:
    """The last line of a launch: how it ended and at which step (a launch that trained no step, resumed
    at train.max_steps, ends at its checkpoint's step); a stop names its signal and the exit status."""
    import signal

    step = loop.last["step"] if loop.last else loop.parts.start_step
    text = f"train {status} at step {step} of {max_steps}"
    if status == "stopped" and loop.stop.agreed:
        name = signal.Signals(loop.stop.agreed).name
        text += f" by {name} (exit status {loop.stop.exit_code()})"
    elif status == "stopped":
        text += " (runtime.exit_after_step)"
    return text


def _auto_kept_blocks(resolved, d):
    """``distributed.activation_checkpointing_skip_blocks: auto`` chosen for this launch: on GPUs, the most
    blocks the memory forecast lets the smallest GPU of the run keep at this topology, with
    ``memory.AUTO_MARGIN`` left free (every rank computes the same choice from the same gathered
    figures); elsewhere every block is recomputed. Returns (the config to build with, the choice or None)."""
    import dataclasses

    import torch

    from solar.config import memory
    from solar.config.contracts import effective_dims

    cfg = resolved.config
    if cfg.distributed.activation_checkpointing_skip_blocks != "auto":
        return resolved, None
    from solar.train import faults

    blocks = effective_dims(cfg).num_layers
    fake = faults.device_memory(d.rank, d.device.type)   # a drill: the GPU branch on the CPU (never on a GPU)
    cuda = d.device.type == "cuda" or fake is not None
    total = fake if fake is not None else torch.cuda.get_device_properties(d.device).total_memory if cuda else 0
    gpu_memory = min(d.all_gather_object(total, "gpu-memory"))
    if cuda:
        skip, fc = memory.auto_kept_blocks(resolved, gpu_memory_bytes=gpu_memory, gpus_per_node=d.local_world)
        why = (f"forecast {fc.peak_bytes / memory.GIB:.1f} GiB of {gpu_memory / memory.GIB:.1f} GiB per GPU, "
               f"{memory.AUTO_MARGIN:.0%} margin beyond the usable {fc.usable_bytes / memory.GIB:.1f} GiB")
        kept = {"skip_blocks": skip, "blocks": blocks, "gpu_memory_bytes": gpu_memory,
                "forecast_peak_bytes": fc.peak_bytes, "why": why}
        chosen = memory.with_kept_blocks(resolved, skip).config
    else:
        kept = {"skip_blocks": 0, "blocks": blocks, "gpu_memory_bytes": None, "forecast_peak_bytes": None,
                "why": f"no GPU ({d.device.type}): every checkpointed block recomputed"}
        dist = cfg.distributed.model_copy(update={"activation_checkpointing_skip_blocks": 0})
        chosen = cfg.model_copy(update={"distributed": dist})
    return dataclasses.replace(resolved, config=chosen), kept


def _check(resolved, out: Path, resuming: bool, device):
    """Rank 0, before anything is written: FP8's needs, the run directory, every weight source and
    whether the model takes it, the training data (index and shards), the video writer and the test
    set. Returns ``run_dir.prepare``'s decision (a resume's changes, a restart, a rewind)."""
    cfg = resolved.config
    from solar.train.fp8 import launch_problem

    problem = launch_problem(cfg.model.fp8_linear, device)
    if problem:
        raise SolarError(problem)
    from solar.data.from_config import preflight_train_data
    from solar.train.setup import preflight_weights
    from solar.train.sources import preflight_sources, require_global_batch

    completed = None
    if cfg.checkpoint.mode == "full_resume":   # a changed global batch named as such, before the run's own check
        require_global_batch(cfg, cfg.checkpoint.path)
        completed = _checkpoint_step(cfg.checkpoint.path)
    prepared = run_dir.prepare(out, resolved, resuming=resuming, completed_step=completed)
    preflight_sources(resolved)
    preflight_weights(resolved)
    preflight_train_data(cfg)
    run = cfg.runtime
    if cfg.validation.passes and (run.validate_every or run.validation_steps):
        from solar.generation.test_set import check_test_set
        from solar.generation.video import check_writer

        check_writer()
        restart = prepared is not None and prepared.supersede is not None and prepared.supersede.kind == "restart"
        # a restart moves the earlier launches' validation (and its frozen plan) aside
        check_test_set(cfg, None if restart else out / "validation" / "frozen-plan.json")
    return prepared


def _checkpoint_step(path: str) -> int | None:
    """The step of the checkpoint a full resume reads, or None when it cannot be read (the source
    checks that follow say why)."""
    from solar.storage.checkpoints import read_manifest

    try:
        return int(read_manifest(path)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
