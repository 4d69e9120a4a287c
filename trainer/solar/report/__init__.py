"""``solar report RUN_DIR`` (or a SolarRun's root: each stage's, ``stage_dirs``): the completion report of semantics.md §9 as a document
(``solar.report.v1``), text, and one self-contained HTML page (``html.py``: inline SVG plots and
validation thumbnails as data URIs; the wording of values both pages share). Besides the numbers it
lists every launch of the run directory (where each began on the step axis, how, what it changed
and how its attempt ended) so that resumes, rewinds in place and restarts from step 0 are marked
(each step's numbers are the latest launch's that did it, ``_lineage``), the run's shape over time
with the time each interruption cost (``shape.py``), and the Stage2 student's series beside the
critic's. Torch-free; thumbnails need PyAV and Pillow (the trainer extra) and are left out, with a
note, without them.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path

from solar.diagnose import diagnose_dir
from solar.diagnose.classify import jsonable
from solar.diagnose.evidence import gather
from solar.errors import SolarError
from solar.report import shape
from solar.storage.run_dir import launch_records
from solar.report.html import (code_text, environment_text, final_text, interruption_text,
                               launch_text, lost_text, shape_text, superseded_text, usage_text, weights_text)

SCHEMA = "solar.report.v1"


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _number(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _events(root: Path) -> list[dict]:
    """Rank 0's event log, every launch of the run directory appended in order (unreadable lines skipped)."""
    path, events = root / "events" / "rank-00000.jsonl", []
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    return [e for e in events if isinstance(e, dict)]


def _lineage(events: list[dict]) -> list[dict]:
    """The events of the run's own history: each launch (from its ``start``) takes the run back to
    where it began (a rewind's or restart's step, else the step before its first), so what earlier
    launches recorded past that point (steps done again, checkpoints and validations a rewind moved
    aside) is dropped; every step's numbers are then the latest launch's that did it."""
    first = next((i for i, e in enumerate(events) if e.get("event") == "start"), len(events))
    out = list(events[:first])   # before any start: nobody's, kept as it was
    for part in shape.segments(events):
        back = shape.began_at(part)
        if back is not None:
            out = [e for e in out if not (isinstance(e.get("step"), int) and e["step"] > back
                                          and e.get("event") in ("step", "checkpoint", "validation"))]
        out += part
    return out


def _series(events: list[dict]) -> dict:
    """Rank 0's curves (step, loss, grad norm, lr, step time; Stage2: the student's too) and its
    checkpoint/validation timeline, along the run's own history (``_lineage``)."""
    steps, checkpoints, validations = {}, [], []
    for e in _lineage(events):
        if e.get("event") == "step" and isinstance(e.get("step"), int):
            steps[e["step"]] = e
        elif e.get("event") == "checkpoint":
            checkpoints.append({"step": e.get("step"), "time": e.get("time"), "seconds": e.get("seconds"),
                                "path": e.get("path")})
        elif e.get("event") == "validation":
            validations.append({k: e.get(k) for k in ("step", "passes", "slots", "ok_slots", "error_slots")
                                if k in e})
    ordered = [steps[k] for k in sorted(steps)]
    out = {
        "step": [e["step"] for e in ordered],
        "loss": [_number(e.get("loss_mean", e.get("loss"))) for e in ordered],
        "grad_norm": [_number(e.get("grad_norm")) for e in ordered],
        "lr": [_number(e.get("lr")) for e in ordered],
        "step_seconds": [_number(e.get("step_seconds")) for e in ordered],
        "checkpoints": checkpoints,
        "validations": validations,
    }
    if any("student_step" in e for e in ordered):  # Stage2: `loss` is the critic's, the student's is sparse
        updated = [e if e.get("student_updated") else {} for e in ordered]
        out["student_loss"] = [_number((e.get("losses") or {}).get("student", e.get("student_loss")))
                               for e in updated]
        out["student_grad_norm"] = [_number(e.get("student_grad_norm")) for e in updated]
        out["student_lr"] = [_number(e.get("student_lr")) for e in updated]
    return out


