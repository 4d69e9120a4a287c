"""``solar report RUN_DIR``: the completion report of semantics.md §9 as a document
(``solar.report.v1``), text, and one self-contained HTML page (``html.py``: inline SVG plots and
validation thumbnails as data URIs). Torch-free; thumbnails need PyAV and Pillow (the trainer
extra) and are left out, with a note, without them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from solar.diagnose import diagnose_dir
from solar.diagnose.classify import jsonable
from solar.diagnose.evidence import gather
from solar.errors import SolarError

SCHEMA = "solar.report.v1"


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _number(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _series(root: Path) -> dict:
    """Rank 0's curves (step, loss, grad norm, lr, step time) and its checkpoint/validation timeline."""
    path = root / "events" / "rank-00000.jsonl"
    steps, checkpoints, validations = {}, [], []
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == "step":
                    steps[e["step"]] = e  # a resumed run repeats no step, but keep the newest record of each
                elif e.get("event") == "checkpoint":
                    checkpoints.append({"step": e.get("step"), "time": e.get("time"), "seconds": e.get("seconds"),
                                        "path": e.get("path")})
                elif e.get("event") == "validation":
                    validations.append({k: e.get(k) for k in ("step", "passes", "slots", "ok_slots", "error_slots")
                                        if k in e})
    ordered = [steps[k] for k in sorted(steps)]
    return {
        "step": [e["step"] for e in ordered],
        "loss": [_number(e.get("loss_mean", e.get("loss"))) for e in ordered],
        "grad_norm": [_number(e.get("grad_norm")) for e in ordered],
        "lr": [_number(e.get("lr")) for e in ordered],
        "step_seconds": [_number(e.get("step_seconds")) for e in ordered],
        "checkpoints": checkpoints,
        "validations": validations,
    }


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


def build(run_dir: str | os.PathLike) -> dict:
    root = Path(run_dir)
    ev = gather(root, now=__import__("time").time())
    if ev.launch is None:
        raise SolarError(f"{root} has no launch-manifest.json: nothing to report (RUN_DIR is a run's "
                         "runtime.output_dir)")
    diagnosis = diagnose_dir(root)
    env = _json(root / "environment.json") or {}
    result = ev.result or {}
    topo = ev.launch.get("topology") or {}
    series = _series(root)
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
        "outputs": _outputs(ev),
        "series": series,
        "diagnosis": diagnosis.as_dict(),
        "not_verified": not_verified,
    })


def render_text(report: dict) -> str:
    topo, final = report["topology"], report.get("final") or {}
    lines = [f"{report['name']}: {report['action']} {report['route']} — {report['status']}",
             f"  code {((report.get('code') or {}).get('revision') or 'unknown')[:12]}"
             f"{' (dirty)' if (report.get('code') or {}).get('dirty') else ''}; python "
             f"{report['environment']['python']}, torch {report['environment']['torch']}, devices "
             f"{report['environment']['devices'] or ['cpu']}",
             f"  world {topo['world_size']}, SP {topo['sequence_parallel_size']}, logical DP "
             f"{topo['logical_dp_world_size']}, global batch {topo['global_batch_size']} (micro "
             f"{topo['micro_batch_size']} x accumulation {topo['gradient_accumulation']})"]
    w = report["weights"]
    passes = ", ".join(f"{p['name']}={p['weights']}" for p in w["passes"]) or "none"
    lines.append(f"  init {w['init_mode']}; checkpoint weights {w['checkpoint_weights'] or '-'}; passes {passes}")
    if final:
        lines.append(f"  final step {final.get('step')}: loss {_fmt(final.get('loss'))}, grad norm "
                     f"{_fmt(final.get('grad_norm'))}, step time {_fmt(final.get('step_seconds'))} s")
    usage = report.get("usage") or {}
    if usage.get("attempts"):
        attempts = ", ".join(f"{a.get('status')} {a.get('gpu_seconds', 0) / 3600:.4f} h on {a.get('world_size')} "
                             f"{a.get('device', 'gpu')}" for a in usage["attempts"])
        lines.append(f"  GPU time: {usage.get('gpu_seconds', 0) / 3600:.4f} GPU-hours in {len(usage['attempts'])} "
                     f"launch(es): {attempts}")
    valid = [c for c in report["checkpoints"] if c["valid"]]
    lines.append(f"  checkpoints: {len(valid)} verified of {len(report['checkpoints'])}"
                 + (f" (newest step {valid[-1]['step']})" if valid else "")
                 + (f"; {len(report['partial_checkpoints'])} partial" if report["partial_checkpoints"] else ""))
    for out in report["outputs"]:
        parts = ", ".join(f"{p['pass']} {p['ok_slots']} ok/{len(p['error_slots'])} error/"
                          f"{p['compare_videos']} compare" + ("" if p["complete"] else " (incomplete)")
                          for p in out["passes"])
        lines.append(f"  {out['where']}: {'complete' if out['complete'] else 'INCOMPLETE'} — {parts}")
    d = report["diagnosis"]
    lines.append(f"  diagnosis: {d['status']} ({d['kind']}): {d['summary']}")
    lines += [f"  not verified: {n}" for n in report["not_verified"]]
    return "\n".join(lines)


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def render_html(report: dict, path: str | os.PathLike) -> None:
    from solar.report.html import page
    from solar.storage.atomic import write_create_only

    target = Path(path)
    if target.exists():
        raise SolarError(f"--html {target} exists; reports are never overwritten (choose a new path)")
    write_create_only(target, page(report).encode("utf-8"), what="report")


__all__ = ["build", "render_html", "render_text"]
