"""The memory forecast held to the product: ``solar train`` on the released configs at scaled shapes,
its peak ``torch.cuda.max_memory_allocated`` (the step events' ``memory.cuda_peak_bytes``) beside
``solar config memory``'s forecast of the same config and edits.

Each case synthesizes data at the config's resolution (``solar data synth --profile released``,
cached per family), starts ``python -m solar train`` (world 1, unsharded, no validation, no save),
waits for its third step event, and stops it (a 5B run's final save would not fit this disk).
Steady step times are recorded too.

    PYTHONPATH=trainer:. python3 bench/gpu/memory_runs.py [CASE ...]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/solar-memory"))
WAN = "configs/solar_wm/wan22_ti2v_5b"
COMMON = ["distributed.world_size=1", "distributed.sharding=none", "train.global_batch_size=1",
          "runtime.validate_every=0", "runtime.validation_steps=[]", "runtime.save_every=0", "runtime.log_every=1",
          "model.pretrained_path=", "model.vae_path=", "checkpoint.mode=none", "train.max_steps=1000",
          "data.train_index=train-index.jsonl.gz", "data.test_index=test-index.jsonl.gz"]
CASES = {
    "s05_l10_480": (f"{WAN}/train_stage0p5_fm_81f.yaml", ["model.dims.num_layers=10"]),
    "s05_153f_l10_save_attention": (f"{WAN}/train_stage0p5_fm_153f.yaml", [
        "model.dims.num_layers=10", "distributed.activation_checkpointing_policy=save_attention"]),
    "s05_l30_480": (f"{WAN}/train_stage0p5_fm_81f.yaml", []),
    "s05_l20_480_skip4": (f"{WAN}/train_stage0p5_fm_81f.yaml", [
        "model.dims.num_layers=20", "distributed.activation_checkpointing_skip_blocks=4"]),
    "s1_anyflow_l10_480": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", ["model.dims.num_layers=10",
                                                                        "checkpoint.path=null", "checkpoint.weights=null"]),
    # the student's EMA from its first update (released: 39), so the steady state is measured
    "s2_l5_480": (f"{WAN}/train_stage2_sgf_81f.yaml", ["model.dims.num_layers=5", "checkpoint.roles=null",
                                                       "train.ema.start_step=1"]),
    "s2_l10_480": (f"{WAN}/train_stage2_sgf_81f.yaml", ["model.dims.num_layers=10", "checkpoint.roles=null",
                                                        "train.ema.start_step=1"]),
}
STEPS = {"s2_l5_480": 12, "s2_l10_480": 12}  # Stage2: student updates at outer steps 6 and 11 (AdamW allocates its state at the first)


def released_data(height: int, width: int, samples: int = 4) -> Path:
    """``solar data synth --profile released`` data at this resolution (``samples`` training clips and
    a quarter of that, at least 2, test clips), made once per WORK."""
    root = WORK / (f"data-{height}x{width}" + (f"-{samples}" if samples != 4 else ""))
    if not (root / "train-index.jsonl.gz").exists():
        subprocess.run([sys.executable, "-m", "solar", "data", "synth", "--family", "wan22_ti2v_5b", "--out",
                        str(root), "--samples", str(samples), "--profile", "released"], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
    return root


def _value(sets: list[str], key: str, default: str) -> str:
    return next((s.split("=", 1)[1] for s in reversed(sets) if s.startswith(key + "=")), default)


def prepare(work: Path, name: str, extra: list[str]) -> tuple[list[str], Path]:
    """A case's ``--set`` values (COMMON, its own, its data at its resolution) and its fresh run
    directory (a case run again starts a new one)."""
    sets = COMMON + extra
    height, width = int(_value(sets, "data.height", "480")), int(_value(sets, "data.width", "864"))
    data = released_data(height, width)
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    return sets + [f"data.root={data}", f"runtime.output_dir={out}"], out


def run(name: str) -> dict:
    from solar.config import memory
    from solar.config.resolve import resolve_file

    config, extra = CASES[name]
    sets, out = prepare(WORK, name, extra)
    resolved = resolve_file(REPO / config, sets, expected_action="train")
    forecast = memory.forecast(resolved, gpu_memory_bytes=143771 << 20)
    args = [sys.executable, "-m", "solar", "train", "--config", str(REPO / config)]
    for s in sets:
        args += ["--set", s]
    log = open(WORK / f"{name}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    events, started, want = out / "events" / "rank-00000.jsonl", time.time(), STEPS.get(name, 3)
    steps: list[dict] = []
    while proc.poll() is None and time.time() - started < 420:
        if events.exists():
            steps = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "step"]
            if len(steps) >= want:
                break
        time.sleep(1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    if len(steps) < want:
        tail = (WORK / f"{name}.log").read_text()[-1500:]
        return {"case": name, "error": f"{len(steps)} steps in {time.time() - started:.0f}s", "log": tail}
    measured = max(e["memory"].get("cuda_peak_bytes", 0) for e in steps) or 1
    return {"case": name, "config": config, "sets": extra, "measured_peak_bytes": measured,
            "forecast_peak_bytes": forecast.peak_bytes, "ratio": round(forecast.peak_bytes / measured, 3),
            "forecast": forecast.as_dict(), "step_seconds": [round(e["step_seconds"], 3) for e in steps],
            "start_seconds": round(time.time() - started, 1)}


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or list(CASES):
        print(json.dumps(run(name)), flush=True)


if __name__ == "__main__":
    main()