def _epoch(iso) -> float | None:
    try:
        return datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def _launches(root: Path, events: list[dict], usage: dict | None) -> list[dict]:
    """Every launch of the run directory, oldest first: its record (launch-manifest.json, then
    launches/NNNN-launch-manifest.json), where it began on the step axis (rank 0's `start` events, in
    the same order, and the steps after each), how it started (init mode and sources; a rewind in
    place or a restart from step 0, ``_went_back``), what changed
    from the launch before (topology, recorded config changes) and how its attempt ended
    (run-result.json's usage, matched by time and world size: a launch killed outright records no
    attempt, and the next may have begun within the seconds the time match allows)."""
    records = launch_records(root)
    parts = shape.segments(events)
    attempts = [a for a in (usage or {}).get("attempts") or [] if isinstance(a, dict)]
    out, previous, done = [], None, 0
    for n, record in enumerate(records):
        manifest = _json(record)
        if manifest is None:
            continue
        part = parts[n] if n < len(parts) else []
        ran = [e["step"] for e in part if e.get("event") == "step" and isinstance(e.get("step"), int)]
        rewind, restart = _went_back(manifest, part)
        back = shape.rewound_to(part)
        started = part[0].get("time") if part else None
        topology = manifest.get("topology") or {}
        init = manifest.get("init") or {}
        world = topology.get("world_size")
        attempt = next((a for a in attempts if started is not None and _epoch(a.get("started")) is not None
                        and _epoch(a["started"]) - 2 <= started <= (_epoch(a.get("ended")) or math.inf) + 2
                        and (world is None or a.get("world_size") in (None, world))), None)
        if attempt is not None:
            attempts.remove(attempt)
        out.append({
            "launch": n + 1, "record": str(record.relative_to(root)), "started": started,
            "init_mode": init.get("mode"), "init_sources": init.get("sources") or [],
            "first_step": ran[0] if ran else None, "last_step": ran[-1] if ran else None,
            "at_step": ran[0] if ran else (back if back is not None else done) + 1,  # where it begins on the step axis
            "rewind": rewind, "restart": restart,
            "topology": topology,
            "topology_changes": {k: [previous[k], v] for k, v in topology.items()
                                 if previous is not None and k in previous and previous[k] != v},
            "config_changes": manifest.get("changes") or [],
            "attempt": {k: attempt.get(k) for k in ("status", "wall_seconds", "world_size", "device")}
            if attempt else None})
        previous, done = topology, max([done if back is None else back, *ran])
    return out


def _went_back(manifest: dict, part: list[dict]) -> tuple[dict | None, dict | None]:
    """A launch's rewind in place and restart from step 0: its launch record's ``rewind`` /
    ``restart``, else (a record without them) what rank 0's ``rewound`` / ``restarted`` event says."""
    rewind, restart = manifest.get("rewind"), manifest.get("restart")
    event = next((e for e in part if e.get("event") in ("rewound", "restarted")), None)
    fields = {k: v for k, v in (event or {}).items() if k not in ("event", "time", "rank")}
    if not isinstance(rewind, dict) and event is not None and event["event"] == "rewound":
        rewind = fields
    if not isinstance(restart, dict) and event is not None and event["event"] == "restarted":
        restart = fields
    return (rewind if isinstance(rewind, dict) else None), (restart if isinstance(restart, dict) else None)


def _outputs(ev) -> list[dict]:
    rows = []
    for out in ev.outputs:
        passes = []
        for p in out.passes.values():
            slot_dirs = sorted((ev.root / out.where / p.name).glob("slot_*"))
            compare = sum(1 for s in slot_dirs if (s / "compare.mp4").is_file())
            passes.append({"pass": p.name, "complete": p.complete, "ok_slots": len(p.ok),
                           "error_slots": [{"slot": e["slot"], "sample_id": e["sample_id"], "error": e["error"]}
                                           for e in p.errors],
                           "partial_slots": p.partial, "compare_videos": compare})
        rows.append({"where": out.where, "step": out.step, "complete": out.complete, "passes": passes})
    return rows


def _weights(config: dict, launch: dict) -> dict:
    ck = (config or {}).get("checkpoint") or {}
    passes = ((config or {}).get("validation") or {}).get("passes") or []
    return {"init_mode": ((launch or {}).get("init") or {}).get("mode") or ck.get("mode"),
            "init_sources": ((launch or {}).get("init") or {}).get("sources"),
            "checkpoint_weights": ck.get("weights"),
            "passes": [{"name": p.get("name"), "weights": p.get("weights")} for p in passes if isinstance(p, dict)]}


