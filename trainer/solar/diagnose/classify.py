"""From evidence to a diagnosis (semantics.md §8): start at the first failing boundary, name the
ranks, steps and sample identities, and quote the evidence lines. Pure: ``diagnose(Evidence)``.

Classes: non_finite, oom, hang, sp_mismatch, shape, data, checkpoint_load, checkpoint_collision (a
save that found its step's checkpoint already committed by an earlier launch: a resume from an older
checkpoint into a directory that was not rewound), validation_setup, validation_missing,
validation_errors, crashed, error (unclassified, quoted), and the healthy states healthy, running,
stopped. A quiet worker alone is never a fault: a hang needs a rank that has not entered the
collective its peers are in, and either the peers failed (a collective timeout) or every rank's
heartbeat has been still for ``STALE_SECONDS``.

Every diagnosis also names the rewinds in place and restarts from step 0 the launch records hold
(the latest launch's with its record and event as evidence) and the checkpoints rewinds moved aside;
a stopped run, or a failed one that left a checkpoint to go on from, gets the command that continues
it (``continuation.py``).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from solar.diagnose.evidence import Evidence, Line, OutputState, Rank
from solar.storage.checkpoints import step_name

STALE_SECONDS = float(os.environ.get("SOLAR_DIAGNOSE_STALE_SECONDS", "300"))
ERROR_KINDS = {"non_finite": "non_finite", "oom": "oom", "sp_mismatch": "sp_mismatch", "shape": "shape",
               "data": "data", "checkpoint": "checkpoint_load", "validation_setup": "validation_setup",
               "collective_timeout": "hang", "storage_full": "storage_full", "storage_error": "storage_error"}


@dataclass
class Diagnosis:
    status: str                     # healthy | running | stopped | degraded | failed
    kind: str
    summary: str
    first_bad: dict = field(default_factory=dict)   # rank, step, phase, sample identity ...
    details: list[str] = field(default_factory=list)
    evidence: list[Line] = field(default_factory=list)
    next: dict | None = None   # what continues the run: {command, from_source, checkpoint, step, note}

    def as_dict(self) -> dict:
        return jsonable({"schema": "solar.diagnosis.v1", "status": self.status, "kind": self.kind,
                         "summary": self.summary, "first_bad": self.first_bad, "details": self.details,
                         "evidence": [line.as_dict() for line in self.evidence], "next": self.next})

    def text(self) -> str:
        lines = [f"{self.status.upper()}: {self.kind}", f"  {self.summary}"]
        if self.first_bad:
            lines.append("  first bad: " + ", ".join(f"{k} {v}" for k, v in self.first_bad.items()))
        lines += [f"  - {d}" for d in self.details]
        if self.next:
            lines.append(f"continue it from checkpoint step {self.next['step']}:" if self.next["step"] is not None
                         else "start it over from step 0 (no checkpoint to resume from):")
            lines.append(f"  {self.next['command']}")
            if self.next["from_source"]:
                lines += ["  or from its source config:", f"  {self.next['from_source']}"]
            if self.next["note"]:
                lines.append(f"  ({self.next['note']})")
        if self.evidence:
            lines.append("evidence:")
            lines += [f"  {e.where}: {e.text}" for e in self.evidence]
        return "\n".join(lines)


def jsonable(value):
    """Strict JSON: a NaN or infinite loss is written as the string "nan"/"inf"/"-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _short(event: dict, keys=("event", "step", "error_type", "message", "loss", "sample_id", "start_frame",
                              "timestep", "ranks", "phase")) -> str:
    text = json.dumps({k: event[k] for k in keys if k in event and event[k] not in (None, [])}, allow_nan=True)
    return text if len(text) <= 400 else text[:397] + "..."


def _where(ev: Evidence, folder: str, rank: int, suffix: str, line: int | None = None) -> str:
    name = f"{folder}/rank-{rank:05d}.{suffix}"
    return f"{name}:{line}" if line else name


