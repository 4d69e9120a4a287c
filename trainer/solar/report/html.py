"""The completion report as one self-contained HTML page: inline CSS, inline SVG plots, validation
thumbnails embedded as PNG data URIs. No script, no external resource.

Every plot's labels are placed inside its canvas (widths estimated from the font size), step ticks
are integers, noisy curves (loss, grad norm) are drawn raw (faint) under their EMA (the weight is in
the legend), later launches (resumes, relaunches, topology changes) are marked on every step axis,
overlapping checkpoint labels are thinned (each square keeps its step as a tooltip), and a plot
with no data is left out. A run of several launches also gets its shape over wall time: each
launch's world size as a step, each interruption shaded with the seconds it cost (``shape.py``).
The wording of values (environment, weights, final numbers, launches, interruptions) is
shared with the text report, which imports it from here; a value that was not recorded is left out
or said to be "not recorded", never printed as None."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

PLOT_W, PLOT_H = 520, 240
TIMELINE_W, TIMELINE_H = PLOT_W * 2 + 20, 124
FONT = 11  # px, the plots' text size (CSS below)
THUMBS_PER_PASS = 4
STUDENT = "#db2777"  # Stage2: the student's series in every plot
LAUNCH = "#dc2626"


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _width(text: str, size: float = FONT) -> float:
    """A label's width in px, a little over what sans-serif fonts draw (digits ~0.56 em)."""
    return len(text) * size * 0.64 + 2


