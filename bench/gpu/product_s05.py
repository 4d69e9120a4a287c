"""Issue 18 (1): the product's Stage0.5 step beside its benchmark and the diffusers peer, in one call.

``python -m solar train`` on the released TI2V-5B Stage0.5 81f config at 81 frames 704x1280 (18,480
tokens) with issue 18's settings (compile, ``save_attention``, 18 blocks not checkpointed, world 1,
unsharded, batch 1, random init) on ``solar data synth --profile released`` data synthesized at that
resolution, no saves and no validation (memory_runs' COMMON values); its own step events give the
step times. Then ``bench/gpu/train_step.py`` in a subprocess for the model-only figure of the same
settings (``ours_compiled_save_attention_skip18``) and the diffusers peer (``diffusers``).

    PYTHONPATH=trainer:. python3 bench/gpu/product_s05.py [CASE ...]    # default: product bench diffusers

Cases (run in the order given; each product case is its own ``solar train`` process, the bench
cases share one ``train_step.py`` process, run after the product cases):

- ``product``: the product; steady s/step = the median of the step events' ``step_seconds`` after
  the first ``WARM`` steps (compile), and the period = the median interval between those steps'
  events (what a clip costs, the loop's work between steps included); peak = ``cuda_peak_bytes``.
- ``product_profile``: the same with ``runtime.profile_steps=[PROFILE_STEP]``; carries the
  trainer's profile summary (``profile/*.json``, the tables beside it in ``$BENCH_WORK``).
- ``product_before``: the trainer of the tree at ``$BENCH_BASE`` (another checkout's ``trainer/``),
  same config and data, so a change is measured against what it replaces in one call.
- ``bench``: ``ours_compiled_save_attention_skip18``; ``bench_prope``: the same with camera PRoPE on
  (as the product runs); ``bench_prope_foreach``: and AdamW's foreach kernels (the product's);
  ``diffusers``: the peer.

Last, a ``summary`` row: product/bench (step and period), product vs diffusers, and the same
against ``bench_prope`` where it ran. Expected device time (one H200, from earlier runs): a product
case ≈ 150 s (≈ 40 s start, ≈ 70 s compile, 12 steps; the second product case in a call compiles
from the inductor cache), ``product_profile`` ≈ 200 s (a 5B step's tables take up to a minute),
``bench`` ≈ 110 s, ``bench_prope`` ≈ 110 s, ``diffusers`` ≈ 50 s; the default list ≈ 5-6 minutes.
``BENCH_STEPS`` (step events per product case, default 12) and ``BENCH_CASE_LIMIT`` (seconds per
product case, default 300) trim a call; ``BENCH_SETS`` (space-separated ``KEY=VALUE``) adds
``--set`` values to the product cases (e.g. a few small blocks for a CPU smoke run).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.memory_runs import COMMON, WAN

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/solar-s05"))
CONFIG = f"{WAN}/train_stage0p5_fm_81f.yaml"
HEIGHT, WIDTH = 704, 1280
# issue 18's table: the settings the product ran with (COMMON adds world 1, unsharded, batch 1, no
# base weights, no saves, no validation, log every step)
ISSUE18 = [f"data.height={HEIGHT}", f"data.width={WIDTH}", "runtime.compile=true",
           "distributed.activation_checkpointing_policy=save_attention",
           "distributed.activation_checkpointing_skip_blocks=18"]
WARM = 2
PROFILE_STEP = 6
STEPS = int(os.environ.get("BENCH_STEPS", "12"))
LIMIT = float(os.environ.get("BENCH_CASE_LIMIT", "300"))
BENCH_VARIANTS = {"bench": "ours_compiled_save_attention_skip18",
                  "bench_prope": "ours_compiled_save_attention_skip18_prope",
                  "bench_prope_foreach": "ours_compiled_save_attention_skip18_prope_foreach",
                  "diffusers": "diffusers"}
PRODUCT = ("product", "product_profile", "product_before")


def data_root() -> Path:
    """The synthetic dataset at 704x1280 (``solar data synth --profile released`` writes the released
    latent layout at 480x864; the resolution is the only change), made once per ``$BENCH_WORK``."""
    from solar.data import synth

    root = WORK / f"data-{HEIGHT}x{WIDTH}"
    if not (root / "train-index.jsonl.gz").exists():
        synth.RESOLUTION["released"]["wan22_ti2v_5b"] = (HEIGHT, WIDTH)
        synth.synthesize("wan22_ti2v_5b", root, samples=8, seed=1, profile="released")
    return root


def _events(path: Path) -> list[dict]:
    """The run's events so far (a line being written is left for the next look)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def product(name: str) -> dict:
    extra = ISSUE18 + os.environ.get("BENCH_SETS", "").split()
    if name == "product_profile":
        extra.append(f"runtime.profile_steps=[{PROFILE_STEP}]")
    out = WORK / "runs" / name
    if out.exists():  # a case run again starts a new run directory (nothing deleted)
        out = WORK / "runs" / f"{name}-{time.strftime('%H%M%S')}"
    sets = COMMON + extra + [f"data.root={data_root()}", f"runtime.output_dir={out}"]
    env = dict(os.environ, TORCH_LOGS="recompiles,graph_breaks")
    if name == "product_before":
        base = Path(os.environ["BENCH_BASE"]).resolve()
        env["PYTHONPATH"] = f"{base / 'trainer'}:{env.get('PYTHONPATH', '')}"  # its solar package first
    args = [sys.executable, "-m", "solar", "train", "--config", str(REPO / CONFIG)]
    for s in sets:
        args += ["--set", s]
    log_path = WORK / f"{name}.log"
    started, steps = time.time(), []
    want = max(STEPS, PROFILE_STEP + 1) if name == "product_profile" else STEPS
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)
        events_path = out / "events" / "rank-00000.jsonl"
        while proc.poll() is None and time.time() - started < LIMIT:
            steps = [e for e in _events(events_path) if e["event"] == "step"]
            profiled = list((out / "profile").glob("*.json")) if name == "product_profile" else [True]
            if len(steps) >= want and profiled:
                break
            time.sleep(1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    steps = [e for e in _events(out / "events" / "rank-00000.jsonl") if e["event"] == "step"]
    text = log_path.read_text(errors="replace")
    rank_log = out / "logs" / "rank-00000.log"
    text += rank_log.read_text(errors="replace") if rank_log.exists() else ""
    row = {"row": name, "config": CONFIG, "sets": extra, "wall_seconds": round(time.time() - started, 1),
           "recompiles": text.count("Recompiling function"), "graph_breaks": text.count("Graph break")}
    if len(steps) <= WARM + 1:
        return {**row, "error": f"{len(steps)} step events", "log": text[-2000:]}
    seconds = [e["step_seconds"] for e in steps]
    times = [e["time"] for e in steps]
    skip = {PROFILE_STEP, PROFILE_STEP + 1} if name == "product_profile" else set()  # the tables' writing
    steady = [s for e, s in zip(steps, seconds) if e["step"] > WARM and not (skip and e["step"] == PROFILE_STEP)]
    periods = [b - a for a, b, e in zip(times, times[1:], steps[1:]) if e["step"] > WARM and e["step"] not in skip]
    row.update(step_seconds=[round(s, 3) for s in seconds], first_step_seconds=round(seconds[0], 1),
               steady_steps=f"{WARM + 1}-{steps[-1]['step']}", steady_median=round(statistics.median(steady), 4),
               steady_mean=round(statistics.mean(steady), 4),
               period_median=round(statistics.median(periods), 4) if periods else None,
               peak_gib=round(max(e["memory"].get("cuda_peak_bytes", 0) for e in steps) / 2**30, 2),
               losses=[round(e["loss"], 5) for e in steps], grad_norms=[round(e["grad_norm"], 5) for e in steps])
    if name == "product_profile":
        row["profiles"] = [json.loads(p.read_text()) for p in sorted((out / "profile").glob("*.json"))]
        # kernel time over the profiled step's wall time: what is left is the GPU waiting on the host
        row["gpu_busy_fraction"] = [round(q["gpu_ms"] / 1e3 / q["step_seconds"], 4) for q in row["profiles"]
                                    if q.get("step_seconds")]
        row["profile_tables"] = [str(p) for p in sorted((out / "profile").glob("*.txt"))]
    return row


def bench(names: list[str]) -> list[dict]:
    """``train_step.py`` with the cases' variants, one process; its JSON lines as rows."""
    variants = [BENCH_VARIANTS[n] for n in names]
    byvariant = {v: n for n, v in zip(names, variants)}
    started = time.time()
    try:
        proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "train_step.py"), *variants], cwd=REPO,
                              capture_output=True, text=True, env=os.environ, timeout=LIMIT * len(variants))
    except subprocess.TimeoutExpired as exc:  # the rows it printed before the limit still count
        proc = subprocess.CompletedProcess(exc.cmd, -9, exc.stdout or "", exc.stderr or "")
        proc.stdout = proc.stdout.decode() if isinstance(proc.stdout, bytes) else proc.stdout
        proc.stderr = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
    rows = []
    for line in proc.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("bench") == "train_step":
            rows.append({"row": byvariant.get(record["variant"], record["variant"]), **record})
    if proc.returncode or not rows:
        rows.append({"row": "bench_error", "returncode": proc.returncode, "stderr": proc.stderr[-2000:]})
    rows.append({"row": "bench_wall", "wall_seconds": round(time.time() - started, 1)})
    return rows


