"""The completion report as one self-contained HTML page: inline CSS, inline SVG plots, validation
thumbnails embedded as PNG data URIs (those of at most ``EMBEDDED_OUTPUTS`` validation steps, evenly
sampled with the first and the last, within ``THUMB_BUDGET`` bytes; the other videos are linked
relative to the page). No script; nothing loaded from elsewhere.

Stage2's critic and student each get plots of their own (the student's loss, about 0.05, would lie
flat on the critic's axis, about 2). The learning rate is held between steps (a change is a step);
series longer than a plot is wide are decimated per pixel column, extremes kept.

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
import os
from pathlib import Path

PLOT_W, PLOT_H = 520, 240
TIMELINE_W, TIMELINE_H = PLOT_W * 2 + 20, 140
FONT = 11  # px, the plots' text size (CSS below)
THUMBS_PER_PASS = 4
EMBEDDED_OUTPUTS = 4         # validation steps whose thumbnails are embedded; the others are linked
THUMB_BUDGET = 3_500_000     # bytes of embedded thumbnails (data URIs) at most, whatever their size
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


def span_text(seconds: float) -> str:
    """A long duration in the unit that reads: ``42.0 s``, ``12.5 min``, ``3.2 h``, ``7.0 d``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return _seconds(seconds)


def interruption_text(g: dict) -> str:
    """An interruption (``shape.interruptions``): how the launch before it ended, where, what was
    repeated and how long until a later launch trained past the newest checkpoint; after a launch
    that completed, the extension a person chose (not time lost)."""
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
    took = span_text if g.get("chosen") else _seconds   # an extension may come days later
    parts.append(f"{took(g['seconds'])} {until}" if g["seconds"] is not None else f"{until} (time not recorded)")
    through = g["through"]
    if through:
        parts.append(f"launch{'es' if len(through) > 1 else ''} {', '.join(map(str, through))} ended before "
                     f"getting there")
    if g.get("chosen"):   # the run had completed: a person extended it (or took it back on purpose)
        pause = g.get("pause")
        paused = f" after a pause of {span_text(pause[1] - pause[0])}" if pause else ""
        return f"{parts[0]}: continued{paused}: " + ", ".join(parts[1:]) + \
            " (a person's choice, not counted as time lost)"
    return f"{parts[0]}: " + ", ".join(parts[1:])


def lost_text(shape_doc: dict) -> str:
    """The seconds all interruptions cost, by how the launch before each ended (``shape.build``);
    the extensions after a completed launch are a person's choice, named apart and not counted."""
    chosen = [g for g in shape_doc["interruptions"] if g.get("chosen")]
    gaps = [g for g in shape_doc["interruptions"] if not g.get("chosen")]
    counted = [g for g in gaps if g["seconds"] is not None]
    left = len(gaps) - len(counted)
    extended = (f"{len(chosen)} extension{'s' if len(chosen) != 1 else ''} after a completed launch not counted "
                f"({span_text(shape_doc.get('chosen_seconds') or 0.0)}, a person's choice)") if chosen else ""
    if not counted and not left:
        return f"none; {extended}" if extended else "none"
    if not counted:
        return f"none counted ({left} interruption{'s' if left != 1 else ''} not recovered or not timed)" \
            + (f"; {extended}" if extended else "")
    by_end = ", ".join(f"{end} {_seconds(seconds)}" for end, seconds in shape_doc["lost_by_end"].items())
    text = f"{_seconds(shape_doc['lost_seconds'])} in {len(counted)} interruption{'s' if len(counted) != 1 else ''}" \
        f" ({by_end})"
    return text + (f"; {left} more not counted (not recovered or not timed)" if left else "") \
        + (f"; {extended}" if extended else "")


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


def _marker_svg(m: dict, x: float, top: float, bottom: float, label: tuple[float, float, bool] | None) -> str:
    """A launch's dashed line at x with its label centred at ``label`` (x, y, whether it lies over
    the plot: then with a white halo; left out when there was no room)."""
    text = (f'<text class="marker-label{" inner" if label[2] else ""}" x="{label[0]:.1f}" y="{label[1]}" '
            f'text-anchor="middle">{_esc(m["label"])}</text>') if label else ""
    return (f'<g class="launch-marker" data-launch="{m["launch"]}" data-step="{m["step"]}"><title>{_esc(m["title"])}'
            f'</title><line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{LAUNCH}" stroke-width="1.2" '
            f'stroke-dasharray="4 3"/>{text}</g>')