# -- wording shared with the text report --------------------------------------------------------------
def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _shown(value) -> str | None:
    """A finite number, formatted; None when it was not recorded."""
    return _fmt(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _known(*parts) -> str:
    """``label value`` parts whose value was recorded, comma-separated (an unknown value is left out)."""
    return ", ".join(f"{label} {value}".strip() for label, value in parts if value not in (None, "", []))


def environment_text(env: dict) -> str:
    if not any(env.get(k) for k in ("python", "torch", "host")):
        return "environment not recorded"
    cuda = env.get("cuda") or ("no CUDA" if env.get("cuda_available") is False else None)
    return _known(("python", env.get("python")), ("torch", env.get("torch")),
                  ("CUDA" if env.get("cuda") else "", cuda),
                  ("devices", ", ".join(env.get("devices") or []) or ("cpu" if env.get("torch") else None)),
                  ("host", env.get("host")))


def code_text(code: dict | None) -> str:
    revision = (code or {}).get("revision")
    return f"{revision[:12]}{' (dirty)' if (code or {}).get('dirty') else ''}" if revision else "not recorded"


def source_text(source: dict) -> str:
    """One init source: its path, role and weights (``live``, ``ema``, ...)."""
    return f"{source.get('path')} ({_known(('role', source.get('role')), ('weights', source.get('weights')))})"


def weights_text(weights: dict) -> str:
    sources = "; ".join(source_text(s) for s in weights.get("init_sources") or [])
    passes = ", ".join(p["name"] if p.get("weights") is None else f"{p['name']}={p['weights']}"
                       for p in weights["passes"])
    return _known(("init", weights.get("init_mode") or "not recorded"), ("from", sources),
                  ("checkpoint weights", weights.get("checkpoint_weights")), ("passes", passes))


def final_text(report: dict) -> str | None:
    """The last training step's numbers (Stage2: the critic's and the student's), None without one."""
    final, s = report.get("final") or {}, report["series"]
    if final.get("step") is None:
        return None
    parts = [("step time", _shown(final.get("step_seconds")) and f"{_shown(final['step_seconds'])} s")]
    if "student_loss" in s:
        student = [(x, y) for x, y in zip(s["step"], s["student_loss"]) if y is not None]
        parts = [("critic loss", _shown(final.get("loss"))),
                 ("critic grad norm", _shown(final.get("grad_norm"))),
                 ("student loss", f"{_fmt(student[-1][1])} (its update {final.get('student_step')}, at step "
                                  f"{student[-1][0]})" if student else "none yet (the student never updated)"),
                 *parts]
    else:
        parts = [("loss", _shown(final.get("loss"))),
                 ("grad norm", _shown(final.get("grad_norm"))), *parts]
    return f"step {final['step']}: " + _known(*parts)


def launch_text(launch: dict) -> str:
    """A launch: where it began, how, what changed from the one before and how its attempt ended."""
    how = {None: "init not recorded", "none": "fresh start"}.get(launch["init_mode"], f"init {launch['init_mode']}")
    if launch["init_mode"] == "full_resume":
        how = f"resume from {Path((launch['init_sources'] or [{}])[0].get('path') or '').name or 'a checkpoint'}"
    if launch.get("rewind"):
        how += f", {rewind_text(launch['rewind'])}"
    if launch.get("restart"):
        how = restart_text(launch["restart"])
    changes = [f"{k} {a} -> {b}" for k, (a, b) in launch["topology_changes"].items()]
    config = [f"{c.get('key')} {c.get('old')} -> {c.get('new')}" for c in launch["config_changes"]]
    attempt = launch["attempt"] or {}
    ended = (f"{attempt['status']} after {attempt['wall_seconds']:.0f} s"
             if attempt.get("status") and isinstance(attempt.get("wall_seconds"), (int, float)) else None)
    steps = (f"steps {launch['first_step']}-{launch['last_step']}" if launch["first_step"] is not None
             else f"no step recorded (would have begun at step {launch['at_step']})")
    return (f"{how}, {steps}" + (f"; topology {', '.join(changes)}" if changes else "")
            + (f"; config {', '.join(config)}" if config else "") + (f"; {ended}" if ended else ""))


def rewind_text(rewind: dict) -> str:
    """A rewind in place: the step it went back to and the checkpoints it moved aside."""
    names = ", ".join(rewind.get("superseded") or []) or "no checkpoint"
    kept = f", kept under {rewind['superseded_dir']}/" if rewind.get("superseded_dir") else ""
    return f"rewound to step {rewind.get('step')} ({names} superseded{kept})"


def restart_text(restart: dict) -> str:
    """A restart from step 0 of a directory with no committed checkpoint, its earlier launches kept."""
    k = restart.get("earlier_launches")
    moved = (f"; {len(restart.get('moved') or [])} path(s) moved under {restart['superseded_dir']}/"
             if restart.get("superseded_dir") else "")
    return (f"restart from step 0 (no committed checkpoint; its {k} earlier launch{'' if k == 1 else 'es'} kept as "
            f"history{moved})")


def superseded_text(report: dict) -> str:
    """The checkpoints rewinds moved aside: how many, and where."""
    n = len(report["superseded_checkpoints"])
    return f"{n} superseded under checkpoints/superseded/"


def _seconds(value) -> str:
    return f"{value:.1f} s"


def world_text(s: dict) -> str:
    """A launch's world size, with its nodes x ranks per node where a checkpoint recorded them."""
    if s["world_size"] is None:
        return "world not recorded"
    nodes = s.get("nodes")
    return f"world {s['world_size']}" + (f" ({nodes} node{'s' if nodes != 1 else ''} x {s['ranks_per_node']})"
                                         if nodes else "")


def end_text(end: str, error_type: str | None = None) -> str:
    return f"failed ({error_type})" if end == "failed" and error_type else end


def shape_text(s: dict) -> str:
    """A launch on the time axis (``shape.launch_shape``): world, steps, how long it ran, how it ended."""
    steps = (f"steps {s['first_step']}-{s['last_step']}" if s["first_step"] is not None else "no step recorded")
    ran = (f" in {_seconds(s['ended'] - s['started'])}" if s["started"] is not None and s["ended"] is not None
           else "")
    return f"{world_text(s)}, {steps}{ran}, {end_text(s['end'], s['error_type'])}"


def interruption_text(g: dict) -> str:
    """An interruption (``shape.interruptions``): how the launch before it ended, where, what was
    repeated and how long until a later launch trained past the newest checkpoint."""
    where = (f"after step {g['last_step']}" if g.get("last_step") is not None else "before its first step") \
        + (f" (rewound to step {g['rewound_to']} by launch {g['resumed_by']})" if g.get("rewound_to") is not None
           and g["resumed_by"] is not None else f" (checkpoint {g['durable_step']})" if g["durable_step"]
           else " (no checkpoint)")
    redone = g["steps_redone"]
    parts = [f"{end_text(g['previous_end'], g['error_type'])} {where}",
             f"{redone} step{'s' if redone != 1 else ''} redone" if redone else "no step redone"]
    if g["recovered_step"] is None:
        past = f"past step {g['durable_step']}" if g["durable_step"] else "a step"
        return f"{parts[0]}: not recovered (no later launch trained {past})"
    until = f"until step {g['recovered_step']} in launch {g['resumed_by']}"
    parts.append(f"{_seconds(g['seconds'])} {until}" if g["seconds"] is not None else f"{until} (time not recorded)")
    through = g["through"]
    if through:
        parts.append(f"launch{'es' if len(through) > 1 else ''} {', '.join(map(str, through))} ended before "
                     f"getting there")
    return f"{parts[0]}: " + ", ".join(parts[1:])


def lost_text(shape_doc: dict) -> str:
    """The seconds all interruptions cost, by how the launch before each ended (``shape.build``)."""
    gaps = shape_doc["interruptions"]
    counted = [g for g in gaps if g["seconds"] is not None]
    left = len(gaps) - len(counted)
    if not counted:
        return f"none counted ({left} interruption{'s' if left != 1 else ''} not recovered or not timed)"
    by_end = ", ".join(f"{end} {_seconds(seconds)}" for end, seconds in shape_doc["lost_by_end"].items())
    text = f"{_seconds(shape_doc['lost_seconds'])} in {len(counted)} interruption{'s' if len(counted) != 1 else ''}" \
        f" ({by_end})"
    return text + (f"; {left} more not counted (not recovered or not timed)" if left else "")


# -- plots ------------------------------------------------------------------------------------------
def _nice(span: float, n: int) -> float:
    """A tick step of 1, 2, 2.5 or 5 times a power of ten giving about ``n`` intervals over ``span``."""
    raw = span / n
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def int_ticks(lo: float, hi: float, n: int = 6) -> list[int]:
    """Integer ticks (steps) between lo and hi."""
    step = max(1, round(_nice(max(hi - lo, 1), n)))
    return list(range(math.ceil(lo / step) * step, math.floor(hi) + 1, step))


def _fitting(largest: float, span: float) -> int:
    """How many step intervals fit their labels (the widest is ``largest``'s) across ``span`` px."""
    return max(1, min(8, int(span / (_width(str(int(largest))) + 24))))


def value_ticks(lo: float, hi: float, n: int = 4) -> list[tuple[float, str]]:
    """(value, label) ticks between lo and hi, labelled with the digits the step needs."""
    step = _nice(hi - lo, n)
    first = math.ceil(lo / step - 1e-9)
    values = [(first + i) * step for i in range(int((hi - first * step) / step + 1e-9) + 1)]
    top = max(abs(lo), abs(hi))
    digits = max(1, math.floor(math.log10(top)) - math.floor(math.log10(step)) + 2) if top else 1
    return [(v, f"{0.0 if abs(v) < step * 1e-6 else v:.{digits}g}") for v in values]


def ema(ys: list[float], weight: float) -> list[float]:
    """The bias-corrected exponential moving average of ys (the first value is itself)."""
    out, acc = [], 0.0
    for i, y in enumerate(ys, start=1):
        acc = weight * acc + (1 - weight) * y
        out.append(acc / (1 - weight ** i))
    return out


def smoothing_weight(n: int) -> float:
    """The EMA weight for a curve of n points: about n/20 points of memory (0.5 for short runs, 0.95 at 400)."""
    return round(1 - 1 / max(2.0, n / 20), 3)


def _thin(labels: list[tuple[float, str]], lo: float, hi: float, gap: float = 6) -> list[tuple[float, str]]:
    """Centred (x, text) labels, moved inside [lo, hi] and thinned left to right so that none
    overlaps another; the last one is always kept."""
    placed = []
    for x, text in sorted(labels):
        half = _width(text) / 2
        placed.append((min(max(x, lo + half), hi - half), text, half))
    if not placed:
        return []
    last, kept, edge = placed[-1], [], -math.inf
    for x, text, half in placed[:-1]:
        if x - half >= edge + gap and x + half <= last[0] - last[2] - gap:
            kept.append((x, text))
            edge = x + half
    return [*kept, (last[0], last[1])]


def _launch_markers(launches: list[dict]) -> list[dict]:
    """The launches after the first, each where it began on the step axis, with a short label."""
    out = []
    for launch in launches[1:]:
        tag = "resume" if launch["init_mode"] == "full_resume" else "relaunch"
        if launch.get("rewind"):
            tag = f"rewind to step {launch['rewind'].get('step')}"
        if launch.get("restart"):
            tag = "restart"
        if launch["topology_changes"]:
            tag += ", topology"
        out.append({"x": launch["at_step"] - 0.5, "launch": launch["launch"], "step": launch["at_step"],
                    "label": f"launch {launch['launch']} ({tag})",
                    "title": f"launch {launch['launch']}: {launch_text(launch)}"})
    return out


def _marker_svg(m: dict, x: float, top: float, bottom: float, label: tuple[float, float] | None) -> str:
    """A launch's dashed line at x with its label centred at ``label`` (left out when thinned)."""
    text = (f'<text class="marker-label" x="{label[0]:.1f}" y="{label[1]}" text-anchor="middle">'
            f'{_esc(m["label"])}</text>') if label else ""
    return (f'<g class="launch-marker" data-launch="{m["launch"]}" data-step="{m["step"]}"><title>{_esc(m["title"])}'
            f'</title><line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{LAUNCH}" stroke-width="1.2" '
            f'stroke-dasharray="4 3"/>{text}</g>')


def _marker_labels(marks: list[dict], xs: list[float], lo: float, hi: float, beside: bool) -> dict[str, float]:
    """Each marker label's centre, beside its line (right of it where it fits) or under it, thinned."""
    centres = []
    for m, x in zip(marks, xs):
        half = _width(m["label"]) / 2
        if beside:
            x = x + 3 + half if x + 3 + 2 * half <= hi else x - 3 - half
        centres.append((x, m["label"]))
    return {text: centre for centre, text in _thin(centres, lo, hi)}


def line_plot(title: str, series: list[dict], markers: list[dict] = ()) -> str:
    """An SVG plot of every series ({name, xs, ys, color, smooth}) against the step, with launch
    markers; "" when no series has a point (the page leaves the plot out)."""
    lines = []
    for s in series:
        pts = [(x, y) for x, y in zip(s["xs"], s["ys"]) if x is not None and y is not None and math.isfinite(y)]
        if pts:
            lines.append({**s, "points": pts, "weight": smoothing_weight(len(pts))})
    if not lines:
        return ""
    every = [p for s in lines for p in s["points"]]
    x0, x1 = min(p[0] for p in every), max(p[0] for p in every)
    marks = [m for m in markers if x0 - 1 <= m["x"] <= x1 + 1]
    x0, x1 = min([x0, *(m["x"] for m in marks)]), max([x1, *(m["x"] for m in marks)])
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(p[1] for p in every), max(p[1] for p in every)
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) * 0.1 or 1), y1 + (abs(y1) * 0.1 or 1)
    yticks = value_ticks(y0, y1)
    left = 10 + max(_width(label) for _, label in yticks) + 6
    right, top, bottom = PLOT_W - 24, 58, PLOT_H - 34  # title, legend and launch labels above the plot

    def sx(x):
        return left + (x - x0) / (x1 - x0) * (right - left)

    def sy(y):
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    parts = [f'<svg class="plot" role="img" aria-label="{_esc(title)}" viewBox="0 0 {PLOT_W} {PLOT_H}" '
             f'width="{PLOT_W}" height="{PLOT_H}" xmlns="http://www.w3.org/2000/svg">'
             f'<text x="{PLOT_W / 2}" y="16" text-anchor="middle" class="title">{_esc(title)}</text>',
             _legend(lines, 10, 33),
             f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>']
    for v, label in yticks:
        parts.append(f'<line x1="{left - 4}" y1="{sy(v):.1f}" x2="{right}" y2="{sy(v):.1f}" class="grid"/>'
                     f'<text class="ytick" x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{label}</text>')
    for t in int_ticks(x0, x1, _fitting(x1, right - left)):
        parts.append(f'<text class="xtick" x="{sx(t):.1f}" y="{bottom + 15}" text-anchor="middle">{t}</text>')
    parts.append(f'<text x="{(left + right) / 2}" y="{PLOT_H - 4}" text-anchor="middle" class="label">step</text>')
    for s in lines:
        parts += _curve(s, sx, sy)
    xs = [sx(m["x"]) for m in marks]
    labels = _marker_labels(marks, xs, left, right, beside=True)
    parts += [_marker_svg(m, x, top - 4, bottom, (labels[m["label"]], top - 8) if m["label"] in labels else None)
              for m, x in zip(marks, xs)]
    return "".join(parts) + "</svg>"


def _curve(s: dict, sx, sy) -> list[str]:
    """One series: its raw points, and over them (when smoothed) the EMA as the solid line."""
    pts, color, cls = s["points"], s["color"], _esc(s["name"])
    raw = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    if not s.get("smooth"):
        out = [f'<polyline class="series {cls}" points="{raw}" fill="none" stroke="{color}" stroke-width="2"/>']
        if len(pts) <= 60:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
        return out
    if len(pts) < 2:   # no line to draw yet (Stage2's student after its first update): a solid point
        return [f'<circle class="series {cls}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"/>'
                for x, y in pts]
    smooth = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for (x, _), y in zip(pts, ema([y for _, y in pts], s["weight"])))
    out = [f'<polyline class="raw {cls}" points="{raw}" fill="none" stroke="{color}" stroke-opacity="0.3" '
           f'stroke-width="1"/>']
    if len(pts) <= 60:
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color}" fill-opacity="0.3"/>' for x, y in pts]
    return out + [f'<polyline class="smooth {cls}" points="{smooth}" fill="none" stroke="{color}" stroke-width="2"/>']


