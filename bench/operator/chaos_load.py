"""Operator chaos: SolarRuns of every kind against the real ``solar-operator`` while it is SIGKILLed at
random moments and the API server misbehaves.

The emulated API server (tests/support/kube.py) answers a random share of the operator's requests
(never the harness's own) with 500, 429 with a Retry-After, 409 Conflict on patches and deletes
(never on create), slow answers, and ends watch streams early (cleanly or mid-stream). Meanwhile:

- users create ``--runs`` three-stage SolarRuns, at most ``--active`` unfinished at a time: plain
  ones, invalid ones, ones suspended while a stage runs and resumed, ones whose job fails once and is
  retried, ones whose job fails past ``backoffLimit``, ones deleted while a stage runs; a finished
  run is deleted a little later (as a TTL would), so the active set stays bounded;
- the kubelet and the training operator are played here: each PyTorchJob is marked Running, its
  stage directory written as the trainer writes it (a real checkpoint transaction, validation and
  generation markers, run-result.json) and the job marked Succeeded or Failed; a deleted job's
  "pods" stop; the garbage collector deletes the jobs of a deleted run;
- the fault driver SIGKILLs the operator ``--kills`` times (the first once every run of the first
  window is active, the others when the number of finished runs crosses random marks, plus a random
  0-1 s; with ``--kill-interval S``, every S s after the first instead: a burst of restarts) and
  starts it again 0.2-1 s later;
- ``/healthz`` is asked every 0.25 s by a process of its own (prober.py).

Recorded (the poll interval stated): duplicate jobs, stages skipped or run twice, runs stuck (a
reaction the operator owes, such as the next job after a job finished, taking longer than 5x the
poll interval with the time the operator was down left out), status regressions, outcomes other than
the scenario's, attempts and failures in the status that differ from the jobs that ran, liveness
answers slower than ``--liveness-bound`` or missing after a process first answered, time from a
kill to the process answering and to every reaction pending at the kill being done, next-job
latency (all, and outside faults: no kill and no fault on the run's own requests in between, a slow
answer counting for its whole delay),
the operator's RSS. Prints one JSON document; exits 1 when a failure count is not 0.

    .venv/bin/python bench/operator/chaos_load.py --runs 1000 --kills 30 --seed 1
"""

from __future__ import annotations

import argparse
import gc
import heapq
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.operator.reconcile_load import _port, _proc_stats, distribution  # noqa: E402
from tests.integration.world import CRD, World, load_case, write_checkpoint  # noqa: E402
from tests.support.crd_schema import ANCHORS  # noqa: E402
from tests.support.kube import HARNESS_AGENT, ApiError, CutWatch, Slow, emulated_cluster  # noqa: E402

STAGES = ("fm", "anyflow", "generate")
FINAL_STEP, MID_STEP = 4, 2          # the tiny configs' train.max_steps; the step an attempt saves first
KINDS = {"ok": 40, "invalid": 8, "suspend": 14, "retry": 18, "exhaust": 5, "delete": 15}   # weights
INVALID_CASES = ("invalid-init", "invalid-spec", "storage-escape")


def _say(text: str) -> None:
    print(f"chaos_load: {text}", file=sys.stderr, flush=True)


# --- the API faults ------------------------------------------------------------------------------

@dataclass
class FaultRates:
    error500: float = 0.03
    error429: float = 0.02
    conflict409: float = 0.03      # PATCH and DELETE only
    slow: float = 0.03             # answered 0.2-1.5 s late
    cut_watch: float = 0.5         # of watch requests: ended after 1-15 s (half of them mid-stream)


