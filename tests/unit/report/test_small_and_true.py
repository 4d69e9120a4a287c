"""The report small and true (issue 53 items 3, 4 and 7), on hand-written run directories and
series: Stage2's student on a value axis of its own (one update included), an lr change drawn as a
step, long series decimated with their spikes kept, every launch marker labelled where there is
room, an extension after a completed launch not counted as time lost (and cut out of the wall-time
axis), a CPU run's time called CPU time, the thumbnails of a long run capped and sampled, and a
SolarRun's root reported stage by stage. The page in a browser: tests/e2e/test_report_released_length.py."""

from __future__ import annotations

import json
import re

import pytest

from solar.report import build, render_text, shape, stage_dirs
from solar.report.html import (PLOT_H, _launch_markers, _plots, decimate, embedded_outputs, interruption_text, line_plot, lost_text,
                               page, shape_chart, usage_text)
from tests.support.run_dirs import T0, Run, first_launch, start, step

BOTTOM, TOP = PLOT_H - 34, 58   # line_plot's plot area (y grows downwards)


def _svg(html: str, label: str) -> str:
    return re.search(rf'<svg class="plot"[^>]*aria-label="{re.escape(label)}".*?</svg>', html, re.S).group(0)


def _polyline(svg: str, cls: str) -> list[tuple[float, float]]:
    points = re.search(rf'<polyline class="{cls}" points="([^"]*)"', svg).group(1)
    return [tuple(map(float, p.split(","))) for p in points.split()]


def _stage2_series(student: dict[int, float], steps: int = 20) -> dict:
    return {"step": list(range(1, steps + 1)), "loss": [2.0 + 0.01 * (i % 3) for i in range(steps)],
            "grad_norm": [1.0] * steps, "lr": [1e-4] * steps, "step_seconds": [1.0] * steps,
            "student_loss": [student.get(n) for n in range(1, steps + 1)],
            "student_grad_norm": [0.5 if n in student else None for n in range(1, steps + 1)],
            "student_lr": [1e-5 if n in student else None for n in range(1, steps + 1)],
            "checkpoints": [], "validations": []}


# -- Stage2: each role on its own axis ----------------------------------------------------------------
def test_the_students_loss_has_an_axis_of_its_own_and_spans_it():
    """Critic about 2, student 0.05-0.1: on one linear axis the student lay flat on the x-axis; in a
    plot of its own its curve spans most of the plot's height."""
    student = {n: 0.05 + 0.05 * (n % 4) / 3 for n in range(2, 21, 2)}
    html = _plots({"series": _stage2_series(student), "launches": []})
    labels = re.findall(r'<svg class="plot"[^>]*aria-label="([^"]*)"', html)
    assert labels == ["critic loss", "student loss", "critic grad norm", "student grad norm", "critic learning rate",
                      "student learning rate", "step time (s)"]
    ys = [y for _, y in _polyline(_svg(html, "student loss"), "raw student")]
    assert max(ys) - min(ys) > 0.6 * (BOTTOM - TOP), ys       # the raw student curve spans the plot
    assert 'class="raw critic"' not in _svg(html, "student loss")


def test_a_single_student_update_is_a_visible_point():
    """The first student update (dc0c576): one point, drawn as a solid dot inside the plot."""
    html = _plots({"series": _stage2_series({5: 0.07}), "launches": []})
    svg = _svg(html, "student loss")
    dot = re.search(r'<circle class="series student" cx="([\d.]+)" cy="([\d.]+)" r="([\d.]+)"', svg)
    assert dot, svg
    x, y, r = map(float, dot.groups())
    assert 40 < x < 520 and TOP < y < BOTTOM and r >= 3
    assert re.search(r'<circle cx="[\d.]+" cy="[\d.]+" r="2.5"', _svg(html, "student learning rate"))