def _legend(lines: list[dict], x: float, y: float) -> str:
    """A swatch per named series, then how the solid and faint lines were drawn."""
    parts = ['<g class="legend">']
    for s in lines:
        if len(lines) > 1 or s.get("smooth"):
            text = s["name"] if len(lines) > 1 else ""
            parts.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" stroke="{s["color"]}" '
                         f'stroke-width="2"/>')
            x += 20
            if text:
                parts.append(f'<text x="{x}" y="{y}">{_esc(text)}</text>')
                x += _width(text) + 10
    weights = sorted({s["weight"] for s in lines if s.get("smooth")})
    if weights:
        parts.append(f'<text x="{x}" y="{y}">solid: EMA (weight {" / ".join(f"{w:g}" for w in weights)}), '
                     f'faint: raw</text>')
    return "".join(parts) + "</g>"


def timeline(checkpoints: list[dict], validations: list[dict], launches: list[dict], last_step: int | None) -> str:
    """Checkpoint (blue squares, thinned labels), validation (green dots) and later launches (red
    dashes) on one step axis; "" when there is nothing to place."""
    steps = [c["step"] for c in checkpoints if isinstance(c.get("step"), int)]
    vsteps = [v["step"] for v in validations if isinstance(v.get("step"), int)]
    marks = _launch_markers(launches)
    if not steps and not vsteps and not marks:
        return ""
    end = max([1, *steps, *vsteps, last_step or 0, *(m["step"] for m in marks)])
    w, h, left, right, axis = TIMELINE_W, TIMELINE_H, 24, TIMELINE_W - 24, 58

    def sx(s):
        return left + s / end * (right - left)

    shown = _thin([(sx(s), str(s)) for s in steps], 0, w)
    note = f" (labels for {len(shown)} of {len(steps)} checkpoints; hover a square for its step)" \
        if len(shown) < len(steps) else ""
    parts = [f'<svg class="plot timeline" role="img" aria-label="checkpoint timeline" viewBox="0 0 {w} {h}" '
             f'width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" class="title">checkpoints (blue), validations (green) '
             f'and later launches (red) by step{_esc(note)}</text>',
             f'<line x1="{left}" y1="{axis}" x2="{right}" y2="{axis}" class="axis"/>']
    parts += [f'<rect class="ckpt" x="{sx(s) - 4:.1f}" y="{axis - 16}" width="8" height="14" fill="#2563eb">'
              f'<title>checkpoint {s}</title></rect>' for s in steps]
    parts += [f'<text class="ckpt-label" x="{x:.1f}" y="{axis - 21}" text-anchor="middle">{t}</text>'
              for x, t in shown]
    parts += [f'<circle class="validation" cx="{sx(s):.1f}" cy="{axis + 9}" r="5" fill="#16a34a"><title>validation '
              f'{s}</title></circle>' for s in vsteps]
    for t in int_ticks(0, end, _fitting(end, right - left)):
        parts.append(f'<line x1="{sx(t):.1f}" y1="{axis}" x2="{sx(t):.1f}" y2="{axis + 3}" class="axis"/>'
                     f'<text class="xtick" x="{sx(t):.1f}" y="{axis + 30}" text-anchor="middle">{t}</text>')
    xs = [sx(m["x"]) for m in marks]
    labels = _marker_labels(marks, xs, 0, w, beside=False)
    parts += [_marker_svg(m, x, axis - 16, axis + 16, (labels[m["label"]], axis + 48) if m["label"] in labels else None)
              for m, x in zip(marks, xs)]
    parts.append(f'<text x="{w / 2}" y="{h - 5}" text-anchor="middle" class="label">step</text>')
    return "".join(parts) + "</svg>"


