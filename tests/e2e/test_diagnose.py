"""`solar diagnose` and `solar report` on real tiny runs: every failure class produced by an opt-in
fault (SOLAR_ALLOW_FAULTS=1) or a real broken input is named with its first bad rank and step; a
healthy run is healthy; the HTML report renders in headless Chromium with non-blank plots."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.helpers import TINY, env, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CONFIG = TINY["wan22_ti2v_5b"]
TWO = ["distributed.world_size=2", "train.global_batch_size=2"]


@pytest.fixture(scope="module")
def data(wan_data):
    return wan_data


def _sets(data_root, out, *extra):
    return [f"data.root={data_root}", f"runtime.output_dir={out}", "runtime.log_every=100", "train.max_steps=4",
            "runtime.save_every=2", *extra]


def _solar(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "solar", *args], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)


def _diagnosis(out: Path) -> dict:
    proc = _solar("diagnose", str(out), "--json")
    found = json.loads(proc.stdout)
    # exit 1 for a diagnosed failure (or a degraded run), 0 for healthy / stopped / running
    assert proc.returncode == (1 if found["status"] in ("failed", "degraded") else 0), proc.stderr
    return found


@pytest.mark.parametrize("kind, nproc, fault, extra, rank, step", [
    ("non_finite", 2, "nan_batch:step=2:rank=1", TWO, 1, 2),
    ("oom", 2, "oom:step=3:rank=1", TWO, 1, 3),
    ("sp_mismatch", 2, "sp_mismatch:step=2:rank=1",
     ["distributed.world_size=2", "distributed.sequence_parallel_size=2", "train.global_batch_size=1"], 1, 2),
    ("hang", 2, "hang:step=2:rank=1",  # rank 1 stops entering collectives; rank 0 ends on the timeout
     TWO + ["distributed.timeout_seconds=10", "runtime.stop_grace_seconds=3"], 1, 2),
    ("shape", 1, "shape:step=3", [], 0, 3),
])
def test_each_injected_fault_is_named_with_its_first_bad_rank_and_step(kind, nproc, fault, extra, rank, step, data,
                                                                       tmp_path):
    out = tmp_path / "run"
    proc = train(CONFIG, _sets(data, out, *extra), nproc=nproc, extra_env={"SOLAR_INJECT_FAULT": fault})
    assert proc.returncode != 0
    found = _diagnosis(out)
    assert (found["status"], found["kind"]) == ("failed", kind), found
    assert (found["first_bad"]["rank"], found["first_bad"]["step"]) == (rank, step), found
    assert found["evidence"] and all(e["where"] and e["text"] for e in found["evidence"])
    text = _solar("diagnose", str(out)).stdout
    assert text.startswith(f"FAILED: {kind}") and "evidence:" in text
    if kind == "hang":
        assert "never entered collective error-exchange" in found["summary"]
        assert any("Timed out" in e["text"] for e in found["evidence"])  # the peers' collective timeout
    if kind == "non_finite":
        assert found["first_bad"]["sample_id"].startswith("synth-train-")
        assert found["first_bad"]["timestep"] is not None
    if kind in ("oom", "shape"):  # the rank's own traceback is captured in its log
        assert "Traceback" in (out / "logs" / f"rank-{rank:05d}.log").read_text()


def test_a_corrupt_sample_is_a_data_error_naming_the_sample(data, tmp_path):
    broken = tmp_path / "data"
    shutil.copytree(data, broken)
    rows = [json.loads(line) for line in __import__("gzip").open(broken / "train-index.jsonl.gz", "rt")]
    victim = rows[1]
    with open(broken / victim["shard"], "r+b") as fh:  # the member's safetensors header, same size
        fh.seek(victim["member_offset"] + 8)
        fh.write(b"{garbage" * 4)
    out = tmp_path / "run"
    proc = train(CONFIG, _sets(broken, out, "train.max_steps=6"))
    assert proc.returncode != 0
    found = _diagnosis(out)
    assert found["kind"] == "data" and found["first_bad"]["rank"] == 0
    assert found["first_bad"]["sample_id"] == victim["sample_id"] and found["first_bad"]["step"] >= 1


def test_a_checkpoint_that_stopped_verifying_is_a_load_failure(data, tmp_path):
    out = tmp_path / "run"
    assert train(CONFIG, _sets(data, out, "runtime.exit_after_step=2")).returncode == 0
    member = out / "checkpoints" / "step_00000002" / "model" / "live.safetensors"
    with open(member, "r+b") as fh:
        fh.seek(8)
        fh.write(b"garbage!")
    resumed = train(CONFIG, _sets(data, out, "checkpoint.mode=full_resume",
                                  f"checkpoint.path={out / 'checkpoints' / 'step_00000002'}"))
    assert resumed.returncode == 2 and "is not usable" in resumed.stderr
    found = _diagnosis(out)
    assert found["kind"] == "checkpoint_load" and found["first_bad"]["step"] == 2
    assert "model/live.safetensors" in found["summary"]


def test_a_run_killed_in_validation_is_missing_its_validation_output(data, tmp_path):
    out = tmp_path / "run"
    proc = train(CONFIG, _sets(data, out, "runtime.validate_every=2"),
                 extra_env={"SOLAR_INJECT_FAULT": "kill_validation:step=2"})
    assert proc.returncode != 0
    found = _diagnosis(out)
    assert found["kind"] == "validation_missing" and found["first_bad"]["step"] == 2
    assert found["first_bad"]["rank"] == 0 and found["first_bad"]["slot"] == 1
    assert any("was killed" in d for d in found["details"])


@pytest.fixture(scope="module")
def healthy(data, tmp_path_factory):
    """A run with validation at its last step, and a fault asked for without SOLAR_ALLOW_FAULTS=1."""
    out = tmp_path_factory.mktemp("healthy") / "run"
    proc = train(CONFIG, _sets(data, out, "runtime.validation_steps=[4]"),
                 extra_env={"SOLAR_INJECT_FAULT": "nan_batch:step=1", "SOLAR_ALLOW_FAULTS": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ignoring SOLAR_INJECT_FAULT" in proc.stderr  # faults need the explicit allowance
    return out


def test_a_healthy_run_is_reported_healthy_with_its_completion_report(healthy, tmp_path):
    found = _diagnosis(healthy)
    assert (found["status"], found["kind"]) == ("healthy", "healthy")
    proc = _solar("report", str(healthy), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == "solar.report.v1" and report["action"] == "train" and report["status"] == "complete"
    assert report["topology"]["world_size"] == 1 and report["final"]["step"] == 4
    assert report["environment"]["torch"].startswith("2.") and report["code"]["revision"]
    assert [c["step"] for c in report["checkpoints"] if c["valid"]] == [2, 4]
    assert [o["step"] for o in report["outputs"]] == [4] and all(o["complete"] for o in report["outputs"])
    assert {p["pass"]: p["compare_videos"] for p in report["outputs"][-1]["passes"]} == {"live-unipc": 2,
                                                                                         "ema-unipc": 2}
    assert report["series"]["step"] == [1, 2, 3, 4] and all(v is not None for v in report["series"]["loss"])
    assert report["weights"]["passes"] == [{"name": "live-unipc", "weights": "live"},
                                           {"name": "ema-unipc", "weights": "ema"}]
    text = _solar("report", str(healthy)).stdout
    assert "final step 4" in text and "checkpoints: 2 verified of 2" in text and "not verified:" in text
    attempts = report["usage"]["attempts"]  # the launch's GPU time (a CPU process counts as one device)
    assert [(a["status"], a["world_size"], a["device"]) for a in attempts] == [("complete", 1, "cpu")]
    assert "CPU time:" in text and "GPU time" not in text and "1 launch(es): complete" in text
    page = tmp_path / "report.html"
    assert _solar("report", str(healthy), "--html", str(page)).returncode == 0
    again = _solar("report", str(healthy), "--html", str(page))
    assert again.returncode == 2 and "never overwritten" in again.stderr  # create-only


def test_the_html_report_renders_in_headless_chromium_with_plots(healthy, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (python scripts/fetch_tools.py installs it)")
    from PIL import Image

    page = tmp_path / "report.html"
    assert _solar("report", str(healthy), "--html", str(page)).returncode == 0
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert html.count("<svg") == 5 and html.count("data:image/png;base64,") == 4  # 4 plots + timeline; 2 x 2 slots
    shot = tmp_path / "shot.png"
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", "--window-size=1200,1800", f"--screenshot={shot}",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert "Uncaught" not in proc.stderr and ":CONSOLE" not in proc.stderr
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1800)
    pixels = list(image.get_flattened_data() if hasattr(image, "get_flattened_data") else image.getdata())
    colours = {"loss": (0x25, 0x63, 0xEB), "grad norm": (0x93, 0x33, 0xEA), "lr": (0xEA, 0x58, 0x0C),
               "step time": (0x08, 0x91, 0xB2)}
    for name, rgb in colours.items():  # each plot's line is drawn
        assert sum(1 for p in pixels if p == rgb) > 100, name
    thumbs = image.crop((0, 1000, 700, 1500))
    flat = thumbs.get_flattened_data() if hasattr(thumbs, "get_flattened_data") else thumbs.getdata()
    assert len(set(flat)) > 1000  # the thumbnails are real images