# -- lr as a step, long series decimated --------------------------------------------------------------
def test_an_lr_change_is_a_step_not_a_ramp():
    xs = list(range(1, 11))
    svg = line_plot("learning rate", [{"name": "lr", "xs": xs, "ys": [1e-4] * 5 + [5e-5] * 5, "color": "#000",
                                       "smooth": False, "stairs": True}])
    pts = _polyline(svg, "series lr")
    slanted = [(a, b) for a, b in zip(pts, pts[1:]) if a[0] != b[0] and a[1] != b[1]]
    assert slanted == []                                      # only flat and vertical segments
    [vertical] = [(a, b) for a, b in zip(pts, pts[1:]) if a[0] == b[0] and a[1] != b[1]]
    x5, x6 = pts[0][0] + 4 * (pts[-1][0] - pts[0][0]) / 9, pts[0][0] + 5 * (pts[-1][0] - pts[0][0]) / 9
    assert vertical[0][0] == pytest.approx((x5 + x6) / 2, abs=0.2)   # halfway between step 5 and step 6


def test_decimation_keeps_each_columns_extremes_in_order():
    xy = [(i / 10, float(i % 7)) for i in range(1000)] + [(100.05, 50.0)]
    kept = decimate(xy)
    assert len(kept) <= 4 * 101 and kept[0] == xy[0] and kept[-1] == xy[-1]
    assert (100.05, 50.0) in kept and max(y for _, y in kept) == 50.0 and min(y for _, y in kept) == 0.0
    assert [x for x, _ in kept] == sorted(x for x, _ in kept)
    assert decimate(xy[:5]) == xy[:5]


def test_a_30000_step_plot_stays_small_and_keeps_its_spike():
    n = 30_000
    ys = [1.0 + 0.001 * (i % 10) for i in range(n)]
    ys[17_000] = 9.0
    svg = line_plot("loss", [{"name": "loss", "xs": list(range(1, n + 1)), "ys": ys, "color": "#000",
                              "smooth": True}])
    assert len(svg) < 40_000, len(svg)   # drawn raw, 30,000 points make ~660 KB
    raw = _polyline(svg, "raw loss")
    assert min(y for _, y in raw) == pytest.approx(TOP, abs=0.2)     # the spike reaches the top of the plot


# -- launch markers ----------------------------------------------------------------------------------
def _launch(n: int, at: int) -> dict:
    return {"launch": n, "init_mode": "full_resume", "init_sources": [{"path": f"/r/checkpoints/step_{at - 1:08d}"}],
            "rewind": None, "restart": None, "topology_changes": {}, "config_changes": [], "attempt": None,
            "first_step": at, "last_step": at + 5, "at_step": at}


