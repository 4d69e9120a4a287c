"""Crash consistency of checkpoint transactions: SIGKILL a tiny run that saves every step at random
moments; after each kill every step_NNNNNNNN directory must verify, no partial (even one holding
COMPLETE.json, killed just before its rename) may be listed as complete, and a full resume from the
newest valid checkpoint (same world and sharding) must run and commit the next step. Prints JSON.

At ``--world N`` (N > 1) the run is N ranks under ``torchrun --standalone`` with
``distributed.sharding`` (full_shard: every rank writes its own shards of each save). The kill hits
any one rank, chosen at random (its local rank is recorded), or in about one trial of four
(``--agent-kills``) the torchrun agent itself; torchrun then tears the other ranks down, and what is
still alive after ``--teardown-timeout`` seconds is killed. Ranks die with a killed agent (the
parent-death signal each rank asks for); one still alive ``--orphan-grace`` seconds later is a
failure of the trial (and is killed). ``--kill-in-save`` aims each kill inside a save, while a
partial checkpoint directory holds some of its files, so every trial tears a save.

    python bench/crash/crash_consistency.py [--trials 30] [--seed 0] [--workdir /tmp/solar-crash]
        [--world 1] [--sharding none] [--async-checkpoint] [--decode-latents N] [--kill-in-save]
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

from solar.storage.checkpoints import PARTIAL_DIR, STEP_DIR, latest_valid, list_checkpoints, verify  # noqa: E402

CONFIG = REPO / "configs/solar_wm/tiny/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml"
# A launcher's variables must not leak into the runs (a bench started under torchrun, a fault drill).
_DROP = ("SOLAR_INJECT_FAULT", "SOLAR_ALLOW_FAULTS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
         "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


MARK = "SOLAR_CRASH_LAUNCH"  # in every process of one launch (torchrun passes its environment on)


def solar(*args: str, world: int = 1, log: Path | None = None, mark: str = "", **kw) -> subprocess.Popen:
    """``python -m solar ARGS`` (world 1) or torchrun with ``world`` ranks of it, in a session of its own;
    stdout and stderr go to ``log``; every process of the launch carries ``SOLAR_CRASH_LAUNCH=mark``."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **{MARK: mark})
    # the trainer of the tree this bench sits in (a snapshot of a commit too), not the venv's editable install
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "trainer"), *filter(None, [env.get("PYTHONPATH")])])
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"] if world > 1 else []
    sink = open(log, "ab") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen([sys.executable, *launcher, "-m", "solar", *args], cwd=REPO, env=env,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, **kw)
    finally:
        if log is not None:
            sink.close()


# --- processes ------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def launched(mark: str) -> list[int]:
    """The live processes of one launch: those carrying its ``SOLAR_CRASH_LAUNCH`` mark."""
    key = f"{MARK}={mark}".encode()
    return sorted(int(e) for e in os.listdir("/proc")
                  if e.isdigit() and int(e) != os.getpid() and alive(int(e)) and key in _environ(int(e)))


def local_rank(pid: int) -> int | None:
    for item in _environ(pid):
        if item.startswith(b"LOCAL_RANK="):
            return int(item.split(b"=", 1)[1])
    return None


def workers(agent: int, world: int, timeout: float = 60.0) -> dict[int, int]:
    """{local rank: pid} of the torchrun agent's worker processes (its children; all ``world`` of them)."""
    deadline = time.monotonic() + timeout
    while True:
        kids = [int(e) for e in os.listdir("/proc") if e.isdigit() and (_stat(int(e)) or ("", 0))[1] == agent]
        ranks = {r: p for p in kids if (r := local_rank(p)) is not None}
        if len(ranks) == world or time.monotonic() > deadline:
            return ranks
        time.sleep(0.05)


