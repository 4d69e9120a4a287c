"""Crash consistency of checkpoint transactions: SIGKILL a tiny run that saves every step at random
moments; after each kill every step_NNNNNNNN directory must verify, no partial (even one holding
COMPLETE.json, killed just before its rename) may be listed as complete, and a full resume from the newest valid checkpoint must run. Prints JSON.

    python bench/crash/crash_consistency.py [--trials 30] [--seed 0] [--workdir /tmp/solar-crash] [--async-checkpoint]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "trainer"))

from solar.storage.checkpoints import latest_valid, list_checkpoints, verify  # noqa: E402

CONFIG = REPO / "configs/solar_wm/tiny/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml"


def solar(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "solar", *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def trial(index: int, work: Path, data: Path, rng: random.Random, background: bool = False) -> dict:
    out = work / f"run-{index:03d}"
    sets = ["--set", f"data.root={data}", "--set", f"runtime.output_dir={out}", "--set", "train.max_steps=100000",
            "--set", "runtime.save_every=1", "--set", "runtime.log_every=100000"]
    if background:  # saves written by a background thread, committed at a later step
        sets += ["--set", "runtime.async_checkpoint=true"]
    proc = solar("train", "--config", str(CONFIG), *sets)
    events = out / "events" / "rank-00000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (events.exists() and '"checkpoint"' in events.read_text()):
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the middle of steps and saves
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows = list_checkpoints(out)
    problems = []
    marked_partials = 0
    for entry in (out / "checkpoints").iterdir():
        if entry.name.endswith(".partial"):
            # Killed between COMPLETE.json and the rename: still a partial, never a checkpoint.
            marked_partials += (entry / "COMPLETE.json").exists()
            continue
        if (entry / "COMPLETE.json").exists() and not verify(entry)["valid"]:
            problems.append(f"{entry.name} has COMPLETE.json but does not verify")
    partials = [r for r in rows if ".partial" in r["path"]]
    if any(r["complete"] or r["valid"] for r in partials):
        problems.append("a partial checkpoint was listed as complete")
    newest = latest_valid(out)
    resumed = None
    if newest is None:
        problems.append("no valid checkpoint to resume from")
    else:
        # Same config (a resume may change only checkpoint.* and runtime.exit_after_step): one more step.
        resume = solar("train", "--config", str(CONFIG), *sets, "--set", f"runtime.exit_after_step={newest['step'] + 1}",
                       "--set", "checkpoint.mode=full_resume", "--set", f"checkpoint.path={newest['path']}")
        _, err = resume.communicate(timeout=300)
        resumed = resume.returncode
        if resume.returncode != 0:
            problems.append(f"resume from step {newest['step']} failed: {err.strip().splitlines()[-1:]}")
        elif not verify(out / "checkpoints" / f"step_{newest['step'] + 1:08d}")["valid"]:
            problems.append(f"the resumed run did not commit step {newest['step'] + 1}")
    shutil.rmtree(out, ignore_errors=True)
    return {"trial": index, "checkpoints": len(rows) - len(partials), "partials": len(partials),
            "partials_with_complete_marker": marked_partials,
            "newest": newest and newest["step"], "resume_rc": resumed, "problems": problems}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/solar-crash")
    parser.add_argument("--async-checkpoint", action="store_true", help="runtime.async_checkpoint=true")
    args = parser.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from solar.data.synth import synthesize

    synthesize("wan22_ti2v_5b", work / "data", samples=4, seed=0)
    rng = random.Random(args.seed)
    started = time.time()
    trials = [trial(i, work, work / "data", rng, args.async_checkpoint) for i in range(args.trials)]
    failures = [t for t in trials if t["problems"]]
    print(json.dumps({"benchmark": "checkpoint crash consistency (SIGKILL)", "date": time.strftime("%Y-%m-%d"),
                      "async_checkpoint": args.async_checkpoint,
                      "trials": len(trials), "failures": len(failures),
                      "trials_with_partial_left": sum(1 for t in trials if t["partials"]),
                      "partials_with_complete_marker": sum(t["partials_with_complete_marker"] for t in trials),
                      "checkpoints_verified": sum(t["checkpoints"] for t in trials),
                      "seconds": round(time.time() - started, 1), "details": failures or trials[:3]}, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