class Faults:
    """The emulator's fault callable: random answers by ``rates``, each recorded with the run it hit
    (from the path or the label selector) for the latency split."""

    RUN_PATH = re.compile(r"/(?:solarruns|pytorchjobs)/([a-z0-9-]+)")

    def __init__(self, rng: random.Random, rates: FaultRates, runs: set[str]) -> None:
        self.rng, self.rates, self.runs = rng, rates, runs
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        # run -> (from, to) of each fault on its requests: the moment of an error, the whole delay of a
        # slow answer (a pass that started before a reaction and waits out a slow answer delays it)
        self.hits: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.cuts: list[float] = []                              # when a watch stream was ended
        self.enabled = True

    def _run(self, path: str, body) -> str | None:
        """The run a request is for: by the run label in the query, the run or job name in the path,
        or, for a create (a job, an Event), the name in the body."""
        if isinstance(body, dict):
            meta = body.get("metadata") or {}
            named = (meta.get("labels") or {}).get("solarwm.io/run") or (body.get("involvedObject") or {}).get("name")
            if named in self.runs:
                return named
        query = urllib.parse.unquote(path.partition("?")[2])
        if m := re.search(r"solarwm\.io/run=([a-z0-9-]+)", query):
            return m.group(1)
        if m := self.RUN_PATH.search(path.partition("?")[0]):
            name = m.group(1)
            if name in self.runs:
                return name
            head = name.rsplit("-", 1)[0]   # a job: <run>-<stage>
            return head if head in self.runs else None
        return None

    with_body = True   # the emulator passes the request's body: a create's name is only there

    def __call__(self, method: str, path: str, body=None):
        if not self.enabled:
            return None
        r, rates = self.rng, self.rates
        with self.lock:
            if method == "GET" and "watch=" in path:
                if r.random() < rates.cut_watch:
                    after = r.uniform(1.0, 15.0)
                    self.counts["watch_cut"] += 1
                    self.cuts.append(time.monotonic() + after)
                    return CutWatch(after, abrupt=r.random() < 0.5)
                return None
            x = r.random()
            outcome, kind = None, None
            if x < rates.error500:
                outcome, kind = ApiError(500, "InternalError", "chaos: internal error"), "500"
            elif (x := x - rates.error500) < rates.error429:
                outcome, kind = ApiError(429, "TooManyRequests", "chaos: too many requests",
                                         retry_after=r.choice((1, 2))), "429"
            elif (x := x - rates.error429) < rates.conflict409:
                if method in ("PATCH", "DELETE"):
                    outcome, kind = ApiError(409, "Conflict", "chaos: the object has been modified; please apply "
                                             "your changes to the latest version and try again"), "409"
            elif x - rates.conflict409 < rates.slow:
                outcome, kind = Slow(r.uniform(0.2, 1.5)), "slow"
            if kind is None:
                return None
            self.counts[kind] += 1
            run = self._run(path, body)
            if run is not None:
                now = time.monotonic()
                self.hits[run].append((now, now + outcome.seconds if kind == "slow" else now))
            return outcome


# --- what happened (every thread writes here under one lock) ------------------------------------

@dataclass
class Job:
    name: str
    run: str
    stage: str
    attempt: int
    uid: str
    added: float
    finished: float | None = None
    outcome: str | None = None          # Succeeded | Failed (set by the kubelet)
    deleted: float | None = None


@dataclass
class Run:
    name: str
    kind: str
    stage: str | None = None            # the stage the scenario acts on
    uid: str = ""
    created: float = 0.0
    deleted_at: float | None = None     # the user (or the TTL) asked for its deletion
    gone: bool = False
    statuses: list[tuple[float, dict]] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    suspended_at: float | None = None
    resumed_at: float | None = None
    resume_asked: bool = False


@dataclass
class Reaction:
    run: str
    what: str                           # first_job | next_job | retry | last | suspend | resume | invalid
    start: float
    done: float | None = None


class Book:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runs: dict[str, Run] = {}
        self.jobs: dict[str, Job] = {}            # uid -> job
        self.reactions: list[Reaction] = []
        self.down: list[list[float]] = []         # [killed, answered again] per kill
        self.regressions: list[str] = []
        self.skipped: list[str] = []
        self.twice: list[str] = []
        self.after_delete: list[str] = []

    def owe(self, run: str, what: str, start: float | None = None) -> None:
        with self.lock:
            self.reactions.append(Reaction(run, what, start if start is not None else time.monotonic()))

    def settle(self, run: str, whats: tuple[str, ...], when: float) -> None:
        with self.lock:
            for r in self.reactions:
                if r.run == run and r.done is None and r.what in whats:
                    r.done = when

    def finished(self, run: Run) -> bool:
        return run.gone or (bool(run.statuses) and run.statuses[-1][1].get("phase") in ("Succeeded", "Failed"))


def _regressions(name: str, old: dict, new: dict) -> list[str]:
    """What a later status of one run may never do."""
    out = []
    if old.get("phase") in ("Succeeded", "Failed") and new.get("phase") != old.get("phase"):
        out.append(f"{name}: phase {old.get('phase')} -> {new.get('phase')}")
    if (new.get("observedGeneration") or 0) < (old.get("observedGeneration") or 0):
        out.append(f"{name}: observedGeneration went back")
    before = {s["name"]: s for s in old.get("stages") or []}
    for st in new.get("stages") or []:
        prev = before.get(st["name"])
        if prev is None:
            continue
        if prev.get("phase") == "Succeeded" and st.get("phase") != "Succeeded":
            out.append(f"{name}/{st['name']}: Succeeded -> {st.get('phase')}")
        for key in ("attempt", "failures"):
            if (st.get(key) or 0) < (prev.get(key) or 0):
                out.append(f"{name}/{st['name']}: {key} {prev.get(key)} -> {st.get(key)}")
        step = lambda s: (s.get("checkpoint") or {}).get("step") or 0  # noqa: E731
        if step(st) < step(prev):
            out.append(f"{name}/{st['name']}: checkpoint step {step(prev)} -> {step(st)}")
    return out


# --- watching (the harness's own streams: never faulted) -----------------------------------------