def _marker_labels(marks: list[dict], xs: list[float], lo: float, hi: float, rows: list[tuple[float, bool]],
                   beside: bool, gap: float = 6) -> dict[int, tuple[float, float, bool]]:
    """Each launch's label (x centre, y, over the plot), placed where there is room: on the first of
    ``rows`` (y, over the plot) where it overlaps no label placed before it, beside its line (right
    of it, else left) or centred under it. A label with no room anywhere is left out (the line's
    tooltip still names the launch)."""
    placed: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(rows))}
    out = {}
    for m, x in zip(marks, xs):
        half = _width(m["label"]) / 2
        centres = [x + 3 + half, x - 3 - half] if beside else [x]
        for i, (y, inner) in enumerate(rows):
            spot = next((c for c in (min(max(c, lo + half), hi - half) for c in centres)
                         if all(c + half + gap <= a or b + gap <= c - half for a, b in placed[i])), None)
            if spot is not None:
                placed[i].append((spot - half, spot + half))
                out[m["launch"]] = (spot, y, inner)
                break
    return out


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
    labels = _marker_labels(marks, xs, left, right, [(top - 8, False), (top + 12, True), (top + 26, True)],
                            beside=True)
    parts += [_marker_svg(m, x, top - 4, bottom, labels.get(m["launch"])) for m, x in zip(marks, xs)]
    return "".join(parts) + "</svg>"


def decimate(xy: list[tuple[float, float]], width: float = 1.0) -> list[tuple[float, float]]:
    """Screen points thinned to what a line through them shows: per ``width`` px column the first,
    lowest, highest and last point, in order (a spike stays; 30,000 steps become a few hundred
    columns of at most four points each)."""
    if len(xy) <= 8:
        return list(xy)
    out, column = [], []

    def flush():
        if column:
            keep = {0, len(column) - 1, min(range(len(column)), key=lambda i: column[i][1]),
                    max(range(len(column)), key=lambda i: column[i][1])}
            out.extend(column[i] for i in sorted(keep))

    edge = None
    for x, y in xy:
        col = math.floor(x / width)
        if col != edge:
            flush()
            column, edge = [], col
        column.append((x, y))
    flush()
    return out


