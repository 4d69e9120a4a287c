"""The run's shape over time and what its interruptions cost (issue 45 item 5), from the run
directory's own records: every launch's world size (nodes x ranks per node where a checkpoint it
committed records ``saved_with.nproc_per_node`` in ``data/position.json``), when it ran and how it
ended; and, for each interruption, the time from the end of one launch to the moment a later launch
trained past the newest checkpoint committed by then.

What the records give, and what is read from where:

- a launch's events are rank 0's ``events/rank-00000.jsonl`` from its ``start`` event to the next
  launch's (every launch appends to the same file);
- it began at its ``start`` event and ended at its last event of any kind (the ``complete``,
  ``stopped`` or ``error`` event when it wrote one). A launch killed outright (SIGKILL, a lost node)
  writes no end: its last event, a step or a checkpoint, is the last thing known of it, so the
  interruption that follows is measured from there (the kill itself came at most one step later);
- how it ended: its end event (``complete``; ``stopped``: on request, a signal or
  ``runtime.exit_after_step``; ``error`` -> ``failed`` with the event's ``error_type``), else its
  attempt in ``run-result.json`` (matched by time in ``solar.report``), else ``killed`` (nothing
  recorded its end; ``running`` for the last launch of a run whose diagnosis is running);
- the durable point after a launch is the newest checkpoint committed by then (rank 0's
  ``checkpoint`` events, written after each commit), by that launch or an earlier one.

An interruption starts at a launch's end and ends at the first ``step`` event of a later launch whose
step is greater than that durable point: when training got past where it had been durably, so the
cost includes the restart, the checkpoint load and the steps done again. Steps the interrupted launch
ran past its newest checkpoint are repeated by the next (``steps_redone``). A launch that ends
before getting past the durable point (it failed or was killed again) belongs to the same
interruption (``through``), which is not counted twice; one that the records never see recover is
``recovered_at: None`` and left out of ``lost_seconds``. A launch that rewound the run in place (its
``rewound`` event: the checkpoints past its step were moved aside) or started it over (``restarted``:
step 0) went back on purpose: the durable point after it starts from that step, and an interruption
it ends counts until its first step past that step (``rewound_to``). The operator's
``disruptionSeconds`` ends at the next committed checkpoint instead (``solar.run.machine``); this is
the trainer's own view.

Not every gap between launches is lost time. A launch that completed (its ``complete`` event: the
run reached ``train.max_steps``) and a later launch that went on (an extension: a larger
``train.max_steps``, days later perhaps) is a person's choice: that interruption is ``chosen``, its
seconds kept but left out of ``lost_seconds`` (they are ``chosen_seconds``), and the idle time from
the completed launch's end to the next launch's start is a ``pause`` the wall-time chart cuts out.
Only ``complete`` says so: a ``stopped`` launch may have been stopped by a person or by the cluster
(preemption sends the same signal), and its gap is counted.

Pure functions of the records but for ``saved_with``, which reads one small file per launch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

_END_EVENTS = {"complete": "complete", "stopped": "stopped", "error": "failed"}


def _time(event: dict | None) -> float | None:
    t = (event or {}).get("time")
    return float(t) if isinstance(t, (int, float)) and math.isfinite(t) else None


def segments(events: list[dict]) -> list[list[dict]]:
    """Rank 0's events cut at each ``start`` event: one list per launch, oldest first (anything
    before the first ``start`` belongs to no launch)."""
    out: list[list[dict]] = []
    for e in events:
        if e.get("event") == "start":
            out.append([e])
        elif out:
            out[-1].append(e)
    return out


def _steps(segment: list[dict]) -> list[tuple[int, float | None]]:
    return [(e["step"], _time(e)) for e in segment if e.get("event") == "step" and isinstance(e.get("step"), int)]


def rewound_to(segment: list[dict] | None) -> int | None:
    """The step a launch took the run back to on purpose: its ``rewound`` event's (a full resume from
    an older checkpoint, in place: the later checkpoints moved aside), 0 for a restart from step 0
    (``restarted``); None for any other launch."""
    for e in segment or []:
        if e.get("event") == "rewound" and isinstance(e.get("step"), int):
            return e["step"]
        if e.get("event") == "restarted":
            return 0
    return None


def began_at(segment: list[dict] | None) -> int | None:
    """The step a launch went on from: where it rewound to, else the step before its first step;
    None for a launch that recorded neither."""
    back = rewound_to(segment)
    if back is not None:
        return back
    steps = _steps(segment or [])
    return steps[0][0] - 1 if steps else None


def _checkpoints(segment: list[dict]) -> list[int]:
    return [e["step"] for e in segment if e.get("event") == "checkpoint" and isinstance(e.get("step"), int)]


def saved_with(root: Path, steps: list[int], world_size: int | None) -> dict | None:
    """``saved_with`` of the first of ``steps``' checkpoints whose ``data/position.json`` records
    this world size and its ranks per node (None when none does: pruned, or none committed)."""
    for step in steps:
        try:
            doc = json.loads((root / "checkpoints" / f"step_{step:08d}" / "data" / "position.json").read_text())
        except (OSError, ValueError):
            continue
        saved = doc.get("saved_with") if isinstance(doc, dict) else None
        if isinstance(saved, dict) and saved.get("world_size") == world_size \
                and isinstance(saved.get("nproc_per_node"), int) and saved["nproc_per_node"] > 0:
            return saved
    return None


def ending(segment: list[dict], attempt: dict | None, *, last: bool, running: bool) -> tuple[str, str | None]:
    """How a launch ended, and the error type of a failed one: its end event, else its attempt's
    status, else ``running`` (the last launch of a running run) or ``killed``."""
    for e in reversed(segment):
        kind = _END_EVENTS.get(e.get("event"))
        if kind is not None:
            return kind, e.get("error_type") if kind == "failed" else None
    status = (attempt or {}).get("status")
    if status in ("complete", "stopped", "failed"):
        return status, None
    return ("running" if last and running else "killed"), None


def world_size(launch: dict, segment: list[dict] | None) -> int | None:
    """A launch's world size: its launch record's, else its ``start`` event's, else its attempt's."""
    for world in ((launch.get("topology") or {}).get("world_size"), (segment or [{}])[0].get("world"),
                  (launch.get("attempt") or {}).get("world_size")):
        if isinstance(world, int) and not isinstance(world, bool):
            return world
    return None


def launch_shape(launch: dict, segment: list[dict] | None, saved: dict | None, *, last: bool,
                 running: bool) -> dict:
    """One launch on the time axis: ``launch`` is its entry in the report's ``launches`` (topology
    from its launch record, attempt from run-result.json); ``segment`` its rank-0 events."""
    segment = segment or []
    world = world_size(launch, segment)
    end, error_type = ending(segment, launch.get("attempt"), last=last, running=running)
    times = [t for t in map(_time, segment) if t is not None]
    steps = [s for s, _ in _steps(segment)]
    per_node = saved["nproc_per_node"] if saved else None
    return {"launch": launch["launch"], "world_size": world,
            "nodes": world // per_node if per_node and isinstance(world, int) and world % per_node == 0 else None,
            "ranks_per_node": per_node if per_node and isinstance(world, int) and world % per_node == 0 else None,
            "started": _time(segment[0]) if segment else None, "ended": times[-1] if times else None,
            "end": end, "error_type": error_type,
            "first_step": steps[0] if steps else None, "last_step": steps[-1] if steps else None,
            "checkpoints": _checkpoints(segment)}


def interruptions(shapes: list[dict], parts: list[list[dict] | None]) -> list[dict]:
    """Each interruption (module docstring): after which launch, how that launch ended, from when
    (its end) to when (the first step past the durable point, in the launch that reached it), the
    seconds in between, and the launches that ended again before getting there (``through``).
    ``parts[i]`` is ``shapes[i]``'s rank-0 events."""
    out, durable, i = [], [], 0
    for shape, part in zip(shapes, parts):   # newest committed by its end (a rewind sets the ones past it aside)
        back = rewound_to(part)
        durable.append(max([*((durable[-1:] or [0]) if back is None else [back]), *shape["checkpoints"]]))
    while i < len(shapes) - 1:
        prev, past, rewound = shapes[i], durable[i], None
        j, recovered = i + 1, None
        while j < len(shapes):
            back = rewound_to(parts[j])
            if back is not None and back < past:   # a later launch went back on purpose: training resumes past it
                past = rewound = back
            recovered = next(((s, t) for s, t in _steps(parts[j] or []) if s > past and t is not None), None)
            if recovered is not None:
                break
            j += 1
        began = prev["ended"]
        at = recovered[1] if recovered else None
        out.append({"after_launch": prev["launch"], "previous_end": prev["end"], "error_type": prev["error_type"],
                    "last_step": prev["last_step"], "began": began, "durable_step": past or None,
                    "steps_redone": max(0, (prev["last_step"] or 0) - past),
                    "through": [s["launch"] for s in shapes[i + 1:j]],
                    "resumed_by": shapes[j]["launch"] if recovered else None,
                    "recovered_step": recovered[0] if recovered else None, "recovered_at": at,
                    "seconds": round(at - began, 3) if at is not None and began is not None else None,
                    "rewound_to": rewound, "chosen": prev["end"] == "complete",
                    "pause": _pause(prev, shapes[i + 1]) if prev["end"] == "complete" else None})
        if recovered is None:
            break
        i = j
    return out