class Watch(threading.Thread):
    """One resource's events, resumed from the last resourceVersion whenever the stream ends."""

    def __init__(self, url: str, path: str, on_event, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.on_event, self.stop = url, path, on_event, stop
        self.version = ""
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            query = {"watch": "true", "timeoutSeconds": "60"}
            if self.version:
                query["resourceVersion"] = self.version
            req = urllib.request.Request(f"{self.url}{self.path}?{urllib.parse.urlencode(query)}",
                                         headers={"User-Agent": HARNESS_AGENT})
            try:
                with urllib.request.urlopen(req, timeout=90) as resp:
                    self.ready.set()
                    for line in resp:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        self.version = event["object"]["metadata"].get("resourceVersion") or self.version
                        self.on_event(event["type"], event["object"], time.monotonic())
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.2)


# --- the kubelet, the training operator and the garbage collector --------------------------------

class Scheduler:
    """Timed actions run by a few threads (``at(delay, fn)``)."""

    def __init__(self, stop: threading.Event, threads: int = 4) -> None:
        self.heap: list = []
        self.cond = threading.Condition()
        self.stop, self.seq = stop, 0
        self.errors: list[str] = []
        for _ in range(threads):
            threading.Thread(target=self._work, daemon=True).start()

    def at(self, delay: float, fn, *args) -> None:
        with self.cond:
            self.seq += 1
            heapq.heappush(self.heap, (time.monotonic() + delay, self.seq, fn, args))
            self.cond.notify()

    def _work(self) -> None:
        while not self.stop.is_set():
            with self.cond:
                while not self.stop.is_set() and (not self.heap or self.heap[0][0] > time.monotonic()):
                    self.cond.wait(0.05 if not self.heap else max(0.0, min(0.05, self.heap[0][0] - time.monotonic())))
                if self.stop.is_set():
                    return
                _, _, fn, args = heapq.heappop(self.heap)
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 (a harness bug: reported, the bench goes on)
                self.errors.append(f"{fn.__name__}{args[:1]}: {exc!r}")


class Players:
    """The players other than the operator: users, kubelet + training operator, garbage collector."""

    def __init__(self, world: World, book: Book, rng: random.Random, sched: Scheduler) -> None:
        self.world, self.book, self.rng, self.sched = world, book, rng, sched
        self.c = world.cluster

    # -- the training operator: job status with optimistic concurrency on that very job
    def _job_status(self, job: Job, phase: str, message: str = "") -> bool:
        path = f"{self.world.jobs_path}/{job.name}"
        for _ in range(20):
            try:
                current = self.c.get(path)
            except Exception:  # noqa: BLE001 (gone)
                return False
            meta = current["metadata"]
            if meta["uid"] != job.uid or meta.get("deletionTimestamp"):
                return False
            conditions = [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}]
            if phase in ("Running", "Succeeded", "Failed"):
                conditions.append({"type": "Running", "status": "True" if phase == "Running" else "False",
                                   "reason": "PyTorchJobRunning"})
            if phase in ("Succeeded", "Failed"):
                conditions.append({"type": phase, "status": "True", "reason": f"PyTorchJob{phase}",
                                   "message": message})
            try:
                self.c.patch(f"{path}/status", {"metadata": {"resourceVersion": meta["resourceVersion"]},
                                                "status": {"conditions": conditions}})
                return True
            except Exception as exc:  # noqa: BLE001
                if getattr(exc, "status", None) != 409:
                    return False
        return False

    def job_added(self, job: Job) -> None:
        self.sched.at(self.rng.uniform(0.05, 0.3), self._start, job)

    def _alive(self, job: Job) -> bool:
        with self.book.lock:
            return job.deleted is None

    def _start(self, job: Job) -> None:
        if not self._alive(job):
            return
        root = self._stage_dir(job)
        root.mkdir(parents=True, exist_ok=True)
        (root / "launch-manifest.json").write_text(json.dumps({"schema": "solar.launch.v1", "name": job.run}))
        if job.stage != "generate" and not (root / "checkpoints" / f"step_{MID_STEP:08d}").exists():
            write_checkpoint(root, MID_STEP)   # the trainer's first save (a resume starts from it)
        if not self._job_status(job, "Running"):
            return
        run = self.book.runs[job.run]
        if run.kind in ("suspend", "delete") and job.stage == run.stage and job.attempt == 1:
            self.sched.at(self.rng.uniform(0.1, 0.6), self._interrupt, job)   # this attempt never ends by itself
            return
        self.sched.at(self.rng.uniform(0.2, 0.8), self._finish, job)

    def _finish(self, job: Job) -> None:
        if not self._alive(job):
            return
        run = self.book.runs[job.run]
        fails = job.stage == run.stage and ((run.kind == "retry" and job.attempt == 1) or run.kind == "exhaust")
        root = self._stage_dir(job)
        if not fails and job.stage != "generate":
            if not (root / "checkpoints" / f"step_{FINAL_STEP:08d}").exists():
                write_checkpoint(root, FINAL_STEP)
            marker = root / "validation" / f"step_{FINAL_STEP:08d}" / "COMPLETE.json"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"schema": "solar.validation-complete.v1", "status": "complete"}))
        if not fails and job.stage == "generate":
            (root / "generation").mkdir(exist_ok=True)
            (root / "generation" / "COMPLETE.json").write_text(json.dumps({"status": "complete"}))
        from solar.storage.run_dir import write_result

        write_result(root, "failed" if fails else "complete", error_type="runtime_error" if fails else None,
                     message="chaos: the trainer failed" if fails else None)
        phase = "Failed" if fails else "Succeeded"
        if not self._alive(job):
            return
        now = time.monotonic()
        with self.book.lock:   # before the patch: the operator may react before the patch call returns
            job.finished, job.outcome = now, phase
        if not self._job_status(job, phase, "chaos: exit code 1" if fails else ""):
            with self.book.lock:
                job.finished = job.outcome = None
            return
        last = job.stage == STAGES[-1]
        if fails:
            self.book.owe(job.run, "last" if job.attempt == 3 else "retry", now)
        else:
            self.book.owe(job.run, "last" if last else "next_job", now)

    def _interrupt(self, job: Job) -> None:
        """The user suspends or deletes the run while this job runs."""
        if not self._alive(job):
            return
        run = self.book.runs[job.run]
        path = f"{self.world.runs_path}/{job.run}"
        now = time.monotonic()
        if run.kind == "suspend":
            run.suspended_at = now
            self.c.patch(path, {"spec": {"runPolicy": {"suspend": True}}})
            self.book.owe(job.run, "suspend", now)
        else:
            with self.book.lock:
                run.deleted_at = now
            self.c.delete(path)

    def resume_later(self, run: Run) -> None:
        with self.book.lock:
            if run.resume_asked:
                return
            run.resume_asked = True
        self.sched.at(self.rng.uniform(0.3, 1.5), self._resume, run)

    def _resume(self, run: Run) -> None:
        now = time.monotonic()
        run.resumed_at = now
        self.c.patch(f"{self.world.runs_path}/{run.name}", {"spec": {"runPolicy": {"suspend": False}}})
        self.book.owe(run.name, "resume", now)

    def collect(self, owner_uid: str) -> None:
        """The garbage collector: the jobs of a deleted run go (owner references)."""
        for j in self.c.list(self.world.jobs_path)["items"]:
            if any(r.get("uid") == owner_uid for r in j["metadata"].get("ownerReferences") or []):
                try:
                    self.c.delete(f"{self.world.jobs_path}/{j['metadata']['name']}",
                                  {"propagationPolicy": "Background"})
                except Exception:  # noqa: BLE001 (already gone)
                    pass

    def _stage_dir(self, job: Job) -> Path:
        return self.world.storage / job.run / job.stage