def _heartbeat_line(ev: Evidence, r: Rank) -> Line:
    hb = dict(r.heartbeat or {})
    age = ev.now - hb["time"] if hb.get("time") else None
    hb.pop("pid", None)
    text = json.dumps({k: hb[k] for k in ("phase", "failed_in", "step", "collective") if k in hb})
    return Line(_where(ev, "heartbeat", r.rank, "json"), text + (f" ({age:.0f}s ago)" if age is not None else ""))


def _step_of(r: Rank) -> int | None:
    hb = r.heartbeat or {}
    if hb.get("step") is not None:
        return int(hb["step"])
    last = r.last_step
    return int(last["step"]) + 1 if last else None


def _phase_of(r: Rank) -> str | None:
    hb = r.heartbeat or {}
    return hb.get("failed_in") or hb.get("phase")


def _log_lines(ev: Evidence, r: Rank, limit: int = 4) -> list[Line]:
    hits = [(n, t) for n, t in r.log_tail if re.search(r"Error|error:|Traceback|Timed out|timeout", t)]
    return [Line(_where(ev, "logs", r.rank, "log", n), t.strip()[:300]) for n, t in hits[-limit:]]


# -- the entry point ---------------------------------------------------------------------------------------
def diagnose(ev: Evidence) -> Diagnosis:
    found = _classify(ev)
    details, evidence = _history(ev)
    found.details += details
    found.evidence += evidence
    found.next = _next(ev, found)
    return found


def _classify(ev: Evidence) -> Diagnosis:
    result = ev.result or {}
    errors = [(r, n, e) for r in ev.ranks.values() for n, e in r.of("error")]
    failed_ranks = [r for r in ev.ranks.values() if (r.heartbeat or {}).get("phase") == "failed"]
    if result.get("status") == "failed" or errors or failed_ranks:
        return _failure(ev, errors)
    hang = _hang(ev, peers_failed=False)
    if hang is not None:
        return hang
    finished = result.get("status") in ("complete", "stopped")
    gone = [r for r in ev.ranks.values() if r.process_gone() is True]
    if not finished and gone:
        return _crashed(ev, gone)
    outputs = _outputs_problem(ev, finished=finished)
    if outputs is not None:
        return outputs
    broken = _broken_checkpoints(ev)
    if broken is not None:
        return broken
    return _healthy(ev)


def _broken_checkpoints(ev: Evidence) -> Diagnosis | None:
    """A committed checkpoint that no longer verifies: loading it (a resume, the next stage) fails."""
    from solar.storage.checkpoints import verify

    bad = [c for c in ev.checkpoints if c.get("complete") and not c.get("valid")]
    if not bad:
        return None
    first = bad[0]
    problems = verify(first["path"])["problems"]
    summary = (f"checkpoint step {first['step']} is committed but does not verify, so it cannot be loaded: "
               f"{_clip('; '.join(problems), 240)}")
    good = [c["step"] for c in ev.checkpoints if c.get("valid")]
    details = [f"{ev.rel(Path(c['path']))}: complete, does not verify" for c in bad]
    details.append(f"verified checkpoints: {good or 'none'} (resume from one of them, or restore the files)")
    return Diagnosis("failed", "checkpoint_load", summary, {"step": first["step"], "checkpoint": first["path"]},
                     details, [Line(ev.rel(Path(first["path"])), _clip(p, 200)) for p in problems[:3]])


