"""Running `solar train` as users do: a process, or ranks under torchrun."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import CONFIGS, REPO

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
TINY = {
    "wan22_ti2v_5b": CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml",
    "wan22_i2v_a14b": CONFIGS / "tiny" / "wan22_i2v_a14b" / "train_stage0p5_fm_81f.yaml",
    "ltx25_video": CONFIGS / "tiny" / "ltx25" / "train_stage0p5_fm_153f.yaml",
    "minimax_h3": CONFIGS / "tiny" / "minimax_h3" / "train_stage0p5_fm_158f.yaml",
}


def env(extra: dict | None = None) -> dict:
    out = {k: v for k, v in os.environ.items()
           if k not in ("SOLAR_INJECT_FAULT", "SOLAR_ALLOW_FAULTS", "SOLAR_DEBUG", "RANK", "WORLD_SIZE")}
    out.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out.update(extra or {})
    if "SOLAR_INJECT_FAULT" in out:  # drills opt in explicitly
        out.setdefault("SOLAR_ALLOW_FAULTS", "1")
    return out


def train(config: Path, sets: list[str], *, nproc: int = 1, extra_env: dict | None = None, timeout: int = 300,
          wait: bool = True):
    args = ["-m", "solar", "train", "--config", str(config)]
    for item in sets:
        args += ["--set", item]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    else:
        cmd = [sys.executable, *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=env(extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(cmd, cwd=REPO, env=env(extra_env), capture_output=True, text=True, timeout=timeout)


def infer(config: Path, sets: list[str], *, timeout: int = 600, extra_env: dict | None = None
          ) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "solar", "infer", "--config", str(config)]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, cwd=REPO, env=env(extra_env), capture_output=True, text=True, timeout=timeout)


def steps(run: Path, rank: int = 0) -> list[dict]:
    path = run / "events" / f"rank-{rank:05d}.jsonl"
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "step"]


def result(run: Path) -> dict:
    return json.loads((run / "run-result.json").read_text())


def measuring(body: str, result: str) -> str:
    """A script for ``laid_out``: once the page has loaded, ``body`` (JavaScript with ``box(element)``,
    its [left, top, right, bottom], and ``all(root, selector)`` at hand) runs and the object literal
    ``result`` is written as JSON into ``<pre id="measured">``."""
    return ("<script>\naddEventListener('load', () => {\n"
            "  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };\n"
            "  const all = (root, sel) => [...root.querySelectorAll(sel)];\n"
            f"{body}\n"
            "  const pre = document.createElement('pre');\n  pre.id = 'measured';\n"
            f"  pre.textContent = JSON.stringify({result});\n"
            "  document.body.appendChild(pre);\n});\n</script>")


def laid_out(source: str, script: str, tmp_path: Path) -> dict:
    """What headless Chromium laid out of an HTML page: ``script`` (added to a copy of the page, whose
    own source has no script) writes JSON into ``<pre id="measured">``, which --dump-dom prints."""
    measured = tmp_path / "measured.html"
    measured.write_text(source.replace("</body>", script + "</body>"))
    dom = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--window-size=1200,1800", "--virtual-time-budget=10000", "--dump-dom", measured.as_uri()],
                         capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout, re.S)
    assert dom.returncode == 0 and found, dom.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))
