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
    session = Session(resolved, d, out, verb="training")
    session.check(lambda: _check(resolved, out, resuming, d.device))  # nothing is written on a refusal
    status, loop = "failed", None
    try:
        session.open()
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
        status = loop.run()
    except BaseException as exc:  # noqa: BLE001 - every failure ends in run-result.json
        session.failed(exc)
    finally:
        if loop is not None and loop.metrics is not None:
            loop.metrics.close()
        if loop is not None:
            loop.parts.stream.close()   # the clip read ahead (solar.data.prefetch)
        session.close(status, final=loop.last if loop and loop.last else None,
                      checkpoints=loop.checkpoints if loop else [], validations=loop.validations if loop else [])
    session.raise_failure()
    if d.rank == 0:
        final = loop.last
        print(f"solar: train {status} at step {final['step'] if final else '-'} -> {out}", file=sys.stderr)
    return 0


def _check(resolved, out: Path, resuming: bool, device) -> None:
    """Rank 0, before anything is written: FP8's needs, the run directory, every weight source, the
    video writer and the test set."""
    cfg = resolved.config
    from solar.train.fp8 import launch_problem

    problem = launch_problem(cfg.model.fp8_linear, device)
    if problem:
        raise SolarError(problem)
    run_dir.prepare(out, resolved, resuming=resuming)
    from solar.train.sources import preflight_sources

    preflight_sources(resolved)
    run = cfg.runtime
    if cfg.validation.passes and (run.validate_every or run.validation_steps):
        from solar.generation.test_set import check_test_set
        from solar.generation.video import check_writer

        check_writer()
        check_test_set(cfg, out / "validation" / "frozen-plan.json")