# -- failures ----------------------------------------------------------------------------------------------
def _failure(ev: Evidence, errors: list[tuple[Rank, int | None, dict]]) -> Diagnosis:
    result = ev.result or {}
    error_type = result.get("error_type") or next((e.get("error_type") for _, _, e in errors), None) or "error"
    message = result.get("message") or next((e.get("message") for _, _, e in errors), "") or ""
    kind = ERROR_KINDS.get(error_type, "error")
    collision = COLLISION.search(message)
    if collision is not None:
        return _collision(ev, errors, message, int(collision.group(1)))
    if kind == "error" and re.search(r"timed out|timeout", message, re.I):
        kind = "hang"
    if kind == "hang":
        found = _hang(ev, peers_failed=True)
        if found is not None:
            return found
    if kind == "non_finite":
        found = _non_finite(ev, message)
        if found is not None:
            return found
    bad = _first_bad_rank(ev, errors, message)
    r = ev.ranks.get(bad) if bad is not None else None
    sample = re.search(r"sample '([^']+)'", message)
    first = {"rank": bad, "step": _step_of(r) if r else None, "phase": _phase_of(r) if r else None,
             "sample_id": sample.group(1) if sample else None}
    first = {k: v for k, v in first.items() if v is not None}
    evidence = _error_lines(ev, errors)
    if r is not None:
        evidence += [*_exception_lines(ev, r), _heartbeat_line(ev, r), *_log_lines(ev, r)]
    details = _context(ev, kind, r)
    where = f" on rank {bad}" if bad is not None else ""
    at = f" at step {first['step']}" if "step" in first else ""
    titles = {"oom": "out of memory", "sp_mismatch": "SP peers read different inputs", "shape": "a shape mismatch",
              "data": "a data error", "checkpoint_load": "a checkpoint that does not load",
              "validation_setup": "validation could not be set up", "hang": "a collective timed out",
              "non_finite": "a non-finite value", "error": "an error", "storage_full": "a full volume",
              "storage_error": "a failing volume"}
    summary = f"{titles[kind]}{where}{at}: {_clip(message)}"
    return Diagnosis("failed", kind, summary, first, details, evidence)


# -- rewinds, restarts, and what continues the run -----------------------------------------------------
def _launch_number(record: str) -> int | None:
    """A launch's number from its record: ``launch-manifest.json`` 1, ``launches/NNNN-...`` NNNN + 1."""
    if record == "launch-manifest.json":
        return 1
    m = re.match(r"launches/(\d{4})-launch-manifest\.json$", record)
    return int(m.group(1)) + 1 if m else None


def _history(ev: Evidence) -> tuple[list[str], list[Line]]:
    """Every rewind in place and restart from step 0 the launch records hold (one line each), the
    latest launch's own with its record and rank 0's event as evidence, and the checkpoints kept aside."""
    details, evidence = [], []
    for where, doc in ev.records:
        n = _launch_number(where)
        rewind, restart = doc.get("rewind"), doc.get("restart")
        if isinstance(rewind, dict):
            names = ", ".join(rewind.get("superseded") or []) or "no checkpoint"
            details.append(f"launch {n} ({where}) rewound the run to step {rewind.get('step')}: {names} superseded"
                           + (f", kept under {rewind['superseded_dir']}/" if rewind.get("superseded_dir") else ""))
        if isinstance(restart, dict):
            k = restart.get("earlier_launches")
            details.append(f"launch {n} ({where}) started the run over from step 0 (no committed checkpoint); its "
                           f"{k} earlier launch{' is' if k == 1 else 'es are'} kept as history"
                           + (f"; {len(restart.get('moved') or [])} path(s) moved under {restart['superseded_dir']}/"
                              if restart.get("superseded_dir") else ""))
    if ev.records:
        where, doc = ev.records[-1]
        for key, fields in (("rewind", ("checkpoint", "step", "superseded", "superseded_dir")),
                            ("restart", ("earlier_launches", "superseded_dir", "moved"))):
            if isinstance(doc.get(key), dict):
                shown = json.dumps({k: doc[key][k] for k in fields if k in doc[key]})
                evidence.append(Line(where, f"{key}: {_clip(shown, 400)}"))
        r = ev.ranks.get(0)
        for kind in ("rewound", "restarted"):
            evidence += [Line(_where(ev, "events", 0, "jsonl", n), _short(e, ("event", "step", "earlier_launches",
                                                                              "superseded")))
                         for n, e in (r.of(kind) if r else [])]
    if ev.superseded:
        details.append(f"{len(ev.superseded)} superseded checkpoint{'s' if len(ev.superseded) > 1 else ''} kept under "
                       "checkpoints/superseded/ (never resumed from)")
    return details, evidence


