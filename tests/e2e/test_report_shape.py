"""`solar report` on a real run whose first launch is killed and which resumes at another world size:
a tiny Wan Stage0.5 run at world 2 (two ranks under torchrun, a checkpoint every 3 steps) loses rank
0 at step 6 (``os._exit``, the ``exit`` drill: no end recorded), and a second launch resumes from
step 3 at world 1. The report's shape lists both launches with their world sizes and the one
interruption with its seconds; the HTML page draws it, and headless Chromium (where installed)
lays every label of that chart out inside it without overlaps."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import BROWSER, env, laid_out, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"

# Added to a copy of the page: every text box of the shape chart and the chart's frame, as JSON.
MEASURE = """<script>
addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const svg = document.querySelector('svg.shape');
  const pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify({frame: box(svg), texts: [...svg.querySelectorAll('text')].map(
    t => ({cls: t.getAttribute('class') || '', text: t.textContent, box: box(t)}))});
  document.body.appendChild(pre);
});
</script>"""


def _solar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "solar", *args], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)


def _sets(data: Path, out: Path, world: int, *extra: str) -> list[str]:
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=1000",
            f"distributed.world_size={world}", f"train.gradient_accumulation={2 // world}",
            "train.global_batch_size=2", "train.micro_batch_size=1", "train.max_steps=8", "runtime.save_every=3",
            "runtime.validate_every=0", "runtime.validation_steps=[]", *extra]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Path:
    from solar.data.synth import synthesize

    base = tmp_path_factory.mktemp("shape")
    data, out = base / "data", base / "run"
    synthesize("wan22_ti2v_5b", data, samples=4, seed=3)
    killed = train(CONFIG, _sets(data, out, 2), nproc=2, extra_env={"SOLAR_INJECT_FAULT": "exit:step=6:rank=0"})
    assert killed.returncode != 0, killed.stderr[-2000:]
    again = train(CONFIG, _sets(data, out, 1, "checkpoint.mode=full_resume",
                                f"checkpoint.path={out}/checkpoints/step_00000003"))
    assert again.returncode == 0, again.stderr[-3000:]
    return out


def test_the_report_draws_a_killed_run_resumed_at_another_world_size(resumed, tmp_path):
    proc = _solar("report", str(resumed), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)["shape"]
    assert [(s["launch"], s["world_size"], s["nodes"], s["ranks_per_node"], s["first_step"], s["last_step"], s["end"])
            for s in doc["launches"]] == [(1, 2, 1, 2, 1, 5, "killed"), (2, 1, 1, 1, 4, 8, "complete")]
    [gap] = doc["interruptions"]
    assert (gap["after_launch"], gap["previous_end"], gap["last_step"], gap["durable_step"], gap["steps_redone"],
            gap["resumed_by"], gap["recovered_step"], gap["through"]) == (1, "killed", 5, 3, 2, 2, 4, [])
    assert math.isfinite(gap["seconds"]) and 0 < gap["seconds"] < 120
    assert doc["lost_seconds"] == gap["seconds"] and doc["lost_by_end"] == {"killed": gap["seconds"]}
    # the killed launch's rank 1 (a peer error) is not evidence of the resumed, completed run
    assert json.loads(proc.stdout)["diagnosis"]["status"] == "healthy"

    text = _solar("report", str(resumed)).stdout
    assert re.search(r"^  shape: launch 1: world 2 \(1 node x 2\), steps 1-5 in [\d.]+ s, killed$", text, re.M), text
    assert re.search(r"^  shape: launch 2: world 1 \(1 node x 1\), steps 4-8 in [\d.]+ s, complete$", text, re.M)
    assert f"interruption after launch 1: killed after step 5 (checkpoint 3): 2 steps redone, {gap['seconds']:.1f} s " \
           f"until step 4 in launch 2" in text
    assert f"time lost to interruptions: {gap['seconds']:.1f} s in 1 interruption (killed" in text

    page = tmp_path / "report.html"
    assert _solar("report", str(resumed), "--html", str(page)).returncode == 0
    source = page.read_text()
    chart = re.search(r'<svg class="shape".*?</svg>', source).group(0)
    assert chart.count('class="shape-launch"') == 2 and chart.count('class="interruption"') == 1
    assert 'data-launch="1" data-world="2"' in chart and 'data-launch="2" data-world="1"' in chart
    assert f">{gap['seconds']:.1f} s<" in chart and "<script" not in source
    assert "time lost to interruptions" in source

    if BROWSER is None:
        pytest.skip("chromium is not installed: the chart's layout is not measured")
    seen = laid_out(source, MEASURE, tmp_path)
    left, top, right, bottom = seen["frame"]
    boxes = [t["box"] for t in seen["texts"]]
    for t in seen["texts"]:
        x0, y0, x1, y1 = t["box"]
        assert left - 0.5 <= x0 and x1 <= right + 0.5 and top - 0.5 <= y0 and y1 <= bottom + 0.5, t
    assert not any(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
                   for i, a in enumerate(boxes) for b in boxes[i + 1:]), seen["texts"]
    assert [t["text"] for t in seen["texts"] if t["cls"] == "launch-label"] == [
        "launch 1: world 2 (1 node x 2), killed", "launch 2: world 1 (1 node x 1), complete"]