def _time_unit(span: float) -> tuple[str, float]:
    """Seconds for up to 10 minutes, minutes up to 10 hours, hours beyond: integer ticks in each."""
    return ("s", 1.0) if span <= 600 else ("min", 60.0) if span <= 36000 else ("h", 3600.0)


def shape_chart(shape_doc: dict) -> str:
    """The run's shape over wall time: each launch a step of its world size from its start to its
    last event (labelled above the plot with its nodes where known and how it ended; the full line
    is its tooltip), each interruption shaded red from the end of the launch before it to the step
    that got past the newest checkpoint, labelled with the seconds it cost. "" with fewer than two
    launches or none whose times were recorded."""
    placed = [s for s in shape_doc["launches"] if s["started"] is not None and s["ended"] is not None]
    if len(shape_doc["launches"]) < 2 or not placed:
        return ""
    gaps = [g for g in shape_doc["interruptions"] if g["began"] is not None]
    t0 = min(s["started"] for s in placed)
    t1 = max([s["ended"] for s in placed] + [g["recovered_at"] for g in gaps if g["recovered_at"] is not None])
    unit, scale = _time_unit(t1 - t0)
    span = max((t1 - t0) / scale, 1e-9)
    top_world = max([1, *(s["world_size"] for s in placed if s["world_size"] is not None)])
    yticks = int_ticks(0, top_world, 4)
    w, h = TIMELINE_W, 200
    left = 10 + max(_width(str(t)) for t in yticks) + 6
    right, top, bottom = w - 24, 58, h - 40  # two label rows above the plot: launches, interruptions

    def sx(t):
        return left + (t - t0) / scale / span * (right - left)

    def sy(world):
        return bottom - world / top_world * (bottom - top)

    first = min(placed, key=lambda s: s["started"])["launch"]
    parts = [f'<svg class="shape" role="img" aria-label="run shape over time" viewBox="0 0 {w} {h}" width="{w}" '
             f'height="{h}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" class="title">world size over wall time: launches (blue)'
             f' and interruptions (red, with the time each cost)</text>',
             f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>']
    for v in yticks:
        parts.append(f'<line x1="{left - 4}" y1="{sy(v):.1f}" x2="{right}" y2="{sy(v):.1f}" class="grid"/>'
                     f'<text class="ytick" x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v}</text>')
    for t in int_ticks(0, span, _fitting(span, right - left)):
        x = left + t / span * (right - left)
        parts.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 3}" class="axis"/>'
                     f'<text class="xtick" x="{x:.1f}" y="{bottom + 15}" text-anchor="middle">{t}</text>')
    parts.append(f'<text x="{(left + right) / 2}" y="{h - 5}" text-anchor="middle" class="label">wall time since '
                 f'launch {first} began ({unit})</text>')
    gap_labels = []
    for g in gaps:
        x0 = sx(g["began"])
        x1 = sx(g["recovered_at"]) if g["recovered_at"] is not None else right
        text = _seconds(g["seconds"]) if g["seconds"] is not None else "not recovered"
        gap_labels.append(((x0 + x1) / 2, text))
        parts.append(f'<g class="interruption" data-after="{g["after_launch"]}"><title>interruption after launch '
                     f'{g["after_launch"]}: {_esc(interruption_text(g))}</title><rect x="{x0:.1f}" y="{top}" '
                     f'width="{max(x1 - x0, 2):.1f}" height="{bottom - top}" fill="{LAUNCH}" fill-opacity="0.15"/></g>')
    step, launch_labels = [], []
    for s in sorted(placed, key=lambda s: s["started"]):
        x0, x1, world = sx(s["started"]), max(sx(s["ended"]), sx(s["started"]) + 2), s["world_size"]
        launch_labels.append(((x0 + x1) / 2, f"launch {s['launch']}: {world_text(s)}, {end_text(s['end'])}"))
        if world is None:
            continue
        y = sy(world)
        step += [f"{x0:.1f},{bottom}", f"{x0:.1f},{y:.1f}", f"{x1:.1f},{y:.1f}", f"{x1:.1f},{bottom}"]
        parts.append(f'<g class="shape-launch" data-launch="{s["launch"]}" data-world="{world}"><title>launch '
                     f'{s["launch"]}: {_esc(shape_text(s))}</title><rect x="{x0:.1f}" y="{y:.1f}" '
                     f'width="{x1 - x0:.1f}" height="{bottom - y:.1f}" fill="#2563eb" fill-opacity="0.15"/></g>')
    parts.append(f'<polyline class="world" points="{" ".join(step)}" fill="none" stroke="#2563eb" stroke-width="2"/>')
    parts += [f'<text class="launch-label" x="{x:.1f}" y="34" text-anchor="middle">{_esc(t)}</text>'
              for x, t in _thin(launch_labels, 0, w)]
    parts += [f'<text class="marker-label" x="{x:.1f}" y="50" text-anchor="middle">{_esc(t)}</text>'
              for x, t in _thin(gap_labels, 0, w)]
    return "".join(parts) + "</svg>"