def _next(ev: Evidence, found: Diagnosis) -> dict | None:
    """The command that continues a training run found stopped, or failed after committing a
    checkpoint: a full resume from its newest verified checkpoint (a collision: from the newest this
    launch committed, else its own resume point, where the launch meant to go on from)."""
    from solar.diagnose.continuation import continuation

    action = (ev.current or ev.launch or {}).get("action") or (ev.config or {}).get("action")
    if action != "train" or ev.config_path is None or found.status not in ("stopped", "failed"):
        return None
    valid = {c["step"]: Path(c["path"]).name for c in ev.checkpoints if c.get("valid")}
    note = None
    if found.kind == "checkpoint_collision":
        own = [s for s in _own_checkpoints(ev) if s in valid]
        step = max(own) if own else _resumed_step(ev.current)
        later = [valid[s] for s in sorted(valid) if step is not None and s > step and s not in own]
        if later:
            note = (f"a trainer that rewinds in place moves {', '.join(later)} under checkpoints/superseded/; to go "
                    f"on from the earlier launch's newest instead, resume from "
                    f"{Path(os.path.abspath(ev.root)) / 'checkpoints' / later[-1]}")
    else:
        step = max(valid) if valid else None
    if (step is None and found.status == "failed") or (step is not None and step not in valid):
        return None   # a failure with no checkpoint to go on from is fixed first, not continued
    out = continuation(ev.root, ev.config_path, ev.current or ev.launch or {}, valid.get(step))
    if out is not None and note:
        out["note"] = note + (f"; {out['note']}" if out["note"] else "")
    return out


# a save whose step directory is already there (solar.storage.checkpoints.begin/commit: a CheckpointError)
COLLISION = re.compile(r"checkpoints/step_(\d{8}) already exists; checkpoints are never overwritten")


def _collision(ev: Evidence, errors, message: str, step: int) -> Diagnosis:
    """A save that found its step's checkpoint already committed: by an earlier launch, which this
    launch (a resume from an older checkpoint) did not move aside."""
    bad = _first_bad_rank(ev, errors, message)
    r = ev.ranks.get(bad) if bad is not None else None
    where = f"checkpoints/{step_name(step)}"
    first = {"rank": bad, "step": step, "phase": _phase_of(r) if r else None, "checkpoint": where}
    resumed, own = _resumed_step(ev.current), _own_checkpoints(ev)
    earlier = [c["step"] for c in ev.checkpoints if c["step"] not in own and (resumed is None or c["step"] > resumed)]
    summary = f"saving step {step} found {where} already there, committed by an earlier launch"
    if resumed is not None and earlier:
        summary += (f": this launch resumed from step {resumed} of a directory holding checkpoints after it "
                    f"({', '.join(map(str, earlier))}) that were not moved aside (a rewind in place moves them "
                    "under checkpoints/superseded/)")
    details = [f"{where} is intact: a save never overwrites a checkpoint",
               f"this launch committed: {', '.join(map(str, sorted(own))) or 'no checkpoint'}"]
    evidence = _error_lines(ev, errors)
    if r is not None:
        evidence += [*_exception_lines(ev, r), _heartbeat_line(ev, r), *_log_lines(ev, r)]
    return Diagnosis("failed", "checkpoint_collision", summary, {k: v for k, v in first.items() if v is not None},
                     details, evidence)


def _resumed_step(launch: dict | None) -> int | None:
    """The step a full resume started from (its checkpoint's name), None for any other launch."""
    init = (launch or {}).get("init") or {}
    path = next((s.get("path") for s in init.get("sources") or [] if s.get("role") == "model"), None)
    m = re.search(r"step_(\d{8})/?$", path or "") if init.get("mode") == "full_resume" else None
    return int(m.group(1)) if m else None