# --- the operator process and its liveness ---------------------------------------------------------

class Operator:
    def __init__(self, storage: Path, namespace: str, env: dict, log, poll: float) -> None:
        self.storage, self.namespace, self.env, self.log = storage, namespace, env, log
        self.poll = poll
        self.proc: subprocess.Popen | None = None
        self.starts: list[dict] = []
        self.rss: list[float] = []
        self.answers: list[tuple[int, float, float | None]] = []   # (start index, asked at, seconds or None)
        self.lock = threading.Lock()
        self.live = f"http://127.0.0.1:{_port()}/healthz"   # every process serves it on the same port

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("solar-operator")), "--standalone", "-n", self.namespace,
             "--storage-root", str(self.storage), "--metrics-port", str(_port()), "--liveness", self.live],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        with self.lock:
            self.starts.append({"started": time.monotonic(), "first_200": None, "killed": None,
                                "pid": self.proc.pid})

    def kill(self) -> float:
        now = time.monotonic()
        with self.lock:   # first: a probe answered after this moment is not held against the process
            self.starts[-1]["killed"] = now
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return now

    def stop(self) -> None:
        with self.lock:   # the bench is over: an ask SIGTERM leaves unanswered is not the process's failure
            if self.starts and self.starts[-1]["killed"] is None:
                self.starts[-1]["killed"] = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def probe(self, stop: threading.Event, period: float = 0.25) -> None:
        """``/healthz`` asked by a prober process of its own (prober.py: this process's own waits are not
        the operator's); each answer belongs to the process started last before it was asked, unless
        that one was killed before the answer came."""
        prober = subprocess.Popen([sys.executable, str(Path(__file__).with_name("prober.py")), self.live, str(period)],
                                  stdout=subprocess.PIPE, text=True)
        threading.Thread(target=lambda: (stop.wait(), prober.kill()), daemon=True).start()
        for line in prober.stdout:
            asked, seconds, ok = (float(x) for x in line.split())
            took = seconds if ok else None
            with self.lock:
                index = next((i for i in range(len(self.starts) - 1, -1, -1) if self.starts[i]["started"] <= asked),
                             None)
                if index is None:
                    continue
                current = self.starts[index]
                if current["killed"] is not None and current["killed"] <= asked + seconds:
                    continue   # killed before this answer (or this failure) came
                self.answers.append((index, asked, took))
                if took is not None and current["first_200"] is None:
                    current["first_200"] = asked + took
            try:
                self.rss.append(_proc_stats(current["pid"])["rss_mib"])
            except (OSError, KeyError, IndexError):
                pass
        prober.wait()

    def ready(self) -> bool:
        with self.lock:
            return bool(self.starts) and self.starts[-1]["first_200"] is not None


