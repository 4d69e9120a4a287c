"""What a stage directory says about its stage (the I/O edge of the state machine; torch-free).

A stage directory is the trainer's run directory: ``run-result.json``, ``checkpoints/step_N``
(verified, never trusted by name), ``validation/step_N/COMPLETE.json`` or
``generation/COMPLETE.json``, and ``events``/``heartbeat`` files whose modification times show
progress. ``LazyStageFiles`` observes a stage only when the state machine asks about it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from solar.run.reshape import DataPosition
from solar.storage import checkpoints as ckpt
from solar.storage.run_dir import latest_config, launch_records


@dataclass(frozen=True)
class StageFiles:
    exists: bool
    launched: bool = False                  # launch-manifest.json exists: the directory is a run's
    result: str | None = None               # run-result.json status (complete, failed, stopped, ...)
    result_message: str | None = None
    result_error: str | None = None         # run-result.json error_type (non_finite, oom, checkpoint, ...)
    latest: int | None = None               # step of the newest verified checkpoint
    final: str | None = None                # the expected final checkpoint: verified|missing|incomplete|unverifiable
    final_problems: tuple[str, ...] = ()
    marker: bool = False                    # the expected validation/generation COMPLETE.json exists
    marker_status: str | None = None        # its status (complete | partial)
    last_activity: float | None = None      # newest mtime of heartbeats, events, checkpoints (epoch seconds)
    usage: dict | None = None               # run-result.json usage: GPU time of every launch so far
    result_problem: str | None = None       # run-result.json exists but cannot be read as one (names the file)
    marker_problem: str | None = None       # the expected COMPLETE.json exists but cannot be read as one
    skipped: tuple[str, ...] = ()           # newer checkpoints that do not verify ("<path>: <problem>")
    position: DataPosition | None = None    # the newest verified checkpoint's data/position.json, when it has one
    config: dict | None = None              # the resolved config of the directory's latest launch
    last_step: tuple[int, float] | None = None  # rank 0's newest step record: (step, epoch seconds)
    launches: int = 0                       # launch records in the directory (launch-manifest.json, launches/)
    rewinds: tuple[int, ...] = ()           # the steps its launch records say a launch rewound to ("rewind")


def _document(path: Path, what: str) -> tuple[dict | None, str | None]:
    """(the JSON object at ``path``, None), (None, None) when there is no file, or (None, the problem:
    the file and what is wrong with it) when it is truncated, not JSON or not a JSON object."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{what} {path} cannot be read: {exc.strerror or exc}"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        how = "is empty" if not text.strip() else f"is not valid JSON (truncated?): {exc}"
        return None, f"{what} {path} {how}"
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return None, f"{what} {path} is not a {what} document (no status)"
    return doc, None


def data_position(checkpoint: Path) -> DataPosition | None:
    """A checkpoint's ``data/position.json``; None when it has none (written before the file existed)
    or it does not read as one (the trainer's own resume then says what is wrong)."""
    from pydantic import ValidationError

    try:
        doc = ckpt.data_position(checkpoint)
    except ckpt.CheckpointError:
        return None
    if doc is None:
        return None
    try:
        return DataPosition.model_validate(doc)
    except ValidationError:
        return None


def _mtime(paths) -> float | None:
    times = []
    for p in paths:
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def _final(root: Path, step: int) -> tuple[str, tuple[str, ...]]:
    path = root / "checkpoints" / ckpt.step_name(step)
    if not path.exists():
        return "missing", ()
    report = ckpt.verify(path)
    if not report["complete"]:
        return "incomplete", tuple(report["problems"])
    return ("verified", ()) if report["valid"] else ("unverifiable", tuple(report["problems"]))