def _own_checkpoints(ev: Evidence) -> set[int]:
    """The steps the latest launch committed (rank 0's ``checkpoint`` events since its ``start``)."""
    r = ev.ranks.get(0)
    return {e["step"] for _, e in (r.of("checkpoint") if r else []) if isinstance(e.get("step"), int)}


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _first_bad_rank(ev: Evidence, errors, message: str) -> int | None:
    for _, _, e in errors:
        if e.get("ranks"):
            return int(e["ranks"][0])
    m = re.search(r"\brank (\d+):", message)
    if m:
        return int(m.group(1))
    own = sorted((e.get("time", 0), r.rank) for r, _, e in errors)
    return own[0][1] if own else None


def _exception_lines(ev: Evidence, r: Rank) -> list[Line]:
    """Where the rank's own exception was raised: its error and the innermost traceback frame."""
    found = r.of("exception")
    if not found:
        return []
    n, e = found[-1]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', e.get("traceback", ""))
    where = f" (raised in {frames[-1][2]} at {Path(frames[-1][0]).name}:{frames[-1][1]})" if frames else ""
    return [Line(_where(ev, "events", r.rank, "jsonl", n), f"step {e.get('step')}: {_clip(str(e.get('error')))}{where}")]


def _error_lines(ev: Evidence, errors) -> list[Line]:
    lines, seen = [], set()
    for r, n, e in sorted(errors, key=lambda x: x[0].rank):
        key = e.get("message")
        if key in seen and len(lines) >= 1:
            continue  # every rank carries the same exchanged message: quote it once
        seen.add(key)
        lines.append(Line(_where(ev, "events", r.rank, "jsonl", n), _short(e)))
    if ev.result and ev.result.get("status") == "failed":
        lines.append(Line("run-result.json", _short({"status": "failed", **ev.result},
                                                    ("status", "error_type", "message"))))
    return lines


def _non_finite(ev: Evidence, message: str) -> Diagnosis | None:
    found = [(e.get("step", 0), r.rank, n, e) for r in ev.ranks.values() for n, e in r.of("non_finite")]
    if not found:
        return None
    found.sort(key=lambda x: (x[0], x[1]))
    step, rank, n, e = found[0]
    first = {"rank": rank, "step": step, "sample_id": e.get("sample_id"), "start_frame": e.get("start_frame"),
             "timestep": e.get("timestep"), "loss": e.get("loss")}
    others = sorted({x[1] for x in found if x[0] == step and x[1] != rank})
    details = [f"every rank refused step {step} and stopped together (the optimizer never applied it)"]
    if others:
        details.append(f"ranks {others} were also non-finite at step {step}")
    samples = [s for s in e.get("samples", []) if not _finite(s.get("loss"))]
    for s in samples[:4]:
        details.append(f"sample {s.get('sample_id')!r} start frame {s.get('start_frame')} timestep "
                       f"{s.get('timestep')}: loss {s.get('loss')}")
    last = ev.ranks[rank].last_step
    if last is not None:
        details.append(f"the rank's last finite step was {last['step']} (loss {last.get('loss')}, grad norm "
                       f"{last.get('grad_norm')}, lr {last.get('lr')})")
    good = [c["step"] for c in ev.checkpoints if c.get("valid")]
    if good:
        details.append(f"newest verified checkpoint: step {max(good)} (resume from it with other data or a lower lr)")
    evidence = [Line(_where(ev, "events", rank, "jsonl", n), _short(e)), _heartbeat_line(ev, ev.ranks[rank])]
    summary = (f"non-finite loss at step {step} on rank {rank} (sample {e.get('sample_id')!r}, start frame "
               f"{e.get('start_frame')}, timestep {e.get('timestep')})")
    return Diagnosis("failed", "non_finite", summary, first, details, evidence)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and value == value and value not in (float("inf"), float("-inf"))


