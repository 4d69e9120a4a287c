"""`solar report --html` of runs at the released length, read in headless Chromium (issue 53 items 3
and 4): a synthetic run directory of the released Stage0.5 cadence (tests/support/released_run.py:
30,000 steps, validation every 500 with 2 passes of 4 compare videos whose thumbnails are about
100 KB each, a killed launch resumed) makes a page under 5 MB with the thumbnails of 4 validation
steps embedded and the other 56 linked; the page lays out (every label inside its plot, no two
step ticks or launch labels overlapping, no horizontal overflow). A Stage2 run of the same length
draws the student (about 0.05-0.1) on its own axis, spanning its plot's height, beside the critic
(about 2); a Stage2 run with a single student update shows it as a visible point."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.helpers import BROWSER, env, laid_out, measuring
from tests.support.released_run import EVERY, PASSES, SLOTS, STEPS, noise_video, released

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
MB = 1_000_000

MEASURE = measuring("""\
  const plots = all(document, 'svg.plot').map(svg => ({
    label: svg.getAttribute('aria-label'), frame: box(svg),
    texts: all(svg, 'text').map(t => ({cls: t.getAttribute('class') || '', text: t.textContent, box: box(t)})),
    lines: all(svg, 'polyline').map(p => ({cls: p.getAttribute('class'), box: box(p)})),
    dots: all(svg, 'circle.series').map(c => ({cls: c.getAttribute('class'), box: box(c)})),
    axis: all(svg, 'line.axis').map(box)}));
  const images = all(document, 'img').map(i => ({natural: i.naturalWidth, shown: i.getBoundingClientRect().width}));""",
                    "{plots, images, links: all(document, 'a.video').length, "
                    "width: document.documentElement.scrollWidth, text: document.body.innerText}")


def _html(run: Path, page: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "solar", "report", str(run), "--html", str(page)], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return page.read_text()


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    base = tmp_path_factory.mktemp("released")
    video = noise_video(base / "noise.mp4")
    out = {}
    for name, kwargs in (("stage0p5", {"video": video}), ("stage2", {"stage2": True}),
                         ("one-update", {"stage2": True, "steps": 7})):
        run = released(base / name, **kwargs).root
        page = base / "reports" / f"{name}.html"
        page.parent.mkdir(exist_ok=True)
        out[name] = (page, _html(run, page))
    return out


def _inside(plot: dict, box: list[float]) -> bool:
    left, top, right, bottom = plot["frame"]
    return left - 0.5 <= box[0] and box[2] <= right + 0.5 and top - 0.5 <= box[1] and box[3] <= bottom + 0.5


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _seen(pages, name: str, tmp_path: Path) -> dict:
    if BROWSER is None:
        pytest.skip("chromium is not installed (make tools / python scripts/fetch_tools.py installs it)")
    return laid_out(pages[name][1], MEASURE, tmp_path)


def test_a_released_length_page_stays_small_with_sampled_thumbnails(pages):
    page, source = pages["stage0p5"]
    validations = STEPS // EVERY
    assert page.stat().st_size < 5 * MB, page.stat().st_size
    images = re.findall(r'<img alt="slot_\d+" src="(data:image/png;base64,[^"]+)"', source)
    per_step = len(PASSES) * SLOTS
    assert len(images) == 4 * per_step                                   # 4 of the 60 validation steps
    assert sum(map(len, images)) / len(images) > 90_000                  # thumbnails the size the issue measured
    embedded = re.findall(r'<section class="output" data-where="validation/step_(\d+)"', source)
    assert [int(s) for s in embedded] == [500, 10_500, 20_000, 30_000]   # the first, the last, evenly between
    links = re.findall(r'<a class="video" href="([^"]+)"', source)
    assert len(links) == (validations - 4) * per_step
    assert all(not href.startswith("/") and (page.parent / href).resolve().is_file() for href in links[:5] + links[-5:])
    assert links[0] == "../stage0p5/validation/step_00001000/ema-unipc/slot_000000/compare.mp4"
    assert "Thumbnails of 4 of 60 validation steps (the first, the last and evenly between)" in source
    assert "CPU time" in source and "GPU time" not in source


def test_the_released_length_page_lays_out_in_chromium(pages, tmp_path):
    seen = _seen(pages, "stage0p5", tmp_path)
    assert seen["width"] <= 1200                                         # nothing wider than the window
    assert [p["label"] for p in seen["plots"]] == ["loss", "grad norm", "learning rate", "step time (s)",
                                                   "checkpoint timeline"]
    for plot in seen["plots"]:
        assert all(_inside(plot, t["box"]) for t in plot["texts"]), plot["label"]
        assert all(_inside(plot, line["box"]) for line in plot["lines"]), plot["label"]
        for kind in ("xtick", "ckpt-label", "marker-label"):
            boxes = [t["box"] for t in plot["texts"] if t["cls"].split()[:1] == [kind]]
            assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), (plot["label"], kind)
        if plot["label"] != "checkpoint timeline":
            assert [t["text"] for t in plot["texts"] if t["cls"].startswith("marker-label")] == ["launch 2 (resume)"]
    # the embedded thumbnails decode; the page names the interruption and the thumbnails it left out
    assert len(seen["images"]) == 32 and all(i["natural"] > 0 and i["shown"] > 0 for i in seen["images"])
    assert seen["links"] == 56 * 8
    assert "time lost to interruptions: 121.0 s in 1 interruption (killed 121.0 s)" in seen["text"]


def test_stage2_draws_the_student_on_its_own_axis(pages, tmp_path):
    seen = _seen(pages, "stage2", tmp_path)
    labels = [p["label"] for p in seen["plots"]]
    assert labels[:2] == ["critic loss", "student loss"], labels
    for label in ("critic loss", "student loss"):
        plot = next(p for p in seen["plots"] if p["label"] == label)
        role = label.split()[0]
        [raw] = [line["box"] for line in plot["lines"] if line["cls"] == f"raw {role}"]
        [axis] = [a for a in plot["axis"] if a[0] == a[2]]               # the value axis: a vertical line
        assert raw[3] - raw[1] > 0.6 * (axis[3] - axis[1]), (label, raw, axis)   # spans the plot's height
        assert all(_inside(plot, t["box"]) for t in plot["texts"]), label
    student = next(p for p in seen["plots"] if p["label"] == "student loss")
    ticks = [float(t["text"]) for t in student["texts"] if t["cls"] == "ytick"]
    assert 0.04 <= min(ticks) and max(ticks) <= 0.11, ticks             # the student's own scale, not the critic's


def test_a_single_student_update_is_a_visible_point(pages, tmp_path):
    seen = _seen(pages, "one-update", tmp_path)
    student = next(p for p in seen["plots"] if p["label"] == "student loss")
    [dot] = student["dots"]
    x0, y0, x1, y1 = dot["box"]
    assert dot["cls"] == "series student" and x1 - x0 >= 6 and y1 - y0 >= 6
    assert _inside(student, dot["box"])
