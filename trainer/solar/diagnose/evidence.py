"""What a run directory holds as evidence (torch-free, read-only): the launch and result documents,
each rank's events, heartbeat and log, checkpoint and validation transaction states, every launch
record (a rewind in place or a restart from step 0 is recorded in its launch's) and the checkpoints
rewinds moved aside (``checkpoints/superseded/NNNN/``, never the run's).

Events files are read from their tail (``TAIL_BYTES`` per rank), so diagnosing a long run with many
ranks stays cheap; the completion report reads rank 0's events in full.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from solar.errors import SolarError
from solar.storage import checkpoints as ckpt
from solar.storage import supersede
from solar.storage.run_dir import launch_records

TAIL_BYTES = 256 * 1024
LOG_TAIL_LINES = 40
RANK_FILE = re.compile(r"rank-(\d{5})\.(jsonl|json|log)$")


@dataclass(frozen=True)
class Line:
    """One piece of evidence: where it is (file:line) and what it says."""

    where: str
    text: str

    def as_dict(self) -> dict:
        return {"where": self.where, "text": self.text}


@dataclass
class Rank:
    rank: int
    heartbeat: dict | None = None
    events: list[tuple[int | None, dict]] = field(default_factory=list)  # (line number or None, event)
    log_tail: list[tuple[int, str]] = field(default_factory=list)

    def of(self, kind: str) -> list[tuple[int | None, dict]]:
        return [(n, e) for n, e in self.events if e.get("event") == kind]

    @property
    def last_step(self) -> dict | None:
        steps = self.of("step")
        return steps[-1][1] if steps else None

    @property
    def collective(self) -> tuple[str, int] | None:
        c = (self.heartbeat or {}).get("collective")
        return (c["name"], int(c["seq"])) if c else None

    def process_gone(self) -> bool | None:
        """True/False when the heartbeat's process is on this host; None when that cannot be told."""
        hb = self.heartbeat or {}
        if hb.get("host") != socket.gethostname() or not hb.get("pid"):
            return None
        try:
            os.kill(int(hb["pid"]), 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


@dataclass
class PassState:
    name: str
    complete: bool
    ok: list[int] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)   # the error manifests
    partial: list[str] = field(default_factory=list)   # hidden .slot_*.partial directories (crashed writes)


@dataclass
class OutputState:
    """A validation step (``validation/step_N``) or the generation directory."""

    where: str
    step: int | None
    complete: bool
    marker: dict | None
    passes: dict[str, PassState]