def stage_dirs(root: Path) -> list[Path]:
    """A SolarRun's root (``solar run``'s ``<workdir>/<name>``, the operator's ``<storage>/<run>``):
    its stage directories that hold a run (a launch record), in the order its ``status.json`` lists
    the stages, then any other by name; [] for any other directory (a run directory among them)."""
    if not root.is_dir() or (root / "launch-manifest.json").is_file():
        return []
    held = {p.name: p for p in root.iterdir() if p.is_dir() and (p / "launch-manifest.json").is_file()}
    order = [st.get("name") for st in ((_json(root / "status.json") or {}).get("stages") or [])
             if isinstance(st, dict)]
    return [held[n] for n in order if n in held] + [held[n] for n in sorted(held) if n not in order]


def build(run_dir: str | os.PathLike) -> dict:
    """The report of a run directory; of a SolarRun's root (``stage_dirs``), each stage's report in
    ``stages`` (each with its ``stage`` name)."""
    root = Path(run_dir)
    stages = stage_dirs(root)
    if stages:
        return {"schema": SCHEMA, "run_root": str(root), "name": root.name,
                "stages": [{"stage": d.name, **build(d)} for d in stages]}
    ev = gather(root, now=__import__("time").time())
    if ev.launch is None:
        raise SolarError(f"{root} has no launch-manifest.json: nothing to report (RUN_DIR is a run's "
                         "runtime.output_dir)")
    diagnosis = diagnose_dir(root)
    env = _json(root / "environment.json") or {}
    result = ev.result or {}
    topo = ev.launch.get("topology") or {}
    events = _events(root)
    series = _series(events)
    outputs = _outputs(ev)
    launches = _launches(root, events, result.get("usage"))
    diagnosis_doc = diagnosis.as_dict()
    if ev.launch.get("action") == "infer":  # an inference run has no training step: say what it generated
        diagnosis_doc["summary"] = _generation_summary(diagnosis_doc, outputs)
    not_verified = ["numbers are this run's own; nothing here compares them with a reference run",
                    "videos are listed and decoded for thumbnails, not judged for quality"]
    if not env:
        not_verified.append("no environment.json: the machine and package versions were not recorded")
    if any(c["complete"] and not c["valid"] for c in ev.checkpoints):
        not_verified.append("some checkpoints are complete but do not verify")
    return jsonable({
        "schema": SCHEMA,
        "run_dir": str(root),
        "name": ev.launch.get("name"),
        "action": ev.launch.get("action"),
        "route": ev.launch.get("route"),
        "status": result.get("status", diagnosis.status),
        "code": ev.launch.get("code"),
        "environment": {"python": (env.get("python") or {}).get("version"),
                        "torch": (env.get("torch") or {}).get("version"),
                        "cuda": (env.get("cuda") or {}).get("version"),
                        "cuda_available": (env.get("cuda") or {}).get("available"),
                        "devices": [d.get("name") for d in env.get("devices") or []],
                        "host": (env.get("platform") or {}).get("hostname")},
        "topology": {k: topo.get(k) for k in ("world_size", "sequence_parallel_size", "logical_dp_world_size",
                                               "micro_batch_size", "gradient_accumulation", "global_batch_size")},
        "weights": _weights(ev.config, ev.launch),
        "final": result.get("final"),
        "usage": result.get("usage"),
        "checkpoints": [{"step": c["step"], "path": c["path"], "complete": c["complete"], "valid": c["valid"]}
                        for c in ev.checkpoints],
        "partial_checkpoints": ev.partial_checkpoints,
        "superseded_checkpoints": [{"launch": c["launch"], "step": c["step"], "path": c["path"]}
                                   for c in ev.superseded],
        "outputs": outputs,
        "series": series,
        "launches": launches,
        "shape": shape.build(root, events, launches, running=diagnosis.status == "running"),
        "diagnosis": diagnosis_doc,
        "not_verified": not_verified,
    })


