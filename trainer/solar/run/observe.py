"""What a stage directory says about its stage (the I/O edge of the state machine; torch-free).

A stage directory is the trainer's run directory: ``run-result.json``, ``checkpoints/step_N``
(verified, never trusted by name), ``validation/step_N/COMPLETE.json`` or
``generation/COMPLETE.json``, and ``events``/``heartbeat`` files whose modification times show
progress.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from solar.storage import checkpoints as ckpt


@dataclass(frozen=True)
class StageFiles:
    exists: bool
    launched: bool = False                  # launch-manifest.json exists: the directory is a run's
    result: str | None = None               # run-result.json status (complete, failed, stopped, ...)
    result_message: str | None = None
    latest: tuple[int, str] | None = None   # (step, path) of the newest verified checkpoint
    final_problem: str | None = None        # why the expected final checkpoint does not count (None: it does)
    validation: tuple[int, str] | None = None   # (step, status) of the expected validation marker
    last_activity: float | None = None      # newest mtime of heartbeats, events, checkpoints (epoch seconds)


def _mtime(paths) -> float | None:
    times = []
    for p in paths:
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def observe_stage(stage_dir: str | Path, *, final_step: int | None, validation_step: int | None,
                  generation: bool) -> StageFiles:
    root = Path(stage_dir)
    if not root.is_dir():
        return StageFiles(exists=False)
    result = message = None
    try:
        doc = json.loads((root / "run-result.json").read_text())
        result, message = doc.get("status"), doc.get("message")
    except (OSError, ValueError):
        pass
    latest = ckpt.latest_valid(root)
    latest_pair = (latest["step"], latest["path"]) if latest else None
    final_problem = None
    if final_step is not None:
        path = root / "checkpoints" / f"step_{final_step:08d}"
        if not path.exists():
            final_problem = f"CheckpointMissing: {path} does not exist"
        else:
            report = ckpt.verify(path)
            if not report["complete"]:
                final_problem = f"CheckpointIncomplete: {path}: {'; '.join(report['problems'])}"
            elif not report["valid"]:
                final_problem = f"CheckpointUnverifiable: {path}: {'; '.join(report['problems'])}"
    validation = None
    marker = None
    if validation_step is not None:
        marker = root / "validation" / f"step_{validation_step:08d}" / "COMPLETE.json"
    elif generation:
        marker = root / "generation" / "COMPLETE.json"
    if marker is not None and marker.is_file():
        try:
            validation = (validation_step or 0, json.loads(marker.read_text()).get("status", "complete"))
        except (OSError, ValueError):
            validation = None
    activity = _mtime(list((root / "heartbeat").glob("*.json")) + list((root / "events").glob("*.jsonl"))
                      + list((root / "checkpoints").glob("step_*")) + [root / "run-result.json"])
    return StageFiles(True, (root / "launch-manifest.json").is_file(), result, message, latest_pair, final_problem,
                      validation, activity)