def _pause(prev: dict, after: dict) -> list[float] | None:
    """[from, to]: the idle time between a completed launch's end and the next launch's start
    (None when either time was not recorded, or the next began before the end)."""
    if prev["ended"] is None or after["started"] is None or after["started"] <= prev["ended"]:
        return None
    return [prev["ended"], after["started"]]


def build(root: Path, events: list[dict], launches: list[dict], *, running: bool = False) -> dict:
    """The report's ``shape``: every launch of ``launches`` (the report's, oldest first) on the time
    axis, the interruptions between them and their sum, by how the launch before each ended."""
    parts = segments(events)
    shapes, own = [], []
    for n, launch in enumerate(launches):
        segment = parts[launch["launch"] - 1] if 0 < launch["launch"] <= len(parts) else None
        saved = saved_with(root, _checkpoints(segment or []), world_size(launch, segment))
        shapes.append(launch_shape(launch, segment, saved, last=n == len(launches) - 1, running=running))
        own.append(segment)
    gaps = interruptions(shapes, own)
    by_end: dict[str, float] = {}
    for g in gaps:
        if g["seconds"] is not None and not g["chosen"]:
            by_end[g["previous_end"]] = round(by_end.get(g["previous_end"], 0.0) + g["seconds"], 3)
    return {"launches": shapes, "interruptions": gaps,
            "lost_seconds": round(sum(g["seconds"] for g in gaps if g["seconds"] is not None and not g["chosen"]), 3),
            "lost_by_end": by_end,
            "chosen_seconds": round(sum(g["seconds"] for g in gaps if g["seconds"] is not None and g["chosen"]), 3)}


__all__ = ["began_at", "build", "ending", "interruptions", "launch_shape", "rewound_to", "saved_with",
           "segments", "world_size"]
