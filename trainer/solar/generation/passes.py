"""Running generation passes over the frozen validation plan and writing their outputs.

Layout (``root`` is ``validation/step_NNNNNNNN`` in training, ``generation`` in ``solar infer``)::

    <root>/<pass>/slot_NNNNNN/{manifest.json, generated.mp4, compare.mp4}
    <root>/<pass>/COMPLETE.json
    <root>/COMPLETE.json          only when every intended slot of every pass has a manifest

A slot is built in a hidden ``.slot_NNNNNN.<random>.partial`` sibling and renamed into place, so a
slot directory always holds a terminal manifest (ok or error); a killed run leaves no COMPLETE.json
and a resumed run finishes the missing slots only. Slot s belongs to logical DP rank s % dp_world;
SP peers generate it together and the first of them writes it. With FSDP2 every rank must run
every forward, so ranks without a slot in a round run a discarded forward.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solar.config.canonical import blake2s_hex, pretty_bytes
from solar.data.selection import Slot
from solar.data.stream import ClipSource, Occurrence
from solar.generation import video
from solar.generation.generate import sample
from solar.launch import precision
from solar.launch.batch import Batch, collate
from solar.storage import space
from solar.storage.atomic import fsync_dir, write_create_only

# The decoded ground truth of a slot is the same in every pass and at every validation step of a
# launch (same sample, start and decode length): it is decoded once and kept up to this many bytes.
TRUTH_CACHE_BYTES = 2 << 30

SLOT_SCHEMA = "solar.sample.v1"
PASS_SCHEMA = "solar.validation-pass-complete.v1"
STEP_SCHEMA = "solar.validation-complete.v1"


@dataclass
class Generation:
    cfg: object
    dist: object
    model: torch.nn.Module
    codec: object
    source: ClipSource
    slots: list[Slot]
    negative: torch.Tensor | None
    audio_silence: torch.Tensor | None
    sharded: bool = False
    log: Callable[[str], None] = lambda _: None
    fault: object = None  # solar.train.faults.Fault (kill_validation and enospc_validation drills)
    truths: dict = field(default_factory=dict)  # (input digest, decoded latents) -> uint8 frames
    storage_problem: tuple[str, str] | None = None  # (message, storage_full | storage_error) of a failed write
    files: "_FileWorker | None" = None  # the slot files' worker while ``run`` runs
    stop: object = None  # solar.launch.stop.Stop (``solar infer``): agreed after each round of slots
    stopped: bool = False  # ``run`` ended early on a stop: finished slots kept, no COMPLETE.json written

    def truth_frames(self, batch: Batch, shown: int) -> torch.Tensor:
        """The slot's ground truth as uint8 frames [F, H, W, 3], decoded once per launch while the
        cache holds under ``TRUTH_CACHE_BYTES`` (keyed by the input bytes, so a changed input decodes anew)."""
        key = (batch.digest(), shown)
        frames = self.truths.get(key)
        if frames is None:
            frames = video.to_uint8(self.codec.decode(batch.latents[:, :, :shown])[0]).cpu()
            if sum(f.nbytes for f in self.truths.values()) + frames.nbytes <= TRUTH_CACHE_BYTES:
                self.truths[key] = frames
        return frames

    def batch_for(self, slot: Slot) -> Batch | str:
        occ = Occurrence(reader=-1, epoch=0, position=slot.slot, row=slot.row, repeat_ordinal=0,
                         start_frame=slot.start_frame)
        clip = self.source.read(occ, self.camera_length_frames(slot))
        return clip if isinstance(clip, str) else collate([clip]).to(self.dist.device)

    def camera_length_frames(self, slot: Slot) -> int | None:
        """Camera-length inference: the longest whole-chunk rollout the sample's camera track
        supports from the slot's start (pixel frames), else None (the configured clip)."""
        inference = getattr(self.cfg, "inference", None)
        if inference is None or inference.length != "camera":
            return None
        frames = self.source.row(slot.row).num_frames
        if frames is None or frames < 0:
            raise ValueError(f"sample {slot.sample_id!r}: camera-length inference needs num_frames in the test index")
        chunk = self.cfg.model.causal.chunk_latents
        latents = 1 + (frames - slot.start_frame - 1) // 4
        rollout = latents // chunk * chunk
        if rollout < chunk:
            raise ValueError(f"sample {slot.sample_id!r}: its camera track from frame {slot.start_frame} supports "
                             f"{latents} latents, less than one {chunk}-latent chunk")
        return 1 + 4 * (rollout - 1)

    def _sample(self, batch: Batch, p, noise_seed: int) -> torch.Tensor:
        """One slot's latents, the model computing in the run's precision (``launch.precision``;
        the solver's state stays fp32)."""
        with precision.autocast(self.cfg, self.dist.device, sharded=self.sharded):
            latents = sample(self.model, self.cfg, batch, noise_seed=noise_seed, solver=p.solver, steps=p.steps,
                             negative=self.negative, audio_silence=self.audio_silence)
        return latents.float()

    def _dummy(self, batch: Batch, p) -> None:
        self._sample(batch, p, 0)

    def _slot(self, pass_dir: Path, p, weights: str, slot: Slot, step: int | None, writer: bool) -> None:
        """Generate and decode one slot on this rank; its writer hands the frames to the file worker
        (``_finish``), which encodes and commits them while the next slot generates."""
        batch = None
        manifest = {"schema": SLOT_SCHEMA, "slot": slot.slot, "sample_id": slot.sample_id,
                    "start_frame": slot.start_frame, "noise_seed": slot.noise_seed, "pass": p.name,
                    "weights": weights, "solver": p.solver, "steps": p.steps, "step": step,
                    "logical_dp_rank": self.dist.dp_rank, "artifacts": []}
        partial = pass_dir / f".slot_{slot.slot:06d}.{secrets.token_hex(4)}.partial"
        if writer:
            partial.mkdir(parents=True)
        clock = _PhaseClock(self.dist.device)
        try:
            batch = self.batch_for(slot)
            if isinstance(batch, str):
                raise ValueError(batch)
            clock.lap("read")
            latents = self._sample(batch, p, slot.noise_seed)
            clock.lap("generate")
            if not writer:
                return
            shown = self.cfg.validation.decode_latents or latents.shape[2]
            truth = self.truth_frames(batch, shown)
            clock.lap("truth")
            made = video.to_uint8(self.codec.decode(latents[:, :, :shown])[0])
            clock.lap("decode")
            manifest["rollout_latents"] = int(latents.shape[2])
        except Exception as exc:  # noqa: BLE001 - the slot's terminal state records it
            if self._storage_failed(exc, p, slot, pass_dir, partial if writer else None):
                return
            if self.sharded and batch is not None and not isinstance(batch, str):
                raise
            if not writer:   # an SP peer's error: the slot's writer records the slot
                self.log(f"solar: validation slot {slot.slot} ({slot.sample_id}) failed: {_error_text(exc)}")
                return
            self.files.submit(self._finish, pass_dir, partial, p, slot, step, manifest, None, None, clock, exc)
            return
        self.files.submit(self._finish, pass_dir, partial, p, slot, step, manifest, truth, made, clock, None)

    def _finish(self, pass_dir: Path, partial: Path, p, slot: Slot, step: int | None, manifest: dict,
                truth: torch.Tensor | None, made: torch.Tensor | None, clock: "_PhaseClock",
                failed: BaseException | None) -> None:
        """The slot's files (on the file worker): its MP4s, their digests and the terminal manifest in
        the hidden partial, then the rename that makes it a slot."""
        final = pass_dir / f"slot_{slot.slot:06d}"
        clock.cuda = False   # this thread waits for no GPU work: the frames are on the host
        exc = failed
        if exc is None:
            try:
                fps = float(self.cfg.data.fps or 16.0)
                video.write_mp4(partial / "generated.mp4", made, fps)
                if self.fault is not None and step is not None and \
                        self.fault.fires("enospc_validation", step, self.dist.rank):
                    import errno

                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial / "compare.mp4"))
                video.write_mp4(partial / "compare.mp4", video.side_by_side(truth, made), fps)
                clock.lap("encode")
                for name in ("generated.mp4", "compare.mp4"):
                    data = (partial / name).read_bytes()
                    manifest["artifacts"].append({"path": name, "bytes": len(data), "blake2s": blake2s_hex(data)})
                manifest["status"] = "ok"
                manifest["frames"] = int(made.shape[0])
            except Exception as caught:  # noqa: BLE001 - the slot's terminal state records it
                exc = caught
        if exc is not None:
            if self._storage_failed(exc, p, slot, pass_dir, partial):
                return
            manifest.update(status="error", error=_error_text(exc), artifacts=[])
            manifest.pop("rollout_latents", None)
            self.log(f"solar: validation slot {slot.slot} ({slot.sample_id}) failed: {manifest['error']}")
        try:
            for leftover in ("generated.mp4", "compare.mp4"):
                if manifest["status"] == "error" and (partial / leftover).exists():
                    (partial / leftover).unlink()
            write_create_only(partial / "manifest.json", pretty_bytes(manifest), what="slot manifest")
            fsync_dir(partial)
            os.rename(partial, final)
            fsync_dir(pass_dir)
        except OSError as caught:
            if self._storage_failed(caught, p, slot, pass_dir, partial):
                return
            raise
        clock.lap("files")
        if manifest["status"] == "ok":
            phases = " ".join(f"{k} {v:.1f}" for k, v in clock.seconds.items())
            self.log(f"solar: {p.name} slot {slot.slot + 1}/{len(self.slots)} ({slot.sample_id}) "
                     f"{clock.total():.1f}s ({phases})")
        if self.fault is not None and step is not None and self.fault.fires("kill_validation", step, self.dist.rank):
            os.kill(os.getpid(), signal.SIGKILL)

    def _storage_failed(self, exc: BaseException, p, slot: Slot, pass_dir: Path, partial: Path | None) -> bool:
        """A write that met a full or failing volume is no slot error: it is kept for ``_agree`` (every
        rank then fails with it) and the slot's partial directory is removed."""
        kind = space.storage_class(exc)
        if kind is None:
            return False
        what = f"validation slot {slot.slot} of pass {p.name}"
        self.storage_problem = (space.message(kind, what, exc, pass_dir) + " (its partial slot was removed)", kind)
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        return True

    def _agree(self) -> None:
        """After each round of slots: any rank's storage failure ends validation on every rank."""
        problem = self.storage_problem
        self.dist.exchange_error(problem[0] if problem else None, problem[1] if problem else "error")

    def run(self, root: Path, passes: list, weights_for: Callable, step: int | None) -> dict | None:
        """Every pass (``weights_for(pass)`` -> (context manager, resolved role) or None to skip). With
        ``stop``, every rank agrees after each round of slots whether to stop: then the finished slots'
        files are written, ``stopped`` is set and None is returned (a later launch finishes the rest)."""
        d = self.dist
        done_passes = []
        with _FileWorker() as self.files:
            for number, p in enumerate(passes, start=1):
                chosen = weights_for(p)
                if chosen is None:
                    self.log(f"solar: validation pass {p.name} skipped (its weights do not exist yet)")
                    continue
                context, role = chosen
                pass_dir = root / p.name
                pass_dir.mkdir(parents=True, exist_ok=True)
                rounds = -(-len(self.slots) // d.dp_world)
                with context:
                    for r in range(rounds):
                        index = r * d.dp_world + d.dp_rank
                        slot = self.slots[index] if index < len(self.slots) else None
                        if slot is not None and (pass_dir / f"slot_{slot.slot:06d}").is_dir():
                            slot = None  # finished by an earlier launch
                        if slot is None:
                            if self.sharded:
                                self._dummy(self._dummy_batch(), p)
                        else:
                            self._slot(pass_dir, p, role, slot, step, writer=d.sp_rank == 0)
                        self._agree()
                        more = r + 1 < rounds or number < len(passes)   # a stop after the last slot is no stop
                        if more and self.stop is not None and self.stop.agree(d, "generation-stop"):
                            self.stopped = True
                            break
                self.files.drain()
                self._agree()
                if self.stopped:
                    break
                d.barrier(f"validation-pass-{p.name}")
                done_passes.append(p.name)
                if d.rank == 0:
                    self._complete(pass_dir / "COMPLETE.json", PASS_SCHEMA, step, [p.name], root)
        if self.stopped:
            return None
        summary = None
        if d.rank == 0:
            summary = self._complete(root / "COMPLETE.json", STEP_SCHEMA, step, done_passes, root)
        return d.all_gather_object(summary, "validation-summary")[0]

    def _dummy_batch(self) -> Batch:
        first = self.batch_for(self.slots[0])
        if isinstance(first, str):
            raise RuntimeError(f"no valid input to keep FSDP ranks in step: {first}")
        return first

    def _complete(self, path: Path, schema: str, step, passes: list[str], root: Path) -> dict:
        import json

        manifests = []
        for name in passes:
            pass_dir = root / name
            for slot in self.slots:
                m = pass_dir / f"slot_{slot.slot:06d}" / "manifest.json"
                if not m.is_file():
                    raise RuntimeError(f"validation slot {slot.slot} of pass {name} has no manifest")
                manifests.append(json.loads(m.read_text()))
        ok = sum(1 for m in manifests if m["status"] == "ok")
        doc = {"schema": schema, "step": step, "passes": passes, "slots": len(manifests), "ok_slots": ok,
               "error_slots": len(manifests) - ok, "status": "complete" if ok == len(manifests) else "partial"}
        if not path.exists():
            write_create_only(path, pretty_bytes(doc), what="validation COMPLETE.json")
        return {**doc, "path": str(path.parent)}


def _error_text(exc: BaseException) -> str:
    """A failed slot's error as its manifest records it (an input's ValueError is its own message)."""
    return str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"


class _FileWorker:
    """One thread that encodes and commits slots in order, so a slot's MP4s are written while the
    next slot generates on the GPU. One slot waits at most: ``submit`` first waits for the slot
    before it (a slot's frames are a few hundred MB), ``drain`` for the last; an exception the
    worker raised (not a slot's error, which its manifest records) is raised again there."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="solar-slot-files")
        self.pending = None

    def submit(self, fn, *args) -> None:
        self.drain()
        self.pending = self.pool.submit(fn, *args)

    def drain(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def __enter__(self) -> "_FileWorker":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.drain()
        finally:
            self.pool.shutdown(wait=True)


class _PhaseClock:
    """Wall seconds per phase of a slot (read, generate, truth, decode on the GPU's thread; encode and
    files on the file worker, counted from the moment the worker takes the slot up). Each lap waits
    for the GPU's queued work first, so a phase is charged with its own kernels; every lap falls where
    the slot's next step waits for the GPU anyway."""

    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def total(self) -> float:
        return sum(self.seconds.values())

    def lap(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now


def clean_partials(root: Path) -> None:
    """Hidden slot partials of a killed run: not outputs, safe to remove before resuming a pass."""
    if root.is_dir():
        for leftover in root.glob("*/.slot_*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def nothing():
    yield