def _shape_section(report: dict) -> str:
    """The run's shape over time and what its interruptions cost, drawn and in words (more than one launch)."""
    doc = report.get("shape") or {}
    if len(report["launches"]) < 2 or not doc.get("launches"):
        return ""
    items = [f"<li>interruption after launch {g['after_launch']}: {_esc(interruption_text(g))}</li>"
             for g in doc["interruptions"]]
    if doc["interruptions"]:
        items.append(f"<li>time lost to interruptions: {_esc(lost_text(doc))}</li>")
    return (f"<h2>Shape over time</h2>{shape_chart(doc)}"
            + (f'<ul class="interruptions">{"".join(items)}</ul>' if items else ""))


def thumbnail(video: Path, width: int = 320) -> str | None:
    """The middle frame of a video as a PNG data URI (None when it cannot be decoded)."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(str(video)) as container:
            middle = container.streams.video[0].frames // 2  # 0 when the container does not say
            frames = []
            for frame in container.decode(video=0):
                frames.append(frame)
                if middle and len(frames) > middle:
                    break
        if not frames:
            return None
        image = frames[middle if middle and len(frames) > middle else len(frames) // 2].to_image()
        scale = width / image.width
        image = image.resize((width, max(1, round(image.height * scale))))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
    except Exception:  # noqa: BLE001 - a broken video is reported as missing, not a crash
        return None
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _output_title(out: dict) -> str:
    where = f"validation step {out['step']}" if isinstance(out.get("step"), int) else out["where"]
    return f"{where}: {'complete' if out['complete'] else 'INCOMPLETE'}"


def _thumbnails(report: dict) -> str:
    """Every validation step's (or the generation's) passes, up to THUMBS_PER_PASS slots each."""
    if not report["outputs"]:
        return "<p>No validation or generation outputs.</p>"
    root, blocks = Path(report["run_dir"]), []
    for out in report["outputs"]:
        passes = []
        for p in out["passes"]:
            cells = []
            for slot in sorted((root / out["where"] / p["pass"]).glob("slot_*"))[:THUMBS_PER_PASS]:
                video = slot / "compare.mp4" if (slot / "compare.mp4").is_file() else slot / "generated.mp4"
                uri = thumbnail(video) if video.is_file() else None
                what = "ground truth | generated" if video.name == "compare.mp4" else "generated"
                cells.append(f'<figure><img alt="{_esc(slot.name)}" src="{uri}"/><figcaption>{_esc(slot.name)} '
                             f'({what})</figcaption></figure>' if uri else
                             f'<figure class="missing"><figcaption>{_esc(slot.name)}: no decodable video'
                             f'</figcaption></figure>')
            errors = "".join(f"<li>slot {e['slot']} ({_esc(e['sample_id'])}): {_esc(e['error'])}</li>"
                             for e in p["error_slots"])
            passes.append(f'<div class="pass"><h4>pass {_esc(p["pass"])}: {p["ok_slots"]} ok, '
                          f'{len(p["error_slots"])} error{"" if p["complete"] else " (incomplete)"}</h4>'
                          f'<div class="thumbs">{"".join(cells)}</div>'
                          + (f"<ul class='errors'>{errors}</ul>" if errors else "") + "</div>")
        blocks.append(f'<section class="output" data-where="{_esc(out["where"])}"><h3>{_esc(_output_title(out))}'
                      f'</h3><div class="passes">{"".join(passes)}</div></section>')
    return "".join(blocks)


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#111;background:#fff;max-width:1120px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 4px} h4{font-size:13px;font-weight:600;margin:4px 0}
table{border-collapse:collapse} td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
.launches td,.launches th{border-bottom:1px solid #eee}
.plots{display:grid;grid-template-columns:repeat(2,1fr);gap:12px}
.plot text,.shape text{font-size:11px;fill:#333}.plot .title,.shape .title{font-size:13px;font-weight:600}
.plot .marker-label,.shape .marker-label{fill:#dc2626}.shape .launch-label{fill:#1d4ed8}
.axis{stroke:#333;stroke-width:1}.grid{stroke:#e5e7eb;stroke-width:1}
.passes{display:flex;gap:8px 24px;flex-wrap:wrap}
.thumbs{display:flex;gap:10px;flex-wrap:wrap} figure{margin:0} figcaption{font-size:12px;color:#444}
img{border:1px solid #ccc;display:block} .status-failed{color:#b91c1c} .status-healthy{color:#15803d}
.errors{color:#b91c1c}
"""


