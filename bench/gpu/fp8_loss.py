"""FP8 linear layers (``model.fp8_linear``, issues 18 and 25) against bf16 through the product:
``python -m solar train`` on the released TI2V-5B configs with ``model.dims.num_layers=10`` at the
released 480x864 shape (81 frames, 8,505 tokens) on ``solar data synth --profile released`` data,
world 1, unsharded, compile on, no validation, no save (``bench.gpu.memory_runs.prepare``). Every
case has the same data, seed and noise draws (the trainer's per-step generators), so the per-step
losses differ only by the linear layers' precision.

Cases: ``s05_<recipe>`` (Stage0.5 FM, ``--steps`` steps, 200 by default: the loss-curve comparison)
and ``s1_<recipe>`` (Stage1 TF-AnyFlow, ``--s1-steps`` steps, 8 by default: speed, and the forwards
without grad in FP8), ``<recipe>`` one of off, tensorwise, rowwise. A case waits for its step
events and stops the trainer (a 5B run's final save would not fit the disk). One JSON line per case
(per-step losses and seconds, the steady median s/step after ``--warm`` steps, peak memory, the
``fp8`` event's converted-layer count, compile log counts), then one ``compare`` line per FP8 case
against the ``off`` case of its stage: max and mean relative per-step loss difference, the same for
20-step window means, and the speed-up.

    PYTHONPATH=trainer:. python3 bench/gpu/fp8_loss.py [--steps 200] [--s1-steps 8] CASE [CASE ...]

Expected duration on one H200: about 2 minutes per 200-step Stage0.5 case at 10 blocks (start and
compile ~1 min, ~0.4 s/step), about 2 minutes per 8-step Stage1 case; ``s05_off s05_tensorwise``
fits one 10-minute call with room for ``s05_rowwise``. A pair too long for one call (Stage1 over 200
steps, ~1.1 s/step at 10 blocks) runs as two: ``--out a.jsonl s1_off``, then ``--baseline a.jsonl
s1_tensorwise``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.memory_runs import WAN, prepare

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/solar-fp8"))
LIMIT = float(os.environ.get("BENCH_CASE_LIMIT", "360"))  # seconds per case
STAGES = {
    "s05": (f"{WAN}/train_stage0p5_fm_81f.yaml", ["model.dims.num_layers=10", "runtime.compile=true"]),
    "s1": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", ["model.dims.num_layers=10", "runtime.compile=true",
                                                       "checkpoint.path=null", "checkpoint.weights=null"]),
}
RECIPES = ("off", "tensorwise", "rowwise")
WINDOW = 20


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(name: str, steps: int, warm: int) -> dict:
    stage, recipe = name.split("_", 1)
    config, extra = STAGES[stage]
    extra = [*extra, f"model.fp8_linear={recipe}", f"train.max_steps={steps + 1000}"]
    sets, out = prepare(WORK, name, extra)
    args = [sys.executable, "-m", "solar", "train", "--config", str(REPO / config)]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "TORCH_LOGS": "recompiles,graph_breaks"}
    log_path = WORK / f"{name}.log"
    started = time.time()
    events_path = out / "events" / "rank-00000.jsonl"
    step_events: list[dict] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        while proc.poll() is None and time.time() - started < LIMIT:
            step_events = [e for e in _events(events_path) if e["event"] == "step"]
            if len(step_events) >= steps:
                break
            time.sleep(1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    events = _events(events_path)
    step_events = [e for e in events if e["event"] == "step"][:steps]
    rank_log = out / "logs" / "rank-00000.log"
    text = log_path.read_text(errors="replace") + (rank_log.read_text(errors="replace") if rank_log.exists() else "")
    result = {"case": name, "config": config, "sets": extra, "wall_seconds": round(time.time() - started, 1),
              "fp8_event": next(({k: e[k] for k in ("recipe", "linears")} for e in events if e["event"] == "fp8"),
                                None),
              "recompiles": text.count("Recompiling function"), "graph_breaks": text.count("Graph break")}
    if len(step_events) < steps:
        return {**result, "error": f"{len(step_events)} of {steps} steps", "log": text[-2000:]}
    seconds = [round(e["step_seconds"], 4) for e in step_events]
    return {**result, "steps": steps, "losses": [e["loss"] for e in step_events], "step_seconds": seconds,
            "first_step_seconds": seconds[0], "steady_median": round(statistics.median(seconds[warm:]), 4),
            "peak_bytes": max(e["memory"].get("cuda_peak_bytes", 0) for e in step_events)}


def compare(fp8: dict, off: dict) -> dict:
    a, b = fp8["losses"], off["losses"]
    n = min(len(a), len(b))
    rel = [abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n]) if y]
    windows = [(sum(a[i:i + WINDOW]) / WINDOW, sum(b[i:i + WINDOW]) / WINDOW) for i in range(0, n - WINDOW + 1, WINDOW)]
    wrel = [abs(x - y) / abs(y) for x, y in windows if y]
    return {"compare": fp8["case"], "against": off["case"], "steps": n,
            "max_rel_loss_diff": round(max(rel), 5), "mean_rel_loss_diff": round(statistics.mean(rel), 5),
            "median_rel_loss_diff": round(statistics.median(rel), 5),
            f"max_rel_diff_of_{WINDOW}_step_means": round(max(wrel), 5) if wrel else None,
            "mean_loss": [round(statistics.mean(a[:n]), 5), round(statistics.mean(b[:n]), 5)],
            "steady_median": [fp8["steady_median"], off["steady_median"]],
            "speedup": round(off["steady_median"] / fp8["steady_median"], 3),
            "peak_bytes": [fp8["peak_bytes"], off["peak_bytes"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help="s05_<recipe> or s1_<recipe>, recipe off/tensorwise/rowwise")
    parser.add_argument("--steps", type=int, default=200, help="steps of each Stage0.5 case")
    parser.add_argument("--s1-steps", type=int, default=8, help="steps of each Stage1 case")
    parser.add_argument("--warm", type=int, default=5, help="first steps left out of the steady median")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--baseline", help="JSON lines of an earlier call (its --out file): its off cases stand in "
                                           "for those not run now, so a long pair can span two device calls")
    args = parser.parse_args()
    for name in args.cases:
        stage, _, recipe = name.partition("_")
        if stage not in STAGES or recipe not in RECIPES:
            parser.error(f"case {name}: use s05_<recipe> or s1_<recipe> with recipe one of {', '.join(RECIPES)}")
    WORK.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}

    def emit(doc: dict) -> None:
        line = json.dumps(doc)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    for name in args.cases:
        steps = args.steps if name.startswith("s05_") else args.s1_steps
        results[name] = run(name, steps, min(args.warm, steps - 1))
        emit(results[name])
    earlier: dict[str, dict] = {}
    if args.baseline:
        for line in Path(args.baseline).read_text().splitlines():
            doc = json.loads(line) if line.strip() else {}
            if doc.get("case", "").endswith("_off") and "error" not in doc:
                earlier[doc["case"]] = doc
    for name, result in results.items():
        off = results.get(name.split("_")[0] + "_off") or earlier.get(name.split("_")[0] + "_off")
        if name.endswith("_off") or off is None or "error" in result or "error" in off:
            continue
        emit(compare(result, off))


if __name__ == "__main__":
    main()
