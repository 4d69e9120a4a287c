"""`solar report --html` read in a real browser, as an engineer reads it (issue 44): reports written
by tiny CPU runs — a resumed Stage0.5 run whose resume changes its topology (micro-batch 1 x
accumulation 2 -> 2 x 1) with many checkpoints, a Stage2 run and an inference run — are opened in
headless Chromium with a measuring script added to a copy of the page; the script reports what the
browser laid out (every label's box, tick texts, series, markers, decoded thumbnails, the page's
text) and the assertions read that, not the HTML source."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import BROWSER, env, infer, laid_out, measuring, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WAN = CONFIGS / "tiny" / "wan22_ti2v_5b"

# Added to a copy of the report (the report itself has no script): once the page has loaded, what
# the browser drew, as JSON in <pre id="measured">, which --dump-dom prints.
MEASURE = measuring("""\
  const plots = all(document, 'svg.plot').map(svg => ({
    label: svg.getAttribute('aria-label'), frame: box(svg),
    texts: all(svg, 'text').map(t => ({cls: t.getAttribute('class') || '', text: t.textContent, box: box(t)})),
    series: all(svg, 'polyline').map(p => p.getAttribute('class')),
    markers: all(svg, 'g.launch-marker').map(g => ({step: +g.dataset.step, launch: +g.dataset.launch,
                                                   title: g.querySelector('title').textContent})),
    checkpoints: all(svg, 'rect.ckpt').length,
    legend: all(svg, 'g.legend').map(g => g.textContent).join(' ')}));
  const outputs = all(document, 'section.output').map(s => ({
    where: s.dataset.where, title: s.querySelector('h3').textContent,
    images: all(s, 'img').map(i => ({natural: i.naturalWidth, shown: i.getBoundingClientRect().width}))}));
  const cells = all(document, 'td').map(td => td.textContent.trim());""",
                    "{plots, outputs, cells, text: document.body.innerText}")


def _solar(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "solar", *args], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]


def _sets(data, out, *extra):
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=1000", *extra]


@pytest.fixture(scope="module")
def runs(wan_data, tmp_path_factory):
    """Three real run directories: Stage0.5 (120 steps, a checkpoint every 2, validation at 30 and
    120, stopped at 60 and resumed with another micro-batch/accumulation split), Stage2 (the student
    updating every second step) and an inference run from the Stage0.5 run's last checkpoint."""
    base = tmp_path_factory.mktemp("report")
    s05, s2, gen = base / "stage0p5", base / "stage2", base / "infer"
    stage2 = train(WAN / "train_stage2_sgf_81f.yaml", _sets(
        wan_data, s2, "train.max_steps=6", "train.sgf.critic_updates_per_student=2", "runtime.save_every=0",
        "runtime.validate_every=0"), wait=False)  # alongside the Stage0.5 run
    common = ["train.max_steps=120", "train.global_batch_size=2", "runtime.save_every=2", "runtime.validate_every=0",
              "runtime.validation_steps=[30,120]", "validation.sample_count=1"]
    _ok(train(WAN / "train_stage0p5_fm_81f.yaml", _sets(
        wan_data, s05, *common, "train.gradient_accumulation=2", "runtime.exit_after_step=60")))
    _ok(train(WAN / "train_stage0p5_fm_81f.yaml", _sets(
        wan_data, s05, *common, "train.micro_batch_size=2", "train.gradient_accumulation=1",
        "checkpoint.mode=full_resume", f"checkpoint.path={s05}/checkpoints/step_00000060")))
    out, err = stage2.communicate(timeout=300)
    assert stage2.returncode == 0, err[-3000:]
    _ok(infer(WAN / "infer_stage0p5_fm_81f.yaml", [f"data.root={wan_data}", f"runtime.output_dir={gen}",
                                                   f"checkpoint.path={s05}/checkpoints/step_00000120"]))
    return {"stage0p5": s05, "stage2": s2, "infer": gen}


def _reported(run: Path, tmp_path: Path) -> tuple[dict, str, dict]:
    """The run's report (JSON and text) and what Chromium laid out of its HTML page."""
    if BROWSER is None:
        pytest.skip("chromium is not installed (make tools / python scripts/fetch_tools.py installs it)")
    proc = _solar("report", str(run), "--json")
    _ok(proc)
    report, text = json.loads(proc.stdout), _solar("report", str(run)).stdout
    page = tmp_path / "report.html"
    _ok(_solar("report", str(run), "--html", str(page)))
    source = page.read_text()
    assert "<script" not in source  # the report is static; the measuring script goes into a copy
    return report, text, laid_out(source, MEASURE, tmp_path)


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _plot(seen: dict, label: str) -> dict:
    return next(p for p in seen["plots"] if p["label"] == label)


def _readable(seen: dict, text: str) -> None:
    """What every report must be: each label inside its canvas, integer step ticks, no placeholder
    where a value belongs."""
    for plot in seen["plots"]:
        (left, top, right, bottom) = plot["frame"]
        for t in plot["texts"]:
            x0, y0, x1, y1 = t["box"]
            assert left - 0.5 <= x0 and x1 <= right + 0.5 and top - 0.5 <= y0 and y1 <= bottom + 0.5, (plot["label"], t)
        ticks = [t["text"] for t in plot["texts"] if t["cls"] == "xtick"]
        assert ticks and all(re.fullmatch(r"\d+", tick) for tick in ticks), (plot["label"], ticks)
        assert "no data" not in [t["text"] for t in plot["texts"]]
    for words in (seen["text"], text):
        assert not re.search(r"\bNone\b|\bnull\b", words), words
    assert all(cell not in ("", "-", "None") for cell in seen["cells"]), seen["cells"]