def _usage(usage: dict | None) -> str | None:
    """Every launch's GPU time (world size x wall time), failed and retried ones apart."""
    if not usage or not usage.get("attempts"):
        return None
    launches = "; ".join(f"{a.get('status')}: {a.get('gpu_seconds', 0) / 3600:.4f} h ({a.get('world_size')} x "
                         f"{a.get('wall_seconds', 0):.0f} s, {a.get('device', 'gpu')})" for a in usage["attempts"])
    return f"{usage.get('gpu_seconds', 0) / 3600:.4f} GPU-hours — {launches}"


def _rows(report: dict) -> list[tuple[str, str]]:
    """The summary table: only rows with a recorded value."""
    topo, launches = report["topology"], report["launches"]
    changed = [f"launch {n['launch']}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in n["topology_changes"].items())
               for n in launches if n["topology_changes"]]
    weights, infer = report["weights"], report["action"] == "infer"
    rows = [("route", report["route"]), ("action", report["action"]), ("status", report["status"]),
            ("code", code_text(report.get("code"))), ("environment", environment_text(report["environment"])),
            ("topology", ", ".join(f"{k} {v}" for k, v in topo.items() if v is not None)
             + (f" (changed at {'; '.join(changed)})" if changed else "")),
            ("weights", weights_text({**weights, "init_sources": []} if infer else weights))]
    if infer:  # the checkpoint it generated from, with its weights role, on a row of its own
        rows.append(("checkpoint", "; ".join(source_text(s) for s in weights.get("init_sources") or [])
                     or "not recorded"))
    rows.append(("final", final_text(report)))
    if report["checkpoints"] or report["partial_checkpoints"] or report["action"] != "infer":
        rows.append(("checkpoints", f"{sum(c['valid'] for c in report['checkpoints'])} verified of "
                                    f"{len(report['checkpoints'])}; partial: {len(report['partial_checkpoints'])}"
                                    + (f"; {superseded_text(report)}" if report.get("superseded_checkpoints")
                                       else "")))
    if len(launches) > 1:
        rows.append(("launches", f"{len(launches)} (see the launch table)"))
    rows.append(("GPU time", _usage(report.get("usage"))))
    return [(k, v) for k, v in rows if v]