# --- the bench -------------------------------------------------------------------------------------

def _scenarios(rng: random.Random, n: int) -> list[Run]:
    kinds, weights = zip(*KINDS.items())
    out = []
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        out.append(Run(f"run-{i:04d}", kind, stage=rng.choice(STAGES) if kind not in ("ok", "invalid") else None))
    return out


def _doc(run: Run, rng: random.Random, base: dict) -> dict:
    if run.kind == "invalid":
        doc = load_case(rng.choice(INVALID_CASES))
    else:
        doc = json.loads(json.dumps(base))
        doc["spec"]["storage"]["path"] = run.name
    doc["metadata"]["name"] = run.name
    return doc


class StallProbe(threading.Thread):
    """The bench process's own stalls: a thread that sleeps 20 ms at a time and records each wake-up
    later than 0.2 s (the GIL held or a garbage collection: the emulator and the players, which
    timestamp what the operator does, stop with it). ``freeze``: every second, move what the process
    holds into Python's permanent generation (``gc.freeze``), so that the full collections of an
    append-only history (the emulator records every request) stop scanning it again."""

    def __init__(self, stop: threading.Event, freeze: bool) -> None:
        super().__init__(daemon=True)
        self.stop, self.freeze, self.stalls = stop, freeze, []

    def run(self) -> None:
        last_freeze = time.monotonic()
        while not self.stop.is_set():
            before = time.monotonic()
            time.sleep(0.02)
            late = time.monotonic() - before - 0.02
            if late > 0.2:
                self.stalls.append((before, late))
            if self.freeze and time.monotonic() - last_freeze > 1.0:
                gc.freeze()
                last_freeze = time.monotonic()

    def report(self) -> dict:
        longest = sorted(self.stalls, key=lambda s: -s[1])[:5]
        return {"gc_freeze": self.freeze, "over_0_2s": len(self.stalls),
                "over_0_5s": sum(1 for _, s in self.stalls if s > 0.5),
                "max_seconds": round(max((s for _, s in self.stalls), default=0.0), 2),
                "longest": [f"{s:.2f}s at {_wall_clock(t)}" for t, s in longest]}


def _wall_clock(monotonic: float) -> str:
    """A time.monotonic() moment as the wall clock the operator's log shows (HH:MM:SS.mmm)."""
    at = time.time() - time.monotonic() + monotonic
    return f"{time.strftime('%H:%M:%S', time.localtime(at))}.{int(at % 1 * 1000):03d}"