@dataclass
class Evidence:
    root: Path
    launch: dict | None
    config: dict | None
    result: dict | None
    ranks: dict[int, Rank]
    checkpoints: list[dict]      # {step, path, complete, valid, problems}
    partial_checkpoints: list[str]
    outputs: list[OutputState]
    now: float
    current: dict | None = None  # the latest launch's manifest (launches/NNNN-...; else ``launch``)
    records: list[tuple[str, dict]] = field(default_factory=list)  # every launch's (record, manifest)
    superseded: list[dict] = field(default_factory=list)           # ``superseded_checkpoints``
    config_path: Path | None = None  # the latest launch's resolved config (``_latest_config``)

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    @property
    def topology(self) -> dict:
        """The latest launch's topology (a resume may run at another shape than the first launch)."""
        return (self.current or self.launch or {}).get("topology") or {}

    @property
    def world(self) -> int:
        return int(self.topology.get("world_size") or max(len(self.ranks), 1))


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail_lines(path: Path, limit: int) -> tuple[int | None, list[str]]:
    """(number of the first returned line, or None when the file was cut), lines."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size <= limit:
            return 1, fh.read().decode("utf-8", "replace").splitlines()
        fh.seek(size - limit)
        return None, fh.read().decode("utf-8", "replace").splitlines()[1:]  # drop the cut line


def _events(path: Path) -> list[tuple[int | None, dict]]:
    first, lines = _tail_lines(path, TAIL_BYTES)
    out = []
    for i, line in enumerate(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        out.append((first + i if first is not None else None, event))
    return out


def _outputs(root: Path) -> list[OutputState]:
    places = sorted((root / "validation").glob("step_*")) if (root / "validation").is_dir() else []
    if (root / "generation").is_dir():
        places.append(root / "generation")
    out = []
    for place in places:
        if not place.is_dir():
            continue
        step = int(place.name[5:]) if place.name.startswith("step_") and place.name[5:].isdigit() else None
        marker = _json(place / "COMPLETE.json")
        passes = {}
        for pass_dir in sorted(p for p in place.iterdir() if p.is_dir() and not p.name.startswith(".")):
            state = PassState(pass_dir.name, (pass_dir / "COMPLETE.json").is_file())
            for slot in sorted(pass_dir.iterdir()):
                if slot.name.startswith(".slot_") and slot.name.endswith(".partial"):
                    state.partial.append(slot.name)
                elif slot.name.startswith("slot_"):
                    manifest = _json(slot / "manifest.json") or {}
                    index = int(slot.name[5:]) if slot.name[5:].isdigit() else -1
                    if manifest.get("status") == "ok":
                        state.ok.append(index)
                    else:
                        state.errors.append({"slot": index, "error": manifest.get("error", "no manifest"),
                                             "sample_id": manifest.get("sample_id"), "path": str(slot)})
            passes[pass_dir.name] = state
        where = f"validation/{place.name}" if step is not None else "generation"
        out.append(OutputState(where, step, marker is not None, marker, passes))
    return out


def gather(run_dir: str | os.PathLike, *, now: float) -> Evidence:
    root = Path(run_dir)
    if not root.is_dir():
        raise SolarError(f"{root} is not a directory (RUN_DIR is a run's runtime.output_dir)")
    launch = _json(root / "launch-manifest.json")
    if launch is None and not (root / "events").is_dir() and not (root / "heartbeat").is_dir():
        raise SolarError(f"{root} holds no run: no launch-manifest.json, events/ or heartbeat/ "
                         "(RUN_DIR is a run's runtime.output_dir)")
    ranks: dict[int, Rank] = {}
    for folder, kind in (("heartbeat", "json"), ("events", "jsonl"), ("logs", "log")):
        for path in sorted((root / folder).glob(f"rank-*.{kind}")):
            m = RANK_FILE.search(path.name)
            if not m:
                continue
            r = ranks.setdefault(int(m.group(1)), Rank(int(m.group(1))))
            if kind == "json":
                r.heartbeat = _json(path)
            elif kind == "jsonl":
                r.events = _events(path)
            else:
                first, lines = _tail_lines(path, 64 * 1024)
                start = (first or 1) + max(len(lines) - LOG_TAIL_LINES, 0)
                r.log_tail = list(enumerate(lines[-LOG_TAIL_LINES:], start=start))
    records = [(str(path.relative_to(root)), doc) for path in launch_records(root)
               if (doc := _json(path)) is not None]
    current = records[-1][1] if records else None
    _latest_launch_only(ranks, (current or {}).get("topology") or {})
    listed = ckpt.list_checkpoints(root)
    checkpoints = [c for c in listed if not Path(c["path"]).name.startswith(".")]
    partial = [Path(c["path"]).name for c in listed if Path(c["path"]).name.startswith(".")]
    return Evidence(root, launch, _json(root / "resolved-config.json"), _json(root / "run-result.json"), ranks,
                    checkpoints, partial, _outputs(root), now, current, records, supersede.superseded_checkpoints(root),
                    _latest_config(root))


def _latest_config(root: Path) -> Path | None:
    """The latest launch's resolved config file (as ``solar.storage.run_dir.latest_config`` reads it)."""
    later = sorted((root / "launches").glob("*-resolved-config.json"))
    path = later[-1] if later else root / "resolved-config.json"
    return path if path.is_file() else None


def _latest_launch_only(ranks: dict[int, Rank], topology: dict) -> None:
    """Every launch appends to the same per-rank files: what an earlier launch left is not evidence
    of the latest one. Ranks at or above the latest launch's world size are an earlier, larger
    launch's (dropped); each rank's events start at its last ``start`` event (when the tail read holds
    none, the whole tail came after it)."""
    world = topology.get("world_size")
    if isinstance(world, int) and world > 0:
        for rank in [r for r in ranks if r >= world]:
            del ranks[rank]
    for r in ranks.values():
        starts = [i for i, (_, e) in enumerate(r.events) if e.get("event") == "start"]
        if starts:
            r.events = r.events[starts[-1]:]