@pytest.mark.parametrize("ats, labelled", [((61, 81), 2), ((61, 71, 81), 3), ((40, 45, 50, 55), 3)])
def test_every_launch_marker_is_labelled_where_there_is_room(ats, labelled):
    """Three launches 10 steps apart (about 40 px) are each labelled (a second and third row of
    labels); four 5 steps apart leave one label out (its line's tooltip names it)."""
    launches = [{**_launch(1, 1), "init_mode": "none"}, *(_launch(i + 2, at) for i, at in enumerate(ats))]
    svg = line_plot("loss", [{"name": "loss", "xs": list(range(1, 121)), "ys": [1.0] * 120, "color": "#000",
                              "smooth": False}], _launch_markers(launches))
    labels = re.findall(r'<text class="marker-label[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    assert len(labels) == labelled and len(set(t for _, _, t in labels)) == labelled
    assert svg.count('<g class="launch-marker"') == len(ats) and svg.count("<title>launch ") == len(ats)
    boxes = [(float(x) - len(t) * 11 * 0.32, float(y), float(x) + len(t) * 11 * 0.32) for x, y, t in labels]
    for i, a in enumerate(boxes):             # no two labels of one row overlap
        for b in boxes[i + 1:]:
            assert a[1] != b[1] or a[2] <= b[0] or b[2] <= a[0], (a, b)


# -- time lost: only what nobody chose ---------------------------------------------------------------
WEEK = 7 * 86400.0


def _extended(tmp_path):
    """Launch 1 completes at step 4; a week later launch 2 extends the run (steps 5-8), is killed
    after step 6, and launch 3 resumes from step 6 a minute later."""
    first = [start(0), step(1, 1, 1.0), step(2, 2, 1.0), {"event": "checkpoint", "step": 2, "time": T0 + 2.5},
             step(3, 3, 1.0), step(4, 4, 1.0), {"event": "checkpoint", "step": 4, "time": T0 + 4.5},
             {"event": "complete", "time": T0 + 5}]
    second = [start(WEEK), step(5, WEEK + 10, 1.0), step(6, WEEK + 11, 1.0),
              {"event": "checkpoint", "step": 6, "time": T0 + WEEK + 11.5}, step(7, WEEK + 12, 1.0)]
    third = [start(WEEK + 72), step(7, WEEK + 80, 1.0), step(8, WEEK + 81, 1.0), {"event": "complete",
                                                                                 "time": T0 + WEEK + 82}]
    launches = [{"launch": n, "topology": {"world_size": 1}, "attempt": None} for n in (1, 2, 3)]
    return shape.build(tmp_path, first + second + third, launches)


def test_an_extension_after_a_completed_launch_is_not_time_lost(tmp_path):
    doc = _extended(tmp_path)
    chosen, killed = doc["interruptions"]
    assert (chosen["after_launch"], chosen["previous_end"], chosen["chosen"]) == (1, "complete", True)
    assert chosen["pause"] == [T0 + 5, T0 + WEEK] and chosen["seconds"] == WEEK + 5
    assert (killed["after_launch"], killed["previous_end"], killed["chosen"], killed["seconds"]) == (2, "killed", False,
                                                                                                    68.0)
    assert doc["lost_seconds"] == 68.0 and doc["lost_by_end"] == {"killed": 68.0}
    assert doc["chosen_seconds"] == WEEK + 5
    assert lost_text(doc) == ("68.0 s in 1 interruption (killed 68.0 s); 1 extension after a completed launch not "
                              "counted (7.0 d, a person's choice)")
    assert interruption_text(chosen) == ("complete after step 4 (checkpoint 4): continued after a pause of 7.0 d: no "
                                         "step redone, 7.0 d until step 5 in launch 2 (a person's choice, not counted "
                                         "as time lost)")


def test_the_wall_time_chart_cuts_the_pause_out():
    """A week's pause drawn to scale would squash the launches into slivers at either end; the axis
    is broken instead and the launches keep their width."""
    import tempfile
    from pathlib import Path

    doc = _extended(Path(tempfile.mkdtemp()))
    svg = shape_chart(doc)
    assert svg.count('class="axis-break"') == 1 and 'data-seconds="604795"' in svg
    assert "less the pauses before extensions (breaks)" in svg and ">pause 7.0 d, extension<" in svg
    assert 'class="interruption chosen"' in svg and ">68.0 s<" in svg
    widths = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r'data-launch="(\d)" data-world="1"><title>[^<]*</title><rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"', svg)}
    assert all(w > 30 for w in widths.values()), widths   # to scale, launch 1 would be 0.0003 px wide
    # without the cut the same launches are slivers: what the test guards against
    uncut = json.loads(json.dumps(doc))
    for g in uncut["interruptions"]:
        g["chosen"], g["pause"] = False, None
    assert "axis-break" not in shape_chart(uncut)


def test_a_completed_run_extended_reads_as_such_in_the_text(tmp_path):
    run = Run(tmp_path / "run")
    first_launch(run, last=4)
    run.launch(resume_from=4)
    run.events(start(WEEK), step(5, WEEK + 5, 0.5), step(6, WEEK + 6, 0.5), {"event": "complete", "time": T0 + WEEK + 7})
    run.result("complete", final={"step": 6, "loss": 0.5})
    text = render_text(build(run.root))
    assert "  time lost to interruptions: none; 1 extension after a completed launch not counted (7.0 d, a person's " \
           "choice)" in text, text


