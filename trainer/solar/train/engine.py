"""The training loop (semantics.md §7 step order):

    zero grad -> micro-batches (SP identity check) -> gradient sync + clip -> refuse non-finite
    -> optimizer -> schedule -> EMA -> event -> save (steps) -> validate -> stop check
    (any rank's signal and rank 0's ``SaveClock`` reading in one collective) -> save by time? -> stop?

Failures local to a rank are exchanged at fixed points (before a micro-batch's forward, before the
gradient sync) so every rank ends with the same ordered message instead of hanging.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solar.config.resolve import Resolved
from solar.errors import SolarError
from solar.launch.batch import collate
from solar.launch.distributed import CollectiveFailure, Dist
from solar.launch.errors import describe, error_type_of
from solar.launch.stop import Stop
from solar.storage import checkpoints as ckpt
from solar.storage import space
from solar.storage.run_dir import EventLog, Heartbeat
from solar.train import checkpoint_io as io
from solar.train import faults
from solar.train.faults import Fault
from solar.train.gradients import sync_and_clip
from solar.train.metrics import observe_step
from solar.train.profiling import StepProfiler, phase
from solar.train.save_clock import SaveClock
from solar.train.schedule import lr_at
from solar.train.setup import Parts, contract_of


def memory_reading() -> dict:
    """This process's memory for the step event: peak RSS, and CUDA allocated/peak/reserved bytes."""
    import resource

    out = {"host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.update(cuda_allocated_bytes=torch.cuda.memory_allocated(), cuda_peak_bytes=torch.cuda.max_memory_allocated(),
                   cuda_reserved_bytes=torch.cuda.memory_reserved())
    return out


def read_records(records: list[dict]) -> list[dict]:
    """The records with their tensor values (an objective's per-sample losses, kept on the device
    so that reading them does not wait for the forward) as floats, read in one copy."""
    found = [(i, k) for i, r in enumerate(records) for k, v in r.items() if isinstance(v, torch.Tensor)]
    if not found:
        return records
    values = torch.stack([records[i][k].reshape(()).float() for i, k in found]).tolist()
    out = [dict(r) for r in records]
    for (i, k), v in zip(found, values):
        out[i][k] = v
    return out