PLOTS = (("loss", "loss", "#2563eb", True), ("grad norm", "grad_norm", "#9333ea", True),
         ("learning rate", "lr", "#ea580c", False), ("step time (s)", "step_seconds", "#0891b2", False))


def _plots(report: dict) -> str:
    """Loss and grad norm (raw and EMA), learning rate and step time, with the later launches;
    Stage2: the critic's and the student's series in each (step time is the step's). Plots without
    data are left out."""
    s, markers = report["series"], _launch_markers(report["launches"])
    stage2 = "student_loss" in s
    plots = []
    for title, key, color, smooth in PLOTS:
        series = [{"name": "critic" if stage2 else title, "xs": s["step"], "ys": s[key], "color": color,
                   "smooth": smooth}]
        if stage2 and f"student_{key}" in s:
            series.append({"name": "student", "xs": s["step"], "ys": s[f"student_{key}"], "color": STUDENT,
                           "smooth": smooth})
        elif stage2:
            series[0]["name"] = title
        plots.append(line_plot(f"{title} (critic and student)" if stage2 and key == "loss" else title, series, markers))
    return "".join(plots)


def _launch_table(report: dict) -> str:
    launches = report["launches"]
    if len(launches) < 2:
        return ""
    shapes = {s["launch"]: s for s in (report.get("shape") or {}).get("launches") or []}
    rows = "".join(f"<tr><td>{n['launch']}</td><td>{_esc(launch_text(n))}</td><td>"
                   f"{_esc(shape_text(shapes[n['launch']])) if n['launch'] in shapes else 'not recorded'}</td></tr>"
                   for n in launches)
    return f'<h2>Launches</h2><table class="launches"><tr><th>launch</th><th>how it began, steps, changes, end' \
           f'</th><th>world, steps, wall time, how it ended</th></tr>{rows}</table>'