# -- CPU time ----------------------------------------------------------------------------------------
def test_a_cpu_run_says_cpu_time():
    cpu = {"gpu_seconds": 7200.0, "attempts": [{"status": "complete", "world_size": 2, "device": "cpu",
                                                "wall_seconds": 3600.0, "gpu_seconds": 7200.0}]}
    assert usage_text(cpu) == "CPU time: 2.0000 rank-hours in 1 launch(es): complete 2.0000 h on 2 cpu ranks"
    gpu = {"gpu_seconds": 3600.0, "attempts": [{"status": "complete", "world_size": 8, "device": "cuda",
                                                "wall_seconds": 450.0, "gpu_seconds": 3600.0}]}
    assert usage_text(gpu) == "GPU time: 1.0000 GPU-hours in 1 launch(es): complete 1.0000 h on 8 cuda"


# -- thumbnails --------------------------------------------------------------------------------------
def test_embedded_thumbnails_are_evenly_sampled_with_the_first_and_the_last():
    assert embedded_outputs(60) == [0, 20, 39, 59]
    assert embedded_outputs(3) == [0, 1, 2] and embedded_outputs(0) == []
    assert embedded_outputs(60, 6) == [0, 12, 24, 35, 47, 59]


# -- a SolarRun's root -------------------------------------------------------------------------------
def test_a_solarrun_root_is_reported_stage_by_stage(tmp_path):
    root = tmp_path / "tiny-wan"
    for name in ("fm", "anyflow"):
        run = Run(root / name, "train.max_steps=4")
        first_launch(run, last=4)
        run.result("complete", final={"step": 4, "loss": 1.0})
    (root / "logs").mkdir()
    (root / "status.json").write_text(json.dumps({"stages": [{"name": "fm"}, {"name": "anyflow"}, {"name": "sgf"}]}))
    assert [p.name for p in stage_dirs(root)] == ["fm", "anyflow"]          # the manifest's order; sgf not begun
    assert stage_dirs(root / "fm") == [] and stage_dirs(tmp_path / "nothing") == []
    report = build(root)
    assert [(s["stage"], s["status"], s["run_dir"]) for s in report["stages"]] == [
        ("fm", "complete", str(root / "fm")), ("anyflow", "complete", str(root / "anyflow"))]
    text = render_text(report)
    assert text.startswith(f"SolarRun tiny-wan ({root}): 2 stage(s): fm, anyflow\n")
    assert "\nstage fm: tiny-wan22-ti2v-5b-train-stage0p5-fm-81f: train " in text
    assert "\nstage anyflow: " in text
    html = page(report)
    assert html.count('<section class="stage"') == 2 and html.count('<svg class="plot"') >= 8


def test_solar_report_on_a_solarrun_root_from_the_command_line(tmp_path):
    """Where `solar run` points (``<workdir>/<name>``) used to say "holds no run"; each stage is
    reported, as text and as one HTML page; a directory with no run and no stage still refuses."""
    import subprocess
    import sys

    from tests.conftest import REPO

    root = tmp_path / "tiny-wan"
    for name in ("fm", "anyflow"):
        run = Run(root / name, "train.max_steps=4")
        first_launch(run, last=4)
        run.result("complete", final={"step": 4, "loss": 1.0})

    def solar(*args):
        return subprocess.run([sys.executable, "-m", "solar", "report", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    text = solar(str(root))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"SolarRun tiny-wan ({root}): 2 stage(s): anyflow, fm\n")
    html = solar(str(root), "--json", "--html", str(tmp_path / "run.html"))
    assert html.returncode == 0 and [s["stage"] for s in json.loads(html.stdout)["stages"]] == ["anyflow", "fm"]
    assert (tmp_path / "run.html").read_text().count('<section class="stage"') == 2
    (tmp_path / "empty").mkdir()
    refused = solar(str(tmp_path / "empty"))
    assert refused.returncode == 2 and "holds no run" in refused.stderr and "Traceback" not in refused.stderr
