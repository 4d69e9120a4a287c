"""Run directories built by hand, torch-free, as the trainer leaves them after a rewind in place, a
restart from step 0 and a save that collided with an earlier launch's checkpoint (issue 52 items 2,
3 and 5): launch records, rank 0's events, run-result.json, committed checkpoints and what a rewind
moved under ``checkpoints/superseded/NNNN/``. ``solar diagnose``, ``solar report`` and ``solar
checkpoint`` read them in tests/unit/diagnose, tests/unit/report and tests/cli."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from solar.config.canonical import canonical_bytes
from solar.config.resolve import resolve_file
from solar.storage import checkpoints as ckpt
from tests.conftest import CONFIGS

CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
T0 = 1_800_000_000.0


def _safetensors(value: float) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack("<f", value)


def checkpoint(root: Path, step: int) -> Path:
    """A committed checkpoint transaction with one safetensors member, as the trainer commits it."""
    partial = ckpt.begin(root, step)
    (partial / "model").mkdir()
    (partial / "model" / "live.safetensors").write_bytes(_safetensors(float(step)))
    return ckpt.commit(partial, step=step, contract={"family": "wan22_ti2v_5b"},
                       roles={"model": {"weights": ["live"], "members": ["model/live.safetensors"]}},
                       trainer_state={"step": step})


class Run:
    """One run directory: ``launch`` writes a launch's records (the first ``launch-manifest.json`` and
    ``resolved-config.json``, each later one ``launches/NNNN-...``), ``events`` appends rank 0's."""

    def __init__(self, root: Path, *sets: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.sets = [f"runtime.output_dir={root}", "data.root=/data/tiny", "train.max_steps=8",
                     "runtime.save_every=2", *sets]
        self.launches = 0

    def launch(self, *, resume_from: int | None = None, **record) -> str:
        """The next launch's records; ``resume_from``: a full resume from this run's step. Returns the
        record number (``NNNN``; ``""`` for the first launch)."""
        sets = list(self.sets)
        if resume_from is not None:
            sets += ["checkpoint.mode=full_resume",
                     f"checkpoint.path={self.root / 'checkpoints' / ckpt.step_name(resume_from)}"]
        resolved = resolve_file(CONFIG, sets, placeholders=False)
        cfg = resolved.config_dict
        init = {"mode": cfg["checkpoint"]["mode"], "sources": [] if resume_from is None else [
            {"role": "model", "path": cfg["checkpoint"]["path"], "weights": "all"}]}
        manifest = {"schema": "solar.launch.v1", "action": "train", "name": cfg["name"], "route": resolved.route.key,
                    "source_config": {"path": resolved.source, "digest": resolved.source_digest},
                    "resolved_config_digest": resolved.resolved_digest, "topology": resolved.topology.as_dict(),
                    "init": init, **record}
        config = canonical_bytes(cfg) + b"\n"
        self.launches += 1
        if self.launches == 1:
            (self.root / "launch-manifest.json").write_text(json.dumps(manifest, indent=2))
            (self.root / "resolved-config.json").write_bytes(config)
            return ""
        number = f"{self.launches - 1:04d}"
        (self.root / "launches").mkdir(exist_ok=True)
        (self.root / "launches" / f"{number}-launch-manifest.json").write_text(json.dumps(manifest, indent=2))
        (self.root / "launches" / f"{number}-resolved-config.json").write_bytes(config)
        return number

    def events(self, *records: dict) -> None:
        (self.root / "events").mkdir(exist_ok=True)
        with open(self.root / "events" / "rank-00000.jsonl", "a") as fh:
            fh.writelines(json.dumps({"rank": 0, **r}) + "\n" for r in records)

    def result(self, status: str, **fields) -> None:
        (self.root / "run-result.json").write_text(json.dumps({"schema": "solar.run-result.v1", "status": status,
                                                               **fields}))

    def heartbeat(self, *, phase: str, step: int, **extra) -> None:
        (self.root / "heartbeat").mkdir(exist_ok=True)
        (self.root / "heartbeat" / "rank-00000.json").write_text(json.dumps(
            {"rank": 0, "pid": 1, "host": "elsewhere", "phase": phase, "step": step, "time": T0 + 500, **extra}))


def start(t: float) -> dict:
    return {"event": "start", "time": T0 + t, "world": 1, "route": "wan22_ti2v_5b:stage0p5:bidirectional:flow_matching"}


def step(n: int, t: float, loss: float) -> dict:
    return {"event": "step", "step": n, "time": T0 + t, "loss": loss, "grad_norm": 1.0, "lr": 1e-4,
            "step_seconds": 1.0}


def saved(root: Path, n: int, t: float) -> dict:
    return {"event": "checkpoint", "step": n, "time": T0 + t, "seconds": 0.1,
            "path": str(root / "checkpoints" / ckpt.step_name(n))}


def first_launch(run: Run, last: int = 8, *, loss: float = 1.0) -> None:
    """Launch 1: steps 1..``last`` with a checkpoint every 2 steps, then complete."""
    run.launch()
    events = [start(0)]
    for n in range(1, last + 1):
        events.append(step(n, n, loss))
        if n % 2 == 0:
            checkpoint(run.root, n)
            events.append(saved(run.root, n, n + 0.5))
    run.events(*events, {"event": "complete", "time": T0 + last + 1})


def rewound(root: Path) -> Run:
    """Launch 1 trained steps 1-8 (checkpoints 2, 4, 6, 8; validation at 8); launch 2 resumed from
    step 4 in place: steps 6 and 8 moved under ``checkpoints/superseded/0001/`` (and validation step
    8 under ``validation/superseded/0001/``), then steps 5-6 trained again (loss 0.5) and it stopped
    (SIGTERM) after committing step 6 anew."""
    run = Run(root)
    first_launch(run)
    (root / "validation" / "step_00000008").mkdir(parents=True)   # left unfinished: superseded, not missing
    moved = root / "checkpoints" / "superseded" / "0001"
    moved.mkdir(parents=True)
    for n in (6, 8):
        shutil.move(root / "checkpoints" / ckpt.step_name(n), moved / ckpt.step_name(n))
    (root / "validation" / "superseded" / "0001").mkdir(parents=True)
    shutil.move(root / "validation" / "step_00000008", root / "validation" / "superseded" / "0001" / "step_00000008")
    record = {"moved": ["checkpoints/superseded/0001/step_00000006", "checkpoints/superseded/0001/step_00000008",
                        "validation/superseded/0001/step_00000008"],
              "checkpoint": str(root / "checkpoints" / "step_00000004"), "step": 4,
              "superseded": ["step_00000006", "step_00000008"], "superseded_dir": "checkpoints/superseded/0001"}
    number = run.launch(resume_from=4, rewind=record)   # as solar.storage.supersede.apply records it
    assert number == "0001"
    run.events(start(100), {"event": "rewound", "time": T0 + 100.5, **record}, step(5, 105, 0.5), step(6, 106, 0.5))
    checkpoint(root, 6)
    run.events(saved(root, 6, 106.5), {"event": "stopped", "time": T0 + 107})
    run.result("stopped", final={"step": 6, "loss": 0.5})
    return run


def restarted(root: Path) -> Run:
    """Launch 1 trained steps 1-3 (loss 1.0) and failed (OOM) before its first checkpoint; launch 2
    started over: steps 1-4 (loss 0.5), checkpoints 2 and 4, complete at train.max_steps 4."""
    run = Run(root, "train.max_steps=4")
    run.launch()
    run.events(start(0), step(1, 1, 1.0), step(2, 2, 1.0), step(3, 3, 1.0),
               {"event": "error", "time": T0 + 4, "error_type": "oom", "message": "CUDA out of memory"})
    record = {"moved": [], "earlier_launches": 1, "superseded_dir": None}
    number = run.launch(restart=record)
    run.events(start(50), {"event": "restarted", "time": T0 + 50.5, **record})
    for n in range(1, 5):
        run.events(step(n, 50 + n, 0.5))
        if n % 2 == 0:
            checkpoint(root, n)
            run.events(saved(root, n, 50 + n + 0.5))
    run.events({"event": "complete", "time": T0 + 56})
    run.result("complete", final={"step": 4, "loss": 0.5})
    assert number == "0001"
    return run


def collided(root: Path) -> Run:
    """Launch 1 trained steps 1-8 (checkpoints 2-8); launch 2, by a trainer that did not rewind,
    resumed from step 4 in the same directory, trained step 5 and failed saving step 6, which launch
    1 had committed."""
    run = Run(root)
    first_launch(run)
    run.launch(resume_from=4)
    message = collision_message(root, 6)
    run.events(start(100), step(5, 105, 0.5), step(6, 106, 0.5),
               {"event": "error", "time": T0 + 107, "error_type": "checkpoint", "message": message})
    run.heartbeat(phase="failed", step=6, failed_in="checkpoint")
    run.result("failed", error_type="checkpoint", message=message)
    return run


def collision_message(root: Path, step: int, *, at_commit: bool = False) -> str:
    """What a launch records (``solar.launch.errors.describe``) when its save of ``step`` finds the
    step's checkpoint already there: raised by ``checkpoints.begin``, or by ``commit`` when it
    appeared while the save was written."""
    final = root / "checkpoints" / ckpt.step_name(step)
    try:
        if at_commit:
            aside = final.rename(final.with_name("aside"))
            partial = ckpt.begin(root, step)
            aside.rename(final)
            ckpt.commit(partial, step=step, contract={}, roles={}, trainer_state={})
        else:
            ckpt.begin(root, step)
    except ckpt.CheckpointError as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError(f"saving step {step} of {root} did not collide")
