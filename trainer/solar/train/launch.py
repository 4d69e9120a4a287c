"""``solar train``: resolve, join the process group, check the run directory, build, loop, report.

Rank 0 writes ``resolved-config.json`` and ``launch-manifest.json`` before any model is allocated
and ``run-result.json`` at the end (complete, stopped or failed, with the error type and message
every rank agreed on).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from solar.config.resolve import resolve_file
from solar.errors import SolarError
from solar.storage import run_dir
from solar.storage.checkpoints import CheckpointError


def _error_type(exc: BaseException) -> str:
    from solar.train.distributed import CollectiveFailure

    if isinstance(exc, CollectiveFailure):
        return exc.error_type
    if isinstance(exc, CheckpointError):
        return "checkpoint"
    name, text = type(exc).__name__, str(exc)
    if name == "DataError":
        return "data"
    if ("DistBackendError" in name or "timed out" in text.lower() or "timeout" in text.lower()) and (
            "gloo" in text.lower() or "nccl" in text.lower() or "collective" in text.lower() or "DistBackend" in name):
        return "collective_timeout"
    from solar.train.engine import error_type_of

    return error_type_of(exc)


def train(config: str, sets: Sequence[str]) -> int:
    resolved = resolve_file(config, sets, expected_action="train")
    cfg = resolved.config
    import torch

    from solar.train import distributed, faults
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
    # The directory check happens on rank 0 and its verdict is shared: nothing is written on failure.
    verdict = None
    if d.rank == 0:
        try:
            run_dir.prepare(out, resolved, resuming=resuming)
            from solar.train.setup import preflight_sources

            preflight_sources(resolved)
            run = cfg.runtime
            if cfg.validation.passes and (run.validate_every or run.validation_steps):
                from solar.infer.setup import check_test_set

                check_test_set(cfg, out / "validation" / "frozen-plan.json")
        except SolarError as exc:
            verdict = str(exc)
    verdict = d.all_gather_object(verdict, "prepare")[0]
    if verdict:
        d.close()
        raise SolarError(verdict)
    events = heartbeat = rank_log = None
    status, error = "failed", None
    loop = None
    try:
        if d.rank == 0:
            run_dir.write_launch(out, resolved, init_record(cfg))
            run_dir.write_environment(out)
        d.barrier("launch-written")
        rank_log = run_dir.RankLog(out, d.rank)
        events, heartbeat = run_dir.EventLog(out, d.rank), run_dir.Heartbeat(out, d.rank)
        d.on_collective = heartbeat.collective
        events.write("start", rank=d.rank, world=d.world, pid=os.getpid(), route=resolved.route.key)
        from solar.train.setup import build_parts

        from solar.models.sequence_parallel import SPGroup

        sp = SPGroup(d.sp_group, d.sp_rank, d.sp) if d.sp > 1 else None
        silence = _audio_silence(cfg)
        if resolved.route.stage == "stage2":
            from solar.train.stage2 import build_stage2

            parts, stage2 = build_stage2(resolved, d.rank, d.device, world=d.world, sp=sp)
            loop = Loop(resolved, d, parts, out, events, heartbeat, maybe_start(d.rank), fault, silence,
                        stage2=stage2, term="critic")
        else:
            from solar.train.objective import objective_for

            parts = build_parts(resolved, d.rank, d.device, world=d.world, local_world=d.local_world, sp=sp)
            objective, term = objective_for(resolved, d, silence)
            loop = Loop(resolved, d, parts, out, events, heartbeat, maybe_start(d.rank), fault, silence,
                        objective=objective, term=term)
        status = loop.run()
    except BaseException as exc:  # noqa: BLE001 - every failure ends in run-result.json
        error = exc
        if os.environ.get("SOLAR_DEBUG") == "1":
            traceback.print_exc()
    finally:
        final = loop.last if loop and loop.last else None
        checkpoints = loop.checkpoints if loop else []
        validations = loop.validations if loop else []
        if error is not None:
            message = str(error) if isinstance(error, SolarError) else f"{type(error).__name__}: {error}"
            run_dir.record_failure(error, error_type=_error_type(error), message=message, events=events,
                                   heartbeat=heartbeat, rank_log=rank_log)
            if d.rank == 0 and (out / "launch-manifest.json").exists():
                run_dir.write_result(out, "failed", error_type=_error_type(error), message=message, final=final,
                                     checkpoints=checkpoints, validations=validations)
        else:
            if heartbeat is not None:
                heartbeat.update(phase=status)
            if events is not None:
                events.write(status, durable=True, **(final or {}))
            if d.rank == 0:
                run_dir.write_result(out, status, final=final, checkpoints=checkpoints, validations=validations)
        if loop is not None and loop.metrics is not None:
            loop.metrics.close()
        if events is not None:
            events.close()
        if rank_log is not None:
            rank_log.close()
        d.close()
    if error is not None:
        if isinstance(error, SolarError):
            raise error
        raise SolarError(f"training failed: {type(error).__name__}: {error}") from error
    if d.rank == 0:
        print(f"solar: train {status} at step {final['step'] if final else '-'} -> {out}", file=sys.stderr)
    return 0


def init_record(cfg) -> dict:
    """The launch manifest's ``init``: the mode and every weight source it reads."""
    ck = cfg.checkpoint
    sources = []
    if ck.mode == "none" and cfg.model.pretrained_path:
        sources.append({"role": "model", "path": cfg.model.pretrained_path, "weights": "released"})
    elif ck.mode in ("weights_only", "full_resume"):
        sources.append({"role": "model", "path": ck.path, "weights": ck.weights or "all"})
    elif ck.mode == "roles":
        for role in ("student", "teacher", "critic"):
            spec = getattr(ck.roles, role)
            sources.append({"role": role, "path": spec.path, "weights": spec.weights})
    if cfg.model.training_mode == "lora" and cfg.model.pretrained_path and ck.mode != "none":
        sources.append({"role": "base", "path": cfg.model.pretrained_path, "weights": "released"})
    return {"mode": ck.mode, "sources": sources}


def _audio_silence(cfg):
    if cfg.model.family != "minimax_h3":
        return None
    from safetensors.torch import load_file

    from solar.data.layout import AUDIO_SILENCE

    path = Path(cfg.data.root) / AUDIO_SILENCE
    if not path.is_file():
        raise SolarError(f"MiniMax-H3 training needs the encoded silence {path} (data.root/{AUDIO_SILENCE})")
    return load_file(path)["audio_latents"].float()
