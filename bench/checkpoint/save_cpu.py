"""Checkpoint saves on the CPU (gloo), today's whole-file path against every rank writing its shards
(issue 38 item 7). One run per call: a tiny Wan TI2V-5B Stage0.5 config widened to the 5B's
attention width (16 heads x 64, FFN 4096; ``--layers`` blocks, ~76 M parameters at 4), trained 2
steps at world ``--world`` (full_shard; world 1 unsharded) and saved once at step 2, from the trainer
tree ``--tree`` (``current``: this checkout's trainer/; a path: another tree's trainer/ directory,
e.g. ``git archive 43a4e26 trainer | tar -x -C /tmp/base`` then ``--tree /tmp/base/trainer``).

Measured, per run (one JSON line appended to ``--results``):
  - the save's total seconds and, with ``--async``, its blocking seconds: the ``checkpoint`` event of
    each rank's events/rank-NNNNN.jsonl (the trainer's own clock);
  - the bytes each rank wrote: new path, ``shards/shard-{rank+1:05d}-*`` plus its ``rng/`` and
    ``data/`` files; every other file of the checkpoint (whole safetensors files, trainer.json,
    shards.json, optimizer.json, manifest) is rank 0's;
  - each rank's resident memory: every worker process (a child of torchrun carrying RANK, or the
    single process at world 1) sampled from /proc/PID/status every ``--interval`` s: peak VmRSS before
    the save, peak VmRSS inside the save window ([event time - seconds, event time]), and the
    kernel's own high-water mark VmHWM at the last sample (the whole run's peak, no sampling gap).

    python bench/checkpoint/save_cpu.py --tree current --world 4 [--async] [--layers 4] \
        [--data /tmp/ckb/data] [--work /tmp/ckb/runs] [--results bench/checkpoint/results/X.jsonl]

``--report`` reads ``--results`` and prints the markdown tables of bench/RESULTS.md: the measured runs
per world (every repeat's seconds, the fastest first) and the released configs modelled from them:

    python bench/checkpoint/save_cpu.py --report [--old-label base-43a4e26] [--new-label current-665e6fb]

Modelled (nothing released was run), from the fastest run at the largest world here: whole files,
total = the bytes rank 0 writes / its measured rate (bytes / the sync save's total seconds),
blocking = those bytes / its capture rate (bytes / the async save's blocking seconds); shards,
blocking = the bytes one rank captures (the state / the shard degree) / the measured capture rate,
total = that + the bytes one rank writes (the state / the world: DCP writes each replicated piece
once, spread over the ranks) / the measured background write rate; the bytes and host memory from
``solar config memory --json`` (its ``host`` object) at each config's own topology. This assumes the
storage's aggregate bandwidth grows with the number of writers, which a shared filesystem may not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/solar_wm/tiny/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml"
WIDEN = ["model.dims.num_heads=16", "model.dims.head_dim=64", "model.dims.ffn_dim=4096"]


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def status_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in KiB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    rss = hwm = 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return rss, hwm


def rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


class Sampler(threading.Thread):
    """Every ``interval`` s: each rank's (time, VmRSS KiB) and its latest VmHWM."""

    def __init__(self, root: int, world: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.world, self.interval = root, world, interval
        self.ranks: dict[int, int] = {}  # pid -> rank
        self.samples: dict[int, list[tuple[float, int]]] = {}
        self.hwm: dict[int, int] = {}
        self.stop = threading.Event()

    def workers(self) -> None:
        if self.world == 1:
            self.ranks.setdefault(self.root, 0)
            return
        for pid in children(self.root):
            if pid not in self.ranks:
                rank = rank_of(pid)
                if rank is not None:
                    self.ranks[pid] = rank

    def run(self) -> None:
        while not self.stop.is_set():
            if len(self.ranks) < self.world:
                self.workers()
            now = time.time()
            for pid, rank in list(self.ranks.items()):
                got = status_kb(pid)
                if got is None:
                    continue
                self.samples.setdefault(rank, []).append((now, got[0]))
                self.hwm[rank] = max(self.hwm.get(rank, 0), got[1])
            self.stop.wait(self.interval)


def events(out: Path) -> dict[int, list[dict]]:
    found = {}
    for path in sorted((out / "events").glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        found[rank] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def safetensors_numel(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        count = 1
        for s in meta["shape"]:
            count *= s
        total += count
    return total


def written(step_dir: Path, world: int) -> tuple[str, list[int], int]:
    """(layout, bytes written by each rank, parameters of the live model)."""
    per_rank = [0] * world
    shards = step_dir / "shards"
    layout = "shards" if shards.is_dir() else "whole"
    for path in step_dir.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(step_dir)
        size = path.stat().st_size
        rank = 0
        if rel.parts[0] in ("rng", "data"):
            rank = int(path.stem.split("-")[1])
        elif rel.parts[0] == "shards" and path.name.startswith("shard-"):
            rank = int(path.name.split("-")[1]) - 1
        per_rank[rank] += size
    if layout == "shards":
        doc = json.loads((step_dir / "shards.json").read_text())
        params = 0
        for key, meta in doc["tensors"].items():
            if "/live/" in key:
                count = 1
                for s in meta["shape"]:
                    count *= s
                params += count
    else:
        params = safetensors_numel(step_dir / "model" / "live.safetensors")
    return layout, per_rank, params


def _fmt_s(values: list[float]) -> str:
    values = sorted(values)
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values[0]:.2f} ({', '.join(f'{v:.2f}' for v in values[1:])})"


def _gb(b: float) -> str:
    return f"{b / 1e9:.3f}" if b < 1e10 else f"{b / 1e9:.1f}"


def report(results: Path, old: str, new: str) -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    worlds = sorted({r["world"] for r in rows})
    print("Measured (seconds: the fastest run, the others in brackets; GiB: the largest of the runs).\n")
    print("| world | path | mode | runs | blocking s | total s | bytes per rank, max / min (GB) | "
          "rank 0 peak RSS before save / in save (GiB) | other ranks' peak RSS before / in save, max (GiB) | "
          "largest rise in the save over RSS at its start (GiB; x that rank's bytes) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in worlds:
        for mode in ("sync", "async"):
            for label in (old, new):
                sel = [r for r in rows if r["world"] == w and r["mode"] == mode and r["tree"] == label]
                if not sel:
                    continue
                layout = sel[0]["layout"]
                path = ("whole files on rank 0" if layout == "whole" else "every rank its shards") \
                    if w > 1 else "unsharded, whole files (one path)"
                blocking = _fmt_s([r["blocking_seconds"] for r in sel]) if mode == "async" else "-"

                def peak(key, ranks):
                    vals = [x[key] for r in sel for x in r["ranks"] if x["rank"] in ranks and x[key] is not None]
                    return f"{max(vals):.2f}" if vals else "-"
                others = range(1, w)
                rise, ratio = 0.0, 0.0
                for r in sel:
                    for x in r["ranks"]:
                        if x["rss_peak_in_save_gib"] is None or x["rss_at_save_start_gib"] is None:
                            continue
                        up = x["rss_peak_in_save_gib"] - x["rss_at_save_start_gib"]
                        if up > rise:
                            rise, ratio = up, up * 2**30 / max(x["bytes"], 1)
                print(f"| {w} | {label}: {path} | {mode} | {len(sel)} | {blocking} | "
                      f"{_fmt_s([r['seconds'] for r in sel])} | {_gb(sel[0]['bytes_max'])} / {_gb(sel[0]['bytes_min'])} | "
                      f"{peak('rss_peak_before_save_gib', [0])} / {peak('rss_peak_in_save_gib', [0])} | "
                      + (f"{peak('rss_peak_before_save_gib', others)} / {peak('rss_peak_in_save_gib', others)} | "
                         if w > 1 else "- | ") + f"{rise:.2f} (x{ratio:.1f}) |")
    top = max(w for w in worlds if w > 1)

    def fastest(label, mode):
        sel = [r for r in rows if r["world"] == top and r["mode"] == mode and r["tree"] == label]
        return min(sel, key=lambda r: r["seconds"]) if sel else None

    def rates(label):
        sync, bg = fastest(label, "sync"), fastest(label, "async")
        total = sync["bytes_max"] / sync["seconds"]
        capture = bg["bytes_max"] / bg["blocking_seconds"] if bg else None
        write = bg["bytes_max"] / (bg["seconds"] - bg["blocking_seconds"]) if bg else None
        return total, capture, write
    r_old, c_old, _ = rates(old)
    r_new, c_new, w_new = rates(new)
    mb = lambda x: f"{x / 1e6:.0f} MB/s" if x else "-"  # noqa: E731
    print(f"\nRates from the fastest run at world {top}, the bytes of the rank that wrote most over: the save's "
          f"total s (sync), its blocking s (async), and the async save's seconds after the blocking part. "
          f"Whole files (rank 0): {mb(r_old)} total, {mb(c_old)} captured. Shards (each rank): "
          f"{mb(r_new)} total, {mb(c_new)} captured, {mb(w_new)} written in the background.\n")
    print("| config | world, sharding (shard degree) | saved GB | path | GB written per rank | GB captured per rank | "
          "modelled async blocking s | modelled sync total s | host peak per rank in a save, `solar config memory` "
          "(GiB) | + DCP's in-memory file, 2 x GB written (not in the forecast) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cfg in sorted(REPO.glob("configs/solar_wm/*/train_*.yaml")):
        got = subprocess.run([sys.executable, "-m", "solar", "config", "memory", "--config", str(cfg), "--json"],
                             cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO / "trainer")})
        name = str(cfg.relative_to(REPO / "configs/solar_wm"))[:-5]
        if got.returncode != 0:
            print(f"| {name} | config memory failed: {got.stderr.strip()[-200:]} |")
            continue
        host = json.loads(got.stdout)["host"]
        text = cfg.read_text()
        world = int(next(line.split(":")[1] for line in text.splitlines() if line.strip().startswith("world_size:")))
        sharding = next(line.split(":")[1].strip() for line in text.splitlines()
                        if line.strip().startswith("sharding:"))
        degree = host["shard_degree"]
        saved = sum(sum(v.values()) for v in host["saved"].values())
        g = host["gib"]
        print(f"| {name} | {world}, {sharding} ({degree}) | {saved / 1e9:.1f} | whole files on rank 0 | "
              f"rank 0 {saved / 1e9:.1f} | rank 0 {saved / 1e9:.1f} | "
              + (f"{saved / c_old:.0f}" if c_old else "-") + f" | {saved / r_old:.0f}"
              + f" | rank 0 {g['whole_file_rank0_save']:.1f}, others {g['whole_file_other_save']:.1f} | - |")
        written_, staged = saved / world, saved / degree
        blocking = staged / c_new if c_new else None
        total = (blocking + written_ / w_new) if c_new and w_new else written_ / r_new
        print(f"| | | | every rank its shards | {written_ / 1e9:.2f} | {staged / 1e9:.2f} | "
              + (f"{blocking:.1f}" if blocking is not None else "-") + f" | {total:.1f} | every rank {g['save']:.1f} | "
              f"every rank {g['save'] + 2 * written_ / 2**30:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="current", help="'current' or a trainer/ directory of another tree")
    ap.add_argument("--label", default=None, help="name of the tree in the results (default: from --tree)")
    ap.add_argument("--world", type=int)
    ap.add_argument("--report", action="store_true", help="print the markdown tables from --results")
    ap.add_argument("--old-label", default="base-43a4e26")
    ap.add_argument("--new-label", default="current-665e6fb")
    ap.add_argument("--async", dest="background", action="store_true", help="runtime.async_checkpoint=true")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--data", default="/tmp/ckb/data")
    ap.add_argument("--work", default="/tmp/ckb/runs")
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--keep", action="store_true", help="keep the run directory (default: removed)")
    ap.add_argument("--results", default=str(REPO / "bench/checkpoint/results/2026-12-06-save-cpu.jsonl"))
    args = ap.parse_args()
    if args.report:
        report(Path(args.results), args.old_label, args.new_label)
        return
    if args.world is None:
        ap.error("--world is required (or --report)")

    tree = (REPO / "trainer") if args.tree == "current" else Path(args.tree).resolve()
    label = args.label or ("current" if args.tree == "current" else str(tree))
    data = Path(args.data)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    py = sys.executable
    if not (data / "train-index.jsonl.gz").exists():
        subprocess.run([py, "-m", "solar", "data", "synth", "--family", "wan22_ti2v_5b", "--out", str(data),
                        "--samples", "8"], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    # which solar this environment imports (PYTHONPATH before the editable install)
    where = subprocess.run([py, "-c", "import solar; print(solar.__file__)"], cwd=REPO, env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(tree)):
        raise SystemExit(f"solar resolves to {where}, not under {tree}")

    mode = "async" if args.background else "sync"
    stamp = datetime.datetime.now().strftime("%H%M%S")
    out = Path(args.work) / f"{Path(label).name}-w{args.world}-{mode}-l{args.layers}-{stamp}"
    sets = [f"data.root={data}", f"runtime.output_dir={out}", f"distributed.world_size={args.world}",
            f"distributed.sharding={'full_shard' if args.world > 1 else 'none'}",
            f"train.global_batch_size={args.world}", "train.max_steps=2", "runtime.save_every=0",
            "runtime.save_steps=[2]", "runtime.validate_every=0", "runtime.validation_steps=[]",
            "runtime.log_every=100", *WIDEN, f"model.dims.num_layers={args.layers}"]
    if args.background:
        sets.append("runtime.async_checkpoint=true")
    launcher = [py, "-m", "solar"] if args.world == 1 else \
        [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.world}", "-m", "solar"]
    cmd = [*launcher, "train", "--config", CONFIG]
    for s in sets:
        cmd += ["--set", s]

    started = time.time()
    log = Path(args.work) / f"{out.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid, args.world, args.interval)
        sampler.start()
        rc = proc.wait()
        sampler.stop.set()
        sampler.join()
    wall = time.time() - started
    if rc != 0:
        raise SystemExit(f"run failed (rc {rc}); see {log}:\n" + log.read_text()[-3000:])

    ev = events(out)
    saves = {r: next(e for e in evs if e["event"] == "checkpoint") for r, evs in ev.items()}
    step_dir = Path(saves[0]["path"])
    layout, per_rank, params = written(step_dir, args.world)
    gib = 1 / 1024 / 1024  # KiB -> GiB
    ranks = []
    for r in range(args.world):
        save = saves[r]
        end = save["time"]
        begin = end - save["seconds"]
        samples = sampler.samples.get(r, [])
        before = [kb for t, kb in samples if t < begin]
        inside = [kb for t, kb in samples if begin <= t <= end]
        at_start = before[-1] if before else None
        ranks.append({
            "rank": r, "seconds": save["seconds"], "blocking_seconds": save.get("blocking_seconds"),
            "bytes": per_rank[r],
            "rss_peak_before_save_gib": round(max(before) * gib, 3) if before else None,
            "rss_at_save_start_gib": round(at_start * gib, 3) if at_start else None,
            "rss_peak_in_save_gib": round(max(inside) * gib, 3) if inside else None,
            "rss_hwm_gib": round(sampler.hwm.get(r, 0) * gib, 3),
            "samples_in_save": len(inside),
        })
    record = {
        "bench": "checkpoint-save-cpu", "date": datetime.date.today().isoformat(), "tree": label,
        "solar": where, "layout": layout, "world": args.world, "mode": mode, "layers": args.layers,
        "params": params, "checkpoint_bytes": sum(per_rank),
        "seconds": max(x["seconds"] for x in ranks),
        "blocking_seconds": max(x["blocking_seconds"] for x in ranks) if args.background else None,
        "bytes_max": max(per_rank), "bytes_min": min(per_rank),
        "rss_hwm_rank0_gib": ranks[0]["rss_hwm_gib"],
        "rss_hwm_others_max_gib": max((x["rss_hwm_gib"] for x in ranks[1:]), default=None),
        "ranks": ranks, "run_wall_seconds": round(wall, 1), "interval_s": args.interval,
        "torch": subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                text=True).stdout.strip(),
        "cpus": os.cpu_count(), "command": " ".join(f"PYTHONPATH={tree} OMP_NUM_THREADS=1".split() + cmd),
    }
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("ranks", "command")}, sort_keys=True))
    for x in ranks:
        print(json.dumps(x, sort_keys=True))
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