def observe_stage(stage_dir: str | Path, *, final_step: int | None, validation_step: int | None,
                  generation: bool, owner: tuple[str, str] | None = None) -> StageFiles:
    """``owner``: (SolarRun uid, stage name) whose evidence this directory must hold; a run-result.json
    that records another owner is a ``result_problem`` (one that records none is accepted)."""
    root = Path(stage_dir)
    if not root.is_dir():
        return StageFiles(exists=False)
    result = message = error = usage = None
    doc, result_problem = _document(root / "run-result.json", "run-result.json")
    recorded = (doc or {}).get("owner")
    if owner is not None and isinstance(recorded, dict) and (recorded.get("run_uid"), recorded.get("stage")) != owner:
        result_problem = (f"run-result.json {root / 'run-result.json'} was written for SolarRun uid "
                          f"{recorded.get('run_uid')} stage {recorded.get('stage')}, not this run's stage {owner[1]} "
                          f"(uid {owner[0]}): another run's output is in this stage's directory")
        doc = None
    if doc is not None:
        result, message, error = doc.get("status"), doc.get("message"), doc.get("error_type")
        usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
    latest, skipped = ckpt.newest_valid(root)
    final, problems = _final(root, final_step) if final_step is not None else (None, ())
    marker_path = None
    if validation_step is not None:
        marker_path = root / "validation" / f"step_{validation_step:08d}" / "COMPLETE.json"
    elif generation:
        marker_path = root / "generation" / "COMPLETE.json"
    marker, marker_status, marker_problem = False, None, None
    if marker_path is not None:
        doc, marker_problem = _document(marker_path, "COMPLETE.json")
        if doc is not None:
            marker, marker_status = True, doc["status"]
    activity = _mtime(list((root / "heartbeat").glob("*.json")) + list((root / "events").glob("*.jsonl"))
                      + list((root / "checkpoints").glob("step_*")) + [root / "run-result.json"])
    launched = (root / "launch-manifest.json").is_file()
    return StageFiles(True, launched, result, message, error,
                      latest["step"] if latest else None, final, problems, marker, marker_status, activity, usage,
                      result_problem, marker_problem, tuple(skipped),
                      data_position(root / "checkpoints" / ckpt.step_name(latest["step"])) if latest else None,
                      _latest_config(root) if launched else None, _last_step(root / "events" / "rank-00000.jsonl"),
                      *_launches(root))


def _launches(root: Path) -> tuple[int, tuple[int, ...]]:
    """(how many launch records the directory holds, the steps those that rewound it rewound to). A
    record that cannot be read counts as a launch that rewound nothing."""
    records = launch_records(root)
    steps = []
    for path in records:
        try:
            rewind = json.loads(path.read_bytes()).get("rewind")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(rewind, dict) and isinstance(rewind.get("step"), int):
            steps.append(rewind["step"])
    return len(records), tuple(steps)


TAIL_BYTES = 16384   # the end of rank 0's event log read for its newest step record (a step record is ~1 KB)


def _last_step(path: Path) -> tuple[int, float] | None:
    """(step, time) of the newest ``step`` record in the last ``TAIL_BYTES`` of an event log, or None."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()[1 if size > TAIL_BYTES else 0:]):   # the first may be cut
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "step" and isinstance(record.get("step"), int) \
                and isinstance(record.get("time"), (int, float)):
            return record["step"], float(record["time"])
    return None


def _latest_config(root: Path) -> dict | None:
    """The resolved config of the directory's latest launch (what a resume is compared with), None when
    it cannot be read (the trainer's own check then speaks)."""
    try:
        return latest_config(root)
    except (OSError, ValueError):
        return None


class LazyStageFiles(Mapping[str, StageFiles]):
    """stage name -> StageFiles, observed on first access (the machine reads only the stages it reaches)."""

    def __init__(self, names: list[str], observe: Callable[[str], StageFiles]) -> None:
        self._names, self._observe, self._seen = list(names), observe, {}

    def __getitem__(self, name: str) -> StageFiles:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._seen:
            self._seen[name] = self._observe(name)
        return self._seen[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