def _context(ev: Evidence, kind: str, r: Rank | None) -> list[str]:
    cfg = ev.config or {}
    data, train, dist = cfg.get("data") or {}, cfg.get("train") or {}, cfg.get("distributed") or {}
    out = []
    if kind == "oom":
        shape = f"{data.get('pixel_frames')} frames at {data.get('height')}x{data.get('width')}"
        out.append(f"clip: {shape}, micro batch {train.get('micro_batch_size')}, accumulation "
                   f"{train.get('gradient_accumulation')}, SP {dist.get('sequence_parallel_size')}, activation "
                   f"checkpointing {dist.get('activation_checkpointing')}, sharding {dist.get('sharding')}")
        last = r.last_step if r is not None else None
        if last and last.get("memory"):
            out.append("memory at its last step: " + ", ".join(f"{k} {v / 2**30:.2f} GiB"
                                                               for k, v in last["memory"].items()))
        out.append("fewer tokens per rank (SP), activation checkpointing, FSDP2 sharding, or a smaller micro "
                   "batch with more accumulation lower the peak; other processes on the GPU count too "
                   "(`solar environment probe` lists them)")
    elif kind == "checkpoint_load":
        bad = [c for c in ev.checkpoints if not c.get("valid")]
        for c in bad[:3]:
            out.append(f"checkpoint {c['path']} does not verify (`solar checkpoint verify` lists its problems)")
    elif kind in ("storage_full", "storage_error"):
        good = [c["step"] for c in ev.checkpoints if c.get("valid")]
        out.append(f"the run directory's volume {'is full' if kind == 'storage_full' else 'failed'}; the partial "
                   "checkpoint was removed and every earlier checkpoint is intact"
                   + (f" (newest verified: step {max(good)}; resume from it once the volume is fixed)" if good else ""))
    elif kind == "sp_mismatch":
        out.append("SP peers must read the same sample, start frame and bytes: check the data plan ownership "
                   "(logical DP rank), shuffling seeds and per-rank RNG")
    if ev.partial_checkpoints:
        out.append(f"crashed checkpoint writes left {len(ev.partial_checkpoints)} partial director"
                   f"{'y' if len(ev.partial_checkpoints) == 1 else 'ies'} (never taken as checkpoints): "
                   f"{', '.join(ev.partial_checkpoints[:3])}")
    return out


# -- hangs -------------------------------------------------------------------------------------------------
def _hang(ev: Evidence, *, peers_failed: bool) -> Diagnosis | None:
    seen = {r.rank: r.collective for r in ev.ranks.values() if r.collective is not None}
    if len(seen) < 2:
        return None
    newest = max(seq for _, seq in seen.values())
    behind = sorted(rank for rank, (_, seq) in seen.items() if seq < newest)
    if not behind:
        return None
    ahead = sorted(rank for rank in seen if rank not in behind)
    stale = all(ev.now - (r.heartbeat or {}).get("time", ev.now) >= STALE_SECONDS for r in ev.ranks.values())
    if not (peers_failed or stale):
        return None  # ranks at different collectives that are still moving: normal
    name, seq = seen[ahead[0]]
    lag = ev.ranks[behind[0]]
    first = {"rank": behind[0], "step": _step_of(lag), "phase": _phase_of(lag),
             "last_collective": f"{seen[behind[0]][0]} #{seen[behind[0]][1]}"}
    age = ev.now - (lag.heartbeat or {}).get("time", ev.now)
    summary = (f"rank{'s' if len(behind) > 1 else ''} {behind} never entered collective {name} #{seq} that "
               f"rank{'s' if len(ahead) > 1 else ''} {ahead} waited in; rank {behind[0]} was last in phase "
               f"{first['phase']!r} at step {first['step']} ({age:.0f}s ago)")
    details = [f"rank {r}: last collective {seen[r][0]} #{seen[r][1]}, phase {_phase_of(ev.ranks[r])!r}"
               for r in sorted(seen)]
    details.append("the ranks ahead ended on the collective timeout (distributed.timeout_seconds)" if peers_failed
                   else f"no heartbeat has moved for {STALE_SECONDS:.0f}s or more: the run is stuck, not slow")
    evidence = [_heartbeat_line(ev, ev.ranks[r]) for r in sorted(seen)]
    errors = [(r, n, e) for r in ev.ranks.values() for n, e in r.of("error")]
    evidence += _error_lines(ev, errors)
    for r in behind[:1] + ahead[:1]:
        evidence += _log_lines(ev, ev.ranks[r], limit=2)
    return Diagnosis("failed", "hang", summary, {k: v for k, v in first.items() if v is not None}, details, evidence)