def test_a_resumed_run_reads_well_in_chromium(runs, tmp_path):
    report, text, seen = _reported(runs["stage0p5"], tmp_path)
    _readable(seen, text)
    assert [p["label"] for p in seen["plots"]] == ["loss", "grad norm", "learning rate", "step time (s)",
                                                   "checkpoint timeline"]

    # the 120-point loss and grad norm: raw (faint) under an EMA stated in the legend
    for label in ("loss", "grad norm"):
        plot = _plot(seen, label)
        assert sorted(c.split()[0] for c in plot["series"]) == ["raw", "smooth"], plot["series"]
        assert re.search(r"EMA \(weight 0\.\d+\), faint: raw", plot["legend"]), plot["legend"]

    # the resume at step 60, with its topology change, marked on every step axis
    launches = report["launches"]
    assert [(n["launch"], n["init_mode"], n["first_step"], n["last_step"]) for n in launches] == [
        (1, "none", 1, 60), (2, "full_resume", 61, 120)]
    assert launches[1]["topology_changes"] == {"gradient_accumulation": [2, 1], "micro_batch_size": [1, 2]}
    assert [n["attempt"]["status"] for n in launches] == ["stopped", "complete"]
    for plot in seen["plots"]:
        assert [(m["launch"], m["step"]) for m in plot["markers"]] == [(2, 61)], plot["label"]
        assert "resume from step_00000060" in plot["markers"][0]["title"]
        assert "micro_batch_size 1 -> 2" in plot["markers"][0]["title"]
        assert any(t["cls"] == "marker-label" and "topology" in t["text"] for t in plot["texts"]), plot["label"]
    assert "launch 2: resume from step_00000060, steps 61-120; topology gradient_accumulation 2 -> 1" in text

    # 60 checkpoints: a square each; labels thinned where they would overlap, the newest kept
    line = _plot(seen, "checkpoint timeline")
    labels = [t for t in line["texts"] if t["cls"] == "ckpt-label"]
    assert line["checkpoints"] == len(report["checkpoints"]) == 60
    assert not any(_overlap(a["box"], b["box"]) for i, a in enumerate(labels) for b in labels[i + 1:])
    assert not any(_overlap(a["box"], b["box"]) for a in labels for b in line["texts"] if b not in labels)
    assert 10 < len(labels) < 60 and labels[-1]["text"] == "120"

    # thumbnails for every validation step, each decoded by the browser
    assert [o["step"] for o in report["outputs"]] == [30, 120]
    assert [o["title"] for o in seen["outputs"]] == ["validation step 30: complete", "validation step 120: complete"]
    for out in seen["outputs"]:
        assert len(out["images"]) == 2 and all(i["natural"] > 0 and i["shown"] > 0 for i in out["images"])


def test_stage2_shows_the_critic_and_the_student(runs, tmp_path):
    report, text, seen = _reported(runs["stage2"], tmp_path)
    _readable(seen, text)
    s = report["series"]
    assert [x for x, y in zip(s["step"], s["student_loss"]) if y is not None] == [3, 5]
    assert all(y is not None for y in s["loss"])
    # each role on a value axis of its own (the student's loss is about 0.05, the critic's about 2)
    assert {"smooth critic", "raw critic"} == set(_plot(seen, "critic loss")["series"])
    assert {"smooth student", "raw student"} == set(_plot(seen, "student loss")["series"])
    assert {"smooth critic", "raw critic"} == set(_plot(seen, "critic grad norm")["series"])
    assert {"smooth student", "raw student"} == set(_plot(seen, "student grad norm")["series"])
    assert re.search(r"final step 6: critic loss [\d.]+, critic grad norm [\d.]+, student loss [\d.]+ "
                     r"\(its update 2, at step 5\)", text), text
    assert [p["label"] for p in seen["plots"]] == ["critic loss", "student loss", "critic grad norm",
                                                   "student grad norm", "critic learning rate",
                                                   "student learning rate", "step time (s)", "checkpoint timeline"]
    assert _plot(seen, "checkpoint timeline")["checkpoints"] == 1  # the final save


def test_an_inference_report_has_no_empty_plot_and_names_its_checkpoint(runs, tmp_path):
    report, text, seen = _reported(runs["infer"], tmp_path)
    _readable(seen, text)
    assert seen["plots"] == []  # no training curve and nothing on a step axis: no plot at all
    checkpoint = f"{runs['stage0p5']}/checkpoints/step_00000120"
    assert f"{checkpoint} (role model, weights ema)" in seen["cells"]
    assert "the generation completed: 2 slot(s) generated (model-unipc); nothing is wrong" in seen["text"]
    assert "step None" not in text and "the generation completed" in text and checkpoint in text
    assert [o["title"] for o in seen["outputs"]] == ["generation: complete"]
    assert all(i["natural"] > 0 for i in seen["outputs"][0]["images"]) and len(seen["outputs"][0]["images"]) == 2
    assert report["final"] is None and "final" not in text
