"""Every released TI2V-5B training stage through the product (issue 25): ``python -m solar train`` on
the released config at its own shape (81 frames 480x864 unless the config says otherwise) on
``solar data synth --profile released`` data, world 1, unsharded, no save. The trainer's own step
events give the step times (steady state: the median of the steps after ``WARM``; the first steps
compile) and ``memory.cuda_peak_bytes`` (``torch.cuda.max_memory_allocated``). A ``val_*`` case
validates one test row with every pass of the config at step 1 and reads the validation event.

Stage2's three 5B roles do not fit one GPU unsharded: its cases cut ``model.dims.num_layers`` (5,
10 and 15 blocks) and the recipe table extrapolates to 30, saying so. A ``*_profile`` case sets
``runtime.profile_steps`` and carries the trainer's profile summaries (``profile/*.json``) in its
result. A case named ``*_before`` runs
the trainer of the tree at ``$BENCH_BASE`` (another checkout's ``trainer/``) with the same config, so
a change is measured against what it replaces in one call. Compiled cases log recompiles and graph
breaks (``TORCH_LOGS``) and report their count.

    PYTHONPATH=trainer:. python3 bench/gpu/stages_product.py CASE [CASE ...]
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.memory_runs import WAN, prepare

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/solar-stages"))
S1 = ["checkpoint.path=null", "checkpoint.weights=null"]
S2 = ["checkpoint.roles=null", "train.ema.start_step=1"]
COMPILE = ["runtime.compile=true"]
# The released Stage0.5 81f, Stage1 AnyFlow and Stage2 configs compile (fast defaults); the
# eager cases keep the figures recorded before that comparable.
EAGER = ["runtime.compile=false"]
VALIDATE = ["runtime.validation_steps=[1]", "validation.sample_count=1"]
VALIDATE2 = ["runtime.validation_steps=[1]", "validation.sample_count=2"]
SAVE_ATTENTION = ["distributed.activation_checkpointing_policy=save_attention"]
# name: (config, extra --set values, step events to wait for)
CASES = {
    "s05_81f": (f"{WAN}/train_stage0p5_fm_81f.yaml", EAGER, 8),
    "s05_81f_compile": (f"{WAN}/train_stage0p5_fm_81f.yaml", COMPILE, 10),
    "s05_153f": (f"{WAN}/train_stage0p5_fm_153f.yaml", [], 6),
    # recomputation priced for Stage0.5 81f: at the released topology (hybrid_shard over 8, 80 GB)
    # `solar config memory` forecasts even no recomputation at all to fit (66.8 GiB); one unsharded
    # H200 holds fewer kept blocks, so two sizes give the per-block saving
    "s05_81f_compile_skip10": (f"{WAN}/train_stage0p5_fm_81f.yaml", COMPILE + [
        "distributed.activation_checkpointing_skip_blocks=10"], 10),
    "s05_81f_compile_skip18": (f"{WAN}/train_stage0p5_fm_81f.yaml", COMPILE + [
        "distributed.activation_checkpointing_skip_blocks=18"], 10),
    "s1_anyflow": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + EAGER, 8),
    "s1_anyflow_before": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + EAGER, 6),
    "s1_anyflow_compile": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE, 8),
    # the forward with grad keeps the attention outputs (and the last N blocks everything) instead of recomputing
    "s1_anyflow_compile_sa": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION, 8),
    "s1_anyflow_compile_sa_skip6": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION + [
        "distributed.activation_checkpointing_skip_blocks=6"], 8),
    "s1_anyflow_compile_sa_skip10": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION + [
        "distributed.activation_checkpointing_skip_blocks=10"], 8),
    "s1_anyflow_compile_sa_skip12": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION + [
        "distributed.activation_checkpointing_skip_blocks=12"], 8),
    "s1_anyflow_compile_sa_skip14": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION + [
        "distributed.activation_checkpointing_skip_blocks=14"], 8),
    # the clean context with compiled blocks (the trainer's SOLAR_COMPILED_CONTEXT switch, CASE_ENV)
    "s1_anyflow_compile_sa_skip6_ctx": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION + [
        "distributed.activation_checkpointing_skip_blocks=6"], 8),
    # issue 25's FP8 candidate: every block linear through torchao's float8 recipe (model.fp8_linear)
    "s1_anyflow_compile_sa_skip12_fp8": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + COMPILE + SAVE_ATTENTION + [
        "distributed.activation_checkpointing_skip_blocks=12", "model.fp8_linear=tensorwise"], 8),
    # runtime.profile_steps: the trainer's own torch.profiler tables (steady steps)
    "s1_anyflow_profile": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + EAGER + ["runtime.profile_steps=[4]"], 4),
    "s1_anyflow_save_attention": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml",
                                  S1 + EAGER + ["distributed.activation_checkpointing_policy=save_attention"], 8),
    "s1_tffm": (f"{WAN}/train_stage1_tf_fm_81f.yaml", S1, 6),
    # student updates at outer steps 6, 11, 16 (the first allocates AdamW's state: left out)
    "s2_l5": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + EAGER + ["model.dims.num_layers=5"], 17),
    "s2_l10": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + EAGER + ["model.dims.num_layers=10"], 17),
    # step 10: a critic update alone; step 11: a student update (its second) and a critic update
    "s2_l5_profile": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + EAGER + ["model.dims.num_layers=5",
                                                                 "runtime.profile_steps=[10,11]"], 11),
    "s2_l5_compile": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + COMPILE + ["model.dims.num_layers=5"], 17),
    "s2_l10_compile": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + COMPILE + ["model.dims.num_layers=10"], 17),
    "s2_l15_compile": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + COMPILE + ["model.dims.num_layers=15"], 17),
    # recomputation's share: every block keeps its activations (skip 10 of 10) or its attention
    # outputs; the per-block difference against s2_l10_compile prices skip_blocks at 30 blocks
    "s2_l10_compile_skip10": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + COMPILE + [
        "model.dims.num_layers=10", "distributed.activation_checkpointing_skip_blocks=10"], 17),
    "s2_l10_compile_sa": (f"{WAN}/train_stage2_sgf_81f.yaml", S2 + COMPILE + SAVE_ATTENTION + [
        "model.dims.num_layers=10"], 17),
    "val_s05": (f"{WAN}/train_stage0p5_fm_81f.yaml", EAGER + VALIDATE, 1),
    # as shipped (compiled blocks generate too), one live pass over two slots (the first compiles; an
    # EMA pass computes the same): the figures the recipe's validation rows should use
    "val_s05_shipped": (f"{WAN}/train_stage0p5_fm_81f.yaml", VALIDATE2 + [
        "validation.passes=[{name: live-unipc, weights: live, solver: unipc, steps: 50}]"], 1),
    "val_s1_flowmap4_shipped": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + VALIDATE2 + [
        "validation.passes=[{name: live-flowmap4, weights: live, solver: flowmap, steps: 4}]"], 1),
    "val_s1_flowmap50_shipped": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + VALIDATE2 + [
        "validation.passes=[{name: live-flowmap50, weights: live, solver: flowmap, steps: 50}]"], 1),
    "val_s1": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + EAGER + VALIDATE, 1),
    # the 4-step pass alone (an EMA pass computes the same as its live twin)
    "val_s1_flowmap4": (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", S1 + EAGER + VALIDATE + [
        "validation.passes=[{name: live-flowmap4, weights: live, solver: flowmap, steps: 4}]"], 1),
}
CASE_ENV = {"s1_anyflow_compile_sa_skip6_ctx": {"SOLAR_COMPILED_CONTEXT": "1"}}
WARM = 2
# BENCH_STACKS=N: every trainer process writes all its threads' Python stacks to its stderr every N
# seconds (faulthandler, through a sitecustomize on its path): where a long first step spends its time
STACKS = float(os.environ.get("BENCH_STACKS", "0"))
LIMIT = float(os.environ.get("BENCH_CASE_LIMIT", "420"))  # BENCH_STEPS: step events to wait for


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _compile_log(log: str) -> dict:
    lines = log.splitlines()
    recompiles = [ln for ln in lines if "Recompiling function" in ln]
    breaks = [ln for ln in lines if "Graph break" in ln]
    reasons = [ln.strip()[:300] for ln in lines if "triggered by the following guard failure" in ln or
               "- 0/" in ln or "Reason:" in ln]
    return {"recompiles": len(recompiles), "graph_breaks": len(breaks),
            "first_recompiles": [ln.strip()[:300] for ln in recompiles[:6]], "first_reasons": reasons[:8],
            "first_breaks": [ln.strip()[:300] for ln in breaks[:6]]}


def run(name: str) -> dict:
    config, extra, want = CASES[name]
    want = int(os.environ.get("BENCH_STEPS", want))  # fewer steps when device time is short
    validating = name.startswith("val_")
    listed = next((e.split("=", 1)[1] for e in extra if e.startswith("runtime.profile_steps=")), "[]")
    profiles_wanted = len(json.loads(listed))
    sets, out = prepare(WORK, name, extra)
    env = dict(os.environ)
    if name.endswith("_before"):
        base = Path(os.environ["BENCH_BASE"]).resolve()
        env["PYTHONPATH"] = f"{base / 'trainer'}:{env.get('PYTHONPATH', '')}"  # its solar package first
    if "runtime.compile=true" in extra:
        env["TORCH_LOGS"] = "recompiles,graph_breaks"
    env.update(CASE_ENV.get(name, {}))
    if STACKS > 0:
        site = WORK / "stacks"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(
            f"import faulthandler, sys\nfaulthandler.dump_traceback_later({STACKS}, repeat=True, file=sys.stderr)\n")
        env["PYTHONPATH"] = f"{site}:{env.get('PYTHONPATH', '')}"
    args = [sys.executable, "-m", "solar", "train", "--config", str(REPO / config)]
    for s in sets:
        args += ["--set", s]
    log_path = WORK / f"{name}.log"
    started = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)
        events_path = out / "events" / "rank-00000.jsonl"
        steps, validations = [], []
        while proc.poll() is None and time.time() - started < LIMIT:
            events = _events(events_path)
            steps = [e for e in events if e["event"] == "step"]
            validations = [e for e in events if e["event"] == "validation"]
            profiled = len(list((out / "profile").glob("*.json")))   # a profiled step's files come after its event
            if (validations if validating else len(steps) >= want and profiled >= profiles_wanted):
                break
            time.sleep(1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = log_path.read_text()
    rank_log = out / "logs" / "rank-00000.log"   # the trainer's own output (TORCH_LOGS included)
    rank_text = rank_log.read_text(errors="replace") if rank_log.exists() else ""
    result = {"case": name, "config": config, "sets": extra, "wall_seconds": round(time.time() - started, 1)}
    if "runtime.compile=true" in extra:
        result["compile"] = _compile_log(text + "\n" + rank_text)   # TORCH_LOGS writes to the process's stderr
        text = text + rank_text
    profiles = sorted((out / "profile").glob("*.json"))
    if profiles:
        result["profiles"] = [json.loads(p.read_text()) for p in profiles]
    if validating:
        # the validation's own per-slot lines: "solar: PASS slot 1/1 (SAMPLE) 12.3s (read 0.1 generate 5.2 ...)"
        slots = [ln.split("solar: ", 1)[1] for ln in rank_text.splitlines()
                 if "solar: " in ln and re.search(r" slot \d+/\d+ ", ln)]
        if not validations:
            return {**result, "error": "no validation event", "slot_lines": slots, "log": text[-1500:]}
        v = validations[0]
        return {**result, "validation_seconds": round(v["seconds"], 2), "slot_lines": slots,
                "train_step_seconds": [round(e["step_seconds"], 3) for e in steps],
                "validation": {k: v[k] for k in v if k not in ("event", "time")}}
    if len(steps) < want:
        return {**result, "error": f"{len(steps)} steps", "log": text[-1500:]}
    seconds = [round(e["step_seconds"], 3) for e in steps]
    steady = seconds[WARM:]
    result.update(step_seconds=seconds, steady_median=round(statistics.median(steady), 3),
                  peak_bytes=max(e["memory"].get("cuda_peak_bytes", 0) for e in steps),
                  losses=[round(e["loss"], 5) for e in steps])
    if name.startswith("s2_"):
        critic = [s for e, s in zip(steps[WARM:], steady) if not e["student_updated"]]
        both = [s for e, s in zip(steps[WARM:], steady) if e["student_updated"]][1:]
        c = statistics.median(critic)
        result.update(critic_update=round(c, 3), student_update=round(statistics.median(both) - c, 3),
                      student_steps=[e["step"] for e in steps if e["student_updated"]])
    return result


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:]:
        print(json.dumps(run(name)), flush=True)


if __name__ == "__main__":
    main()