def _stairs(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A value held until the next one, which begins halfway between the two points: a change
    (an lr accepted at a resume) is a step, not a ramp from one step to the next."""
    out = []
    for i, (x, y) in enumerate(xy):
        if i:
            mid = (xy[i - 1][0] + x) / 2
            out += [(mid, xy[i - 1][1]), (mid, y)]
        out.append((x, y))
    return out


def _points(xy: list[tuple[float, float]]) -> str:
    """SVG points, a point drawn where the one before it was left out."""
    out: list[str] = []
    for x, y in xy:
        text = f"{x:.1f},{y:.1f}"
        if not out or out[-1] != text:
            out.append(text)
    return " ".join(out)


def _curve(s: dict, sx, sy) -> list[str]:
    """One series: its raw points, and over them (when smoothed) the EMA as the solid line; a
    ``stairs`` series (the learning rate) held between its points; long series decimated to
    the plot's pixel columns (``decimate``)."""
    pts, color, cls = s["points"], s["color"], _esc(s["name"])
    screen = [(sx(x), sy(y)) for x, y in pts]
    raw = _points(decimate(_stairs(screen) if s.get("stairs") else screen))
    if not s.get("smooth"):
        out = [f'<polyline class="series {cls}" points="{raw}" fill="none" stroke="{color}" stroke-width="2"/>']
        if len(pts) <= 60:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
        return out
    if len(pts) < 2:   # no line to draw yet (Stage2's student after its first update): a solid point
        return [f'<circle class="series {cls}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"/>'
                for x, y in pts]
    smooth = _points(decimate([(sx(x), sy(y)) for (x, _), y in zip(pts, ema([y for _, y in pts], s["weight"]))]))
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
    labels = _marker_labels(marks, xs, 0, w, [(axis + 46, False), (axis + 60, False)], beside=False)
    parts += [_marker_svg(m, x, axis - 16, axis + 16, labels.get(m["launch"])) for m, x in zip(marks, xs)]
    parts.append(f'<text x="{w / 2}" y="{h - 5}" text-anchor="middle" class="label">step</text>')
    return "".join(parts) + "</svg>"


def _time_unit(span: float) -> tuple[str, float]:
    """Seconds for up to 10 minutes, minutes up to 10 hours, hours beyond: integer ticks in each."""
    return ("s", 1.0) if span <= 600 else ("min", 60.0) if span <= 36000 else ("h", 3600.0)


BREAK_W = 26  # px: a pause cut out of the wall-time axis


class _WallAxis:
    """Wall time onto x with each pause (``[from, to]``: a completed launch's end to its extension's
    start) cut out and drawn as a break ``BREAK_W`` px wide: a week's pause neither squashes the
    launches around it nor reads as training time. ``t`` values are epoch seconds; ``ticks`` are
    in the unit of the time left after the cuts."""

    def __init__(self, t0: float, t1: float, pauses: list[list[float]], left: float, right: float) -> None:
        self.t0, self.left = t0, left
        self.cuts = sorted((max(a, t0), min(b, t1)) for a, b in pauses if b > a and a < t1 and b > t0)
        self.unit, self.scale = _time_unit(self.shown(t1))
        self.span = max(self.shown(t1) / self.scale, 1e-9)
        self.width = max(right - left - BREAK_W * len(self.cuts), 1.0)

    def shown(self, t: float) -> float:
        """Seconds since t0 less the pauses before t."""
        return t - self.t0 - sum(min(max(t - a, 0.0), b - a) for a, b in self.cuts)

    def x(self, t: float) -> float:
        before = sum(1.0 if t >= b else max(0.0, (t - a) / (b - a)) for a, b in self.cuts if t > a)
        return self.left + self.shown(t) / self.scale / self.span * self.width + BREAK_W * before

    def tick_x(self, value: float) -> float:
        """x of ``value`` (in the unit) on the axis: after every break whose place it is past."""
        places = [self.shown(a) / self.scale for a, _ in self.cuts]
        return self.left + value / self.span * self.width + BREAK_W * sum(1 for p in places if value > p)

    def breaks(self) -> list[tuple[float, float, float, float]]:
        """Each cut: (x where it begins, x where it ends, from, to)."""
        return [(self.x(a), self.x(b), a, b) for a, b in self.cuts]


def shape_chart(shape_doc: dict) -> str:
    """The run's shape over wall time: each launch a step of its world size from its start to its
    last event (labelled above the plot with its nodes where known and how it ended; the full line
    is its tooltip), each interruption shaded red from the end of the launch before it to the step
    that got past the newest checkpoint, labelled with the seconds it cost. An extension after a
    completed launch is a person's choice: shaded grey, labelled as a pause, its idle time cut out
    of the axis (a break, ``_WallAxis``). "" with fewer than two launches or none whose times were
    recorded."""
    placed = [s for s in shape_doc["launches"] if s["started"] is not None and s["ended"] is not None]
    if len(shape_doc["launches"]) < 2 or not placed:
        return ""
    gaps = [g for g in shape_doc["interruptions"] if g["began"] is not None]
    t0 = min(s["started"] for s in placed)
    t1 = max([s["ended"] for s in placed] + [g["recovered_at"] for g in gaps if g["recovered_at"] is not None])
    top_world = max([1, *(s["world_size"] for s in placed if s["world_size"] is not None)])
    yticks = int_ticks(0, top_world, 4)
    w, h = TIMELINE_W, 200
    left = 10 + max(_width(str(t)) for t in yticks) + 6
    right, top, bottom = w - 24, 58, h - 40  # two label rows above the plot: launches, interruptions
    axis = _WallAxis(t0, t1, [g["pause"] for g in gaps if g.get("chosen") and g.get("pause")], left, right)
    sx = axis.x

    def sy(world):
        return bottom - world / top_world * (bottom - top)

    first = min(placed, key=lambda s: s["started"])["launch"]
    cut = ", less the pauses before extensions (breaks)" if axis.cuts else ""
    parts = [f'<svg class="shape" role="img" aria-label="run shape over time" viewBox="0 0 {w} {h}" width="{w}" '
             f'height="{h}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" class="title">world size over wall time: launches (blue)'
             f' and interruptions (red, with the time each cost)</text>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>']
    edges = [left, *[v for x0, x1, _, _ in axis.breaks() for v in (x0, x1)], right]
    parts += [f'<line x1="{a:.1f}" y1="{bottom}" x2="{b:.1f}" y2="{bottom}" class="axis"/>'
              for a, b in zip(edges[::2], edges[1::2])]
    for v in yticks:
        parts.append(f'<line x1="{left - 4}" y1="{sy(v):.1f}" x2="{right}" y2="{sy(v):.1f}" class="grid"/>'
                     f'<text class="ytick" x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v}</text>')
    ticks = [(axis.tick_x(t), str(t)) for t in int_ticks(0, axis.span, _fitting(axis.span, axis.width))]
    for x, t in _thin(ticks, left, right):
        parts.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 3}" class="axis"/>'
                     f'<text class="xtick" x="{x:.1f}" y="{bottom + 15}" text-anchor="middle">{t}</text>')
    parts.append(f'<text x="{(left + right) / 2}" y="{h - 5}" text-anchor="middle" class="label">wall time since '
                 f'launch {first} began ({axis.unit}){cut}</text>')
    gap_labels = []
    for g in gaps:
        x0 = sx(g["began"])
        x1 = sx(g["recovered_at"]) if g["recovered_at"] is not None else right
        chosen = bool(g.get("chosen"))
        if chosen:
            pause = g.get("pause")
            text = f"pause {span_text(pause[1] - pause[0])}, extension" if pause else "extension"
        else:
            text = _seconds(g["seconds"]) if g["seconds"] is not None else "not recovered"
        gap_labels.append(((x0 + x1) / 2, text))
        parts.append(f'<g class="interruption{" chosen" if chosen else ""}" data-after="{g["after_launch"]}"><title>'
                     f'{"extension" if chosen else "interruption"} after launch {g["after_launch"]}: '
                     f'{_esc(interruption_text(g))}</title><rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 2):.1f}" '
                     f'height="{bottom - top}" fill="{"#6b7280" if chosen else LAUNCH}" fill-opacity="0.15"/></g>')
    for x0, x1, a, b in axis.breaks():  # the cut: two slanted strokes across the axis
        parts.append(f'<g class="axis-break" data-seconds="{b - a:.0f}"><title>{span_text(b - a)} cut out of the axis: '
                     f'no launch ran (a completed run waiting for its extension)</title>'
                     + "".join(f'<line x1="{x - 3:.1f}" y1="{bottom + 6}" x2="{x + 3:.1f}" y2="{bottom - 6}" '
                               f'stroke="#333" stroke-width="1.2"/>' for x in (x0 + 4, x1 - 4)) + "</g>")
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