def kill_launch(mark: str) -> int:
    """SIGKILL every live process of the launch; how many there were."""
    pids = launched(mark)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def wait_gone(pids, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_launch_gone(mark: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while launched(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# --- one trial --------------------------------------------------------------------------------
def _in_save(checkpoints: Path, timeout: float) -> bool:
    """Wait until a save is under way (a ``.step_N.<random>.partial`` directory holds a file); False when none
    came within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for partial in checkpoints.glob(".step_*.partial"):
            try:
                if any(p.is_file() for p in partial.rglob("*")):
                    return True
            except OSError:   # committed (renamed) while looked at
                continue
        time.sleep(0.002)
    return False


def trial(index: int, work: Path, data: Path, rng: random.Random, background: bool = False, *, world: int = 1,
          sharding: str = "none", decode_latents: int | None = None, kill_window: float = 1.5,
          agent_kills: float = 0.25, orphan_grace: float = 3.0, teardown_timeout: float = 90.0,
          in_save: bool = False) -> dict:
    started = time.monotonic()
    out = work / f"run-{index:03d}"
    log = work / f"run-{index:03d}.log"
    sets = ["--set", f"data.root={data}", "--set", f"runtime.output_dir={out}", "--set", "train.max_steps=100000",
            "--set", "runtime.save_every=1", "--set", "runtime.log_every=100000"]
    if world > 1:  # the tiny config's global batch is world x micro (1) x accumulation (1)
        sets += ["--set", f"distributed.world_size={world}", "--set", f"distributed.sharding={sharding}",
                 "--set", f"train.global_batch_size={world}"]
    if decode_latents is not None:  # validations decode one latent per slot, not whole clips
        sets += ["--set", f"validation.decode_latents={decode_latents}"]
    if background:  # saves written by a background thread, committed at a later step
        sets += ["--set", "runtime.async_checkpoint=true"]
    mark = f"{work}/{index}/run"
    proc = solar("train", "--config", str(CONFIG), *sets, world=world, log=log, mark=mark)
    events = out / "events" / "rank-00000.jsonl"
    problems: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not (
            events.exists() and '"checkpoint"' in events.read_text()):
        time.sleep(0.05)
    first_checkpoint = time.monotonic() - started
    ranks = workers(proc.pid, world) if world > 1 else {0: proc.pid}
    if proc.poll() is not None:
        problems.append(f"the run exited (rc {proc.returncode}) before the kill")
    elif len(ranks) != world:
        problems.append(f"found {len(ranks)} of {world} ranks under the torchrun agent {proc.pid}")
    delay = rng.uniform(0.0, kill_window)  # somewhere in the middle of steps and saves
    agent = world > 1 and rng.random() < agent_kills
    target = None if agent else rng.choice(sorted(ranks)) if ranks else 0
    if in_save:   # aimed inside a save: the kill lands while a partial holds some of the save's files
        if not _in_save(out / "checkpoints", 60):
            problems.append("no save was seen under way to kill it in")
    else:
        time.sleep(delay)
    before_kill = _last_event(events)
    victim = proc.pid if agent or world == 1 else ranks.get(target, proc.pid)
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        problems.append(f"pid {victim} was gone before the kill")
    leftovers = orphans = 0
    torn = time.monotonic()
    if agent:
        proc.wait()
        # Each rank dies with its agent (the parent-death signal: solar.processes); any still alive
        # after orphan_grace seconds outlived it, a fault, and is killed as a lost node would be.
        wait_gone(ranks.values(), orphan_grace)
        orphans = kill_launch(mark)
        if orphans:
            problems.append(f"{orphans} processes of the launch outlived their killed agent by {orphan_grace:g}s")
    else:
        try:
            proc.wait(timeout=teardown_timeout)
        except subprocess.TimeoutExpired:
            problems.append(f"torchrun did not exit {teardown_timeout:g}s after rank {target} was killed")
    if not wait_launch_gone(mark, 0 if problems else teardown_timeout):
        leftovers = kill_launch(mark)
        problems.append(f"{leftovers} processes of the launch outlived the teardown and were killed")
        wait_launch_gone(mark, 30)
    proc.wait()
    teardown = time.monotonic() - torn

    rows = list_checkpoints(out)
    marked_partials = verified = 0
    layouts = set()
    for entry in sorted((out / "checkpoints").iterdir()) if (out / "checkpoints").is_dir() else []:
        if PARTIAL_DIR.match(entry.name):
            # Killed between COMPLETE.json and the rename: still a partial, never a checkpoint.
            marked_partials += (entry / "COMPLETE.json").exists()
            continue
        if STEP_DIR.match(entry.name):  # only a commit's rename makes one: it must verify
            report = verify(entry)
            if not report["valid"]:
                problems.append(f"{entry.name} does not verify: {report['problems'][:3]}")
            verified += report["valid"]
            layouts |= {r["layout"] for r in report["roles"].values()}
    partials = [r for r in rows if ".partial" in r["path"]]
    if any(r["complete"] or r["valid"] for r in partials):
        problems.append("a partial checkpoint was listed as complete")
    if world > 1 and sharding != "none" and layouts and layouts != {"sharded"}:
        problems.append(f"a world-{world} {sharding} run saved layouts {sorted(layouts)}, not sharded")
    newest = latest_valid(out)
    resumed = resume_s = None
    if newest is None:
        problems.append("no valid checkpoint to resume from")
    else:
        # Same config, world and sharding (a resume may change only checkpoint.* and
        # runtime.exit_after_step; a full resume needs the saving world): one more step.
        nxt = newest["step"] + 1
        again, resume_started = f"{work}/{index}/resume", time.monotonic()
        resume = solar("train", "--config", str(CONFIG), *sets, "--set", f"runtime.exit_after_step={nxt}",
                       "--set", "checkpoint.mode=full_resume", "--set", f"checkpoint.path={newest['path']}",
                       world=world, log=log, mark=again)
        try:
            resumed = resume.wait(timeout=300)
        except subprocess.TimeoutExpired:
            kill_launch(again)
            resumed = resume.wait()
            problems.append(f"resume from step {newest['step']} ran over 300s")
        resume_s = round(time.monotonic() - resume_started, 1)
        if not wait_launch_gone(again, 30):
            problems.append(f"{kill_launch(again)} processes of the resume outlived it and were killed")
        if resumed != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            problems.append(f"resume from step {newest['step']} failed (rc {resumed}): {tail}")
        elif not verify(out / "checkpoints" / f"step_{nxt:08d}")["valid"]:
            problems.append(f"the resumed run did not commit step {nxt}")
    if problems:  # keep the evidence
        keep = work / "failed" / out.name
        keep.parent.mkdir(exist_ok=True)
        shutil.move(str(out), keep)
        if log.exists():
            shutil.move(str(log), keep.parent / log.name)
    else:
        shutil.rmtree(out, ignore_errors=True)
        log.unlink(missing_ok=True)
    return {"trial": index, "killed": "agent" if agent else f"rank {target}", "kill_delay_s": round(delay, 3),
            "last_event_before_kill": before_kill, "orphans_killed": orphans, "leftovers_killed": leftovers,
            "teardown_s": round(teardown, 2), "checkpoints": verified, "partials": len(partials),
            "partials_with_complete_marker": marked_partials, "layouts": sorted(layouts),
            "newest": newest and newest["step"], "resume_rc": resumed,
            "first_checkpoint_s": round(first_checkpoint, 1), "resume_s": resume_s, "seconds": round(time.monotonic() - started, 1),
            "problems": problems}


def _last_event(events: Path) -> str | None:
    """The rank-0 event log's last line as ``event@step`` (where the run was just before the kill)."""
    try:
        last = json.loads(events.read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return f"{last.get('event')}@{last.get('step')}"


def code_version() -> str | None:
    """The commit of the trainer under test: ``REPO/.commit`` (a ``git archive`` snapshot's, written by
    whoever made it) or git's HEAD, ``-dirty`` when trainer/ or configs/ have uncommitted changes."""
    stamp = REPO / ".commit"
    if stamp.is_file():
        return stamp.read_text().strip()
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "trainer", "configs"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return (head + ("-dirty" if dirty else "")) or None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/solar-crash")
    parser.add_argument("--async-checkpoint", action="store_true", help="runtime.async_checkpoint=true")
    parser.add_argument("--world", type=int, default=1, help="ranks under torchrun (1: one process, no torchrun)")
    parser.add_argument("--sharding", default="none", choices=["none", "full_shard", "hybrid_shard"],
                        help="distributed.sharding (full_shard for sharded saves at world > 1)")
    parser.add_argument("--decode-latents", type=int, default=None,
                        help="validation.decode_latents (1: the validations decode one latent per slot)")
    parser.add_argument("--kill-window", type=float, default=1.5,
                        help="the kill comes 0..this many seconds after the first committed checkpoint")
    parser.add_argument("--agent-kills", type=float, default=0.25,
                        help="the share of trials at world > 1 that kill the torchrun agent instead of a rank")
    parser.add_argument("--orphan-grace", type=float, default=10.0,
                        help="ranks must be gone this many seconds after their agent was killed")
    parser.add_argument("--kill-in-save", action="store_true",
                        help="aim each kill inside a save (while a partial checkpoint holds files) instead of at a "
                             "random moment")
    args = parser.parse_args()
    if args.world > 1 and args.sharding == "none":
        print("note: --world > 1 with --sharding none saves whole files on rank 0", file=sys.stderr)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from solar.data.synth import synthesize

    synthesize("wan22_ti2v_5b", work / "data", samples=4, seed=0)
    rng = random.Random(args.seed)
    started = time.time()
    trials = []
    for i in range(args.trials):
        trials.append(trial(i, work, work / "data", rng, args.async_checkpoint, world=args.world,
                            sharding=args.sharding, decode_latents=args.decode_latents,
                            kill_window=args.kill_window, agent_kills=args.agent_kills,
                            orphan_grace=args.orphan_grace, in_save=args.kill_in_save))
        print(json.dumps(trials[-1]), file=sys.stderr, flush=True)
    failures = [t for t in trials if t["problems"]]
    killed: dict[str, int] = {}
    for t in trials:
        killed[t["killed"]] = killed.get(t["killed"], 0) + 1
    print(json.dumps({"benchmark": "checkpoint crash consistency (SIGKILL)", "date": time.strftime("%Y-%m-%d"),
                      "world": args.world, "sharding": args.sharding, "async_checkpoint": args.async_checkpoint,
                      "seed": args.seed, "code": code_version(), "decode_latents": args.decode_latents, "kill_window_s": args.kill_window,
                      "kill_in_save": args.kill_in_save,
                      "trials": len(trials), "failures": len(failures),
                      "trials_with_partial_left": sum(1 for t in trials if t["partials"]),
                      "partials_with_complete_marker": sum(t["partials_with_complete_marker"] for t in trials),
                      "accepted_partials": sum(1 for t in trials if "a partial checkpoint was listed as complete"
                                               in t["problems"]),
                      "checkpoints_verified": sum(t["checkpoints"] for t in trials), "killed": killed,
                      "seconds": round(time.time() - started, 1), "details": trials}, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
