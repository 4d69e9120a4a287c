"""The recipe's cost from one GPU run (issue 54): every figure the recipe table needs, measured through
the product in priority order within a time budget, each written the moment it lands.

One call of at most about nine minutes measures, in this order, as far as its budget reaches:

1. the training stages as shipped: ``python -m solar train`` on the released TI2V-5B configs (81 f
   480x864, world 1, unsharded, compiled, ``activation_checkpointing_skip_blocks: auto`` choosing the
   kept blocks from the card's memory): steady s/step, the kept blocks ``auto`` chose, the peak
   (``torch.cuda.max_memory_allocated`` from the step events) against the forecast ``auto`` chose by
   (the same figure as ``solar config memory``), the first step and the time from launch to it;
2. the ``solar infer`` slot's phases (``bench/gpu/infer_product.py``: the released Stage2 infer config,
   60-latent self-forcing rollouts; read, generate, truth, decode on the GPU's path; encode and files on
   the file worker);
3. Stage2's critic update and student update (the median outer step without a student update; the
   median with one, the first left out, less the critic's);
4. the second launch's time to its first step with torch.compile's caches on the run volume: every
   case of a call runs with ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` at
   ``<work>/run-root/.cache/{torchinductor,triton}``, where the operator puts them (emptied at the
   call's start, as a new run's volume), and ``relaunch_<case>`` starts ``<case>`` again into a fresh
   run directory: its time to the first step against the first launch's;
5. FP8 (``model.fp8_linear=tensorwise``) against bf16: 200 steps of Stage0.5 at 15 blocks, per-step
   losses side by side (``bench/gpu/fp8_loss.compare``), and FP8 at the cut shapes of the speed targets.

The card chooses the shapes (``--plan auto``): an H200 (>= 100 GiB) runs the released 30 blocks, an
H100 (80 GB) the cuts issue 54 names (Stage1 at 15 and 20 blocks, Stage0.5 at 15 and 20, Stage2 at 5
and 10); every line states its card and shape. A case starts only when the budget left holds its
expected minimum on this card; one that runs out of time reports what it measured (a Stage2 case cut
before its second student update still has its critic update). Skipped cases get a line saying so.

    PYTHONPATH=/tmp/site:trainer:. python3 bench/gpu/recipe_run.py [--budget 560] [--out FILE] [CASE ...]
    PYTHONPATH=trainer:. python3 bench/gpu/recipe_run.py --dry-run [--card h100|h200]   # no GPU: the plan
    PYTHONPATH=trainer:. python3 bench/gpu/recipe_run.py --tiny [CASE ...]   # the CPU smoke run, tiny configs
    ... recipe_run.py --pick h100=s2_l5,relaunch_s1_l15 --pick h200=s1,s05   # a call that may get either card

On the device, run a ``git archive`` of the commit (carried) rather than the working tree, and name
it in ``BENCH_TREE`` (every line records it); bench/RESULTS.md (2026-12-07, issue 54) has the calls.
The committed lines (``bench/gpu/results/*-recipe-run-*.jsonl``) are read back by ``recorded()``:
``tests/unit/config/test_recipe_run.py`` holds today's forecast to every measured peak.

``--dry-run`` resolves every case's config with its edits and prints its forecast and ``auto``'s kept
blocks on both cards (``tests/unit/config/test_recipe_run.py`` runs it in ``make test``). ``--tiny``
runs the same machinery on the tiny CPU twins (the configs under ``configs/solar_wm/tiny``, tiny data,
the block cuts dropped): a check of the bench, not a measurement. ``--out`` (default ``$OUT/recipe-run.jsonl``
when ``$OUT`` is set) receives every JSON line as it lands; the summary table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.gpu import memory_runs  # noqa: E402
from bench.gpu.memory_runs import COMMON  # noqa: E402

WORK = Path(os.environ.get("BENCH_WORK", "/tmp/solar-recipe"))
GIB = 1 << 30
WAN, TINY = "configs/solar_wm/wan22_ti2v_5b", "configs/solar_wm/tiny/wan22_ti2v_5b"
S05, S1, S2 = "train_stage0p5_fm_81f.yaml", "train_stage1_tf_anyflow_81f.yaml", "train_stage2_sgf_81f.yaml"
INFER_S2, INFER_S05, INFER_S1 = ("infer_stage2_sgf_81f.yaml", "infer_stage0p5_fm_81f.yaml",
                                 "infer_stage1_tf_anyflow_81f.yaml")
# no base weights or earlier stage here: Stage1 starts from seeded random weights, Stage2's roles too
# (its EMA from the student's first update, so the steady state holds it)
FROM_SCRATCH = {S1: ["checkpoint.path=null", "checkpoint.weights=null"],
                S2: ["checkpoint.roles=null", "train.ema.start_step=1"]}
FP8 = ["model.fp8_linear=tensorwise"]
# the cards by their memory (nvidia-smi's memory.total, MiB)
CARDS = {"h100": 81559 << 20, "h200": 143771 << 20}
DATA_SAMPLES = 16   # 4 test rows: up to 4 slots


@dataclass(frozen=True)
class Case:
    """One measurement. ``kind``: train (``solar train``), relaunch (``of``'s train case again, same
    compile caches, a fresh run directory), infer (``solar infer`` slots through infer_product.py).
    ``steps``: step events to wait for (infer: slots). ``cost``: expected seconds on this card, start
    to finish; ``need``: the least time worth starting it with (default ``cost``). ``of``: the case a
    relaunch repeats or an FP8 case is compared with."""
    name: str
    kind: str
    config: str
    sets: tuple[str, ...]
    steps: int
    shape: str
    cost: float
    need: float | None = None
    of: str | None = None
    target: dict = field(default_factory=dict)
    height: int = 480
    width: int = 864


def _layers(n: int) -> list[str]:
    return [f"model.dims.num_layers={n}"] if n != 30 else []


def _blocks(n: int) -> str:
    return f"{n} of 30 blocks" if n != 30 else "30 blocks (released)"


def train_case(name: str, config: str, blocks: int, steps: int, cost: float, *, extra=(), shape_note: str = "",
               need: float | None = None, of: str | None = None, target: dict | None = None,
               height: int = 480, width: int = 864) -> Case:
    sets = (*FROM_SCRATCH.get(config, []), *_layers(blocks), *extra)
    compiled = "eager" if "runtime.compile=false" in extra else "compiled"
    kept = next((f"skip_blocks {s.split('=', 1)[1]}" for s in extra
                 if s.startswith("distributed.activation_checkpointing_skip_blocks=")), "auto kept blocks")
    shape = f"81f {height}x{width}, {_blocks(blocks)}, world 1 unsharded, {compiled}, {kept}" + \
        (f", {shape_note}" if shape_note else "")
    return Case(name, "train", config, tuple(sets), steps, shape, cost, need, of, target or {}, height, width)


def infer_case(name: str, config: str, slots: int, cost: float, *, passes: str | None = None,
               need: float | None = None, target: dict | None = None,
               clip: str = "60-latent rollout (237 frames)") -> Case:
    sets = (f"validation.passes={passes}",) if passes else ()
    shape = f"solar infer at 480x864, {clip}, 30 blocks (released), {slots} slots per pass"
    return Case(name, "infer", config, sets, slots, shape, cost, need, None, target or {})


def relaunch(case: Case, cost: float) -> Case:
    return Case(f"relaunch_{case.name}", "relaunch", case.config, case.sets, 2,
                case.shape + ", second launch on the first's compile caches", cost, None, case.name, {},
                case.height, case.width)


UNIPC50 = "[{name: model-unipc, weights: model, solver: unipc, steps: 50}]"
FLOWMAP = ("[{name: model-flowmap4, weights: model, solver: flowmap, steps: 4}, "
           "{name: model-flowmap50, weights: model, solver: flowmap, steps: 50}]")


def h100_cases() -> list[Case]:
    """Issue 54's cuts for an 80 GB card, in priority order. Costs measured on the H100 (2026-12-07
    call 1, cold compile caches): about 40 s from launch to the first step's start (imports, the model
    on the GPU), the first step's compile 35-60 s, Stage2's first outer step 61 s and its first student
    update over 100 s; the slot case 136 s (the 20 GB checkpoint written in 37 s)."""
    s1_l15 = train_case("s1_l15", S1, 15, 10, 115, need=100, target={"s_per_step": 1.35})
    s05_l20 = train_case("s05_l20", S05, 20, 14, 80, need=70, target={"s_per_step": 0.48})
    s05_l15 = train_case("s05_l15", S05, 15, 200, 150, need=145)
    return [
        s1_l15, s05_l20,
        infer_case("slot", INFER_S2, 3, 140, need=130, target={"gpu_path_seconds": 12.0}),
        train_case("s2_l5", S2, 5, 12, 280, need=250),
        relaunch(s1_l15, 60),
        s05_l15,
        relaunch(s05_l15, 50),
        train_case("s05_l15_fp8", S05, 15, 200, 155, extra=FP8, shape_note="FP8 tensorwise", need=150, of="s05_l15"),
        train_case("s1_l20", S1, 20, 8, 120, need=95),
        train_case("s1_l15_fp8", S1, 15, 10, 120, extra=FP8, shape_note="FP8 tensorwise", need=100, of="s1_l15",
                   target={"s_per_step": 1.35}),
        train_case("s05_l20_fp8", S05, 20, 14, 85, extra=FP8, shape_note="FP8 tensorwise", need=75, of="s05_l20",
                   target={"s_per_step": 0.48}),
        train_case("s2_l10", S2, 10, 12, 290, need=260),
        infer_case("val_s05", INFER_S05, 2, 150, passes=UNIPC50, clip="21 latents (81 frames), bidirectional"),
        infer_case("val_s1", INFER_S1, 2, 260, passes=FLOWMAP),
    ]


def h200_cases() -> list[Case]:
    """The released shapes on a 141 GB card, in priority order (Stage2's roles do not fit one card
    unsharded at 30 blocks: 5 and 10 blocks, extrapolated). Costs from the 12-04/12-05 H200 calls and
    the 12-07 H100 call (about 40 s from launch to the first step's start)."""
    s1 = train_case("s1", S1, 30, 8, 150, need=125, target={"s_per_step": 3.0})
    return [
        s1, train_case("s05", S05, 30, 12, 95, need=80, target={"s_per_step": 0.8}),
        # the product step at 704x1280 (18,480 tokens), as shipped
        train_case("product_704", S05, 30, 10, 130, height=704, width=1280, need=110, target={"s_per_step": 1.5},
                   extra=("data.height=704", "data.width=1280")),
        infer_case("slot", INFER_S2, 3, 140, need=130, target={"gpu_path_seconds": 12.0}),
        train_case("s2_l5", S2, 5, 12, 280, need=250),
        train_case("s2_l10", S2, 10, 12, 290, need=260),
        relaunch(s1, 70),
        # issue 54 item 3: the released Stage0.5 eager with every block recomputed (111.8 GiB on 12-04)
        train_case("s05_eager_full", S05, 30, 5, 80, shape_note="every block recomputed",
                   extra=("runtime.compile=false", "distributed.activation_checkpointing_skip_blocks=0")),
        train_case("s05_l15", S05, 15, 200, 140, need=130),
        train_case("s05_l15_fp8", S05, 15, 200, 145, extra=FP8, shape_note="FP8 tensorwise", need=135, of="s05_l15"),
        infer_case("val_s05", INFER_S05, 2, 150, passes=UNIPC50, clip="21 latents (81 frames), bidirectional"),
        infer_case("val_s1", INFER_S1, 2, 260, passes=FLOWMAP),
    ]


PLANS = {"h100": h100_cases, "h200": h200_cases}


def card_of(memory_bytes: int) -> str:
    return "h200" if memory_bytes >= 100 * GIB else "h100"


# --------------------------------------------------------------------------------------------- helpers


def events(path: Path) -> list[dict]:
    """A run's events so far (a line being written is left for the next look)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def steady(seconds: list[float], warm: int) -> float:
    return statistics.median(seconds[warm:] if len(seconds) > warm else seconds[-1:])


def stage2_updates(steps: list[dict], warm: int) -> dict:
    """Stage2's critic update (the median outer step without a student update, after ``warm``) and
    student update (the median step with one, the first left out: it allocates AdamW's state and
    compiles, less the critic's)."""
    after = [e for e in steps if e["step"] > warm]
    critic = [e["step_seconds"] for e in after if not e.get("student_updated")]
    both = [e["step_seconds"] for e in steps if e.get("student_updated")][1:]
    out: dict = {"student_steps": [e["step"] for e in steps if e.get("student_updated")]}
    if critic:
        c = statistics.median(critic)
        out["critic_update"] = round(c, 3)
        if both:
            out["student_update"] = round(statistics.median(both) - c, 3)
    first = next((e for e in steps if e.get("student_updated")), None)
    if first is not None:
        out["first_student_step_seconds"] = round(first["step_seconds"], 1)
    return out


SLOT = re.compile(r"solar: (?P<pass>\S+) slot (?P<i>\d+)/(?P<n>\d+) \((?P<sample>[^)]*)\) (?P<total>[\d.]+)s "
                  r"\((?P<phases>[^)]*)\)")
GPU_PATH = ("read", "generate", "truth", "decode")   # the GPU's thread; encode and files on the file worker


def slot_phases(lines: list[str]) -> list[dict]:
    """Each ``solar: <pass> slot i/n (<sample>) <s>s (read .. generate .. ...)`` line as numbers, with
    the GPU's path (read + generate + truth + decode)."""
    out = []
    for line in lines:
        m = SLOT.search(line if line.startswith("solar: ") else "solar: " + line)
        if not m:
            continue
        words = m["phases"].split()
        phases = {k: float(v) for k, v in zip(words[::2], words[1::2])}
        out.append({"pass": m["pass"], "slot": int(m["i"]), "of": int(m["n"]), "total": float(m["total"]),
                    **phases, "gpu_path": round(sum(phases.get(k, 0.0) for k in GPU_PATH), 2)})
    return out


def resolved_for(case: Case, root: str = WAN, data_root: str = "/tmp/unused"):
    from solar.config.resolve import resolve_file

    return resolve_file(REPO / root / case.config, case_sets(case, Path(data_root), Path("/tmp/unused")),
                        expected_action="train")


def forecast(case: Case, gpu_bytes: int, root: str = WAN) -> dict:
    """``solar config memory``'s figures for this case on a card of ``gpu_bytes``: with ``auto``, the
    kept blocks it chooses (as the trainer does at launch, one GPU per node) and the forecast there."""
    from solar.config import memory
    from solar.config.contracts import effective_dims

    resolved = resolved_for(case, root)
    cfg = resolved.config
    blocks = effective_dims(cfg).num_layers
    # with auto: the forecast at the kept blocks auto chooses (memory.auto_kept_blocks), or at every block
    # recomputed when nothing fits (then fits is False, where the trainer refuses to start)
    fc = memory.forecast(resolved, gpu_memory_bytes=gpu_bytes, gpus_per_node=1, look_faster=False)
    if not cfg.distributed.activation_checkpointing:
        skip = blocks
    elif cfg.distributed.activation_checkpointing_skip_blocks == "auto":
        skip = fc.auto
    else:
        skip = cfg.distributed.activation_checkpointing_skip_blocks
    out = {"forecast_kept": skip, "blocks": blocks, "forecast_peak_bytes": fc.peak_bytes, "fits": fc.fits}
    if resolved.route.stage == "stage2":
        roles = fc.roles   # before the student's first update: no student AdamW moments or EMA yet
        others = sum(v for r in roles.values() for k, v in r.items() if k not in ("gradients", "activations"))
        out["forecast_critic_only_bytes"] = others - roles["student"]["optimizer"] - roles["student"]["ema"] + \
            roles["critic"]["gradients"] + roles["critic"].get("activations", 0)
    return out


def case_sets(case: Case, data: Path, out: Path) -> list[str]:
    return [*COMMON, *case.sets, f"data.root={data}", f"runtime.output_dir={out}"]


def tiny_sets(sets: list[str]) -> list[str]:
    """The smoke run's edits: no block cuts (the tiny twins have their own dims), no compile."""
    return [s for s in sets if not s.startswith(("model.dims.num_layers=", "runtime.compile=", "data.height=",
                                                 "data.width="))]


def gpu_card() -> tuple[str, int]:
    """The first GPU's name and memory from nvidia-smi: this process never initialises CUDA (its
    context would take memory from every case it starts)."""
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()[0]
        name, mib = (x.strip() for x in line.rsplit(",", 1))
        return name, int(float(mib)) << 20
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return "cpu", 0


# ------------------------------------------------------------------------------------------ the runner


class Runner:
    def __init__(self, args, card: str, device: str, memory: int) -> None:
        self.args, self.card, self.device, self.memory = args, card, device, memory
        self.tiny = args.tiny
        self.root = TINY if self.tiny else WAN
        self.started = time.time()
        self.results: dict[str, dict] = {}
        self.lines: list[dict] = []
        self.child: subprocess.Popen | None = None
        self.out = Path(args.out) if args.out else None
        self.tree = _tree()

    # the budget
    def left(self) -> float:
        return self.args.budget - (time.time() - self.started)

    def emit(self, doc: dict) -> None:
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": self.device,
               "card": self.card, "tree": self.tree, **doc}
        self.lines.append(doc)
        line = json.dumps(doc)
        print(line, flush=True)
        if self.out:
            with open(self.out, "a") as f:
                f.write(line + "\n")

    def data(self, case: Case) -> Path:
        if self.tiny:
            root = WORK / "data-tiny"
            if not (root / "train-index.jsonl.gz").exists():
                subprocess.run([sys.executable, "-m", "solar", "data", "synth", "--family", "wan22_ti2v_5b",
                                "--out", str(root), "--samples", str(DATA_SAMPLES)], check=True, cwd=REPO,
                               stdout=subprocess.DEVNULL)
            return root
        if (case.height, case.width) != (480, 864):
            from solar.data import synth

            root = WORK / f"data-{case.height}x{case.width}"
            if not (root / "train-index.jsonl.gz").exists():   # as product_s05.data_root: the resolution only
                synth.RESOLUTION["released"]["wan22_ti2v_5b"] = (case.height, case.width)
                try:
                    synth.synthesize("wan22_ti2v_5b", root, samples=8, seed=1, profile="released")
                finally:
                    synth.RESOLUTION["released"]["wan22_ti2v_5b"] = (480, 864)
            return root
        return memory_runs.released_data(480, 864, samples=DATA_SAMPLES)

    def run(self, case: Case, limit: float) -> dict:
        if case.kind == "infer":
            return self.infer(case, limit)
        return self.train(case, limit)

    def _spawn(self, args: list[str], log_path: Path, env: dict) -> subprocess.Popen:
        self.child = subprocess.Popen(args, cwd=REPO, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                      start_new_session=True, env=env)
        return self.child

    def stop_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.child.wait()
        self.child = None

    def train(self, case: Case, limit: float) -> dict:
        config = REPO / self.root / case.config
        name = case.name
        out = WORK / "runs" / name
        shutil.rmtree(out, ignore_errors=True)
        sets = case_sets(case, self.data(case), out)
        if self.tiny:
            sets = tiny_sets(sets)
        want = case.steps if not self.tiny else min(case.steps, 12)
        env = dict(os.environ)
        if "runtime.compile=false" not in sets:
            env["TORCH_LOGS"] = "recompiles,graph_breaks"
        args = [sys.executable, "-m", "solar", "train", "--config", str(config)]
        for s in sets:
            args += ["--set", s]
        log_path = WORK / f"{name}.log"
        launched = time.time()
        proc = self._spawn(args, log_path, env)
        path = out / "events" / "rank-00000.jsonl"
        steps: list[dict] = []
        while proc.poll() is None and time.time() - launched < limit:
            steps = [e for e in events(path) if e["event"] == "step"]
            if len(steps) >= want:
                break
            time.sleep(0.5)
        self.stop_child()
        evs = events(path)
        steps = [e for e in evs if e["event"] == "step"][:want]
        text = log_path.read_text(errors="replace")
        rank_log = out / "logs" / "rank-00000.log"
        rank_text = rank_log.read_text(errors="replace") if rank_log.exists() else ""
        result: dict = {"case": name, "kind": case.kind, "shape": case.shape, "config": f"{self.root}/{case.config}",
                        "sets": list(case.sets), "wall_seconds": round(time.time() - launched, 1),
                        "steps_wanted": want, "steps_done": len(steps)}
        kept = next((e for e in evs if e["event"] == "activation_checkpointing"), None)
        if kept is not None:
            result.update(auto_kept=kept["skip_blocks"], blocks=kept["blocks"], auto_why=kept.get("why"),
                          forecast_peak_bytes=kept.get("forecast_peak_bytes"))
        fp8 = next((e for e in evs if e["event"] == "fp8"), None)
        if fp8 is not None:
            result["fp8_linears"] = fp8.get("linears")
        both = text + "\n" + rank_text
        result["recompiles"] = both.count("Recompiling function")
        result["graph_breaks"] = both.count("Graph break")
        if not steps:
            return {**result, "error": f"no step in {result['wall_seconds']}s", "log": both[-2500:]}
        seconds = [e["step_seconds"] for e in steps]
        warm = 2 if len(steps) < 50 else 5
        result.update(step_seconds=[round(s, 4) for s in seconds], first_step_seconds=round(seconds[0], 1),
                      to_first_step_seconds=round(steps[0]["time"] - launched, 1),
                      steady_median=round(steady(seconds, warm), 4), warm_left_out=warm,
                      losses=[e["loss"] for e in steps])
        peak = max(e["memory"].get("cuda_peak_bytes", 0) for e in steps)
        if peak:
            result["peak_bytes"] = peak
            result["peak_gib"] = round(peak / GIB, 2)
        if "stage2" in case.config:
            result.update(stage2_updates(steps, warm))
            # the whole forecast once a student update has run; before it, the critic's update alone
            fc_key = "forecast_peak_bytes"
            if not result.get("student_steps") and not self.tiny and self.memory:
                fc_key = "forecast_critic_only_bytes"
                result["forecast_critic_only_bytes"] = forecast(case, self.memory).get(fc_key)
            result["forecast_compared"] = fc_key
        else:
            result["forecast_compared"] = "forecast_peak_bytes"
        if result.get("forecast_peak_bytes") is None and self.memory and not self.tiny:
            result["forecast_peak_bytes"] = forecast(case, self.memory)["forecast_peak_bytes"]
        fc = result.get(result["forecast_compared"])
        if peak and fc:
            result["forecast_gib"] = round(fc / GIB, 2)
            result["forecast_over_measured"] = round(fc / peak, 3)
        if len(steps) < want:
            result["note"] = f"cut at {len(steps)} of {want} steps (limit {limit:.0f}s)"
        if case.kind == "relaunch" and case.of in self.results:
            first = self.results[case.of]
            if "to_first_step_seconds" in first:
                result["first_launch_to_first_step_seconds"] = first["to_first_step_seconds"]
                result["over_first_launch"] = round(result["to_first_step_seconds"] / first["to_first_step_seconds"], 3)
        return result

    def infer(self, case: Case, limit: float) -> dict:
        data = self.data(case)
        env = dict(os.environ, BENCH_CONFIG=f"{self.root}/{case.config}", BENCH_SAMPLES=str(case.steps),
                   BENCH_DATA=str(data), BENCH_WORK=str(WORK / f"infer-{case.name}"),
                   BENCH_SETS_JSON=json.dumps(list(case.sets)))
        log_path = WORK / f"{case.name}.log"
        launched = time.time()
        proc = self._spawn([sys.executable, str(REPO / "bench" / "gpu" / "infer_product.py")], log_path, env)
        while proc.poll() is None and time.time() - launched < limit:
            time.sleep(0.5)
        cut = proc.poll() is None
        self.stop_child()
        text = log_path.read_text(errors="replace")
        shutil.rmtree(WORK / f"infer-{case.name}" / "run", ignore_errors=True)   # a cut case's 20 GB checkpoint
        result: dict = {"case": case.name, "kind": "infer", "shape": case.shape, "config": env["BENCH_CONFIG"],
                        "sets": list(case.sets), "wall_seconds": round(time.time() - launched, 1)}
        doc = next((json.loads(ln) for ln in text.splitlines() if ln.startswith('{"bench": "infer_product"')), None)
        if doc is None:
            # cut or failed before its line: the slot lines solar infer printed so far are in its run's log
            logs = sorted((WORK / f"infer-{case.name}" / "out").glob("logs/rank-*.log"))
            lines = [ln for p in logs for ln in p.read_text(errors="replace").splitlines()]
            slots = slot_phases(lines)
            result.update(slots=slots, error="cut by its limit" if cut else "no result line", log=text[-2500:])
        else:
            slots = slot_phases(doc.get("slot_lines", []))
            result.update(checkpoint_write_seconds=doc.get("checkpoint_write_seconds"),
                          infer_wall_seconds=doc.get("infer_wall_seconds"), returncode=doc.get("returncode"),
                          slot_lines=doc.get("slot_lines"), slots=slots)
            if doc.get("returncode"):
                result["error"] = f"solar infer exit {doc.get('returncode')}"
                result["log"] = doc.get("stderr_tail", "")[-2500:]
        by_pass: dict[str, list[dict]] = {}
        for s in slots:
            by_pass.setdefault(s["pass"], []).append(s)
        result["passes"] = {}
        for name, rows in by_pass.items():
            later = rows[1:] or rows
            result["passes"][name] = {
                "first_slot": rows[0]["total"], "first_gpu_path": rows[0]["gpu_path"],
                "later_slot_median": round(statistics.median(r["total"] for r in later), 2),
                "later_gpu_path_median": round(statistics.median(r["gpu_path"] for r in later), 2),
                **{f"later_{k}_median": round(statistics.median(r.get(k, 0.0) for r in later), 2)
                   for k in ("generate", "truth", "decode", "encode")}}
        return result

    def compare_fp8(self, case: Case) -> dict | None:
        from bench.gpu.fp8_loss import compare

        mine, base = self.results.get(case.name), self.results.get(case.of or "")
        if not mine or not base or "losses" not in mine or "losses" not in base or not base.get("peak_bytes") \
                or not mine.get("peak_bytes"):
            return None
        doc = compare({**mine, "case": case.name}, {**base, "case": case.of})
        return {"case": f"{case.name}_vs_bf16", "kind": "fp8_compare", "shape": case.shape, **doc}


def _tree() -> str:
    if os.environ.get("BENCH_TREE"):   # a copy without .git (the device call runs a `git archive` of the commit)
        return os.environ["BENCH_TREE"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+changes" if dirty else "") if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ------------------------------------------------------------------------------- the recorded points

RESULTS = REPO / "bench" / "gpu" / "results"


def recorded() -> list[dict]:
    """Every train or relaunch line with a measured peak in the committed ``*-recipe-run-*.jsonl``
    files, with the card's memory from its call's start line."""
    out = []
    for path in sorted(RESULTS.glob("*-recipe-run-*.jsonl")):
        memory = 0
        for line in path.read_text().splitlines():
            doc = json.loads(line) if line.strip() else {}
            if doc.get("kind") == "start":
                memory = doc["gpu_memory_bytes"]
            elif doc.get("kind") in ("train", "relaunch") and doc.get("peak_bytes"):
                out.append({**doc, "gpu_memory_bytes": memory, "file": path.name})
    return out


def compared(record: dict) -> tuple[int, int, int]:
    """(measured peak, today's forecast of the same figure, the kept blocks today's forecast chooses)
    of one recorded line: the whole forecast, or the critic's update alone for a Stage2 case that
    ended before the student's first update."""
    case = {c.name: c for c in PLANS[record["card"]]()}[record["case"]]
    fc = forecast(case, record["gpu_memory_bytes"])
    return record["peak_bytes"], fc[record["forecast_compared"]], fc["forecast_kept"]


# ----------------------------------------------------------------------------------------- the summary


def summary_rows(lines: list[dict]) -> list[str]:
    rows = ["| case | card | shape | figure | kept | peak GiB | forecast GiB | fc/meas | target |",
            "|---|---|---|---|---|---|---|---|---|"]
    for d in lines:
        kind = d.get("kind")
        if kind in ("train", "relaunch"):
            if "steady_median" not in d:
                figure = d.get("error", "-")[:60]
            elif "critic_update" in d:
                figure = f"critic {d['critic_update']} s, student {d.get('student_update', '-')} s"
            else:
                figure = f"{d['steady_median']} s/step"
            if kind == "relaunch" and "to_first_step_seconds" in d:
                figure = (f"first step after {d['to_first_step_seconds']} s, first launch "
                          f"{d.get('first_launch_to_first_step_seconds', '-')} s ({d.get('over_first_launch', '-')}x)")
            elif "to_first_step_seconds" in d:
                figure += f"; first step at {d['to_first_step_seconds']} s"
            kept = f"{d.get('auto_kept', '-')}/{d.get('blocks', '-')}"
            target = _target_text(d)
            rows.append(f"| {d['case']} | {d['card']} | {d['shape']} | {figure} | {kept} | {d.get('peak_gib', '-')} | "
                        f"{d.get('forecast_gib', '-')} | {d.get('forecast_over_measured', '-')} | {target} |")
        elif kind == "infer":
            for name, p in (d.get("passes") or {}).items():
                rows.append(f"| {d['case']} ({name}) | {d['card']} | {d['shape']} | slot {p['later_slot_median']} s "
                            f"(first {p['first_slot']}); GPU path {p['later_gpu_path_median']} s (first "
                            f"{p['first_gpu_path']}): generate {p['later_generate_median']}, truth "
                            f"{p['later_truth_median']}, decode {p['later_decode_median']}; encode "
                            f"{p['later_encode_median']} | - | - | - | - | {_target_text(d)} |")
            if not d.get("passes"):
                rows.append(f"| {d['case']} | {d['card']} | {d['shape']} | {d.get('error', '-')} | - | - | - | - | - |")
        elif kind == "fp8_compare":
            rows.append(f"| {d['case']} | {d['card']} | {d['shape']} | {d['speedup']}x bf16's speed, loss max rel diff "
                        f"{d['max_rel_loss_diff']} (mean {d['mean_rel_loss_diff']}) over {d['steps']} steps | - | "
                        f"{round(d['peak_bytes'][0] / GIB, 2)} vs {round(d['peak_bytes'][1] / GIB, 2)} | - | - | - |")
        elif kind == "skipped":
            rows.append(f"| {d['case']} | {d['card']} | {d['shape']} | not run: {d['why']} | - | - | - | - | - |")
    return rows


def _target_text(d: dict) -> str:
    t = d.get("target") or {}
    if "s_per_step" in t and "steady_median" in d:
        return f"<= {t['s_per_step']} s: {'met' if d['steady_median'] <= t['s_per_step'] else 'not met'}"
    if "gpu_path_seconds" in t and d.get("passes"):
        p = next(iter(d["passes"].values()))
        met = p["later_gpu_path_median"] <= t["gpu_path_seconds"]
        first = p["first_slot"] - p["later_slot_median"] <= 2.0
        return (f"GPU path <= {t['gpu_path_seconds']} s: {'met' if met else 'not met'}; first slot within 2 s: "
                f"{'yes' if first else 'no'}")
    return "-"


# --------------------------------------------------------------------------------------------- main


def plan_for(card: str, names: list[str]) -> list[Case]:
    cases = PLANS[card]()
    if not names:
        return cases
    known = {c.name: c for c in cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"recipe_run: unknown case(s) for {card}: {', '.join(unknown)}; "
                         f"use {', '.join(known)}")
    return [known[n] for n in names]


def dry_run(card: str, cases: list[Case]) -> list[dict]:
    """Every case resolved and forecast on both cards, without a GPU or torch."""
    docs = []
    for case in cases:
        doc = {"case": case.name, "kind": case.kind, "card": card, "shape": case.shape, "config": case.config,
               "sets": list(case.sets), "steps": case.steps, "cost_seconds": case.cost}
        if case.kind in ("train", "relaunch"):
            for name, memory in CARDS.items():
                fc = forecast(case, memory)
                doc[name] = {"kept": fc["forecast_kept"], "blocks": fc["blocks"],
                             "forecast_gib": round(fc["forecast_peak_bytes"] / GIB, 2), "fits": fc["fits"]}
        else:
            from solar.config.resolve import resolve_file

            sets = ["distributed.world_size=1", "model.pretrained_path=", "model.vae_path=", "data.root=/tmp/unused",
                    "runtime.output_dir=/tmp/unused", "checkpoint.path=/tmp/unused", "checkpoint.weights=live",
                    f"validation.sample_count={case.steps}", *case.sets]
            resolved = resolve_file(REPO / WAN / case.config, sets, expected_action="infer")
            doc["passes"] = [p.name for p in resolved.config.validation.passes]
        docs.append(doc)
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="cases to run, in this order (default: the card's whole plan)")
    parser.add_argument("--plan", choices=["auto", "h100", "h200"], default="auto",
                        help="the shapes: auto chooses by the card's memory (>= 100 GiB: h200)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("BENCH_BUDGET", "540")),
                        help="seconds for the whole call; a case starts only if its need fits what is left")
    parser.add_argument("--out", default=str(Path(os.environ["OUT"]) / "recipe-run.jsonl") if os.environ.get("OUT")
                        else None, help="append every JSON line here as it lands")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: resolve and forecast every case")
    parser.add_argument("--card", choices=list(CARDS), help="with --dry-run: the plan of this card")
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke run on the tiny twins")
    parser.add_argument("--keep-cache", action="store_true", help="keep the compile caches of an earlier call")
    parser.add_argument("--pick", action="append", default=[], metavar="CARD=CASE,CASE",
                        help="the cases to run when the card is CARD (a call that may get either card)")
    args = parser.parse_args(argv)
    picks = {}
    for item in args.pick:
        card_name, _, names = item.partition("=")
        if card_name not in CARDS or not names:
            parser.error(f"--pick {item}: use h100=CASE,CASE or h200=CASE,CASE")
        picks[card_name] = [n for n in names.split(",") if n]

    if args.dry_run:
        card = args.card or (args.plan if args.plan != "auto" else "h100")
        for doc in dry_run(card, plan_for(card, args.cases or picks.get(card, []))):
            print(json.dumps(doc))
        return 0

    device, memory = gpu_card()
    card = args.plan if args.plan != "auto" else (card_of(memory) if memory else "h100")
    if args.tiny:
        device, memory = "cpu (tiny twins)", 0
    cases = plan_for(card, args.cases or picks.get(card, []))
    WORK.mkdir(parents=True, exist_ok=True)
    memory_runs.WORK = WORK   # the synthesized data lives with this run's work
    cache = WORK / "run-root" / ".cache"
    if not args.keep_cache:
        shutil.rmtree(cache, ignore_errors=True)   # a new run's volume: nothing compiled yet
    for name, leaf in (("TORCHINDUCTOR_CACHE_DIR", "torchinductor"), ("TRITON_CACHE_DIR", "triton")):
        os.environ[name] = str(cache / leaf)   # where the operator puts them (solar_operator.pod.COMPILE_CACHES)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    runner = Runner(args, card, device, memory)

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    runner.emit({"kind": "start", "plan": [c.name for c in cases], "budget": args.budget,
                 "gpu_memory_bytes": memory, "cache": str(cache)})
    try:
        for case in cases:
            left = runner.left()
            need = case.need if case.need is not None else case.cost
            if args.tiny:
                need = 0
            if left < need:
                runner.emit({"case": case.name, "kind": "skipped", "shape": case.shape,
                             "why": f"budget: {left:.0f}s left, needs about {need:.0f}s on {card}"})
                continue
            if case.kind == "relaunch" and case.of not in runner.results:
                runner.emit({"case": case.name, "kind": "skipped", "shape": case.shape,
                             "why": f"its first launch ({case.of}) did not run in this call"})
                continue
            limit = min(left - 3, max(case.cost * 2, 60)) if not args.tiny else 300
            result = runner.run(case, limit)
            if case.target:
                result["target"] = case.target
            runner.results[case.name] = result
            runner.emit(result)
            if case.of and case.kind == "train":
                cmp = runner.compare_fp8(case)
                if cmp:
                    runner.results[cmp["case"]] = cmp
                    runner.emit(cmp)
    except KeyboardInterrupt as exc:
        runner.stop_child()
        runner.emit({"kind": "stopped", "why": str(exc) or "interrupted"})
    finally:
        runner.stop_child()
        runner.emit({"kind": "end", "seconds": round(time.time() - runner.started, 1)})
        table = "\n".join(summary_rows(runner.lines))
        if os.environ.get("OUT"):
            (Path(os.environ["OUT"]) / "recipe-run-summary.md").write_text(table + "\n")
            with tarfile.open(Path(os.environ["OUT"]) / "recipe-run-logs.tar.gz", "w:gz") as tar:
                for log in sorted(WORK.glob("*.log")) + sorted(WORK.glob("runs/*/logs/rank-*.log")) + \
                        sorted(WORK.glob("infer-*/out/logs/rank-*.log")):
                    tar.add(log, arcname=str(log.relative_to(WORK)))
        print("\n" + table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
