"""Elastic chaos: SolarRuns with elastic training stages against the real ``solar-operator --read-nodes``
while nodes of the emulated cluster fail and come back (issue 45 item 9).

The cluster is ``--nodes`` nodes of ``--gpus-per-node`` GPUs on the emulated API server
(tests/support/kube.py); ``tests.integration.nodes`` plays the gang scheduler (a job's pods all bound
to Ready nodes with free GPUs, or left Pending ``Unschedulable``), the training operator (pods per
replica, the job's conditions) and the kubelets; here its ranks are a played trainer instead of
torchrun. Meanwhile:

- users create ``--runs`` one-stage SolarRuns, at most ``--active`` unfinished at a time, each a
  training stage of 4, 3 or 2 nodes (one pod of a whole node each) with ``elastic: {minNodes: 1}``
  (4 nodes: 4, 3, 2 or 1 keep the global batch; 3: 3 or 1; 2: 2 or 1), a finished run deleted a
  little later (as a TTL would) and its jobs with it;
- the played trainer of each attempt reads its arguments (``distributed.world_size``,
  ``train.gradient_accumulation``, ``checkpoint.path``) as ``solar train`` does: it checks the shape
  is one the plan allows with the global batch kept, resumes from the checkpoint it was given
  (checked: the newest verified one), trains a step every ``--step-seconds`` x accumulation (fewer
  nodes, more accumulation, slower steps), writes a ``step`` event per step, commits a real
  checkpoint transaction every ``--save-every`` steps, on SIGTERM finishes its step and saves there
  (grow back), and dies on SIGKILL between two writes (a node failure);
- the node-fault driver fails ``--node-kills`` nodes, one every ``--kill-every`` s (x0.5-1.5), at most
  ``--max-down`` at a time, each one running a pod of an attempt that has committed a checkpoint:
  NotReady with ``DisruptionTarget`` (taint manager), deleted (pod GC's ``DisruptionTarget``) or
  NotReady with no pod condition (only the node says why); the node comes back ``--down`` s later;
- ``--operator-kills`` SIGKILLs of the operator (0 by default), spread over the kills.

Measured and checked (failure counts; exit 1 when one is not 0):

- every attempt a node failure killed continues (the run's next attempt trains its first step) at
  the largest shape the cluster holds: how long (the distribution), at which shape (smaller, same).
  Later than ``shrinkAfterSeconds + launch + 3 polls + 2 s`` is a failure when a replacement stayed
  pending with a free node for the smallest allowed shape longer than ``shrinkAfterSeconds + 3 polls
  + 1 s`` (the operator did not shrink it in time); else it is counted apart: waited for capacity (no
  free node), or room taken first (each replacement shrank in time, the room it was sized for went
  to an older pending job first: the gang scheduler binds in creation order);
- a pending attempt replaced by a smaller one (a shrink while unschedulable): admitted to replaced,
  by what it was (a run's first attempt, a grow back's, a killed one's replacement); pending with a
  free node for a smaller shape longer than that bound is a failure;
- a stage running shrunk grows back: count, latency from the moment the cluster held a larger
  allowed shape for it and ``minSecondsBetweenChanges`` had passed (sampled every 0.25 s); a stretch
  of such room longer than 2 polls + the operator's 2 s cluster cache + 1 s without a grow is a miss;
  grows decided with no room for the larger shape in the cluster then (this harness's own listing,
  within 0.1 s of the delete) and collisions (the grown attempt found no room and shrank again);
- from each stage's step events: the committed history (each launch's steps up to the next launch's
  resume point) is 1..max_steps, no step lost or repeated; each launch starts at its checkpoint + 1
  and resumes the newest committed checkpoint; steps after a killed launch's last checkpoint are
  redone (counted), a gracefully stopped launch (grow back) redoes none;
- every run Succeeded with no failure counted; the status's attempts match the jobs (shape of each),
  its shrinks and grows match the attempts' shapes; its disruptionSeconds against the measured
  disruption (from the kill, or the shrink, to the first checkpoint committed after it).

    .venv/bin/python bench/operator/elastic_chaos.py --runs 200 --node-kills 40 --operator-kills 5 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.operator.chaos_load import Operator, Scheduler, StallProbe, Watch, down_overlap, finish  # noqa: E402
from bench.operator.reconcile_load import distribution  # noqa: E402
from solar.run import elastic as elastic_shapes  # noqa: E402
from solar.run.machine import parse_iso  # noqa: E402
from solar.storage import checkpoints as ckpt  # noqa: E402
from solar.storage.run_dir import usage, write_result  # noqa: E402
from solar_operator.capacity import CACHE_SECONDS  # noqa: E402
from tests.integration.nodes import Nodes  # noqa: E402
from tests.integration.world import CRD, World, load_case, write_checkpoint  # noqa: E402
from tests.support.crd_schema import ANCHORS  # noqa: E402
from tests.support.kube import emulated_cluster  # noqa: E402

STAGE = "fm"
SIZES = {4: 2, 3: 1, 2: 1}                # planned nodes -> weight
ACCUMULATION = 3                          # planned gradientAccumulation (every size)
KILL_KINDS = {"not-ready": 2, "deleted": 1, "silent": 1}


def _say(text: str) -> None:
    print(f"elastic_chaos: {text}", file=sys.stderr, flush=True)


def _seconds(values: list[float]) -> dict | None:
    return distribution(values, unit="s", quantiles=(0.5, 0.9)) if values else None


# --- what happened (every thread writes under Ledger.lock) ----------------------------------------

@dataclass
class Attempt:
    run: str
    attempt: int
    uid: str
    nodes: int
    admitted: float                      # its pods created (the training operator saw the job)
    launched: float | None = None        # every pod bound, the ranks started
    first_step: float | None = None
    resume: int = 0
    last_step: int = 0
    end: str | None = None               # complete | killed | stopped | never-launched
    ended: float | None = None
    deleted: float | None = None         # the job gone (the operator deleted it)
    room_since: float | None = None      # pending, with a free node for a smaller allowed shape since
    room_longest: float = 0.0


@dataclass
class Kill:
    node: str
    how: str
    at: float
    wall: float
    victims: list[tuple[str, int, int]]  # (run, attempt, nodes)
    back: float | None = None
    room_since: float | None = None      # the cluster has had a free node since (while not continued)
    room_longest: float = 0.0


@dataclass
class RunRec:
    name: str
    planned: int
    shapes: tuple[int, ...]              # allowed node counts, largest first
    created: float = 0.0
    uid: str = ""
    status: dict = field(default_factory=dict)
    finished: float | None = None
    gone: bool = False
    changes: list[tuple[float, float, int, int]] = field(default_factory=list)  # (monotonic, wall, old, new)
    attempts: dict[int, Attempt] = field(default_factory=dict)
    grow_since: float | None = None      # the cluster has held a larger shape for it since (eligible)
    grow_longest: float = 0.0
    grow_waits: list[float] = field(default_factory=list)     # eligible room -> the grow decision
    grow_missed: list[str] = field(default_factory=list)
    grow_rooms: list[tuple[int, int]] = field(default_factory=list)  # (room, the larger shape) at each grow


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runs: dict[str, RunRec] = {}
        self.kills: list[Kill] = []
        self.down: list[list[float]] = []           # the operator's [killed, answered again]
        self.trainer_problems: list[str] = []       # shape or resume problems the played trainer saw

    def current(self, run: RunRec) -> Attempt | None:
        return run.attempts[max(run.attempts)] if run.attempts else None


# --- the played trainer ------------------------------------------------------------------------------

class PlayedRanks:
    """One attempt's ranks, as ``torchrun -m solar train`` would run them (a thread; the Popen surface
    tests.integration.nodes uses: poll, wait, returncode, stderr)."""

    stderr = None

    def __init__(self, bench: "Bench", attempt: Attempt, args: list[str]) -> None:
        self.bench, self.a = bench, attempt
        sets = dict(item.split("=", 1) for item in (args[i + 1] for i, x in enumerate(args) if x == "--set"))
        self.sets = sets
        self.root = bench.storage / Path(sets["runtime.output_dir"]).relative_to(bench.mount)
        self.world = int(sets["distributed.world_size"])
        self.accumulation = int(sets["train.gradient_accumulation"])
        self.global_batch = int(sets["train.global_batch_size"])
        self.max_steps = int(sets["train.max_steps"])
        self.save_every = int(sets["runtime.save_every"])
        path = sets.get("checkpoint.path")
        self.resume = int(Path(path).name.split("_")[1]) if path else 0
        self.returncode: int | None = None
        self._write = threading.Lock()       # a SIGKILL lands between two writes
        self._wake = threading.Event()
        self._done = threading.Event()
        self._term = False
        threading.Thread(target=self._train, name=f"ranks-{attempt.run}-{attempt.attempt}", daemon=True).start()

    # -- the Popen surface
    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._done.wait(timeout)
        return self.returncode

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            with self._write:
                if self.returncode is None:
                    self._end(-9, "killed")
            self._wake.set()
        else:
            self._term = True

    # -- the trainer
    def _end(self, code: int, how: str) -> None:
        with self.bench.ledger.lock:
            self.a.end, self.a.ended = how, time.monotonic()
        self.returncode = code
        self._done.set()

    def _event(self, kind: str, **fields) -> None:
        with open(self.root / "events" / "rank-00000.jsonl", "a") as fh:
            fh.write(json.dumps({"event": kind, "time": time.time(), "attempt": self.a.attempt, **fields}) + "\n")

    def _checks(self) -> list[str]:
        """What ``solar train`` would refuse (a bench failure: the operator gave it so)."""
        run = self.bench.ledger.runs[self.a.run]
        problems = []
        nproc = self.bench.gpus_per_node
        if self.world != self.a.nodes * nproc:
            problems.append(f"world_size {self.world} on {self.a.nodes} pods of {nproc}")
        batch = run.planned * nproc * ACCUMULATION
        if self.world * self.accumulation != self.global_batch or self.global_batch != batch:
            problems.append(f"world {self.world} x accumulation {self.accumulation} is not the global batch {batch}")
        if self.a.nodes not in run.shapes:
            problems.append(f"{self.a.nodes} nodes is not an allowed shape {run.shapes}")
        newest, _ = ckpt.newest_valid(self.root)
        newest_step = newest["step"] if newest else 0
        if self.resume != newest_step:
            problems.append(f"resumes step {self.resume}, the newest verified checkpoint is {newest_step}")
        if self.resume and self.sets.get("checkpoint.mode") != "full_resume":
            problems.append("a resume without checkpoint.mode=full_resume")
        return [f"{self.a.run} attempt {self.a.attempt}: {p}" for p in problems]

    def _save(self, step: int, on_stop: bool = False) -> None:
        write_checkpoint(self.root, step, saved_with={"world_size": self.world, "nproc_per_node":
                                                      self.bench.gpus_per_node,
                                                      "gradient_accumulation": self.accumulation})
        self._event("checkpoint", step=step, on_stop=on_stop)

    def _result(self, status: str, started: float) -> None:
        write_result(self.root, status, usage=usage(self.root, world=self.world, device="cuda", started=started,
                                                    ended=time.time(), status=status))

    def _train(self) -> None:
        started = time.time()
        with self._write:
            if self.returncode is not None:
                return
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "events").mkdir(exist_ok=True)
            problems = self._checks()
            if problems:
                with self.bench.ledger.lock:
                    self.bench.ledger.trainer_problems += problems
            (self.root / "launch-manifest.json").write_text(json.dumps({"schema": "solar.launch.v1",
                                                                        "name": self.a.run}))
            self._event("launch", resume_step=self.resume, world_size=self.world, nodes=self.a.nodes,
                        gradient_accumulation=self.accumulation)
            with self.bench.ledger.lock:
                self.a.launched, self.a.resume, self.a.last_step = time.monotonic(), self.resume, self.resume
        if self._wake.wait(self.bench.launch_seconds) and self.returncode is not None:
            return                                   # killed while loading the checkpoint
        step = self.resume
        while step < self.max_steps:
            if self._wake.wait(self.bench.step_seconds * self.accumulation) and self.returncode is not None:
                return
            with self._write:
                if self.returncode is not None:
                    return                           # SIGKILL during the step: it never happened
                step += 1
                self._event("step", step=step, gradient_accumulation=self.accumulation, world_size=self.world)
                with self.bench.ledger.lock:
                    self.a.last_step = step
                    if self.a.first_step is None:
                        self.a.first_step = time.monotonic()
                saved = step % self.save_every == 0 or step == self.max_steps
                if saved:
                    self._save(step)
                if self._term and step < self.max_steps:   # grow back: the step is done, save it and stop
                    if not saved:
                        self._save(step, on_stop=True)
                    self._event("stopped", step=step)
                    self._result("stopped", started)
                    self._end(0, "stopped")
                    return
        with self._write:
            if self.returncode is None:
                self._result("complete", started)
                with self.bench.ledger.lock:   # resumed at max_steps: finishing its run-result is its work
                    self.a.first_step = self.a.first_step or time.monotonic()
                self._end(0, "complete")


class PlayedNodes(Nodes):
    """tests.integration.nodes with the played trainer for ranks, the bench's ledger told of every
    job admitted, launched and gone, and node failures that can delete the node."""

    def __init__(self, bench: "Bench") -> None:
        super().__init__(bench.world, [])
        self.bench = bench
        self.errors: list[str] = []

    def _admit(self, uid: str, doc: dict) -> None:
        super()._admit(uid, doc)
        labels = doc["metadata"].get("labels") or {}
        run = self.bench.ledger.runs.get(labels.get("solarwm.io/run", ""))
        if run is not None:
            attempt = int(labels.get("solarwm.io/attempt", "0"))
            with self.bench.ledger.lock:
                run.attempts[attempt] = Attempt(run.name, attempt, uid, len(self.jobs[uid]["pods"]),
                                                time.monotonic())
            self.jobs[uid]["attempt"] = run.attempts[attempt]

    def _launch(self, job: dict, cmd: list[str]):
        return PlayedRanks(self.bench, job["attempt"], job["args"])

    def _signal(self, job: dict, sig: int, *, group: bool = True) -> None:
        job["proc"].signal(sig)

    def _tick(self) -> None:
        before = dict(self.jobs)
        try:
            super()._tick()
        except Exception as exc:  # noqa: BLE001 (a harness hiccup: recorded, the next tick goes on)
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        now = time.monotonic()
        with self.bench.ledger.lock:   # a job gone from the API: forgotten here, or its ranks told to stop
            for uid, job in before.items():
                a = job.get("attempt")
                if a is None or a.deleted is not None or (uid in self.jobs and not job.get("terminated")):
                    continue
                a.deleted = now
                if job.get("proc") is None and a.end is None:
                    a.end, a.ended = "never-launched", now
                elif job.get("terminated") and a.end is None:
                    self.bench.stopping(a, now)     # a running attempt told to stop: a grow back

    def free_nodes(self) -> tuple[int, dict[str, list[str]]]:
        """Ready nodes with a whole pod's GPUs free, and each running attempt's nodes (run -> nodes)."""
        with self._lock:
            free = self._free()
            own = {job["attempt"].run: job.get("nodes", []) for job in self.jobs.values()
                   if job.get("attempt") is not None and job.get("proc") is not None and job["proc"].poll() is None}
        return sum(1 for f in free.values() if f >= self.bench.gpus_per_node), own

    def fail(self, name: str, how: str) -> list[tuple[str, int, int]]:
        """Fail node ``name``; the attempts it hit (run, attempt, nodes)."""
        with self._lock:
            victims = [(job["attempt"].run, job["attempt"].attempt, job["attempt"].nodes) for job in self.jobs.values()
                       if job.get("attempt") is not None and name in job.get("nodes", [])
                       and job.get("proc") is not None and job["proc"].poll() is None]
            self.kill_node(name, how=how, gpus=self.bench.gpus_per_node)
        return victims

    def restore(self, name: str, how: str) -> None:
        with self._lock:
            if how == "deleted":
                self.add(name, self.bench.gpus_per_node)
            else:
                self.ready(name, True, self.bench.gpus_per_node)

    def busy(self) -> dict[str, Attempt]:
        """Node -> the running attempt whose pod it holds."""
        with self._lock:
            return {node: job["attempt"] for job in self.jobs.values()
                    if job.get("attempt") is not None and job.get("proc") is not None and job["proc"].poll() is None
                    and not job.get("terminated") for node in job.get("nodes", [])}


# --- the bench ---------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.gpus_per_node = args.gpus_per_node
        self.step_seconds, self.launch_seconds = args.step_seconds, args.launch_seconds
        self.poll = args.poll_seconds
        self.tmp = workdir
        self.storage = workdir / "runs"
        self.storage.mkdir(parents=True)
        self.mount = Path("/runs")
        self.ledger = Ledger()
        self.stop = threading.Event()
        self.world: World | None = None
        self.nodes: PlayedNodes | None = None
        self.op: Operator | None = None
        self.sched: Scheduler | None = None
        sizes, weights = zip(*SIZES.items())
        for i in range(args.runs):
            planned = self.rng.choices(sizes, weights)[0]
            shapes = tuple(s.nodes for s in elastic_shapes.shapes(
                nodes=planned, gpus_per_node=self.gpus_per_node, sp=1, micro=1,
                global_batch=planned * self.gpus_per_node * ACCUMULATION, lowest=1))
            self.ledger.runs[f"run-{i:04d}"] = RunRec(f"run-{i:04d}", planned, shapes)
        self.plan = list(self.ledger.runs.values())
        # the bounds checked
        self.continue_bound = args.shrink_after + args.launch_seconds + 3 * self.poll + 2.0
        self.grow_bound = 2 * self.poll + CACHE_SECONDS + 1.0
        self.shrink_bound = args.shrink_after + 3 * self.poll + 1.0

    # -- the SolarRuns
    def _doc(self, run: RunRec) -> dict:
        doc = load_case("three-stage")
        doc["metadata"]["name"] = run.name
        doc["spec"]["topology"] = {"nodes": run.planned, "gpusPerNode": self.gpus_per_node,
                                   "gradientAccumulation": ACCUMULATION, "elastic": {
                                       "minNodes": 1, "shrinkAfterSeconds": self.args.shrink_after,
                                       "minSecondsBetweenChanges": self.args.min_between}}
        doc["spec"]["resources"] = {"limits": {"nvidia.com/gpu": self.gpus_per_node}}
        doc["spec"]["storage"]["path"] = run.name
        doc["spec"]["runPolicy"]["backoffLimit"] = 0      # a disruption must not spend a retry
        fm = doc["spec"]["stages"][0]
        sets = [f"train.max_steps={self.args.steps}", f"runtime.save_every={self.args.save_every}",
                "runtime.validate_every=0"]
        doc["spec"]["stages"] = [dict(fm, set=[*fm["set"], *sets])]
        return doc

    def on_run(self, kind: str, obj: dict, now: float) -> None:
        run = self.ledger.runs.get(obj["metadata"]["name"])
        if run is None:
            return
        if kind == "DELETED":
            with self.ledger.lock:
                run.gone = True
            self.sched.at(0.0, self._collect, run.name)
            return
        status = obj.get("status") or {}
        stage = (status.get("stages") or [{}])[0]
        nodes = (stage.get("elastic") or {}).get("nodes")
        with self.ledger.lock:
            run.status = status
            last = run.changes[-1][3] if run.changes else run.planned
            if nodes is not None and nodes != last:
                run.changes.append((now, time.time(), last, nodes))
            if status.get("phase") in ("Succeeded", "Failed") and run.finished is None:
                run.finished = now
                self.sched.at(self.args.linger, self._delete, run.name)

    def _delete(self, name: str) -> None:
        try:
            self.world.cluster.delete(f"{self.world.runs_path}/{name}")
        except Exception:  # noqa: BLE001 (already gone)
            pass

    def _collect(self, name: str) -> None:
        """The garbage collector: the jobs of a deleted run go."""
        for job in self.world.cluster.list(self.world.jobs_path, labelSelector=f"solarwm.io/run={name}")["items"]:
            try:
                self.world.cluster.delete(f"{self.world.jobs_path}/{job['metadata']['name']}",
                                          {"propagationPolicy": "Background"})
            except Exception:  # noqa: BLE001 (already gone)
                pass

    # -- the grow decisions (told by PlayedNodes when a running attempt is told to stop)
    def stopping(self, a: Attempt, now: float) -> None:
        run = self.ledger.runs[a.run]
        free = sum(1 for f in self.nodes._free().values() if f >= self.gpus_per_node)   # the cluster now
        larger = min((n for n in run.shapes if n > a.nodes), default=a.nodes)
        run.grow_rooms.append((free + a.nodes, larger))
        if run.grow_since is not None:
            run.grow_waits.append(now - run.grow_since)
        run.grow_since, run.grow_longest = None, 0.0

    # -- the node faults
    def _faults(self, started: float) -> None:
        args, rng = self.args, random.Random(self.args.seed + 3)
        first_window = min(args.active, args.runs)
        while not self.stop.is_set():   # the first failure once half the first window has a checkpoint
            with self.ledger.lock:
                ready = sum(1 for r in self.plan if any(a.last_step >= args.save_every for a in r.attempts.values()))
            if ready >= first_window // 2 or time.monotonic() - started > 60:
                break
            time.sleep(0.2)
        op_marks = set(rng.sample(range(1, args.node_kills + 1), min(args.operator_kills, args.node_kills)))
        kinds, weights = zip(*KILL_KINDS.items())
        done, next_at = 0, time.monotonic()
        while done < args.node_kills and not self.stop.is_set():
            time.sleep(0.1)
            with self.ledger.lock:
                down = {k.node for k in self.ledger.kills if k.back is None}
                if all(r.finished is not None for r in self.plan):
                    return
            if time.monotonic() < next_at or len(down) >= args.max_down:
                continue
            candidates = sorted(n for n, a in self.nodes.busy().items()
                                if n not in down and (a.resume > 0 or a.last_step >= args.save_every))
            if not candidates:
                continue
            node, how = rng.choice(candidates), rng.choices(kinds, weights)[0]
            at, wall = time.monotonic(), time.time()
            victims = self.nodes.fail(node, how)
            kill = Kill(node, how, at, wall, victims)
            with self.ledger.lock:
                self.ledger.kills.append(kill)
            done += 1
            _say(f"node kill {done}/{args.node_kills}: {node} ({how}) at {at - started:.1f}s, "
                 f"{', '.join(f'{r} attempt {a} on {n}' for r, a, n in victims) or 'no attempt'}")
            self.sched.at(rng.uniform(*args.down), self._restore, kill)
            next_at = at + args.kill_every * rng.uniform(0.5, 1.5)
            if done in op_marks:
                time.sleep(rng.uniform(0.3, 2.0))
                t = self.op.kill()
                with self.ledger.lock:
                    self.ledger.down.append([t, None])
                _say(f"operator SIGKILL at {t - started:.1f}s")
                time.sleep(rng.uniform(0.2, 1.0))
                self.op.start()

    def _restore(self, kill: Kill) -> None:
        self.nodes.restore(kill.node, kill.how)
        with self.ledger.lock:
            kill.back = time.monotonic()

    def _continued(self, kill: Kill, victim: tuple[str, int, int]) -> Attempt | None:
        run = self.ledger.runs[victim[0]]
        later = [a for n, a in sorted(run.attempts.items()) if n > victim[1] and a.first_step is not None]
        return later[0] if later else None

    # -- room, sampled: a free node for a stage waiting to continue; a larger shape for a shrunk one
    def _sample(self) -> None:
        while not self.stop.wait(0.25):
            try:
                free, own = self.nodes.free_nodes()
            except Exception:  # noqa: BLE001 (the API answered badly once: the next sample)
                continue
            now = time.monotonic()
            with self.ledger.lock:
                if self.ledger.down and self.ledger.down[-1][1] is None:   # the operator is down: no stretch counts
                    for item in [*self.ledger.kills, *(a for r in self.plan for a in r.attempts.values())]:
                        item.room_since = None
                    for run in self.plan:
                        run.grow_since = None
                    continue
                for kill in self.ledger.kills:
                    if not kill.victims or self._continued(kill, kill.victims[0]) is not None:
                        kill.room_since = None
                        continue
                    if free >= 1:
                        kill.room_since = kill.room_since or now
                        kill.room_longest = max(kill.room_longest, now - kill.room_since)
                    else:
                        kill.room_since = None
                for run in self.plan:
                    a = self.ledger.current(run)
                    if a is not None and a.launched is None and a.deleted is None and a.nodes > run.shapes[-1] \
                            and free >= run.shapes[-1]:
                        a.room_since = a.room_since or now
                        a.room_longest = max(a.room_longest, now - a.room_since)
                    elif a is not None:
                        a.room_since = None
                    if run.finished is not None or a is None or a.launched is None or a.end is not None \
                            or a.deleted is not None or a.nodes >= run.planned:
                        run.grow_since = None
                        continue
                    larger = min(n for n in run.shapes if n > a.nodes)
                    el = ((run.status.get("stages") or [{}])[0].get("elastic") or {})
                    changed = parse_iso(el.get("changedAt")) or 0.0    # the operator's own clock (seconds)
                    if time.time() >= changed + self.args.min_between and free + len(own.get(run.name, [])) >= larger:
                        if run.grow_since is None:
                            run.grow_since, run.grow_longest = now, 0.0
                        waited = now - run.grow_since
                        if waited > self.grow_bound and run.grow_longest <= self.grow_bound:
                            run.grow_missed.append(f"{run.name} attempt {a.attempt} on {a.nodes} node(s): room for "
                                                   f"{larger} for {waited:.1f}s without a grow")
                        run.grow_longest = waited
                    else:
                        run.grow_since = None

    # -- the users and the operator
    def _drive(self, started: float) -> None:
        deadline = started + self.args.timeout
        created = 0
        while time.monotonic() < deadline:
            with self.ledger.lock:
                done = sum(1 for r in self.plan[:created] if r.finished is not None)
                if self.ledger.down and self.ledger.down[-1][1] is None and self.op.ready():
                    self.ledger.down[-1][1] = self.op.starts[-1]["first_200"]
            while created < len(self.plan) and created - done < self.args.active:
                run = self.plan[created]
                run.created = time.monotonic()
                run.uid = self.world.apply(self._doc(run))["metadata"]["uid"]
                created += 1
            if created == len(self.plan) and done == len(self.plan):
                return
            time.sleep(0.1)
        _say(f"timed out after {self.args.timeout:.0f}s: {sum(r.finished is not None for r in self.plan)} of "
             f"{len(self.plan)} runs finished")

    def run(self) -> dict:
        args = self.args
        result = {"runs": args.runs, "node_kills_asked": args.node_kills, "operator_kills_asked": args.operator_kills,
                  "seed": args.seed, "nodes": args.nodes, "gpus_per_node": self.gpus_per_node, "active": args.active,
                  "poll_seconds": self.poll, "max_steps": args.steps, "save_every": args.save_every,
                  "step_seconds_per_accumulation": self.step_seconds, "launch_seconds": self.launch_seconds,
                  "shrink_after_seconds": args.shrink_after, "min_seconds_between_changes": args.min_between,
                  "down_seconds": list(args.down), "max_down": args.max_down, "kill_every_seconds": args.kill_every,
                  "machine": f"{os.cpu_count()} cores",
                  "planned_nodes": dict(sorted(Counter(r.planned for r in self.plan).items())),
                  "bounds": {"continue_seconds": self.continue_bound, "grow_seconds": self.grow_bound,
                             "shrink_seconds": self.shrink_bound}}
        started = time.monotonic()
        probe = StallProbe(self.stop, True)
        probe.start()
        with emulated_cluster([CRD, ANCHORS / "kubeflow.org_pytorchjobs.yaml"], self.tmp) as cluster:
            self.world = World(cluster, self.storage)
            self.sched = Scheduler(self.stop)
            self.nodes = PlayedNodes(self)
            for i in range(args.nodes):
                self.nodes.add(f"node-{i:03d}", self.gpus_per_node)
            watch = Watch(cluster.url, self.world.runs_path, self.on_run, self.stop)
            watch.start()
            watch.ready.wait(10)
            log = open(self.tmp / "operator.log", "w")  # noqa: SIM115
            env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "SOLAR_OPERATOR_POLL_SECONDS": str(self.poll),
                   "SOLAR_OPERATOR_READ_NODES": "1"}
            self.op = Operator(self.storage, self.world.namespace, env, log, self.poll)
            self.op.start()
            threading.Thread(target=self.op.probe, args=(self.stop,), daemon=True).start()
            threads = [threading.Thread(target=self._faults, args=(started,), daemon=True),
                       threading.Thread(target=self._sample, daemon=True)]
            try:
                with self.nodes:
                    for t in threads:
                        t.start()
                    self._drive(started)
                    result["seconds"] = round(time.monotonic() - started, 1)
                    self.stop.set()
                    for t in threads:
                        t.join(10)
                    reasons = Counter(e["reason"] for e in self.world.events())
            finally:
                self.stop.set()
                self.op.stop()
                log.close()
            result["operator_log"] = str(self.tmp / "operator.log")
            result["harness_errors"] = (self.sched.errors + self.nodes.errors)[:20]
            result["harness_stalls"] = probe.report()
        result["event_reasons"] = {k: reasons.get(k, 0) for k in (
            "TopologyShrunk", "TopologyGrown", "StageDisrupted", "StageStarted", "JobFailed", "JobAdopted")}
        result.update(self.report(reasons))
        return result

    # -- the report
    def _history(self, run: RunRec) -> dict:
        """The run's step events: its launches, the committed history, what was redone, the problems."""
        path = self.storage / run.name / STAGE / "events" / "rank-00000.jsonl"
        launches: list[dict] = []
        try:
            lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            return {"problems": [f"{run.name}: step events unreadable: {exc}"], "launches": [], "checkpoints": []}
        checkpoints = []   # (wall time, step)
        problems = []
        for e in lines:
            if e["event"] == "launch":
                launches.append({"attempt": e["attempt"], "resume": e["resume_step"], "steps": [], "stopped": False,
                                 "nodes": e["nodes"]})
            elif not launches or e["attempt"] != launches[-1]["attempt"]:
                problems.append(f"{run.name}: a {e['event']} event of attempt {e['attempt']} outside its launch")
            elif e["event"] == "step":
                launches[-1]["steps"].append(e["step"])
            elif e["event"] == "checkpoint":
                checkpoints.append((e["time"], e["step"]))
                launches[-1].setdefault("saved", []).append(e["step"])
            elif e["event"] == "stopped":
                launches[-1]["stopped"] = True
        final = self.args.steps
        committed, history = 0, []
        redone = {"killed": 0, "stopped": 0}
        for i, launch in enumerate(launches):
            steps, resume = launch["steps"], launch["resume"]
            if resume != committed:
                problems.append(f"{run.name} attempt {launch['attempt']}: resumed step {resume}, the newest committed "
                                f"checkpoint was {committed}")
            if steps != list(range(resume + 1, resume + 1 + len(steps))):
                problems.append(f"{run.name} attempt {launch['attempt']}: steps not consecutive from {resume + 1}")
            upto = launches[i + 1]["resume"] if i + 1 < len(launches) else final
            history += [s for s in steps if s <= upto]
            extra = sum(1 for s in steps if s > upto)
            if i + 1 < len(launches):
                redone["stopped" if launch["stopped"] else "killed"] += extra
            committed = max([committed, *launch.get("saved", [])])
        lost = sorted(set(range(1, final + 1)) - set(history))
        repeated = len(history) - len(set(history))
        if lost:
            problems.append(f"{run.name}: steps lost {lost[:5]}{'...' if len(lost) > 5 else ''}")
        if repeated:
            problems.append(f"{run.name}: {repeated} steps repeated in the committed history")
        return {"launches": launches, "checkpoints": checkpoints, "lost": len(lost), "repeated": repeated,
                "redone": redone, "problems": problems, "steps_run": sum(len(x["steps"]) for x in launches)}

    @staticmethod
    def _measured_disruption(run: RunRec, kills: list[Kill], checkpoints: list[tuple[float, int]]) -> list[float]:
        """From each kill of one of its attempts, or each shrink outside such a window, to the first
        checkpoint committed after it (wall clock)."""
        openers = sorted([k.wall for k in kills] + [wall for _, wall, old, new in run.changes if new < old])
        windows, open_at, step_at = [], None, 0
        points = sorted(checkpoints)
        for t in openers:
            if open_at is not None:
                close = next((c for c, s in points if c > open_at and s > step_at), None)
                if close is None or close > t:
                    continue                                   # still open: part of that disruption
                windows.append(close - open_at)
            open_at = t
            step_at = max([0] + [s for c, s in points if c <= t])
        if open_at is not None:
            close = next((c for c, s in points if c > open_at and s > step_at), None)
            if close is not None:
                windows.append(close - open_at)
        return windows

    def report(self, reasons: Counter) -> dict:
        led, args = self.ledger, self.args
        out: dict = {}
        failures = Counter()
        details: dict[str, list[str]] = {}

        def fail(kind: str, text: str) -> None:
            failures[kind] += 1
            details.setdefault(kind, []).append(text)

        # 1. the runs' outcomes and their status against the jobs
        histories = {}
        for run in self.plan:
            st = run.status
            stage = (st.get("stages") or [{}])[0]
            if st.get("phase") != "Succeeded":
                fail("runs_not_succeeded", f"{run.name}: {st.get('phase')} {stage.get('reason')} "
                                           f"{stage.get('message')}")
            if stage.get("failures"):
                fail("failures_counted", f"{run.name}: failures {stage.get('failures')}")
            ours = {n: a.nodes for n, a in run.attempts.items()}
            theirs = {a["attempt"]: (a.get("topology") or {}).get("nodes") for a in stage.get("attempts") or []}
            if any(ours.get(n) != nodes for n, nodes in theirs.items()) or set(ours) - set(theirs) - set(
                    range(1, (stage.get("elastic") or {}).get("attemptsDropped", 0) + 1)):
                fail("attempts_mismatch", f"{run.name}: jobs {ours}, status {theirs}")
            shapes = [ours[n] for n in sorted(ours)]
            shrinks = sum(1 for x, y in zip(shapes, shapes[1:]) if y < x)
            grows = sum(1 for x, y in zip(shapes, shapes[1:]) if y > x)
            el = stage.get("elastic") or {}
            if (el.get("shrinks", 0), el.get("grows", 0)) != (shrinks, grows):
                fail("shape_changes_mismatch", f"{run.name}: status shrinks {el.get('shrinks', 0)} grows "
                                               f"{el.get('grows', 0)}, attempts {shapes}")
            histories[run.name] = self._history(run)
            for problem in histories[run.name]["problems"]:
                fail("step_history", problem)
        for problem in led.trainer_problems:
            fail("trainer_refused", problem)
        if reasons.get("JobFailed") or reasons.get("BackoffLimitExceeded"):
            fail("failures_counted", f"events: JobFailed {reasons.get('JobFailed')}, "
                                     f"BackoffLimitExceeded {reasons.get('BackoffLimitExceeded')}")

        # 2. every attempt a node failure killed continues
        kills = [k for k in led.kills if k.victims]
        cont, late_waits, smaller, same, via_unschedulable, at_smallest = [], [], 0, 0, 0, 0
        decided, slowest, raced = [], [], []   # kill -> the failed job deleted; the slowest; room lost to others
        for k in kills:
            for victim in k.victims:
                run = led.runs[victim[0]]
                nxt = self._continued(k, victim)
                killed_attempt = run.attempts[victim[1]]    # (a grow back may have been stopping it)
                if victim[2] == run.shapes[-1]:
                    at_smallest += 1
                if nxt is None:
                    fail("never_continued", f"{victim[0]} attempt {victim[1]} killed on {k.node}: no later attempt "
                                            "trained a step")
                    continue
                took = nxt.first_step - k.at - down_overlap(led.down, k.at, nxt.first_step)
                between = [a for n, a in run.attempts.items() if victim[1] < n < nxt.attempt]
                if killed_attempt.deleted is not None and killed_attempt.deleted > k.at:
                    decided.append(killed_attempt.deleted - k.at)
                steps = [f"kill {k.node} ({k.how})"] + [
                    f"attempt {a.attempt} on {a.nodes}: admitted +{a.admitted - k.at:.1f}s"
                    + (f", replaced +{a.deleted - k.at:.1f}s" if a.deleted and a.launched is None else "")
                    + (f", launched +{a.launched - k.at:.1f}s" if a.launched else "")
                    for a in [killed_attempt, *between, nxt] if a.attempt > victim[1]]
                slowest.append((took, f"{victim[0]} attempt {victim[1]}: {took:.1f}s: " + "; ".join(steps)))
                via_unschedulable += bool(between)
                smaller += nxt.nodes < victim[2]
                same += nxt.nodes == victim[2]
                if nxt.nodes > victim[2] and not (killed_attempt.deleted and killed_attempt.deleted <= k.at):
                    fail("continued_larger", f"{victim[0]} attempt {victim[1]} on {victim[2]} -> {nxt.nodes}")
                pended = max(a.room_longest for a in [*between, nxt])   # a replacement pending with room
                if took <= self.continue_bound:
                    cont.append(took)
                elif pended > self.shrink_bound:
                    fail("continued_late_with_room", f"{victim[0]} attempt {victim[1]} ({k.node}, {k.how}): "
                                                     f"{took:.1f}s, a replacement pending {pended:.1f}s with a "
                                                     "free node")
                elif k.room_longest > self.continue_bound:
                    raced.append(took)      # each replacement shrank in time; the room it was sized for went first
                else:
                    late_waits.append(took)
        out["node_kills"] = {"done": len(led.kills), "hit_an_attempt": len(kills),
                             "by_kind": dict(Counter(k.how for k in led.kills)),
                             "victims_at_smallest_shape": at_smallest}
        out["continued"] = {
            "within_bound": _seconds(cont), "bound_seconds": self.continue_bound,
            "smaller_shape": smaller, "same_shape": same, "after_an_unschedulable_attempt": via_unschedulable,
            "waited_for_capacity": _seconds(late_waits), "room_taken_first": _seconds(raced),
            "all": _seconds(cont + late_waits + raced), "kill_to_decision": _seconds(decided),
            "slowest": [text for _, text in sorted(slowest, reverse=True)[:5]]}

        # 3. grow back
        grow_waits = [w for r in self.plan for w in r.grow_waits]
        stopped = [a for r in self.plan for a in r.attempts.values() if a.end == "stopped"]
        grow_cost = []
        for a in stopped:
            run = led.runs[a.run]
            nxt = next((b for n, b in sorted(run.attempts.items()) if n > a.attempt and b.first_step is not None), None)
            if nxt is not None:
                grow_cost.append(nxt.first_step - a.deleted)
        for r in self.plan:
            for miss in r.grow_missed:
                fail("grow_missed", miss)
        victims = {v[0] for k in kills for v in k.victims}
        back_to_plan = sum(1 for name in victims if led.runs[name].attempts and
                           led.current(led.runs[name]).nodes == led.runs[name].planned and
                           any(a.nodes < led.runs[name].planned for a in led.runs[name].attempts.values()))
        out["grow_back"] = {
            "grows_status": sum((r.status.get("stages") or [{}])[0].get("elastic", {}).get("grows", 0)
                                for r in self.plan),
            "attempts_stopped_for_it": len(stopped),
            "room_to_decision": _seconds(grow_waits),
            "decided_before_a_sample_saw_room": len(stopped) - len(grow_waits),
            "stop_to_first_step_grown": _seconds(grow_cost), "bound_seconds": self.grow_bound,
            "runs_hit_then_finished_at_planned_shape": back_to_plan, "runs_hit": len(victims),
            "decided_without_room_then": sum(1 for r in self.plan for room, larger in r.grow_rooms if room < larger)}

        # 4. shrinks while unschedulable (pending attempts replaced by smaller ones), by what the pending
        # attempt was: a run's first, a grow back's, the continuation of a killed one
        pending, late, causes, collisions = [], [], Counter(), 0
        killed = {(v[0], v[1]) for k in kills for v in k.victims}
        for r in self.plan:
            for n, a in sorted(r.attempts.items()):
                nxt, before = r.attempts.get(n + 1), r.attempts.get(n - 1)
                if a.end != "never-launched" or nxt is None or nxt.nodes >= a.nodes or not a.deleted:
                    continue
                cause = "first" if before is None else "grow" if before.end == "stopped" else \
                    "after_kill" if (r.name, before.attempt) in killed else "after_shrink"
                causes[cause] += 1
                collisions += cause == "grow"
                wait = a.deleted - a.admitted - down_overlap(led.down, a.admitted, a.deleted)
                if wait <= self.shrink_bound:
                    pending.append(wait)
                elif a.room_longest > self.shrink_bound:
                    fail("shrink_late_with_room", f"{r.name} attempt {n} on {a.nodes}: replaced after {wait:.1f}s, "
                                                  f"a free node for {a.room_longest:.1f}s of it")
                else:
                    late.append(wait)
        out["unschedulable_shrinks"] = {"count": sum(causes.values()), "by_pending_attempt": dict(causes),
                                        "admitted_to_replaced": _seconds(pending), "bound_seconds": self.shrink_bound,
                                        "waited_for_capacity": _seconds(late)}
        out["grow_back"]["collisions"] = collisions   # grown attempts that found no room and shrank again

        # 5. the steps
        redone_killed = sum(h["redone"]["killed"] for h in histories.values())
        redone_stopped = sum(h["redone"]["stopped"] for h in histories.values())
        if redone_stopped:
            fail("redone_after_graceful_stop", f"{redone_stopped} steps")
        killed_launches = sum(1 for r in self.plan for a in r.attempts.values() if a.end == "killed")
        out["steps"] = {
            "committed": sum(self.args.steps - h["lost"] for h in histories.values()),
            "run": sum(h.get("steps_run", 0) for h in histories.values()),
            "lost": sum(h.get("lost", 0) for h in histories.values()),
            "repeated_in_history": sum(h.get("repeated", 0) for h in histories.values()),
            "redone_after_kills": redone_killed, "launches_killed": killed_launches,
            "redone_per_killed_launch": round(redone_killed / killed_launches, 1) if killed_launches else None,
            "redone_after_graceful_stops": redone_stopped,
            "launches": sum(len(h["launches"]) for h in histories.values())}

        # 6. disruption seconds: the status against the measured
        diffs, status_total, measured_total = [], 0.0, 0.0
        for r in self.plan:
            mine = [k for k in kills if any(v[0] == r.name for v in k.victims)]
            windows = self._measured_disruption(r, mine, histories[r.name]["checkpoints"])
            measured = sum(windows)
            status = ((r.status.get("stages") or [{}])[0].get("elastic") or {}).get("disruptionSeconds", 0.0)
            status_total += status
            measured_total += measured
            if (measured > 0) != (status > 0):
                fail("disruption_unaccounted", f"{r.name}: status {status}s, measured {measured:.1f}s "
                                               f"({len(windows)} windows)")
            if measured > 0 or status > 0:
                diffs.append(status - measured)
        out["disruption_seconds"] = {"status_total": round(status_total, 1), "measured_total": round(measured_total, 1),
                                     "runs": len(diffs),
                                     "status_minus_measured": _seconds(diffs),
                                     "status_minus_measured_abs": _seconds([abs(d) for d in diffs])}
        out["operator_kills"] = len(led.down)
        out["failures"] = {k: failures.get(k, 0) for k in (
            "runs_not_succeeded", "failures_counted", "attempts_mismatch", "shape_changes_mismatch", "step_history",
            "trainer_refused", "never_continued", "continued_larger", "continued_late_with_room",
            "shrink_late_with_room", "grow_missed",
            "redone_after_graceful_stop", "disruption_unaccounted")}
        out["details"] = {k: v[:10] for k, v in details.items()}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--node-kills", type=int, default=20)
    parser.add_argument("--operator-kills", type=int, default=0,
                        help="SIGKILLs of the operator, each after a random node kill")
    parser.add_argument("--nodes", type=int, default=72,
                        help="nodes in the cluster (the runs' planned shapes need about 3.25 x --active)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node = per pod (one pod per node)")
    parser.add_argument("--active", type=int, default=24, help="unfinished runs at most at a time")
    parser.add_argument("--steps", type=int, default=600, help="train.max_steps")
    parser.add_argument("--save-every", type=int, default=25, help="runtime.save_every")
    parser.add_argument("--step-seconds", type=float, default=0.02,
                        help="seconds per step per accumulation micro-batch")
    parser.add_argument("--launch-seconds", type=float, default=1.0, help="ranks' start to their first step's start")
    parser.add_argument("--shrink-after", type=int, default=5, help="elastic.shrinkAfterSeconds")
    parser.add_argument("--min-between", type=int, default=5, help="elastic.minSecondsBetweenChanges")
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="SOLAR_OPERATOR_POLL_SECONDS")
    parser.add_argument("--kill-every", type=float, default=6.0, help="seconds between node kills (x0.5-1.5)")
    parser.add_argument("--down", type=float, nargs=2, default=(10.0, 20.0), metavar=("MIN", "MAX"),
                        help="seconds a killed node stays down")
    parser.add_argument("--max-down", type=int, default=4, help="nodes down at most at a time")
    parser.add_argument("--linger", type=float, default=2.0, help="seconds a finished run stays before its deletion")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    bench = Bench(args, Path(tempfile.mkdtemp(prefix="solar-elastic-chaos-")))
    result = bench.run()
    finish(result, args.out)


if __name__ == "__main__":
    main()