def _generation_summary(diagnosis: dict, outputs: list[dict]) -> str:
    """The diagnosis of an inference run in its own terms: slots generated, not a training step."""
    ok = sum(p["ok_slots"] for o in outputs for p in o["passes"])
    errors = sum(len(p["error_slots"]) for o in outputs for p in o["passes"])
    passes = ", ".join(p["pass"] for o in outputs for p in o["passes"]) or "no pass"
    done = f"{ok} slot(s) generated ({passes})" + (f", {errors} failed" if errors else "")
    if diagnosis["status"] == "healthy":
        return f"the generation completed: {done}; nothing is wrong"
    if diagnosis["status"] == "stopped":
        return f"the generation was stopped (a signal) after {done}; run it again to continue it"
    if diagnosis["status"] == "running":
        return f"the generation is still running: {done} so far"
    return diagnosis["summary"]


def render_text(report: dict) -> str:
    if "stages" in report:   # a SolarRun's root: each stage's report in turn
        head = (f"SolarRun {report['name']} ({report['run_root']}): {len(report['stages'])} stage(s): "
                + ", ".join(st["stage"] for st in report["stages"]))
        return "\n\n".join([head, *(f"stage {st['stage']}: " + render_text(st) for st in report["stages"])])
    topo = report["topology"]
    lines = [f"{report['name']}: {report['action']} {report['route']} — {report['status']}",
             f"  code {code_text(report.get('code'))}; {environment_text(report['environment'])}",
             f"  world {topo['world_size']}, SP {topo['sequence_parallel_size']}, logical DP "
             f"{topo['logical_dp_world_size']}, global batch {topo['global_batch_size']} (micro "
             f"{topo['micro_batch_size']} x accumulation {topo['gradient_accumulation']})"
             + "".join(f"; launch {n['launch']} changed it" for n in report["launches"] if n["topology_changes"]),
             f"  {weights_text(report['weights'])}"]
    final = final_text(report)
    if final:
        lines.append(f"  final {final}")
    usage = report.get("usage") or {}
    if usage.get("attempts"):
        lines.append(f"  {usage_text(usage)}")
    if len(report["launches"]) > 1:
        lines += [f"  launch {launch['launch']}: {launch_text(launch)}" for launch in report["launches"]]
        run_shape = report.get("shape") or {}
        lines += [f"  shape: launch {s['launch']}: {shape_text(s)}" for s in run_shape.get("launches") or []]
        lines += [f"  interruption after launch {g['after_launch']}: {interruption_text(g)}"
                  for g in run_shape.get("interruptions") or []]
        if run_shape.get("interruptions"):
            lines.append(f"  time lost to interruptions: {lost_text(run_shape)}")
    valid = [c for c in report["checkpoints"] if c["valid"]]
    if report["checkpoints"] or report["partial_checkpoints"] or report["action"] != "infer":
        lines.append(f"  checkpoints: {len(valid)} verified of {len(report['checkpoints'])}"
                     + (f" (newest step {valid[-1]['step']})" if valid else "")
                     + (f"; {len(report['partial_checkpoints'])} partial" if report["partial_checkpoints"] else "")
                     + (f"; {superseded_text(report)}" if report["superseded_checkpoints"] else ""))
    for out in report["outputs"]:
        parts = ", ".join(f"{p['pass']} {p['ok_slots']} ok/{len(p['error_slots'])} error/"
                          f"{p['compare_videos']} compare" + ("" if p["complete"] else " (incomplete)")
                          for p in out["passes"])
        lines.append(f"  {out['where']}: {'complete' if out['complete'] else 'INCOMPLETE'} — {parts}")
    d = report["diagnosis"]
    lines.append(f"  diagnosis: {d['status']} ({d['kind']}): {d['summary']}")
    if d.get("next"):
        lines.append(f"  continue it: {d['next']['command']}")
    lines += [f"  not verified: {n}" for n in report["not_verified"]]
    return "\n".join(lines)


def render_html(report: dict, path: str | os.PathLike) -> None:
    from solar.report.html import page
    from solar.storage.atomic import write_create_only

    target = Path(path)
    if target.exists():
        raise SolarError(f"--html {target} exists; reports are never overwritten (choose a new path)")
    write_create_only(target, page(report, target.parent).encode("utf-8"), what="report")


__all__ = ["build", "render_html", "render_text", "stage_dirs"]