def embedded_outputs(n: int, most: int = EMBEDDED_OUTPUTS) -> list[int]:
    """Which of ``n`` validation steps get embedded thumbnails: all up to ``most``, else ``most``
    of them evenly spaced, the first and the last included."""
    if n <= most:
        return list(range(n))
    if most <= 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def _link(path: Path, base: Path | None) -> str:
    """A file's address from the report: relative to the report's folder, else a file URI."""
    if base is not None:
        try:
            return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()
        except ValueError:   # another drive
            pass
    return path.resolve().as_uri()


def _thumbnails(report: dict, base: Path | None = None) -> str:
    """Every validation step's (or the generation's) passes, up to THUMBS_PER_PASS slots each: as
    embedded thumbnails for at most ``EMBEDDED_OUTPUTS`` steps (evenly spaced, the first and the
    last included) while the embedded images stay under ``THUMB_BUDGET`` bytes, and as links to the
    videos (relative to the report's folder ``base``) for the others, so that the page of a
    released-length run (60 validation steps) stays a few MB."""
    if not report["outputs"]:
        return "<p>No validation or generation outputs.</p>"
    root, blocks = Path(report["run_dir"]), []
    chosen, spent = set(embedded_outputs(len(report["outputs"]))), 0
    shown = 0
    for n, out in enumerate(report["outputs"]):
        embed = n in chosen and spent < THUMB_BUDGET
        shown += embed
        passes = []
        for p in out["passes"]:
            cells = []
            for slot in sorted((root / out["where"] / p["pass"]).glob("slot_*"))[:THUMBS_PER_PASS]:
                video = slot / "compare.mp4" if (slot / "compare.mp4").is_file() else slot / "generated.mp4"
                what = "ground truth | generated" if video.name == "compare.mp4" else "generated"
                if not embed:
                    cells.append(f'<a class="video" href="{_esc(_link(video, base))}">{_esc(slot.name)}</a>'
                                 if video.is_file() else f'<span class="missing">{_esc(slot.name)}: no video</span>')
                    continue
                uri = thumbnail(video) if video.is_file() else None
                if uri and spent + len(uri) > THUMB_BUDGET:   # over the budget: linked like the others
                    cells.append(f'<a class="video" href="{_esc(_link(video, base))}">{_esc(slot.name)}</a>')
                    continue
                spent += len(uri or "")
                cells.append(f'<figure><a href="{_esc(_link(video, base))}"><img alt="{_esc(slot.name)}" src="{uri}"/>'
                             f'</a><figcaption>{_esc(slot.name)} ({what})</figcaption></figure>' if uri else
                             f'<figure class="missing"><figcaption>{_esc(slot.name)}: no decodable video'
                             f'</figcaption></figure>')
            errors = "".join(f"<li>slot {e['slot']} ({_esc(e['sample_id'])}): {_esc(e['error'])}</li>"
                             for e in p["error_slots"])
            passes.append(f'<div class="pass"><h4>pass {_esc(p["pass"])}: {p["ok_slots"]} ok, '
                          f'{len(p["error_slots"])} error{"" if p["complete"] else " (incomplete)"}</h4>'
                          f'<div class="{"thumbs" if embed else "links"}">{"".join(cells)}</div>'
                          + (f"<ul class='errors'>{errors}</ul>" if errors else "") + "</div>")
        blocks.append(f'<section class="output{"" if embed else " linked"}" data-where="{_esc(out["where"])}">'
                      f'<h3>{_esc(_output_title(out))}</h3><div class="passes">{"".join(passes)}</div></section>')
    note = "" if shown == len(report["outputs"]) else (
        f'<p class="thumb-note">Thumbnails of {shown} of {len(report["outputs"])} validation steps (the first, the '
        f'last and evenly between); the others link to their videos.</p>')
    return note + "".join(blocks)


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#111;background:#fff;max-width:1120px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 4px} h4{font-size:13px;font-weight:600;margin:4px 0}
table{border-collapse:collapse} td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
.launches td,.launches th{border-bottom:1px solid #eee}
.plots{display:grid;grid-template-columns:repeat(2,1fr);gap:12px}
.plot text,.shape text{font-size:11px;fill:#333}.plot .title,.shape .title{font-size:13px;font-weight:600}
.plot .marker-label,.shape .marker-label{fill:#dc2626}
.plot .marker-label.inner{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}.shape .launch-label{fill:#1d4ed8}
.axis{stroke:#333;stroke-width:1}.grid{stroke:#e5e7eb;stroke-width:1}
.passes{display:flex;gap:8px 24px;flex-wrap:wrap}
.thumbs{display:flex;gap:10px;flex-wrap:wrap} figure{margin:0} figcaption{font-size:12px;color:#444}
.links{display:flex;gap:4px 12px;flex-wrap:wrap;font-size:12px} .output.linked h3{font-weight:600;font-size:13px}
img{border:1px solid #ccc;display:block} .status-failed{color:#b91c1c} .status-healthy{color:#15803d}
.errors{color:#b91c1c}
"""


def usage_kind(usage: dict | None) -> tuple[str, str]:
    """What a run's usage measured (``run-result.json`` counts world size x wall time on whatever
    device each launch ran on): ("GPU time", "GPU-hours"); on the CPU alone ("CPU time",
    "rank-hours": processes x wall time, not core time); both ("GPU and CPU time", "device-hours")."""
    devices = {a.get("device") or "cuda" for a in (usage or {}).get("attempts") or []}
    if devices == {"cpu"}:
        return "CPU time", "rank-hours"
    return ("GPU and CPU time", "device-hours") if "cpu" in devices else ("GPU time", "GPU-hours")


def _ranks(a: dict) -> str:
    world, device = a.get("world_size"), a.get("device") or "gpu"
    if device == "cpu":
        return f"{world} cpu rank{'s' if world != 1 else ''}"
    return f"{world} {device}"


def usage_text(usage: dict) -> str:
    """The text report's line: the total, then each launch's share and where it ran."""
    kind, unit = usage_kind(usage)
    attempts = ", ".join(f"{a.get('status')} {a.get('gpu_seconds', 0) / 3600:.4f} h on {_ranks(a)}"
                         for a in usage["attempts"])
    return (f"{kind}: {usage.get('gpu_seconds', 0) / 3600:.4f} {unit} in {len(usage['attempts'])} launch(es): "
            f"{attempts}")


def _usage(usage: dict | None) -> str | None:
    """Every launch's GPU (or CPU) time (world size x wall time), failed and retried ones apart."""
    if not usage or not usage.get("attempts"):
        return None
    launches = "; ".join(f"{a.get('status')}: {a.get('gpu_seconds', 0) / 3600:.4f} h ({_ranks(a)} x "
                         f"{a.get('wall_seconds', 0):.0f} s)" for a in usage["attempts"])
    return f"{usage.get('gpu_seconds', 0) / 3600:.4f} {usage_kind(usage)[1]} — {launches}"


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
    rows.append((usage_kind(report.get("usage"))[0], _usage(report.get("usage"))))
    return [(k, v) for k, v in rows if v]


PLOTS = (("loss", "loss", "#2563eb", True), ("grad norm", "grad_norm", "#9333ea", True),
         ("learning rate", "lr", "#ea580c", False), ("step time (s)", "step_seconds", "#0891b2", False))


def _plots(report: dict) -> str:
    """Loss and grad norm (raw and EMA), learning rate (held between steps: a change is a step)
    and step time, with the later launches. Stage2: the critic's and the student's each in a plot
    of its own, side by side, so that each has its own value axis (the student's loss, about 0.05,
    would lie flat on the critic's, about 2); the step time is the step's. Plots without data are
    left out."""
    s, markers = report["series"], _launch_markers(report["launches"])
    plots = []
    for title, key, color, smooth in PLOTS:
        roles = [("", key, color)]
        if "student_loss" in s:
            roles = [("critic ", key, color), ("student ", f"student_{key}", STUDENT)] if f"student_{key}" in s \
                else [("", key, color)]
        for role, field, colour in roles:
            name = f"{role}{title}"
            plots.append(line_plot(name, [{"name": role.strip() or title, "xs": s["step"], "ys": s[field],
                                           "color": colour, "smooth": smooth, "stairs": key == "lr"}], markers))
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


def page(report: dict, base: Path | None = None) -> str:
    """The page; ``base``: the folder it will be written to (links to videos are relative to it). A
    SolarRun root's report (``stages``) is one page with a part per stage."""
    if "stages" in report:
        names = ", ".join(st["stage"] for st in report["stages"])
        parts = "".join(f'<section class="stage" data-stage="{_esc(st["stage"])}"><h1 class="stage">stage '
                        f'{_esc(st["stage"])}: {_esc(st["name"])}</h1>{_body(st, base)}</section>'
                        for st in report["stages"])
        return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Solar report: "
                f"{_esc(report['name'])}</title><style>{CSS}</style></head><body><h1>SolarRun {_esc(report['name'])}"
                f"</h1><p>{_esc(report['run_root'])}: {len(report['stages'])} stage(s) ({_esc(names)})</p>"
                f"{parts}</body></html>")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Solar report: "
            f"{_esc(report['name'])}</title><style>{CSS}</style></head><body>"
            f"<h1>{_esc(report['name'])}</h1>{_body(report, base)}</body></html>")


def _body(report: dict, base: Path | None) -> str:
    s, d = report["series"], report["diagnosis"]
    table = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in _rows(report))
    plots = _plots(report)
    line = timeline(s["checkpoints"], s["validations"], report["launches"], s["step"][-1] if s["step"] else None)
    diag = (f'<p class="status-{_esc(d["status"])}"><b>{_esc(d["status"])}</b> ({_esc(d["kind"])}): '
            f'{_esc(d["summary"])}</p>' + "".join(f"<p>{_esc(x)}</p>" for x in d["details"])
            + (f'<p>continue it: <code class="next">{_esc(d["next"]["command"])}</code></p>' if d.get("next") else ""))
    notes = "".join(f"<li>{_esc(n)}</li>" for n in report["not_verified"])
    outputs = "Generation" if report["action"] == "infer" else "Validation"
    return (f"<p>{_esc(report['run_dir'])}</p><table>{table}</table>"
            + (f"<h2>Training curves</h2><div class=\"plots\">{plots}</div>" if plots else "")
            + (f"<h2>Timeline</h2>{line}" if line else "") + _shape_section(report) + _launch_table(report)
            + f"<h2>{outputs}</h2>{_thumbnails(report, base)}<h2>Diagnosis</h2>{diag}"
            f"<h2>Not verified</h2><ul>{notes}</ul>")