def chaos(*, runs: int = 1000, kills: int = 30, seed: int = 1, poll_seconds: float = 10.0, active: int = 60,
          kill_interval: float | None = None,
          rates: FaultRates | None = None, liveness_bound: float = 1.0, timeout: float = 3600.0,
          linger: float = 3.0, workdir: Path | None = None, gc_freeze: bool = True) -> dict:
    rng = random.Random(seed)
    rates = rates or FaultRates()
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="solar-operator-chaos-"))
    storage = tmp / "runs"
    storage.mkdir(parents=True)
    book, stop = Book(), threading.Event()
    plan = _scenarios(rng, runs)
    names = {r.name for r in plan}
    faults = Faults(random.Random(seed + 1), rates, names)
    result = {"runs": runs, "kills_asked": kills, "kill_interval": kill_interval, "seed": seed,
              "poll_seconds": poll_seconds, "active": active,
              "fault_rates": vars(rates), "liveness_bound_seconds": liveness_bound,
              "machine": f"{os.cpu_count()} cores", "scenarios": dict(Counter(r.kind for r in plan))}
    base = load_case("three-stage")
    started = time.monotonic()
    probe = StallProbe(stop, gc_freeze)
    probe.start()
    with emulated_cluster([CRD, ANCHORS / "kubeflow.org_pytorchjobs.yaml"], tmp) as cluster:
        world = World(cluster, storage)
        sched = Scheduler(stop)
        players = Players(world, book, random.Random(seed + 2), sched)

        def on_run(kind: str, obj: dict, now: float) -> None:
            name = obj["metadata"]["name"]
            run = book.runs.get(name)
            if run is None:
                return
            with book.lock:
                status = obj.get("status") or {}
                if run.statuses:
                    book.regressions += _regressions(name, run.statuses[-1][1], status)
                if kind == "DELETED":
                    run.gone = True
                    sched.at(0.0, players.collect, run.uid)
                    return
                run.statuses.append((now, status))
                phase = status.get("phase")
            if phase in ("Succeeded", "Failed"):
                book.settle(name, ("last", "invalid", "retry", "next_job", "first_job", "resume"), now)
                if run.deleted_at is None:   # the TTL: a finished run goes a little later
                    with book.lock:
                        run.deleted_at = now + linger
                    sched.at(linger, lambda n=name: _delete(world, n))
            if phase == "Suspended" and run.suspended_at is not None and _suspended_stage_idle(run):
                book.settle(name, ("suspend",), now)
                players.resume_later(run)

        def on_job(kind: str, obj: dict, now: float) -> None:
            meta = obj["metadata"]
            labels = meta.get("labels") or {}
            run = book.runs.get(labels.get("solarwm.io/run", ""))
            if run is None:
                return
            with book.lock:
                job = book.jobs.get(meta["uid"])
                if job is None and kind != "DELETED":
                    stage, attempt = labels.get("solarwm.io/stage", ""), int(labels.get("solarwm.io/attempt", "0"))
                    job = Job(meta["name"], run.name, stage, attempt, meta["uid"], now)
                    book.jobs[meta["uid"]] = job
                    _check_new_job(book, run, job)
                    run.jobs.append(job)
                    if run.deleted_at is not None and run.kind == "delete" and run.deleted_at < now:
                        book.after_delete.append(job.name)
                    else:
                        players.job_added(job)
                    book.settle(run.name, ("first_job", "next_job", "retry", "resume"), now)
                if job is not None and (kind == "DELETED" or meta.get("deletionTimestamp")) and job.deleted is None:
                    job.deleted = now
                    if run.suspended_at is not None and run.statuses and \
                            run.statuses[-1][1].get("phase") == "Suspended" and _suspended_stage_idle(run):
                        book.settle(run.name, ("suspend",), now)
                        players.resume_later(run)
            if run.gone and kind != "DELETED":
                sched.at(0.0, players.collect, run.uid)

        watches = [Watch(cluster.url, world.runs_path, on_run, stop), Watch(cluster.url, world.jobs_path, on_job, stop)]
        for w in watches:
            w.start()
            w.ready.wait(10)
        log = open(tmp / "operator.log", "w")  # noqa: SIM115
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "SOLAR_OPERATOR_POLL_SECONDS": str(poll_seconds)}
        op = Operator(storage, world.namespace, env, log, poll_seconds)
        cluster.emulator.faults.append(faults)
        op.start()
        threading.Thread(target=op.probe, args=(stop,), daemon=True).start()
        try:
            _drive(world, book, plan, op, faults, rng, base, kills=kills, kill_interval=kill_interval, active=active,
                   timeout=timeout,
                   started=started)
            result["seconds"] = round(time.monotonic() - started, 1)
            result["operator_log"] = str(tmp / "operator.log")
            result["operator_end"] = _proc_stats(op.proc.pid)
        finally:
            faults.enabled = False
            stop.set()
            op.stop()
            log.close()
        result["harness_errors"] = sched.errors[:20]
        result["harness_stalls"] = probe.report()
        result["faults_injected"] = dict(faults.counts)
    result.update(_report(book, op, faults, plan, poll_seconds, liveness_bound))
    return result


def _suspended_stage_idle(run: Run) -> bool:
    """A suspend is done when the run says Suspended and the suspended stage has no job left."""
    return run.resumed_at is None and not [j for j in run.jobs if j.stage == run.stage and j.deleted is None]


def _delete(world: World, name: str) -> None:
    try:
        world.cluster.delete(f"{world.runs_path}/{name}")
    except Exception:  # noqa: BLE001 (already gone)
        pass


def _check_new_job(book: Book, run: Run, job: Job) -> None:
    """A job the operator just created: its stage's predecessor must have succeeded, the stage itself
    must not have, and no job of this stage and attempt may have existed."""
    if any(j.stage == job.stage and j.attempt == job.attempt for j in run.jobs):
        return  # counted as a duplicate in the report
    index = STAGES.index(job.stage) if job.stage in STAGES else 0
    if index and not any(j.stage == STAGES[index - 1] and j.outcome == "Succeeded" for j in run.jobs):
        book.skipped.append(f"{job.name}: created before {STAGES[index - 1]} succeeded")
    if any(j.stage == job.stage and j.outcome == "Succeeded" for j in run.jobs):
        book.twice.append(f"{job.name}: created after that stage succeeded")


