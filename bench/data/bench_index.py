"""Time `solar data inspect` and `solar data plan --limit 16` on a 1.5-million-row index against
simply decompressing and JSON-parsing the same file, in one run (each a fresh process; best of
--repeat). Prints JSON.

    python bench/data/bench_index.py [--rows 1500000] [--repeat 3] [--workdir /tmp/solar-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINE = ("import gzip, json, sys\n"
            "n = 0\n"
            "with gzip.open(sys.argv[1], 'rb') as f:\n"
            "    for line in f:\n"
            "        json.loads(line); n += 1\n"
            "print(n)\n")


def timed(cmd: list[str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed: {proc.stderr}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, usage.ru_maxrss, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/solar-bench")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    index = work / f"index-{args.rows}.jsonl.gz"
    if not index.exists():
        subprocess.run([sys.executable, str(HERE / "make_index.py"), str(index), "--rows", str(args.rows)],
                       check=True)
    solar = [sys.executable, "-m", "solar"]
    cases = {
        "baseline_gzip_json": [sys.executable, "-c", BASELINE, str(index)],
        "inspect": [*solar, "data", "inspect", str(index)],
        "plan_global_w256": [*solar, "data", "plan", str(index), "--seed", "42", "--pixel-frames", "81",
                             "--world-size", "256", "--rank", "17", "--limit", "16"],
        "plan_node_shard_w256_sp2_workers8": [
            *solar, "data", "plan", str(index), "--seed", "42", "--pixel-frames", "81", "--world-size",
            "256", "--sequence-parallel-size", "2", "--local-world-size", "8", "--num-workers", "8",
            "--rank", "17", "--mode", "node_shard", "--limit", "16"],
    }
    results = {}
    for name, cmd in cases.items():
        best = min(timed(cmd)[0] for _ in range(args.repeat))
        results[name] = {"seconds": round(best, 3)}
    base = results["baseline_gzip_json"]["seconds"]
    for name, entry in results.items():
        entry["ratio_to_baseline"] = round(entry["seconds"] / base, 2)
    # Peak memory of one more run each (ru_maxrss of the largest child so far is monotone, so
    # measure each case in its own wrapper process).
    for name, cmd in cases.items():
        wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); "
                   "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        out = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
        results[name]["peak_rss_mib"] = round(int(out.stdout.strip()) / 1024, 1)
    print(json.dumps({
        "benchmark": "data index inspect/plan vs decompress+json.loads",
        "rows": args.rows, "index_bytes": index.stat().st_size, "repeat": args.repeat,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"), "results": results}, indent=2))


if __name__ == "__main__":
    main()