@dataclass
class Loop:
    resolved: Resolved
    dist: Dist
    parts: Parts
    out: Path
    events: EventLog
    heartbeat: Heartbeat
    metrics: object = None
    fault: Fault | None = None
    audio_silence: torch.Tensor | None = None
    stop: Stop = field(default_factory=Stop)
    checkpoints: list = field(default_factory=list)
    validations: list = field(default_factory=list)
    last: dict = field(default_factory=dict)
    generation: object = None
    objective: object = None  # (model, batch, step, micro) -> (loss, per-sample records)
    stage2: object = None     # solar.train.stage2.Stage2: its outer step and role checkpoints
    pending_save: object = None  # checkpoint_save.BackgroundWrite in flight (runtime.async_checkpoint)
    staging: object = None       # checkpoint_save.Staging: host buffers reused by background saves
    save_clock: SaveClock | None = None   # runtime.save_every_seconds on rank 0's clock (run())
    save_notes: dict = field(default_factory=dict)  # step -> fields its checkpoint event adds (why it saved)
    term: str = "fm"
    tracking: object = None   # rank 0's TensorBoard and MLflow (solar.train.tracking.Tracking)

    # --- one step ---------------------------------------------------------------------------
    def micro_batches(self, step: int) -> tuple[torch.Tensor, list[dict], tuple[str, str] | None]:
        """Forward and backward over the step's micro-batches: (loss, sample records, failure).

        A failure in reading data is exchanged before the forward when the forward itself has
        collectives (SP all-to-all, FSDP2 all-gathers), so no rank enters one alone; a failure in
        the forward or backward (an OOM, a shape error) stops this rank's micro-batches and is
        returned for the step's single error exchange (``step``), so peers never wait for it."""
        cfg, d, p = self.resolved.config, self.dist, self.parts
        total, records = torch.zeros((), device=d.device), []
        accum = cfg.train.gradient_accumulation
        lockstep = d.sp > 1 or p.sharded
        failure = None
        for micro in range(accum):
            error, batch = None, None
            try:
                self.heartbeat.update(phase="data", step=step)
                batch = collate([p.stream.next_clip() for _ in range(cfg.train.micro_batch_size)]).to(d.device)
                self._inject_data_faults(batch, step)
            except Exception as exc:  # noqa: BLE001 - reported to every rank
                error = describe(exc)
            if lockstep:
                d.exchange_error(error, "data" if error and "DataError" in error else "error")
            elif error is not None:
                failure = (error, "data" if "DataError" in error else "error")
                break
            if d.sp > 1:
                self._check_sp_identity(batch, step)
            try:
                self.heartbeat.update(phase="forward", step=step)
                if self.fault and self.fault.fires("oom", step, d.rank):
                    raise torch.OutOfMemoryError(f"injected fault (SOLAR_INJECT_FAULT): CUDA out of memory. Tried "
                                                 f"to allocate 20.00 GiB at step {step}")
                with self.compute_dtype(), phase("forward"):
                    loss, recs = self.objective(p.model, batch, step, micro)
                self.heartbeat.update(phase="backward", step=step)
                with phase("backward"):
                    (loss / accum).backward()
            except Exception as exc:  # noqa: BLE001 - reported to every rank at the step's exchange
                self.events.write("exception", durable=True, step=step, rank=d.rank, error=describe(exc),
                                  error_type=error_type_of(exc), traceback=traceback.format_exc(limit=-6))
                if lockstep:
                    raise
                failure = (describe(exc), error_type_of(exc))
                break
            total = total + loss.detach() / accum
            records += recs
        return total, records, failure

    def compute_dtype(self):
        """The forward's precision context (``solar.launch.precision``)."""
        from solar.launch import precision

        return precision.autocast(self.resolved.config, self.dist.device, sharded=self.parts.sharded)

    def _inject_data_faults(self, batch, step: int) -> None:
        f, rank = self.fault, self.dist.rank
        if f is None:
            return
        if f.fires("nan_batch", step, rank):
            batch.latents.fill_(float("nan"))
        if f.fires("shape", step, rank):  # one latent frame fewer than the plan: the model's own shape error
            batch.latents = batch.latents[:, :, :-1]
        if f.fires("sp_mismatch", step, rank):
            batch.latents.add_(1.0)
        if f.fires("raise", step, rank):
            raise RuntimeError(f"injected fault (SOLAR_INJECT_FAULT) at step {step}")
        if f.fires("exit", step, rank):
            import os

            os._exit(17)
        if f.fires("hang", step, rank):
            self.heartbeat.update(phase="hang (injected)", step=step)
            time.sleep(10**6)

    def _check_sp_identity(self, batch, step: int) -> None:
        d = self.dist
        seen = d.all_gather_object((batch.digest(), batch.identities), "sp-identity", group=d.sp_group)
        if len({digest for digest, _ in seen}) == 1:
            return
        reference = seen[0][0]
        odd = [i for i, (digest, _) in enumerate(seen) if digest != reference]
        ranks = [d.rank - d.sp_rank + i for i in odd]
        detail = "; ".join(f"sp rank {i} (rank {d.rank - d.sp_rank + i}): "
                           f"{[(r['sample_id'], r['start_frame']) for r in ids]}" for i, (_, ids) in enumerate(seen))
        same = len({json.dumps(ids, sort_keys=True) for _, ids in seen}) == 1
        what = "the same samples and start frames but different input bytes (latents, prompt or cameras)" if same \
            else "different samples or start frames"
        raise CollectiveFailure(f"SP peers of dp rank {d.dp_rank} read different micro-batches at step {step}: "
                                f"rank {ranks[0]} differs from sp rank 0, {what} ({detail})", "sp_mismatch", ranks)

    def sync_and_clip(self, step: int) -> float:
        p = self.parts
        return sync_and_clip(self.dist, p.params, self.resolved.config.train.optimizer.grad_clip, p.sharded)

    def step(self, step: int) -> dict:
        if self.stage2 is not None:
            return self.stage2.step(self, step)
        cfg, d, p = self.resolved.config, self.dist, self.parts
        started = time.perf_counter()
        lr = lr_at(step, cfg.train.optimizer, cfg.train.max_steps)
        for group in p.optimizer.param_groups:
            group["lr"] = lr
        p.optimizer.zero_grad(set_to_none=True)
        loss, records, failure = self.micro_batches(step)
        local = float(loss)
        records = read_records(records)
        if failure is None and not math.isfinite(local):
            worst = next((r for r in records if not math.isfinite(r["loss"])), records[0])
            self.events.write("non_finite", durable=True, step=step, rank=d.rank, loss=local,
                              sample_id=worst["sample_id"], start_frame=worst["start_frame"],
                              timestep=worst["timestep"], samples=records)
            failure = (f"non-finite loss {local} at step {step} (sample {worst['sample_id']!r}, start frame "
                       f"{worst['start_frame']}, timestep {worst['timestep']:.4g})", "non_finite")
        d.exchange_error(*(failure or (None, "error")))
        self.heartbeat.update(phase="grad-sync", step=step)
        with phase("clip"):
            norm = self.sync_and_clip(step)
        if not math.isfinite(norm):
            raise CollectiveFailure(f"non-finite gradient norm {norm} at step {step}; the step was refused",
                                    "non_finite")
        with phase("optimizer"):
            p.optimizer.step()
        with phase("ema"):
            p.ema.update(step)
        seconds = time.perf_counter() - started
        total = torch.tensor([local], device=d.device if d.backend == "nccl" else "cpu")
        d.all_reduce(total, "loss-mean")
        mean = float(total) / d.world
        event = {"step": step, "loss": local, "loss_mean": mean, "losses": {self.term: local}, "grad_norm": norm,
                 "lr": lr, "step_seconds": seconds, "samples": records, "ema": p.ema.exists,
                 "memory": memory_reading()}
        self.events.write("step", **event)
        self.last = {"step": step, "loss": mean, "grad_norm": norm, "step_seconds": seconds}
        observe_step(self, step=step, losses={self.term: mean}, grad_norm=norm, seconds=seconds, clips=len(records))
        return event

    @functools.cached_property
    def flops_per_clip(self) -> float:
        from solar.config.contracts import effective_dims
        from solar.train.flops import train_flops_per_clip

        dims = effective_dims(self.resolved.config)
        return train_flops_per_clip(layers=dims.num_layers, hidden=dims.hidden_size, ffn=dims.ffn_dim,
                                    tokens=self.tokens_per_sample)

    @functools.cached_property
    def peak_flops(self) -> float | None:
        from solar.train.flops import peak_flops

        return peak_flops(torch.cuda.get_device_name(self.dist.device) if self.dist.device.type == "cuda" else None)

    @property
    def tokens_per_sample(self) -> int:
        """Latent tokens of one clip (frames x patches) for the tokens counter."""
        from solar.config.contracts import effective_dims, latent_frames

        cfg = self.resolved.config
        dims = effective_dims(cfg)
        from solar.config import families

        s = families.spec(cfg.model.family).vae.spatial
        return latent_frames(cfg) * (cfg.data.height // s // dims.patch_size[1]) * (cfg.data.width // s // dims.patch_size[2])

    # --- saving -----------------------------------------------------------------------------
    def save(self, step: int, **note) -> Path | None:
        """Checkpoint ``step``: capture the state, write it, commit. With ``runtime.async_checkpoint``
        the write runs in the background and the commit follows at a later step (``poll_save``), at
        the next save or when the loop ends (``finish_save``); returns None then. ``note``: fields the
        checkpoint event adds (a save by time says so). The save clock counts again from its return."""
        self.save_notes[step] = note
        path = self._save(step)
        if self.save_clock is not None:
            self.save_clock.restart()
        return path

    def _save(self, step: int) -> Path | None:
        from solar.train import checkpoint_save as cs

        d, p = self.dist, self.parts
        self.finish_save()  # the previous background save commits first; its buffers are reused
        started = time.perf_counter()
        self.heartbeat.update(phase="checkpoint", step=step)
        partial = Path(self.out) / "checkpoints" / "pending"
        if d.rank == 0:
            partial = ckpt.begin(self.out, step)
        partial = Path(d.all_gather_object(str(partial), "checkpoint-begin")[0])
        background = self.resolved.config.runtime.async_checkpoint
        if background and self.staging is None:
            self.staging = cs.Staging()
        staging = self.staging if background else None
        if self.stage2 is not None:
            capture = self.stage2.capture(self, partial, step, staging)
        else:
            capture = self._capture_model(partial, step, staging)
        data_state = p.stream.state_dict()
        capture.files.update(io.rank_state_files(d.rank, data_state=data_state))
        epochs = [r["epoch"] for r in data_state["readers"].values()]
        spans = d.all_gather_object((min(epochs), max(epochs)), "checkpoint-data-epochs")
        if d.rank == 0:
            t = self.resolved.config.train
            capture.files.update(io.position_file(
                step, data_state, {"world_size": d.world, "nproc_per_node": d.local_world, "sequence_parallel_size": d.sp,
                                   "micro_batch_size": t.micro_batch_size, "gradient_accumulation": t.gradient_accumulation},
                (min(lo for lo, _ in spans), max(hi for _, hi in spans))))
        if self.fault is not None:
            capture.inject = faults.storage_error(self.fault, step, d.rank, partial)
        # A volume that cannot hold the checkpoint ends the run now, naming the bytes, instead of
        # writing until it is full.
        short = space.shortfall(partial.parent, capture.size(), f"checkpoint step {step}")
        self._agree_on_write(short, space.FULL, partial)
        if staging is not None:
            staging.ready()
            self.pending_save = cs.BackgroundWrite(capture, started=started,
                                                   blocking=time.perf_counter() - started)
            return None
        roles, problem = {}, None
        try:
            roles = cs.write(capture)
        except OSError as exc:
            problem = cs.failure(capture, exc)
        self._agree_on_write(*(problem or (None, "checkpoint")), partial)
        return self._commit(capture, roles, started, blocking=None)

    def _agree_on_write(self, problem: str | None, error_type: str, partial: Path) -> None:
        """Every rank learns any rank's failed checkpoint write and fails with it (its class:
        storage_full / storage_error / checkpoint); rank 0 first removes the partial directory, which
        is this launch's own and incomplete, so a full volume is not left fuller."""
        try:
            self.dist.exchange_error(problem, error_type)
        except CollectiveFailure:
            if self.dist.rank == 0:
                ckpt.remove_partial(partial)
            raise

    def poll_save(self) -> None:
        """Commit a background save once every rank has written its part (one flag exchange per step
        while a save is in flight; nothing otherwise)."""
        pending = self.pending_save
        if pending is not None and not self.dist.any_flag(not pending.done(), "checkpoint-poll"):
            self.finish_save()

    def finish_save(self) -> None:
        """Wait for the background save and commit it; a rank whose write failed fails every rank."""
        pending, self.pending_save = self.pending_save, None
        if pending is None:
            return
        pending.wait()
        self._agree_on_write(pending.error, pending.error_type, pending.capture.partial)
        self._commit(pending.capture, pending.roles, pending.started, blocking=pending.blocking)

    def _commit(self, capture, roles: dict, started: float, *, blocking: float | None) -> Path:
        d, step = self.dist, capture.step
        d.barrier("checkpoint-written")
        final, problem = None, None
        if d.rank == 0:
            try:
                if self.fault is not None and self.fault.fires("enospc_commit", step, d.rank):
                    raise faults.storage_error(faults.Fault("enospc", step, d.rank), step, d.rank,
                                               capture.partial / "manifest.json")
                final = ckpt.commit(capture.partial, step=step, contract=contract_of(self.resolved), roles=roles,
                                    trainer_state=capture.trainer_state)
            except OSError as exc:
                from solar.train import checkpoint_save as cs

                problem = cs.failure(capture, exc)
        self._agree_on_write(*(problem or (None, "checkpoint")), capture.partial)
        final = Path(d.all_gather_object(str(final), "checkpoint-commit")[0])
        seconds = time.perf_counter() - started
        timing = {"seconds": seconds} if blocking is None else {"seconds": seconds, "blocking_seconds": blocking}
        self.events.write("checkpoint", durable=True, step=step, path=str(final), **timing,
                          **self.save_notes.pop(step, {}))
        self.checkpoints.append({"step": step, "path": str(final)})
        if self.tracking is not None:
            self.tracking.committed(step)
        if self.metrics is not None:
            self.metrics.save_seconds.observe(seconds if blocking is None else blocking)
            self.metrics.last_checkpoint.set(step)
        return final

    def _capture_model(self, partial: Path, step: int, staging):
        """The single-model role: weights, EMA, optimizer, trainer.json (rank 0 writes them)."""
        from solar.train import checkpoint_save as cs

        d, p = self.dist, self.parts
        shadow, meta = p.ema.state()
        roles, files = [], {}
        trainer_state = {"step": step, "adapter_only": p.adapter_only,
                         "base": self.resolved.config.model.pretrained_path, "ema_exists": p.ema.exists}
        weights = ["live", "ema"] if p.ema.exists else ["live"]
        if p.sharded:  # every rank writes its own shards (checkpoint_shards)
            snap = io.snapshot(p.model, p.optimizer, p.names, sharded=True, adapter_only=p.adapter_only, ema=shadow)
            files = io.trainer_file({"step": step, "ema": meta}) if d.rank == 0 else {}
            return cs.sharded(step, partial, [cs.RoleCapture("model", snap, p.names, weights)], trainer_state,
                              files, staging, d)
        if d.rank == 0:
            snap = io.snapshot(p.model, p.optimizer, p.names, sharded=False, adapter_only=p.adapter_only,
                               ema=shadow, staging=staging, key="model")
            roles = [cs.RoleCapture("model", snap, p.names, weights)]
            files = io.trainer_file({"step": step, "ema": meta})
        return cs.Capture(step, partial, roles, trainer_state, files)

    def due(self, step: int) -> bool:
        run = self.resolved.config.runtime
        return (run.save_every and step % run.save_every == 0) or step in run.save_steps \
            or step == self.resolved.config.train.max_steps

    # --- validation -------------------------------------------------------------------------
    def validation_due(self, step: int) -> bool:
        cfg = self.resolved.config
        run = cfg.runtime
        return bool(cfg.validation.passes) and (
            (run.validate_every and step % run.validate_every == 0) or step in run.validation_steps)

    def validation_scheduled(self) -> bool:
        run = self.resolved.config.runtime
        return bool(self.resolved.config.validation.passes) and bool(run.validate_every or run.validation_steps)

    def prepare_validation(self) -> None:
        """The frozen plan, test reader and codec, once per launch (before the first step, so a
        missing test index or a changed plan stops the run before it trains)."""
        from solar.generation import passes as P
        from solar.generation import test_set as S

        if self.generation is not None:
            return
        cfg, d, p = self.resolved.config, self.dist, self.parts
        problem = None
        try:
            source = S.test_source(cfg)
            slots = S.frozen_slots(cfg, source, Path(self.out) / "validation" / "frozen-plan.json",
                                   writer=d.rank == 0)
            self.generation = P.Generation(cfg, d, p.model, S.codec_for(cfg, d.device), source, slots,
                                           S.negative_prompt(cfg), self.audio_silence, sharded=p.sharded,
                                           log=lambda m: sys.stderr.write(m + "\n") if d.rank == 0 else None,
                                           fault=self.fault)
        except SolarError as exc:
            problem = str(exc)
        d.exchange_error(problem, "validation_setup")

    def validate(self, step: int) -> None:
        import contextlib

        from solar.generation import passes as P

        cfg, d, p = self.resolved.config, self.dist, self.parts
        root = Path(self.out) / "validation" / f"step_{step:08d}"
        if (root / "COMPLETE.json").exists():
            return
        self.heartbeat.update(phase="validation", step=step)
        started = time.perf_counter()
        self.prepare_validation()
        if d.rank == 0:
            P.clean_partials(root)
        d.barrier("validation-start")

        def weights_for(pass_):
            if pass_.weights == "ema":
                return (p.ema.swapped(), "ema") if p.ema.exists else None
            return contextlib.nullcontext(), "live"

        from solar.train.fp8 import high_precision

        p.model.eval()
        try:
            with high_precision(p.model):  # generation keeps bf16 under model.fp8_linear, as solar infer does
                summary = self.generation.run(root, cfg.validation.passes, weights_for, step)
        finally:
            p.model.train()
        summary["seconds"] = time.perf_counter() - started
        self.validations.append(summary)
        self.events.write("validation", durable=True, **summary)
        if self.tracking is not None:
            self.tracking.validation(summary)
        if d.rank == 0:
            sys.stderr.write(f"solar: validation step {step} {summary['status']}: {summary['ok_slots']}/"
                             f"{summary['slots']} slots ok ({summary['seconds']:.1f}s)\n")

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> str:
        cfg, d = self.resolved.config, self.dist
        max_steps, exit_after = cfg.train.max_steps, cfg.runtime.exit_after_step
        self.stop.install(self.resolved.config.runtime.stop_grace_seconds)
        progress = Progress(d.rank == 0, max_steps, self.parts.start_step, cfg.runtime.log_every,
                            tokens_per_clip=self.tokens_per_sample,
                            flops_per_clip=self.flops_per_clip if self.peak_flops else 0.0,
                            peak_flops=self.peak_flops, dp_world=d.dp_world, world=d.world)
        start = self.parts.start_step
        if self.validation_scheduled():
            self.prepare_validation()
        if start and self.validation_due(start):  # a resumed run finishes the validation it was killed in
            self.validate(start)
        if start == max_steps and d.rank == 0:  # killed after its last checkpoint: nothing left to train
            sys.stderr.write(f"solar: checkpoint step {start} is train.max_steps; nothing left to train\n")
        profiler = StepProfiler(self.out, cfg.runtime.profile_steps, d.rank, d.device)
        slow = faults.slow_step_seconds()  # a drill (SOLAR_SLOW_STEP_SECONDS): time passes at a known pace
        self.save_clock = SaveClock(cfg.runtime.save_every_seconds, reader=d.rank == 0)
        self.save_clock.restart()
        for step in range(start + 1, max_steps + 1):
            prof = profiler.start(step)
            event = self.step(step)
            if self.tracking is not None:
                self.tracking.step(event)
            profiler.finish(prof, step, event["step_seconds"])
            if slow:
                time.sleep(slow)
            progress.show(event)
            saved = False
            self.poll_save()
            if self.due(step) or step == exit_after:
                self.save(step)
                saved = True
            if self.validation_due(step):
                self.validate(step)
            if step == exit_after and step < max_steps:
                self.finish_save()
                return "stopped"
            # One collective: any rank's stop signal, and rank 0's seconds since the last save, so a
            # save by time lands at the same step on every rank.
            stop, since = self.stop.agree_with(d, self.save_clock.reading(), "stop-check")
            if not saved and self.save_clock.due(since):
                self.save(step, trigger="time", since_save_seconds=round(since, 3))
                saved = True
            if stop:
                if cfg.runtime.checkpoint_on_stop and not saved:
                    self.save(step)
                self.finish_save()
                return "stopped"
        self.finish_save()
        return "complete"


class Progress:
    """Rank 0's progress line, one per ``runtime.log_every`` steps and the last step::

        solar: step 120/30000 loss 0.1234 grad 0.421 lr 2e-06 1.07s/step 7,949 tok/s mfu 41.2% mem 112.1GiB eta 8h51m

    A Stage2 step names each role it updated, the critic's first (every step) and the student's
    beside it on a step that updates the student (losses are means over the ranks)::

        solar: step 6/400 critic loss 0.1234 grad 0.421 lr 2e-06 student loss 0.5678 grad 0.31 lr 2e-06 (update 1) ...

    and on every other line the student's latest loss and the update it came from (the student
    updates every ``train.sgf.critic_updates_per_student`` steps from step ratio + 1 on, and
    ``runtime.log_every`` need not fall on those steps)::

        solar: step 10/400 critic loss 0.1234 grad 0.421 lr 2e-06 student loss 0.5678 (update 1, step 6) ...

    Before the launch's first student update the line names the update the run is at (a resumed
    run's latest student loss is in its events, not in this launch).

    tok/s and mfu per GPU (every logical DP rank's clips of the step over the world size; MFU prices
    a clip at one forward+backward, ``Loop.flops_per_clip``), mem the step's peak GPU memory
    (``torch.cuda.max_memory_allocated``); mfu and mem only where they are known. The ETA comes
    from the wall time between the recent steps (saves and validations inside the window count),
    leaving out the launch's first ``warmup`` steps (compile, allocator warm-up, and before the
    first step the launch's own set-up): the lines of those steps have no ETA (``eta_seconds``)."""

    def __init__(self, enabled: bool, total: int, start: int, every: int, *, tokens_per_clip: int = 0,
                 flops_per_clip: float = 0.0, peak_flops: float | None = None, dp_world: int = 1, world: int = 1,
                 warmup: int = 2, window: int = 20) -> None:
        import collections

        self.enabled, self.total, self.start, self.every = enabled, total, start, every
        self.tokens_per_clip, self.flops_per_clip, self.peak_flops = tokens_per_clip, flops_per_clip, peak_flops
        self.dp_world, self.world, self.warmup = dp_world, world, warmup
        self.last = time.perf_counter()
        self.early: list[float] = []                               # the first ``warmup`` intervals
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.student: dict | None = None                          # Stage2: the latest student update seen

    def show(self, event: dict) -> None:
        now = time.perf_counter()
        (self.early if len(self.early) < self.warmup else self.recent).append(now - self.last)
        self.last = now
        step = event["step"]
        if event.get("student_updated"):
            self.student = {"loss": event.get("student_loss_mean", event.get("student_loss")),
                            "update": event.get("student_step"), "step": step}
        if not self.enabled or (step % self.every and step != self.total):
            return
        seconds = event["step_seconds"]
        parts = [f"solar: step {step}/{self.total} {roles_text(event, self.student)} {seconds:.2f}s/step"]
        clips = len(event.get("samples") or []) * self.dp_world
        if clips and seconds > 0 and self.tokens_per_clip:
            parts.append(f"{self.tokens_per_clip * clips / self.world / seconds:,.0f} tok/s")
        if clips and seconds > 0 and self.peak_flops and self.flops_per_clip:
            parts.append(f"mfu {100 * self.flops_per_clip * clips / self.world / seconds / self.peak_flops:.1f}%")
        peak = (event.get("memory") or {}).get("cuda_peak_bytes")
        if peak:
            parts.append(f"mem {peak / 2**30:.1f}GiB")
        eta = eta_seconds(list(self.recent), self.total - step)
        if eta is not None:
            parts.append(f"eta {duration(eta)}")
        sys.stderr.write(" ".join(parts) + "\n")
        sys.stderr.flush()


def roles_text(event: dict, student: dict | None = None) -> str:
    """``loss L grad G lr R`` of a single-model step; for a Stage2 step (its event has
    ``student_updated``) the critic's and the student's, each named: the student's loss, grad and
    lr when it updated at this step, else ``student`` (its latest update: loss, update number,
    step; ``Progress.student``), else the update the run is at."""
    if "student_updated" not in event:
        return f"loss {event['loss_mean']:.4f} grad {event['grad_norm']:.3g} lr {event['lr']:.3g}"
    text = f"critic loss {event['loss_mean']:.4f} grad {event['grad_norm']:.3g} lr {event['lr']:.3g}"
    if event["student_updated"]:
        loss = event.get("student_loss_mean", event["student_loss"])
        text += (f" student loss {loss:.4f} grad {event['student_grad_norm']:.3g} "
                 f"lr {event['student_lr']:.3g} (update {event.get('student_step')})")
    elif student is not None and student.get("loss") is not None:
        text += f" student loss {student['loss']:.4f} (update {student['update']}, step {student['step']})"
    elif event.get("student_step"):
        text += f" student update {event['student_step']} (its loss before this launch)"
    else:
        text += " student no update yet"
    return text


def eta_seconds(recent: list[float], remaining: int) -> float | None:
    """Seconds left: the mean wall time of the ``recent`` step intervals (the launch's warm-up steps
    already left out) times the steps ``remaining``; 0 when none remain; None while no step after
    the warm-up has been timed (the warm-up's compile and set-up say nothing of the steps to come)."""
    if remaining <= 0:
        return 0.0
    if not recent:
        return None
    return sum(recent) / len(recent) * remaining


def duration(seconds: float) -> str:
    """``42s``, ``7m05s``, ``8h51m``, ``3d04h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