def _drive(world: World, book: Book, plan: list[Run], op: Operator, faults: Faults, rng: random.Random,
           base: dict, *, kills: int, active: int, timeout: float, started: float,
           kill_interval: float | None = None) -> None:
    deadline = started + timeout
    first_window = min(active, len(plan))
    marks = sorted(rng.uniform(1, max(2, len(plan) - 2)) for _ in range(max(0, kills - 1)))
    killed, created = 0, 0
    first_kill_done = kills == 0
    while time.monotonic() < deadline:
        with book.lock:
            done = sum(1 for r in plan[:created] if book.finished(r))
            unfinished = created - done
        while created < len(plan) and unfinished < active:
            run = plan[created]
            with book.lock:
                book.runs[run.name] = run
            doc = _doc(run, rng, base)
            run.created = time.monotonic()
            obj = world.apply(doc)
            run.uid = obj["metadata"]["uid"]
            book.owe(run.name, "invalid" if run.kind == "invalid" else "first_job", run.created)
            created += 1
            unfinished += 1
        if created == len(plan) and done == len(plan):
            return
        with book.lock:
            if book.down and book.down[-1][1] is None and op.ready():
                book.down[-1][1] = op.starts[-1]["first_200"]
        if op.ready():
            due = False
            if not first_kill_done:
                with book.lock:   # every run of the first window has its first job (or is invalid and failed)
                    due = created >= first_window and all(
                        r.jobs or book.finished(r) for r in plan[:first_window])
            elif killed < kills and kill_interval is not None:
                due = time.monotonic() - book.down[-1][0] >= kill_interval
            elif killed < kills and marks and done >= marks[0]:
                marks.pop(0)
                due = True
            if due:
                time.sleep(rng.uniform(0.0, 1.0))
                t = op.kill()
                first_kill_done = True
                killed += 1
                book.down.append([t, None])
                _say(f"kill {killed}/{kills} at {t - started:.1f}s ({done} runs finished)")
                time.sleep(rng.uniform(0.2, 1.0))
                op.start()
        time.sleep(0.05)
    _say(f"timed out after {timeout:.0f}s: {sum(1 for r in plan if book.finished(r))} of {len(plan)} runs finished")


def down_overlap(down: list[list[float]], a: float, b: float) -> float:
    return sum(max(0.0, min(b, end or b) - max(a, start)) for start, end in down)