def page(report: dict) -> str:
    s, d = report["series"], report["diagnosis"]
    table = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in _rows(report))
    plots = _plots(report)
    line = timeline(s["checkpoints"], s["validations"], report["launches"], s["step"][-1] if s["step"] else None)
    diag = (f'<p class="status-{_esc(d["status"])}"><b>{_esc(d["status"])}</b> ({_esc(d["kind"])}): '
            f'{_esc(d["summary"])}</p>' + "".join(f"<p>{_esc(x)}</p>" for x in d["details"])
            + (f'<p>continue it: <code class="next">{_esc(d["next"]["command"])}</code></p>' if d.get("next") else ""))
    notes = "".join(f"<li>{_esc(n)}</li>" for n in report["not_verified"])
    outputs = "Generation" if report["action"] == "infer" else "Validation"
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Solar report: "
            f"{_esc(report['name'])}</title><style>{CSS}</style></head><body>"
            f"<h1>{_esc(report['name'])}</h1><p>{_esc(report['run_dir'])}</p><table>{table}</table>"
            + (f"<h2>Training curves</h2><div class=\"plots\">{plots}</div>" if plots else "")
            + (f"<h2>Timeline</h2>{line}" if line else "") + _shape_section(report) + _launch_table(report)
            + f"<h2>{outputs}</h2>{_thumbnails(report)}<h2>Diagnosis</h2>{diag}"
            f"<h2>Not verified</h2><ul>{notes}</ul></body></html>")
