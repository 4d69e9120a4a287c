"""``solar infer``: the same generation path as periodic validation, over ``generation/``.

A new (or empty) output directory, or one holding an unfinished generation of the same config,
which is then completed. Rank 0 writes resolved-config.json, launch-manifest.json and
run-result.json like training does (``solar.launch.session``). SIGINT or SIGTERM stops it after the
round of slots in progress (``solar.launch.stop``): run-result.json says ``stopped``, the finished
slots stay for the next launch, and the exit status is 130 after SIGINT, 0 after SIGTERM.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from solar.config.resolve import resolve_file
from solar.errors import SolarError
from solar.storage import run_dir


def infer(config: str, sets: Sequence[str]) -> int:
    resolved = resolve_file(config, sets, expected_action="infer")
    cfg = resolved.config
    import torch

    from solar.generation import passes as P
    from solar.generation import test_set as T
    from solar.infer.weights import InferenceWeights, preflight
    from solar.launch import distributed
    from solar.launch.conditions import audio_silence
    from solar.launch.session import Session
    from solar.launch.stop import Stop
    from solar.models.registry import model_from_config

    out = Path(cfg.runtime.output_dir)
    gen_root = out / "generation"
    d = distributed.from_environment(expected_world=cfg.distributed.world_size,
                                     sp=cfg.distributed.sequence_parallel_size, backend=cfg.distributed.backend,
                                     device=cfg.runtime.device, timeout_seconds=cfg.distributed.timeout_seconds)

    def check() -> None:
        if (gen_root / "COMPLETE.json").exists():
            raise SolarError(f"{out} already holds a finished generation; use a new runtime.output_dir")
        continuing = (out / "launch-manifest.json").exists()
        run_dir.prepare(out, resolved, resuming=continuing)
        preflight(cfg, resolved.route, gen_root / "frozen-plan.json")

    session = Session(resolved, d, out, verb="inference")
    session.check(check)
    summary, stop = None, Stop()
    try:
        stop.install(cfg.runtime.stop_grace_seconds, finishing="the slot")
        session.open()
        session.heartbeat.update(phase="generation")
        torch.manual_seed(0)
        # Built on the meta device and allocated on the device: every pass loads all its weights
        # (strictly); a LoRA checkpoint's base is read into it once, here.
        model = model_from_config(cfg, device="meta")
        model.to_empty(device=d.device)
        if cfg.model.pretrained_path and cfg.model.training_mode == "lora":
            from solar.launch.materialize import fill, released

            fill(model, released(cfg.model.family, cfg.model.pretrained_path),
                 where=f"model.pretrained_path {cfg.model.pretrained_path}", lora_seed=0)
        weights = InferenceWeights(cfg, resolved.route, model)
        model.eval()
        if d.sp > 1:
            from solar.models.sequence_parallel import SPGroup

            model.set_sequence_parallel(SPGroup(d.sp_group, d.sp_rank, d.sp))
        problem = None
        try:
            source = T.test_source(cfg)
            slots = T.frozen_slots(cfg, source, gen_root / "frozen-plan.json", writer=d.rank == 0)
            if d.rank == 0:
                P.clean_partials(gen_root)
        except SolarError as exc:
            problem = str(exc)
        d.exchange_error(problem, "validation_setup")
        gen = P.Generation(cfg, d, model, T.codec_for(cfg, d.device), source, slots, T.negative_prompt(cfg),
                           audio_silence(cfg), log=lambda m: print(m, file=sys.stderr) if d.rank == 0 else None,
                           stop=stop)
        summary = gen.run(gen_root, cfg.validation.passes, weights, None)
    except BaseException as exc:  # noqa: BLE001 - reported in run-result.json
        session.failed(exc)
    finally:
        session.close("stopped" if stop.agreed else "complete",
                      validations=[summary] if summary is not None else None)
    session.raise_failure()
    if d.rank == 0 and stop.agreed:
        import signal

        done = sum(1 for _ in gen_root.glob("*/slot_*"))
        print(f"solar: infer stopped by {signal.Signals(stop.agreed).name} with {done} slot{'s' if done != 1 else ''} "
              f"written; run the same command again to finish {gen_root} (exit status {stop.exit_code()})",
              file=sys.stderr)
    elif d.rank == 0:
        print(f"solar: infer {summary['status']}: {summary['ok_slots']}/{summary['slots']} slots ok -> {gen_root}",
              file=sys.stderr)
    return stop.exit_code()
