"""The completion report as one self-contained HTML page: inline CSS, inline SVG plots, validation
thumbnails embedded as PNG data URIs. No script, no external resource."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

PLOT_W, PLOT_H, PAD = 520, 220, 46
THUMBS_PER_PASS = 4


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


def line_plot(title: str, xs: list, ys: list, *, color: str = "#2563eb") -> str:
    """An SVG line plot of ys against xs (None values skipped), with axes, ticks and a title."""
    points = [(x, y) for x, y in zip(xs, ys) if y is not None and x is not None and math.isfinite(y)]
    head = (f'<svg class="plot" role="img" aria-label="{_esc(title)}" viewBox="0 0 {PLOT_W} {PLOT_H}" '
            f'width="{PLOT_W}" height="{PLOT_H}" xmlns="http://www.w3.org/2000/svg">'
            f'<text x="{PLOT_W / 2}" y="16" text-anchor="middle" class="title">{_esc(title)}</text>')
    if not points:
        return head + f'<text x="{PLOT_W / 2}" y="{PLOT_H / 2}" text-anchor="middle">no data</text></svg>'
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9
    left, right, top, bottom = PAD + 10, PLOT_W - 12, 28, PLOT_H - 30

    def sx(x):
        return left + (x - x0) / (x1 - x0) * (right - left)

    def sy(y):
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    parts = [head, f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>']
    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{left - 4}" y1="{sy(t):.1f}" x2="{right}" y2="{sy(t):.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    xticks = sorted({round(t) for t in _ticks(x0, x1)}) if x1 - x0 <= 8 else _ticks(x0, x1)
    for t in xticks:
        parts.append(f'<text x="{sx(t):.1f}" y="{bottom + 16}" text-anchor="middle">{_fmt(round(t, 2))}</text>')
    parts.append(f'<text x="{(left + right) / 2}" y="{PLOT_H - 2}" text-anchor="middle" class="label">step</text>')
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    if len(points) <= 60:
        parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in points]
    return "".join(parts) + "</svg>"


def timeline(checkpoints: list[dict], validations: list[dict], last_step: int | None) -> str:
    """Checkpoint (blue) and validation (green) steps on one step axis."""
    steps = [c["step"] for c in checkpoints if c.get("step") is not None]
    vsteps = [v["step"] for v in validations if v.get("step") is not None]
    end = max([1, *(steps or [0]), *(vsteps or [0]), last_step or 0])
    w, h, left, right = PLOT_W * 2 + 20, 90, 40, PLOT_W * 2
    parts = [f'<svg class="plot" role="img" aria-label="checkpoint timeline" viewBox="0 0 {w} {h}" width="{w}" '
             f'height="{h}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" class="title">checkpoints (blue) and validations '
             f'(green) by step</text>', f'<line x1="{left}" y1="50" x2="{right}" y2="50" class="axis"/>']

    def sx(s):
        return left + s / end * (right - left)

    for s in steps:
        parts.append(f'<rect x="{sx(s) - 4:.1f}" y="34" width="8" height="14" fill="#2563eb"><title>checkpoint '
                     f'{s}</title></rect><text x="{sx(s):.1f}" y="30" text-anchor="middle">{s}</text>')
    for s in vsteps:
        parts.append(f'<circle cx="{sx(s):.1f}" cy="60" r="5" fill="#16a34a"><title>validation {s}</title></circle>')
    parts.append(f'<text x="{left}" y="80">0</text><text x="{right}" y="80" text-anchor="end">{end}</text>')
    return "".join(parts) + "</svg>"


def thumbnail(video: Path, width: int = 320) -> str | None:
    """The middle frame of a video as a PNG data URI (None when it cannot be decoded)."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(str(video)) as container:
            frames = [f for f in container.decode(video=0)]
        if not frames:
            return None
        image = frames[len(frames) // 2].to_image()
        scale = width / image.width
        image = image.resize((width, max(1, round(image.height * scale))))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
    except Exception:  # noqa: BLE001 - a broken video is reported as missing, not a crash
        return None
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _thumbnails(report: dict) -> str:
    outputs = report["outputs"]
    if not outputs:
        return "<p>No validation or generation outputs.</p>"
    root = Path(report["run_dir"])
    out = outputs[-1]  # the newest validation step (or the generation)
    blocks = [f"<p>{_esc(out['where'])}: {'complete' if out['complete'] else 'INCOMPLETE'}</p>"]
    for p in out["passes"]:
        slots = sorted((root / out["where"] / p["pass"]).glob("slot_*"))[:THUMBS_PER_PASS]
        cells = []
        for slot in slots:
            video = slot / "compare.mp4" if (slot / "compare.mp4").is_file() else slot / "generated.mp4"
            uri = thumbnail(video) if video.is_file() else None
            cells.append(f'<figure><img alt="{_esc(slot.name)}" src="{uri}"/><figcaption>{_esc(slot.name)} '
                         f'(ground truth | generated)</figcaption></figure>' if uri else
                         f'<figure class="missing"><figcaption>{_esc(slot.name)}: no decodable video'
                         f'</figcaption></figure>')
        errors = "".join(f"<li>slot {e['slot']} ({_esc(e['sample_id'])}): {_esc(e['error'])}</li>"
                         for e in p["error_slots"])
        blocks.append(f'<h3>pass {_esc(p["pass"])}: {p["ok_slots"]} ok, {len(p["error_slots"])} error'
                      f'{"" if p["complete"] else " (incomplete)"}</h3><div class="thumbs">{"".join(cells)}</div>'
                      + (f"<ul class='errors'>{errors}</ul>" if errors else ""))
    return "".join(blocks)


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#111;background:#fff;max-width:1120px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse} td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
.plots{display:grid;grid-template-columns:repeat(2,1fr);gap:12px}
.plot text{font-size:11px;fill:#333}.plot .title{font-size:13px;font-weight:600}
.axis{stroke:#333;stroke-width:1}.grid{stroke:#e5e7eb;stroke-width:1}
.thumbs{display:flex;gap:10px;flex-wrap:wrap} figure{margin:0} figcaption{font-size:12px;color:#444}
img{border:1px solid #ccc;display:block} .status-failed{color:#b91c1c} .status-healthy{color:#15803d}
.errors{color:#b91c1c}
"""


def _usage(usage: dict | None) -> str:
    """Every launch's GPU time (world size x wall time), failed and retried ones apart."""
    if not usage or not usage.get("attempts"):
        return "-"
    launches = "; ".join(f"{a.get('status')}: {a.get('gpu_seconds', 0) / 3600:.4f} h ({a.get('world_size')} x "
                         f"{a.get('wall_seconds', 0):.0f} s, {a.get('device', 'gpu')})" for a in usage["attempts"])
    return f"{usage.get('gpu_seconds', 0) / 3600:.4f} GPU-hours — {launches}"


def page(report: dict) -> str:
    s = report["series"]
    d = report["diagnosis"]
    topo, env, final = report["topology"], report["environment"], report.get("final") or {}
    rows = [("route", report["route"]), ("action", report["action"]), ("status", report["status"]),
            ("code", (report.get("code") or {}).get("revision")),
            ("environment", f"python {env['python']}, torch {env['torch']}, cuda {env['cuda']}, "
                            f"devices {', '.join(env['devices']) or 'cpu'}, host {env['host']}"),
            ("topology", ", ".join(f"{k} {v}" for k, v in topo.items())),
            ("weights", f"init {report['weights']['init_mode']}, checkpoint weights "
                        f"{report['weights']['checkpoint_weights'] or '-'}, passes "
                        + (", ".join(f"{p['name']}={p['weights']}" for p in report["weights"]["passes"]) or "-")),
            ("final", ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in final.items())
             or "-"),
            ("checkpoints", f"{sum(c['valid'] for c in report['checkpoints'])} verified of "
                            f"{len(report['checkpoints'])}; partial: {len(report['partial_checkpoints'])}"),
            ("GPU time", _usage(report.get("usage")))]
    table = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    plots = "".join(line_plot(title, s["step"], s[key], color=color) for title, key, color in (
        ("loss", "loss", "#2563eb"), ("grad norm", "grad_norm", "#9333ea"), ("learning rate", "lr", "#ea580c"),
        ("step time (s)", "step_seconds", "#0891b2")))
    last = s["step"][-1] if s["step"] else None
    diag = (f'<p class="status-{_esc(d["status"])}"><b>{_esc(d["status"])}</b> ({_esc(d["kind"])}): '
            f'{_esc(d["summary"])}</p>' + "".join(f"<p>{_esc(x)}</p>" for x in d["details"]))
    notes = "".join(f"<li>{_esc(n)}</li>" for n in report["not_verified"])
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Solar report: "
            f"{_esc(report['name'])}</title><style>{CSS}</style></head><body>"
            f"<h1>{_esc(report['name'])}</h1><p>{_esc(report['run_dir'])}</p><table>{table}</table>"
            f"<h2>Training curves</h2><div class=\"plots\">{plots}</div>"
            f"<h2>Checkpoint timeline</h2>{timeline(s['checkpoints'], s['validations'], last)}"
            f"<h2>Validation</h2>{_thumbnails(report)}<h2>Diagnosis</h2>{diag}"
            f"<h2>Not verified</h2><ul>{notes}</ul></body></html>")