def _crashed(ev: Evidence, gone: list[Rank]) -> Diagnosis:
    outputs = _outputs_problem(ev, finished=True)
    r = gone[0]
    first = {"rank": r.rank, "step": _step_of(r), "phase": _phase_of(r)}
    if outputs is not None:
        outputs.details.insert(0, f"rank {r.rank}'s process ({(r.heartbeat or {}).get('pid')}) is gone without a "
                                  f"run-result, last in phase {first['phase']!r}: it was killed")
        outputs.status = "failed"
        outputs.first_bad = {**first, **outputs.first_bad}
        return outputs
    summary = (f"the process of rank {r.rank} ended without a run-result (killed?) in phase {first['phase']!r} at "
               f"step {first['step']}")
    return Diagnosis("failed", "crashed", summary, first, [], [_heartbeat_line(ev, x) for x in gone])


# -- outputs -----------------------------------------------------------------------------------------------
def _intended_slots(ev: Evidence, generation: bool = False) -> int | None:
    """The slots of the frozen plan: validation's, or ``solar infer``'s under ``generation/``."""
    try:
        plan = ev.root / ("generation" if generation else "validation") / "frozen-plan.json"
        return len(json.loads(plan.read_text())["slots"])
    except (OSError, ValueError, KeyError):
        return None


def _outputs_problem(ev: Evidence, *, finished: bool) -> Diagnosis | None:
    if not finished:
        return None
    dp = int(ev.topology.get("logical_dp_world_size") or 1)
    stopped = (ev.result or {}).get("status") == "stopped"
    for out in ev.outputs:
        if out.complete or (stopped and out.step is None):  # a stopped `solar infer`: its next launch finishes it
            continue
        return _missing(ev, out, _intended_slots(ev, generation=out.step is None), dp)
    errors = [(out, p, e) for out in ev.outputs for p in out.passes.values() for e in p.errors]
    if errors:
        out, p, e = errors[0]
        summary = (f"{len(errors)} validation slot{'s' if len(errors) > 1 else ''} ended in an error manifest; first: "
                   f"{out.where}/{p.name}/slot_{e['slot']:06d} (sample {e['sample_id']!r}): {_clip(str(e['error']))}")
        return Diagnosis("degraded", "validation_errors", summary,
                         {"step": out.step, "pass": p.name, "slot": e["slot"], "sample_id": e["sample_id"]},
                         [f"{o.where}/{pp.name}/slot_{x['slot']:06d}: {_clip(str(x['error']), 160)}"
                          for o, pp, x in errors[:6]],
                         [Line(f"{ev.rel(ev.root / out.where / p.name)}/slot_{e['slot']:06d}/manifest.json",
                               _clip(str(e["error"])))])
    return None