def _report(book: Book, op: Operator, faults: Faults, plan: list[Run], poll: float, bound: float) -> dict:
    stuck_limit = 5 * poll
    out: dict = {}
    # duplicates: a second job of one run, stage and attempt
    dup = Counter((j.run, j.stage, j.attempt) for j in book.jobs.values())
    duplicates = [f"{r}/{s} attempt {a} x{n}" for (r, s, a), n in dup.items() if n > 1]
    # outcomes and the status's account of attempts and failures
    wrong, miscounted, unfinished = [], [], []
    for run in plan:
        final = run.statuses[-1][1] if run.statuses else {}
        if run.kind == "delete":
            if not run.gone:
                wrong.append(f"{run.name}: deleted but still there")
            continue
        phase = final.get("phase")
        want = {"ok": "Succeeded", "retry": "Succeeded", "suspend": "Succeeded", "exhaust": "Failed",
                "invalid": "Failed"}[run.kind]
        if phase not in ("Succeeded", "Failed"):
            unfinished.append(f"{run.name} ({run.kind}): {phase}")
            continue
        if phase != want:
            wrong.append(f"{run.name} ({run.kind}): {phase} "
                         f"{[(s.get('name'), s.get('reason')) for s in final.get('stages') or []]}")
            continue
        if run.kind == "invalid":
            if run.jobs:
                wrong.append(f"{run.name}: invalid but {len(run.jobs)} jobs")
            continue
        if run.kind == "exhaust":
            failed = [s for s in final.get("stages") or [] if s.get("phase") == "Failed"]
            if [(s["name"], s.get("reason")) for s in failed] != [(run.stage, "BackoffLimitExceeded")]:
                wrong.append(f"{run.name}: {[(s['name'], s.get('reason')) for s in failed]}")
        for st in final.get("stages") or []:
            jobs = [j for j in run.jobs if j.stage == st["name"]]
            ran = len({j.attempt for j in jobs})
            failures = sum(1 for j in jobs if j.outcome == "Failed")
            if (st.get("attempt") or 0) != ran or (st.get("failures") or 0) != failures:
                miscounted.append(f"{run.name}/{st['name']}: status attempt {st.get('attempt')} failures "
                                  f"{st.get('failures')}, jobs ran {ran} attempts, {failures} failed")
    # reactions
    stuck, next_all, next_clean = [], [], []   # next_clean: (seconds, run, start)
    for r in book.reactions:
        if r.done is None:
            run = book.runs.get(r.run)
            if run is not None and run.deleted_at is not None and run.kind == "delete":
                continue   # owed to a run the user deleted
            if run is not None and run.gone:
                continue
            stuck.append(f"{r.run}: {r.what} never happened")
            continue
        took = r.done - r.start
        effective = took - down_overlap(book.down, r.start, r.done)
        if effective > stuck_limit:
            stuck.append(f"{r.run}: {r.what} after {took:.1f}s ({effective:.1f}s with the operator up)")
        if r.what == "next_job":
            next_all.append((took, r.run, r.start))
            hit = any(a <= r.done and r.start <= b for a, b in faults.hits.get(r.run, []))
            cut = any(r.start <= t <= r.done for t in faults.cuts)
            if not hit and not cut and down_overlap(book.down, r.start, r.done) == 0 and \
                    not any(r.start <= s <= r.done for s, _ in book.down):
                next_clean.append((took, r.run, r.start))
    # kills: to the new process answering, and to every reaction pending at the kill done
    to_ready, to_converged, last = [], [], []   # last: (seconds, the reaction that ended the convergence)
    for killed, answered in book.down:
        if answered is None:
            continue
        to_ready.append(answered - killed)
        pending = [r for r in book.reactions if r.start <= answered and (r.done is None or r.done >= killed)]
        ends = [r for r in pending if r.done is not None]
        end = max(ends, key=lambda r: r.done, default=None)
        to_converged.append(max(answered, end.done if end else answered) - killed)
        if end is not None and end.done > answered:
            last.append((end.done - killed, f"{end.run} {end.what} from {_wall_clock(end.start)}"))
    # liveness: after each process first answered, until it was killed
    slow = missing = 0
    first = [s["first_200"] - s["started"] for s in op.starts if s["first_200"] is not None]
    answered, late = [], []
    for index, asked, took in op.answers:
        f = op.starts[index]["first_200"]
        if f is None or asked + (took or 0) < f:   # still starting
            continue
        if took is None or took > bound:
            late.append(f"process {index}, {asked - op.starts[index]['started']:.1f}s after its start: "
                        + ("no answer" if took is None else f"{took:.2f}s"))
        if took is None:
            missing += 1
        else:
            answered.append(took)
            slow += took > bound
    out["failures"] = {
        "duplicate_jobs": len(duplicates), "stages_skipped": len(book.skipped), "stages_run_twice": len(book.twice),
        "runs_stuck": len(stuck), "status_regressions": len(book.regressions), "wrong_outcomes": len(wrong),
        "attempts_or_failures_miscounted": len(miscounted), "runs_unfinished": len(unfinished),
        "liveness_slower_than_bound": slow, "liveness_missing": missing}
    out["details"] = {k: v[:10] for k, v in {
        "duplicate_jobs": duplicates, "stages_skipped": book.skipped, "stages_run_twice": book.twice,
        "runs_stuck": stuck, "status_regressions": book.regressions, "wrong_outcomes": wrong,
        "miscounted": miscounted, "unfinished": unfinished, "liveness_late": late}.items() if v}
    out["stuck_limit_seconds"] = stuck_limit
    out["kills"] = len(book.down)
    out["jobs_created"] = len(book.jobs)
    out["jobs_created_after_their_run_was_deleted"] = len(book.after_delete)
    out["kill_to_liveness_200"] = distribution(to_ready) if to_ready else None
    out["kill_to_converged"] = distribution(to_converged) if to_converged else None
    out["start_to_first_200"] = distribution(first) if first else None
    out["liveness_answers"] = distribution(answered) if answered else None
    out["kill_to_converged_slowest"] = [f"{took:.1f}s: {what}" for took, what in sorted(last, reverse=True)[:8]]
    out["next_job"] = distribution([c[0] for c in next_all]) if next_all else None
    out["next_job_slowest"] = [
        f"{run}: {took:.2f}s from {_wall_clock(start)}" for took, run, start in sorted(next_all, reverse=True)[:8]]
    out["next_job_outside_faults"] = distribution([c[0] for c in next_clean]) if next_clean else None
    out["next_job_outside_faults_slowest"] = [   # to find in the operator's log
        f"{run}: {took:.2f}s from {_wall_clock(start)}" for took, run, start in sorted(next_clean, reverse=True)[:8]]
    out["operator_rss_mib_max"] = round(max(op.rss), 1) if op.rss else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--kill-interval", type=float, help="seconds from one kill to the next after the first "
                        "(default: when the finished count crosses random marks)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--poll-seconds", type=float, default=10.0, help="SOLAR_OPERATOR_POLL_SECONDS")
    parser.add_argument("--active", type=int, default=60, help="unfinished runs at most at a time")
    parser.add_argument("--liveness-bound", type=float, default=1.0, help="seconds a /healthz answer may take")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--no-gc-freeze", action="store_true", help="leave the bench process's garbage collector "
                        "as it is (its full collections over the emulator's history stall the emulator)")
    parser.add_argument("--no-api-faults", action="store_true", help="the peer: the same load, no API faults "
                        "(with --kills 0: no faults at all)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    rates = FaultRates(0.0, 0.0, 0.0, 0.0, 0.0) if args.no_api_faults else FaultRates()
    result = chaos(runs=args.runs, kills=args.kills, kill_interval=args.kill_interval, seed=args.seed,
                   poll_seconds=args.poll_seconds,
                   active=args.active, liveness_bound=args.liveness_bound, timeout=args.timeout, rates=rates,
                   gc_freeze=not args.no_gc_freeze)
    finish(result, args.out)


def finish(result: dict, out: Path | None) -> None:
    """A bench's end: its JSON document printed (and written to ``out``); exit 1 when a failure count
    is not 0."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")
    sys.exit(1 if any(result["failures"].values()) else 0)


if __name__ == "__main__":
    main()
