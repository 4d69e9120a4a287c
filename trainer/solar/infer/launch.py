"""``solar infer``: the same generation path as periodic validation, over ``generation/``.

A new (or empty) output directory, or one holding an unfinished generation of the same config,
which is then completed. Rank 0 writes resolved-config.json, launch-manifest.json and
run-result.json like training does.
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


def infer(config: str, sets: Sequence[str]) -> int:
    resolved = resolve_file(config, sets, expected_action="infer")
    cfg = resolved.config
    import torch

    from solar.infer import passes as P
    from solar.infer import setup as S
    from solar.models.registry import model_from_config
    from solar.train import distributed
    from solar.train.launch import init_record

    out = Path(cfg.runtime.output_dir)
    gen_root = out / "generation"
    d = distributed.from_environment(expected_world=cfg.distributed.world_size,
                                     sp=cfg.distributed.sequence_parallel_size, backend=cfg.distributed.backend,
                                     device=cfg.runtime.device, timeout_seconds=cfg.distributed.timeout_seconds)
    verdict = None
    if d.rank == 0:
        try:
            if (gen_root / "COMPLETE.json").exists():
                raise SolarError(f"{out} already holds a finished generation; use a new runtime.output_dir")
            continuing = (out / "launch-manifest.json").exists()
            run_dir.prepare(out, resolved, resuming=continuing)
            S.preflight(cfg, resolved.route, gen_root / "frozen-plan.json")
        except SolarError as exc:
            verdict = str(exc)
    verdict = d.all_gather_object(verdict, "prepare")[0]
    if verdict:
        d.close()
        raise SolarError(verdict)
    error, summary = None, None
    rank_log = events = heartbeat = None
    try:
        if d.rank == 0:
            run_dir.write_launch(out, resolved, init_record(cfg))
            run_dir.write_environment(out)
        d.barrier("launch-written")
        rank_log = run_dir.RankLog(out, d.rank)
        events, heartbeat = run_dir.EventLog(out, d.rank), run_dir.Heartbeat(out, d.rank)
        d.on_collective = heartbeat.collective
        events.write("start", rank=d.rank, world=d.world, pid=os.getpid(), route=resolved.route.key)
        heartbeat.update(phase="generation")
        torch.manual_seed(0)
        model = model_from_config(cfg, device="cpu")
        if cfg.model.pretrained_path and cfg.model.training_mode == "lora":
            from solar.train.setup import _load_base

            _load_base(model, cfg.model.family, cfg.model.pretrained_path)
        weights = S.InferenceWeights(cfg, resolved.route, model)
        model.to(d.device).eval()
        if d.sp > 1:
            from solar.models.sequence_parallel import SPGroup

            model.set_sequence_parallel(SPGroup(d.sp_group, d.sp_rank, d.sp))
        problem = None
        try:
            source = S.test_source(cfg)
            slots = S.frozen_slots(cfg, source, gen_root / "frozen-plan.json", writer=d.rank == 0)
            if d.rank == 0:
                P.clean_partials(gen_root)
        except SolarError as exc:
            problem = str(exc)
        d.exchange_error(problem, "validation_setup")
        gen = P.Generation(cfg, d, model, S.codec_for(cfg), source, slots, S.negative_prompt(cfg),
                           S.audio_silence(cfg), log=lambda m: print(m, file=sys.stderr) if d.rank == 0 else None)
        summary = gen.run(gen_root, cfg.validation.passes, weights, None)
    except BaseException as exc:  # noqa: BLE001 - reported in run-result.json
        error = exc
        if os.environ.get("SOLAR_DEBUG") == "1":
            traceback.print_exc()
    finally:
        if error is not None:
            message = str(error) if isinstance(error, SolarError) else f"{type(error).__name__}: {error}"
            from solar.train.launch import _error_type

            run_dir.record_failure(error, error_type=_error_type(error), message=message, events=events,
                                   heartbeat=heartbeat, rank_log=rank_log)
        elif heartbeat is not None:
            heartbeat.update(phase="complete")
            events.write("complete", durable=True)
        if events is not None:
            events.close()
        if rank_log is not None:
            rank_log.close()
        if d.rank == 0 and (out / "launch-manifest.json").exists():
            if error is None:
                run_dir.write_result(out, "complete", validations=[summary])
            else:
                from solar.train.launch import _error_type

                message = str(error) if isinstance(error, SolarError) else f"{type(error).__name__}: {error}"
                run_dir.write_result(out, "failed", error_type=_error_type(error), message=message)
        d.close()
    if error is not None:
        if isinstance(error, SolarError):
            raise error
        raise SolarError(f"inference failed: {type(error).__name__}: {error}") from error
    if d.rank == 0:
        print(f"solar: infer {summary['status']}: {summary['ok_slots']}/{summary['slots']} slots ok -> {gen_root}",
              file=sys.stderr)
    return 0