def summary(rows: dict) -> dict:
    out = {"row": "summary", "tokens": 21 * (HEIGHT // 32) * (WIDTH // 32)}
    prod = rows.get("product") or rows.get("product_profile")
    if prod and "steady_median" in prod:
        out.update(product_s_per_step=prod["steady_median"], product_period=prod["period_median"])
        for key in ("bench", "bench_prope", "bench_prope_foreach", "diffusers"):
            ref = rows.get(key, {}).get("median_s")
            if not ref:
                continue
            if key == "diffusers":
                out["product_speedup_vs_diffusers"] = round(ref / prod["steady_median"], 3)
            else:
                out[f"product_over_{key}"] = round(prod["steady_median"] / ref, 4)
                if prod["period_median"]:
                    out[f"product_period_over_{key}"] = round(prod["period_median"] / ref, 4)
        if "product_before" in rows and "steady_median" in rows["product_before"]:
            out["product_over_before"] = round(prod["steady_median"] / rows["product_before"]["steady_median"], 4)
    if rows.get("bench", {}).get("median_s") and rows.get("diffusers", {}).get("median_s"):
        out["bench_speedup_vs_diffusers"] = round(rows["diffusers"]["median_s"] / rows["bench"]["median_s"], 3)
    return out


def main() -> None:
    names = sys.argv[1:] or ["product", "bench", "diffusers"]
    unknown = [n for n in names if n not in PRODUCT and n not in BENCH_VARIANTS]
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; use {list(PRODUCT) + list(BENCH_VARIANTS)}")
    WORK.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}

    def emit(row: dict) -> None:
        rows[row["row"]] = row
        print(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}), flush=True)

    for name in (n for n in names if n in PRODUCT):
        emit(product(name))
    benches = [n for n in names if n in BENCH_VARIANTS]
    if benches:
        for row in bench(benches):
            emit(row)
    emit(summary(rows))


if __name__ == "__main__":
    main()