def _missing(ev: Evidence, out: OutputState, slots: int | None, dp: int) -> Diagnosis:
    details, evidence = [], [Line(f"{out.where}/COMPLETE.json", "missing")]
    first: dict = {"step": out.step} if out.step is not None else {}
    configured = ((ev.config or {}).get("validation") or {}).get("passes") or []
    names = [p.get("name") for p in configured if isinstance(p, dict)] or list(out.passes)
    for name in names:
        state = out.passes.get(name)
        if state is None:
            details.append(f"pass {name}: not started")
            continue
        have = sorted(state.ok + [e["slot"] for e in state.errors])
        missing = [s for s in range(slots)] if slots is not None else []
        missing = [s for s in missing if s not in have]
        line = f"pass {name}: {len(state.ok)} ok, {len(state.errors)} error of {slots if slots is not None else '?'} slots"
        if missing:
            owners = sorted({s % dp for s in missing})
            line += f"; missing slots {missing[:8]} (owned by logical DP rank{'s' if len(owners) > 1 else ''} {owners})"
            first.setdefault("pass", name)
            first.setdefault("slot", missing[0])
            first.setdefault("logical_dp_rank", missing[0] % dp)
        if state.partial:
            line += f"; crashed slot writes {state.partial[:3]}"
            evidence.append(Line(f"{out.where}/{name}/{state.partial[0]}", "a slot directory that was never finished"))
        if not state.complete:
            evidence.append(Line(f"{out.where}/{name}/COMPLETE.json", "missing"))
        details.append(line)
    what = f"validation step {out.step}" if out.step is not None else "generation"
    summary = f"{what} has no COMPLETE.json: " + "; ".join(details[:2])
    return Diagnosis("failed", "validation_missing", summary, first, details, evidence)


# -- healthy -----------------------------------------------------------------------------------------------
def _at(ev: Evidence, step) -> str:
    """Where the run is: ``at step N``; an inference run (no steps) by its generation's slots; a
    training run before its first step says so."""
    if step is not None:
        return f"at step {step}"
    if ((ev.launch or {}).get("action") or (ev.config or {}).get("action")) == "infer":
        gen = next((o for o in ev.outputs if o.step is None), None)
        if gen is None:
            return "before its generation started (an inference run)"
        ok = sum(len(p.ok) for p in gen.passes.values())
        return f"with {ok} generated slot{'s' if ok != 1 else ''} in {gen.where}/ (an inference run)"
    return "before its first step"


def _healthy(ev: Evidence) -> Diagnosis:
    result = ev.result or {}
    final = result.get("final") or {}
    steps = [r.last_step["step"] for r in ev.ranks.values() if r.last_step]
    step = final.get("step", max(steps) if steps else None)
    good = [c["step"] for c in ev.checkpoints if c.get("valid")]
    details = []
    if good:
        details.append(f"newest verified checkpoint: step {max(good)}")
    done = [o for o in ev.outputs if o.complete]
    if done:
        details.append(f"complete validation/generation outputs: {', '.join(o.where for o in done)}")
    for o in ev.outputs:
        if not o.complete and o.step is None:
            slots = _intended_slots(ev, generation=True)
            ok = sum(len(p.ok) for p in o.passes.values())
            details.append(f"unfinished generation: {ok} slot{'s' if ok != 1 else ''} written"
                           + (f" ({slots} per pass)" if slots is not None else "")
                           + "; the same `solar infer` command finishes it")
    if ev.partial_checkpoints:
        details.append(f"partial checkpoint directories from interrupted saves: {', '.join(ev.partial_checkpoints)}")
    status = result.get("status")
    at = _at(ev, step)
    if status == "complete":
        return Diagnosis("healthy", "healthy", f"the run completed {at}; nothing is wrong", {}, details)
    if status == "stopped":
        return Diagnosis("stopped", "stopped", f"the run was stopped (a signal) {at} and can be resumed",
                         {}, details)
    beats = [(r.heartbeat or {}).get("time") for r in ev.ranks.values() if r.heartbeat]
    quiet = ev.now - max(beats) if beats else None
    text = f"still running {at}" + (f"; newest heartbeat {quiet:.0f}s ago" if quiet is not None else "")
    if quiet is not None and quiet >= STALE_SECONDS:
        text += " (quiet, but no rank disagrees with another: no fault is inferred from silence alone)"
    return Diagnosis("running", "running", text, {}, details, [_heartbeat_line(ev, r) for r in ev.ranks.values()][:4])
