"""Elastic chaos: SolarRuns with elastic training stages against the real ``solar-operator --read-nodes``
while nodes of a faithful emulated cluster are lost and come back (issue 45 item 9, issue 51 item 7).

The cluster is ``--nodes`` nodes of ``--gpus-per-node`` GPUs on the emulated API server
(tests/support/kube.py), played by ``tests.integration.nodes`` in its FAITHFUL variant: kubelets that
heartbeat, the node lifecycle controller (``Ready=Unknown`` after the grace, the NoExecute taints), the
taint manager, PodGC, kube-scheduler's one-pod-at-a-time binding (an attempt may be partly placed), the
PyTorchJob controller's phases (the job reads Running while its master runs) and each pod ITS OWN
process. Here that process is a played rank (this file with ``--played-rank``) instead of torchrun: one
process per pod, the pods of an attempt joined by a collective over TCP (node rank 0 holds a connection
to every other pod, as a rendezvous at ``PET_MASTER_ADDR:PORT``), so a frozen pod blocks the others as
over a real network and a pod whose process is gone fails them. Times are scaled down (stated in the
result: the kubelets' heartbeat, the node-monitor grace, ``nodeLostSeconds``, the termination grace,
PodGC's quarantine; ``tolerationSeconds`` is left long enough that the taint manager's own eviction never
comes while a node is away). Meanwhile:

- users create ``--runs`` one-stage SolarRuns, at most ``--active`` unfinished at a time, each a
  training stage of 4, 3 or 2 nodes (one pod of a whole node each) with ``elastic: {minNodes: 1}``
  (4 nodes: 4, 3, 2 or 1 keep the global batch; 3: 3 or 1; 2: 2 or 1), a finished run deleted a
  little later (as a TTL would) and its jobs with it;
- the played ranks of each attempt read the arguments the operator gave the job as ``solar train``
  does (``distributed.world_size``, ``train.gradient_accumulation``, ``checkpoint.path``) and report
  them (the bench checks the shape is one the plan allows with the global batch kept and the resume
  is the newest verified checkpoint); they honour the fence as the real trainer does, with
  ``solar.storage.fence``'s own functions: rank 0 refuses a stale launch (``admit``), takes the writer
  lock (``run_dir.hold``), records its token (``record``) before anything else is written, and every
  rank checks it (``check``: ``EventLog.write``, ``checkpoints.begin``/``commit``, ``write_result``,
  ``write_replace``) before each write, a stale one leaving at once with exit 3 writing nothing. Each
  step every rank sleeps ``--step-seconds`` x accumulation, then the step's collective (every pod's
  stop flag to rank 0, the answer back), then writes its ``step`` event; every ``--save-every`` steps
  a real checkpoint transaction (rank 0 begins and writes it, a barrier, rank 0 commits, every rank
  waits for the commit, then its ``checkpoint`` event); on SIGTERM the ranks finish the step, save
  there and exit 0 (a grow back; an evicted pod); a peer gone (its connection closed) fails the
  launch (an ``error`` event, rank 0's ``run-result.json`` failed: exit 1), as a collective error does;
- the node-fault driver loses ``--node-kills`` nodes, one every ``--kill-every`` s (x0.5-1.5), at most
  ``--max-down`` at a time, each one running a pod of an attempt that has a checkpoint, about
  ``--min-left`` s of training left and no loss yet, the kinds in turn (each block of five shuffled),
  each node back ``--down`` s later:
  ``not-ready`` (the kubelet reports NotReady and the node gets a NoExecute taint its pods do not
  tolerate: the taint manager evicts them at once, ``DisruptionTarget``, and the kubelet stops them:
  they save), ``not-ready-alone`` (the kubelet reports NotReady, nothing on the pods: only the node
  says why, after ``nodeLostSeconds``), ``deleted`` (the Node object deleted, its processes SIGKILLed;
  PodGC marks and force-deletes its pods), ``silent`` (its kubelet posts nothing and its processes
  are SIGSTOPped: the survivors block in their collective; back: SIGCONT, and the kubelet stops the
  pods deleted meanwhile) and ``dead-kubelet`` (its kubelet posts nothing, its processes run on and
  keep writing);
- ``--operator-kills`` SIGKILLs of the operator (0 by default), spread over the kills.

Measured and checked (failure counts; exit 1 when one is not 0):

- every attempt a lost node hit continues (the run's next attempt trains its first step) at the
  largest shape the cluster holds: how long, per kind of loss (the distribution), at which shape.
  Later than the kind's bound (``shrinkAfterSeconds`` + launch + 3 polls + 3 s, plus for the kinds
  acted on from the node ``nodeLostSeconds`` + a heartbeat + 1 s, plus the termination grace for a
  silent node, whose survivors cannot save) is a failure when a replacement stayed pending with room
  for a smaller shape longer than ``shrinkAfterSeconds + 3 polls + 1 s``; else it is counted apart
  (waited for capacity; room taken first). A replacement may start larger than the lost attempt when
  the cluster holds it again before the start (``TopologyGrown``, counted);
- a pending or partly placed attempt replaced by a smaller one (a shrink while unschedulable):
  admitted to replaced; pending with room for a smaller shape (its own bound pods and the free nodes)
  longer than that bound is a failure;
- a stage running shrunk grows back: count, latency from the moment the cluster held a larger
  allowed shape for it and ``minSecondsBetweenChanges`` had passed (sampled every tick of the
  cluster); room for longer than 2 polls + the operator's 2 s cluster cache + 1 s without a grow is a
  failure. The room each grow was decided with is read from the API server's own state at the very
  moment the operator's DELETE of the running job arrives (a fault hook that injects nothing):
  **decided without room then** (a failure) is a grow whose larger shape did not fit then, unless the
  operator's own listing of all pods less than ``--fresh-listing-seconds`` before that DELETE showed
  it fitting (a pod bound between the operator's fresh listing and its delete: no listing closes
  that); a **collision** (a failure) is such a grow whose grown attempt found no room and shrank
  again;
- from each stage's files: the committed history (each launch's steps up to the next launch's
  resume point) is 1..max_steps, no step lost or repeated; each launch resumes the newest checkpoint
  committed before it (one that a replaced attempt on a lost node, which nobody waits for, committed
  after the operator had given it up is counted apart, as docs/elastic.md states); steps after a
  killed launch's last checkpoint are redone (counted), a gracefully stopped launch redoes none;
- **stale commits**: anything a replaced attempt committed or wrote after the next attempt recorded
  its token (its ``fence`` time, from rank 0's record): a checkpoint renamed into place later (the
  directory's ctime), a ``run-result.json`` or launch manifest written later, an event line of any
  rank's log stamped later or standing after a newer attempt's line; and the processes of replaced
  attempts that left as stale (exit 3), by kind of loss;
- every run Succeeded with no failure counted and none left unfinished; the status's attempts match
  the jobs (shape of each), its shrinks and grows match the attempts' shapes (a shrink grown back
  before its attempt started counts one of each); its disruptionSeconds against the measured
  disruption (from the loss, or the unschedulable shrink's delete, to the first step of the next
  attempt that trained): one without the other is a failure, save a loss whose attempt saved on
  SIGTERM (the operator's ``StageStopped``), counted among the findings;
- the emulation itself: a node the bench did not lose that reads not Ready (the cluster's loop fell
  more than the node-monitor grace behind its heartbeats) is a failure, since the operator then acts
  on a loss nobody made; the loop's tick times are reported.

Findings (counted and listed, not failures: what the operator does that costs a launch but loses
nothing): an unschedulable shrink of an attempt every pod of which was bound when the operator's DELETE
arrived and in its last listing less than ``--fresh-listing-seconds`` before it (decided on a cached
listing older than the binding: a placed attempt stopped); a loss whose ranks saved on SIGTERM with no
disruption seconds; a launch that resumes the last step; a grown attempt that shrank again after a
grow decided with room (the room went to a job created after the decision: nothing is reserved for a
grow while its old pods save).

    .venv/bin/python bench/operator/elastic_chaos.py --runs 120 --node-kills 110 --seed 1
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RANK_FLAG = "--played-rank"
CHAOS_TAINT = "solarwm.io/chaos-evict"       # the NoExecute taint of a ``not-ready`` loss (no pod tolerates it)


# --- the played rank: one process per pod (only solar.storage is imported: it starts in ~0.1 s) --------

class _PeerGone(Exception):
    """A peer's connection closed: the collective fails (gloo's "Connection closed by peer")."""


class _Collective:
    """The attempt's process group: node rank 0 accepts a connection from every other pod's process (the
    static rendezvous at ``PET_MASTER_ADDR:PET_MASTER_PORT``); a collective is every worker's word to
    rank 0 and rank 0's answer (the OR of the words) to every worker. A frozen peer blocks it, as over a
    real network (no timeout: NCCL's is 10 minutes and more); a gone peer fails it."""

    WORD = struct.Struct("!i")

    def __init__(self, rank: int, nnodes: int, port: int) -> None:
        self.rank, self.nnodes, self.port = rank, nnodes, port
        self.peers: list[socket.socket] = []

    def rendezvous(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self.rank == 0:
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", self.port))
            server.listen(64)
            server.settimeout(1.0)
            while len(self.peers) < self.nnodes - 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rendezvous: {len(self.peers) + 1} of {self.nnodes} pods after {timeout:.0f} s")
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._recv(conn)          # its node rank
                self.peers.append(conn)
            server.close()
            return
        while True:
            conn = socket.socket()
            try:
                conn.connect(("127.0.0.1", self.port))
                break
            except OSError:
                conn.close()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rendezvous: no master at port {self.port} after {timeout:.0f} s") from None
                time.sleep(0.05)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(self.WORD.pack(self.rank))
        self.peers = [conn]

    def _recv(self, conn: socket.socket) -> int:
        data = b""
        while len(data) < self.WORD.size:
            try:
                chunk = conn.recv(self.WORD.size - len(data))
            except OSError as exc:
                raise _PeerGone(str(exc)) from None
            if not chunk:
                raise _PeerGone("Connection closed by peer")
            data += chunk
        return self.WORD.unpack(data)[0]

    def _send(self, conn: socket.socket, word: int) -> None:
        try:
            conn.sendall(self.WORD.pack(word))
        except OSError as exc:
            raise _PeerGone(str(exc)) from None

    def any(self, word: int) -> int:
        """The OR of every pod's ``word`` (a step's all-reduce, a barrier, the stop check)."""
        if self.rank == 0:
            for conn in self.peers:
                word |= self._recv(conn)
            for conn in self.peers:
                self._send(conn, word)
            return word
        self._send(self.peers[0], word)
        return self._recv(self.peers[0])


def _safetensors(step: int) -> bytes:
    """One float32 tensor ``w`` of 4 values, encoded as the format says (no torch in a played rank)."""
    header = json.dumps({"w": {"data_offsets": [0, 16], "dtype": "F32", "shape": [4]}}, sort_keys=True).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + struct.pack("<4f", *([float(step)] * 4))


class PlayedRank:
    """One pod's process of an attempt (module docstring). ``audit``: the bench's own record of what rank
    0 did and when (outside the stage: instrumentation, as strace would be), one JSON line each."""

    def __init__(self, audit: Path, cmd: list[str], environ=os.environ) -> None:
        from solar.storage import fence, run_dir

        self.audit_path = audit
        self.sets = dict(cmd[i + 1].split("=", 1) for i, x in enumerate(cmd) if x == "--set" and i + 1 < len(cmd))
        self.out = Path(self.sets["runtime.output_dir"])
        self.world = int(self.sets["distributed.world_size"])
        self.accumulation = int(self.sets["train.gradient_accumulation"])
        self.global_batch = int(self.sets["train.global_batch_size"])
        self.max_steps = int(self.sets["train.max_steps"])
        self.save_every = int(self.sets["runtime.save_every"])
        path = self.sets.get("checkpoint.path")
        self.resume = int(Path(path).name.split("_")[1]) if path else 0
        self.rank, self.nnodes = int(environ["PET_NODE_RANK"]), int(environ["PET_NNODES"])
        self.nproc = int(environ.get("PET_NPROC_PER_NODE", "1"))
        self.step_seconds = float(environ["SOLAR_BENCH_STEP_SECONDS"])
        self.launch_seconds = float(environ["SOLAR_BENCH_LAUNCH_SECONDS"])
        self.token = fence.token_from(environ)
        self.fence = fence.Fence(self.out, self.token, run_dir.owner(environ)) if self.token is not None else None
        self.group = _Collective(self.rank, self.nnodes, int(environ["PET_MASTER_PORT"]))
        self.events = None
        self.term = False
        self.started = time.time()

    def note(self, what: str, **fields) -> None:
        """A line of the bench's audit (rank 0): after the thing it names."""
        if self.rank != 0:
            return
        line = json.dumps({"what": what, "attempt": self.token, "t": time.time(), **fields}) + "\n"
        fd = os.open(self.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def run(self) -> int:
        from solar.errors import SolarError
        from solar.storage import checkpoints as ckpt
        from solar.storage import fence, run_dir
        from solar.storage.atomic import write_replace

        self.group.rendezvous(timeout=300.0)   # SIGTERM meanwhile: the default (the agent exits, 143)
        signal.signal(signal.SIGTERM, self._on_term)
        verdict = 0
        if self.rank == 0:   # as solar.launch.session.Session.check: admit, the writer lock, record
            try:
                if self.fence is not None:
                    fence.admit(self.fence)
                lock = run_dir.hold(self.out, self.token, self.fence.owner if self.fence else None)
                if self.fence is not None:
                    t0 = time.time()
                    fence.record(self.fence)
                    self.note("fence", t0=t0, t1=time.time(), fenced_holder=lock.fenced)
            except fence.Stale:
                verdict = fence.STALE_EXIT
            except SolarError as exc:
                print(f"solar: {exc}", file=sys.stderr)
                verdict = 1
        try:
            verdict = self.group.any(verdict)
        except _PeerGone:
            return 1
        if verdict:
            return verdict if verdict in (1, fence.STALE_EXIT) else 1
        fence.arm(self.fence)   # every rank checks before its writes from now on
        if self.rank == 0:
            lock.record()
            newest, _ = ckpt.newest_valid(self.out)
            write_replace(self.out / "launch-manifest.json", json.dumps(
                {"schema": "solar.launch.v1", "name": self.out.parent.name, "attempt": self.token}).encode())
        self.events = run_dir.EventLog(self.out, self.rank * self.nproc)
        if self.rank == 0:
            self.events.write("launch", resume_step=self.resume, world_size=self.world, nodes=self.nnodes,
                              gradient_accumulation=self.accumulation, attempt=self.token)
            self.note("launch", resume=self.resume, world=self.world, accumulation=self.accumulation,
                      global_batch=self.global_batch, nodes=self.nnodes, nproc=self.nproc,
                      mode=self.sets.get("checkpoint.mode"), newest=newest["step"] if newest else 0)
        try:
            return self._train(ckpt)
        except _PeerGone as exc:
            return self._failed("error", f"RuntimeError: {exc} (a peer of the process group is gone)")
        except ckpt.CheckpointError as exc:
            return self._failed("checkpoint", str(exc))

    def _on_term(self, *_) -> None:
        self.term = True        # the step finishes, the ranks agree to stop, save there and exit

    def _train(self, ckpt) -> int:
        time.sleep(self.launch_seconds)                 # the checkpoint loaded, the first step compiled
        step = self.resume
        first = True
        while step < self.max_steps:
            time.sleep(self.step_seconds * self.accumulation)
            stop = self.group.any(int(self.term))       # the step's all-reduce, and the stop check with it
            step += 1
            self.events.write("step", step=step, gradient_accumulation=self.accumulation, world_size=self.world,
                              attempt=self.token)
            if first:
                first = False
                self.note("first_step", step=step)
            due = step % self.save_every == 0 or step == self.max_steps
            if due or stop:
                self._save(ckpt, step, on_stop=not due)
            if stop and step < self.max_steps:
                self.events.write("stopped", durable=True, step=step, attempt=self.token)
                self._result("stopped", step)
                return 0
        self.events.write("complete", durable=True, step=step, attempt=self.token)
        self._result("complete", step)
        return 0

    def _save(self, ckpt, step: int, on_stop: bool) -> None:
        problem, partial = "", None
        if self.rank == 0:
            try:
                partial = ckpt.begin(self.out, step)
                (partial / "model").mkdir()
                (partial / "model" / "live.safetensors").write_bytes(_safetensors(step))
                (partial / "data").mkdir()
                (partial / "data" / "position.json").write_text(json.dumps({
                    "schema": "solar.data-position.v1", "step": step, "global_batch_size": self.global_batch,
                    "saved_with": {"world_size": self.world, "nproc_per_node": self.nproc,
                                   "sequence_parallel_size": 1, "micro_batch_size": 1,
                                   "gradient_accumulation": self.accumulation}, "epochs": [0, 0]}))
            except ckpt.CheckpointError as exc:
                problem = str(exc)
        if self.group.any(int(bool(problem))):            # "checkpoint-written": every rank's part is written
            raise ckpt.CheckpointError(problem or "a rank's checkpoint write failed")
        if self.rank == 0:
            try:
                ckpt.commit(partial, step=step, contract={"family": "wan22_ti2v_5b"},
                            roles={"model": {"weights": ["live"], "members": ["model/live.safetensors"]}},
                            trainer_state={"step": step, "attempt": self.token})
                self.note("commit", step=step, on_stop=on_stop)
            except ckpt.CheckpointError as exc:
                problem = str(exc)
        if self.group.any(int(bool(problem))):            # "checkpoint-commit": every rank waits for it
            raise ckpt.CheckpointError(problem or "rank 0's commit failed")
        self.events.write("checkpoint", durable=True, step=step, on_stop=on_stop, attempt=self.token)

    def _result(self, status: str, step: int) -> None:
        from solar.storage.run_dir import usage, write_result

        if self.rank == 0:
            write_result(self.out, status, final={"step": step, "attempt": self.token},
                         usage=usage(self.out, world=self.world, device="cuda", started=self.started,
                                     ended=time.time(), status=status))
            self.note("end", how=status, step=step)

    def _failed(self, error_type: str, message: str) -> int:
        """What ``Session.close`` records of a failed launch (each write checked against the fence)."""
        from solar.storage.run_dir import usage, write_result

        self.events.write("error", durable=True, error_type=error_type, message=message, attempt=self.token)
        if self.rank == 0:
            write_result(self.out, "failed", error_type=error_type, message=message,
                         final={"attempt": self.token},
                         usage=usage(self.out, world=self.world, device="cuda", started=self.started,
                                     ended=time.time(), status="failed"))
            self.note("end", how="failed", error_type=error_type, message=message[:200])
        print(f"solar: training failed: {message}", file=sys.stderr)
        return 1


def played_rank(argv: list[str]) -> int:
    """``elastic_chaos.py --played-rank AUDIT -- <the container's command>``."""
    split = argv.index("--")
    return PlayedRank(Path(argv[0]), argv[split + 1:]).run()


if __name__ == "__main__" and sys.argv[1:2] == [RANK_FLAG]:
    sys.exit(played_rank(sys.argv[2:]))


# --- the bench (the played rank above needs none of this) ---------------------------------------------

import argparse  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

sys.path.insert(0, str(REPO))

from kmock import resource  # noqa: E402

from bench.operator.chaos_load import Operator, Scheduler, StallProbe, Watch, down_overlap, finish  # noqa: E402
from bench.operator.reconcile_load import distribution  # noqa: E402
from solar.run import elastic as elastic_shapes  # noqa: E402
from solar.run.machine import parse_iso  # noqa: E402
from solar.storage import checkpoints as ckpt  # noqa: E402
from solar_operator import capacity  # noqa: E402
from solar_operator.capacity import CACHE_SECONDS  # noqa: E402
from tests.integration.nodes import Nodes  # noqa: E402
from tests.integration.world import CRD, World, load_case  # noqa: E402
from tests.support.crd_schema import ANCHORS  # noqa: E402
from tests.support.kube import emulated_cluster  # noqa: E402

STAGE = "fm"
SIZES = {4: 2, 3: 1, 2: 1}                # planned nodes -> weight
ACCUMULATION = 3                          # planned gradientAccumulation (every size)
KINDS = ("not-ready", "not-ready-alone", "deleted", "silent", "dead-kubelet")
FROM_THE_NODE = ("not-ready-alone", "silent", "dead-kubelet")   # acted on after nodeLostSeconds
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
PODS, NODES = resource("", "v1", "pods"), resource("", "v1", "nodes")


def _say(text: str) -> None:
    print(f"elastic_chaos: {text}", file=sys.stderr, flush=True)


def _seconds(values: list[float]) -> dict | None:
    return distribution(values, unit="s", quantiles=(0.5, 0.9)) if values else None


def _regrown(shapes: list[int], shrinks: int, grows: int) -> int | None:
    """How many shrinks the status counts that were grown back before their attempt started (a shrink to a
    shape no attempt ran, then ``TopologyGrown`` to the next attempt's), when the status's counts fit the
    attempts' shapes that way; None when they do not fit. Between two attempts a larger one is a grow or a
    shrink and a grow, a smaller one a shrink or a shrink and a grow, the same one nothing or both."""
    up = sum(1 for x, y in zip(shapes, shapes[1:]) if y > x)
    down = sum(1 for x, y in zip(shapes, shapes[1:]) if y < x)
    same = len(shapes) - 1 - up - down
    for both in range(same + 1):
        extra_shrinks, extra_grows = shrinks - down - both, grows - up - both
        if 0 <= extra_shrinks <= up and 0 <= extra_grows <= down:
            return both + extra_shrinks + extra_grows
    return None


# --- what happened (every thread writes under Ledger.lock) ----------------------------------------

@dataclass
class Attempt:
    run: str
    attempt: int
    uid: str
    job: str
    nodes: int
    admitted: float                      # the training operator saw its job (monotonic)
    admitted_wall: float
    launched: float | None = None        # rank 0 recorded its token and wrote its launch files (monotonic)
    fence: tuple[float, float] | None = None   # rank 0's record of its token: (before, after), wall clock
    first_step: float | None = None      # monotonic
    resume: int = 0
    commits: list[int] = field(default_factory=list)
    launch: dict = field(default_factory=dict)    # what rank 0 read from its arguments, and the newest checkpoint
    end: str | None = None               # complete | stopped | failed | killed | stale | never-launched
    ended: float | None = None
    exits: dict[str, int] = field(default_factory=dict)    # pod -> its container's exit code
    deleted: float | None = None         # the job gone (the operator deleted it; monotonic)
    deleted_wall: float | None = None
    victim_of: str | None = None         # the kind of loss that hit one of its pods
    bound: int = 0                       # its pods bound to a node (the cluster's last tick)
    pending: int = 0                     # its pods Pending and unbound
    room_since: float | None = None      # pending, with room for a smaller allowed shape since
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
    audited: int = 0                     # bytes of its audit read
    grow_since: float | None = None      # the cluster has held a larger shape for it since (eligible)
    grow_longest: float = 0.0
    grow_waits: list[float] = field(default_factory=list)     # eligible room -> the grow decision
    grow_missed: list[str] = field(default_factory=list)


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runs: dict[str, RunRec] = {}
        self.by_uid: dict[str, Attempt] = {}
        self.kills: list[Kill] = []
        self.down: list[list[float]] = []           # the operator's [killed, answered again]
        self.errors: list[str] = []
        self.went_ahead = 0                         # launches that found an older attempt's process holding the lock

    def current(self, run: RunRec) -> Attempt | None:
        return run.attempts[max(run.attempts)] if run.attempts else None


# --- the operator's decisions, as the API server sees them ---------------------------------------------

class DecisionProbe:
    """A fault hook that injects nothing (``FaithfulEmulator.faults``: every client but the harness): it
    runs in the API server's loop as a request arrives, so what it reads of the server's objects is the
    cluster at that very moment. It keeps the state at the operator's latest listing of all pods, and at
    each DELETE of a job: the room a grow back was decided with."""

    def __init__(self, emulator, gpus: int) -> None:
        self.emulator, self.gpus = emulator, gpus
        self.lock = threading.Lock()
        self.listing: tuple[float, list, list] | None = None     # (monotonic, nodes, pods)
        self.deletes: dict[str, dict] = {}                        # job name -> what the cluster held then
        self.errors: list[str] = []

    def _state(self) -> tuple[list, list]:
        """The nodes and pods as ``capacity.free_nodes`` reads them (only those fields: a copy of every pod at
        every listing would slow the server the whole cluster talks to)."""
        key_nodes = self.emulator._key(NODES, None, "")[0]   # noqa: SLF001 (the emulator's own keys)
        key_pods = self.emulator._key(PODS, None, "")[0]     # noqa: SLF001
        nodes, pods = [], []
        for (res, _, _), obj in self.emulator.objects.items():
            if obj.deleted or res not in (key_nodes, key_pods):
                continue
            raw = obj.raw
            meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
            if res == key_nodes:
                nodes.append({"metadata": {"name": meta["name"]}, "spec": {"unschedulable": spec.get("unschedulable")},
                              "status": {"allocatable": dict(status.get("allocatable") or {}), "conditions": [
                                  dict(c) for c in status.get("conditions") or [] if c.get("type") == "Ready"]}})
            else:
                pods.append({"metadata": {"uid": meta.get("uid"), "deletionTimestamp": meta.get("deletionTimestamp"),
                                          "labels": {
                    JOB_NAME_LABEL: (meta.get("labels") or {}).get(JOB_NAME_LABEL)}},
                    "spec": {"nodeName": spec.get("nodeName"), "containers": [
                        {"resources": c.get("resources") or {}} for c in spec.get("containers") or []]},
                    "status": {"phase": status.get("phase")}})
        return nodes, pods

    @staticmethod
    def unbound(pods: list, job: str) -> int:
        """The job's pods not bound to a node (pending), not being deleted."""
        return sum(1 for p in pods if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == job
                   and not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))

    def room(self, nodes: list, pods: list, job: str) -> int:
        """Nodes that could hold one of the job's pods, its own pods moved (the operator's ``_room``)."""
        own = {p["metadata"]["uid"] for p in pods if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == job}
        return capacity.free_nodes(nodes, pods, gpus=self.gpus, own=own)

    def __call__(self, method: str, path: str):
        try:
            bare = path.split("?", 1)[0]
            if method == "GET" and bare == "/api/v1/pods" and "watch=" not in path:
                nodes, pods = self._state()
                with self.lock:
                    self.listing = (time.monotonic(), nodes, pods)
            elif method == "DELETE" and "/pytorchjobs/" in bare:
                name = bare.rsplit("/", 1)[1]
                now = time.monotonic()
                nodes, pods = self._state()
                with self.lock:
                    listing = self.listing
                    if name not in self.deletes:
                        self.deletes[name] = {
                            "at": now, "room": self.room(nodes, pods, name), "unbound": self.unbound(pods, name),
                            "listing_age": now - listing[0] if listing else None,
                            "listing_room": self.room(listing[1], listing[2], name) if listing else None,
                            "listing_unbound": self.unbound(listing[2], name) if listing else None}
        except Exception as exc:  # noqa: BLE001 (the probe must never fail a request)
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        return None


# --- the cluster ---------------------------------------------------------------------------------------

class PlayedNodes(Nodes):
    """tests.integration.nodes, faithful, with the played rank for every pod's container, the bench's
    ledger told of every job admitted and gone, every container's exit and the cluster at every tick, and
    node losses by kind."""

    def __init__(self, bench: "Bench") -> None:
        a = bench.args
        super().__init__(bench.world, [], faithful=True, tick=a.tick, heartbeat=a.heartbeat,
                         node_grace=a.node_grace, toleration_seconds=a.toleration_seconds,
                         termination_grace=a.termination_grace, podgc_delay=a.podgc_delay,
                         log_dir=bench.tmp / "pods")
        self.bench = bench
        self.tick_seconds: list[float] = []

    def _tick(self) -> None:
        started = time.monotonic()
        super()._tick()
        self.tick_seconds.append(time.monotonic() - started)

    def _record(self, doc: dict, world: int) -> dict:
        rec = super()._record(doc, world)
        if "attempt" not in rec:
            rec["attempt"] = self.bench.admitted(doc)
        return rec

    def _launch_container(self, pod: dict, cmd: list[str], environ: dict, log: Path) -> subprocess.Popen:
        run = (pod["metadata"].get("labels") or {}).get("solarwm.io/run", "unknown")
        environ = dict(environ, SOLAR_BENCH_STEP_SECONDS=str(self.bench.args.step_seconds),
                       SOLAR_BENCH_LAUNCH_SECONDS=str(self.bench.args.launch_seconds))
        with open(log, "ab") as out:
            return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), RANK_FLAG,
                                     str(self.bench.audit_path(run)), "--", *cmd], cwd=REPO, env=environ,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _finished(self, c) -> None:
        super()._finished(c)
        rec = self.jobs.get(c.job) if c.job else None
        if rec is not None and rec.get("attempt") is not None:
            self.bench.exited(rec["attempt"], c.pod, c.code)

    def _note_runs(self, jobs: list[dict]) -> None:
        super()._note_runs(jobs)
        self.bench.jobs_seen({j["metadata"]["uid"] for j in jobs})

    def _scheduler(self, nodes: dict[str, dict], pods: list[dict], now: float) -> None:
        try:
            self.bench.observe(nodes, pods, dict(self._queue), now)
        except Exception as exc:  # noqa: BLE001 (a harness bug: recorded, the tick goes on)
            self.errors.append(f"observe: {type(exc).__name__}: {exc}"[:300])
        super()._scheduler(nodes, pods, now)

    # -- node losses
    def _live_on(self, name: str) -> list[Attempt]:
        kubelet = self.kubelets.get(name)
        out = []
        for c in (kubelet.containers.values() if kubelet else []):
            rec = self.jobs.get(c.job) if c.job else None
            a = rec.get("attempt") if rec else None
            if a is not None and c.code is None and c.proc is not None and c.proc.poll() is None:
                out.append(a)
        return out

    def busy(self) -> dict[str, Attempt]:
        """Node (up) -> the running attempt whose pod it holds (one no loss has hit yet)."""
        with self._lock, self.bench.ledger.lock:
            return {name: a for name, k in self.kubelets.items() if k.state == "up" for a in self._live_on(name)
                    if a.launched is not None and a.end is None and a.deleted is None and a.victim_of is None}

    def fail(self, name: str, how: str) -> list[tuple[str, int, int]]:
        """Lose node ``name`` (``how`` in KINDS); the attempts it hit (run, attempt, nodes)."""
        with self._lock:
            with self.bench.ledger.lock:
                hit = [a for a in self._live_on(name) if a.deleted is None and a.end is None]
                for a in hit:
                    a.victim_of = a.victim_of or how
            self.lose_node(name, "not-ready" if how in ("not-ready", "not-ready-alone") else how)
            if how == "not-ready":        # a NoExecute taint no pod tolerates: the taint manager evicts at once
                node = self._get(f"/api/v1/nodes/{name}") or {}
                taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != CHAOS_TAINT]
                self.cluster.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints + [
                    {"key": CHAOS_TAINT, "effect": "NoExecute", "timeAdded": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                             time.gmtime())}]}})
        return sorted({(a.run, a.attempt, a.nodes) for a in hit})

    def restore(self, name: str, how: str) -> None:
        with self._lock:
            if how == "not-ready":
                node = self._get(f"/api/v1/nodes/{name}") or {}
                taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != CHAOS_TAINT]
                self._quiet(lambda: self.cluster.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints}}))
            self.return_node(name)


# --- the bench ---------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.gpus_per_node = args.gpus_per_node
        self.poll = args.poll_seconds
        self.tmp = workdir
        self.storage = workdir / "runs"
        self.storage.mkdir(parents=True)
        (workdir / "audit").mkdir()
        self.ledger = Ledger()
        self.stop = threading.Event()
        self.offset = time.time() - time.monotonic()     # wall = monotonic + offset (the played ranks' times)
        self.world: World | None = None
        self.nodes: PlayedNodes | None = None
        self.op: Operator | None = None
        self.sched: Scheduler | None = None
        self.probe: DecisionProbe | None = None
        self.events: list[dict] = []
        self.started = time.monotonic()
        self.returned: dict[str, float] = {}      # node -> when it came back
        self.spurious: dict[str, float] = {}      # node -> last seen not Ready while the bench had not lost it
        self.spurious_losses: list[str] = []
        sizes, weights = zip(*SIZES.items())
        for i in range(args.runs):
            planned = self.rng.choices(sizes, weights)[0]
            shapes = tuple(s.nodes for s in elastic_shapes.shapes(
                nodes=planned, gpus_per_node=self.gpus_per_node, sp=1, micro=1,
                global_batch=planned * self.gpus_per_node * ACCUMULATION, lowest=1))
            self.ledger.runs[f"run-{i:04d}"] = RunRec(f"run-{i:04d}", planned, shapes)
        self.plan = list(self.ledger.runs.values())
        # the bounds checked
        self.shrink_bound = args.shrink_after + 3 * self.poll + 1.0
        self.grow_bound = 2 * self.poll + CACHE_SECONDS + 1.0
        base = args.shrink_after + args.launch_seconds + 3 * self.poll + 3.0
        node = args.node_lost_seconds + args.heartbeat + 1.0
        self.continue_bound = {"not-ready": base, "deleted": base, "not-ready-alone": base + node,
                               "dead-kubelet": base + node, "silent": base + node + args.termination_grace}

    def audit_path(self, run: str) -> Path:
        return self.tmp / "audit" / f"{run}.jsonl"

    # -- the SolarRuns
    def _doc(self, run: RunRec) -> dict:
        doc = load_case("three-stage")
        doc["metadata"]["name"] = run.name
        doc["spec"]["topology"] = {"nodes": run.planned, "gpusPerNode": self.gpus_per_node,
                                   "gradientAccumulation": ACCUMULATION, "elastic": {
                                       "minNodes": 1, "shrinkAfterSeconds": self.args.shrink_after,
                                       "minSecondsBetweenChanges": self.args.min_between,
                                       "nodeLostSeconds": self.args.node_lost_seconds}}
        doc["spec"]["resources"] = {"limits": {"nvidia.com/gpu": self.gpus_per_node}}
        doc["spec"]["storage"].update(mountPath=str(self.storage), path=run.name)   # the pods share this machine's disk
        doc["spec"]["volumes"] = []
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

    # -- told by the cluster (its thread, the cluster's lock held)
    def admitted(self, doc: dict) -> Attempt | None:
        labels = doc["metadata"].get("labels") or {}
        run = self.ledger.runs.get(labels.get("solarwm.io/run", ""))
        if run is None:
            return None
        number = int(labels.get("solarwm.io/attempt", "0"))
        nodes = sum(int(r.get("replicas", 1)) for r in (doc["spec"].get("pytorchReplicaSpecs") or {}).values())
        with self.ledger.lock:
            a = Attempt(run.name, number, doc["metadata"]["uid"], doc["metadata"]["name"], nodes, time.monotonic(),
                        time.time())
            run.attempts[number] = a
            self.ledger.by_uid[a.uid] = a
        return a

    def exited(self, a: Attempt, pod: str, code: int) -> None:
        with self.ledger.lock:
            a.exits[pod] = code
            if pod.endswith("-master-0") and a.end is None:
                a.end, a.ended = ("stale" if code == 3 else "killed" if code else None), time.monotonic()

    def jobs_seen(self, live: set[str]) -> None:
        now, wall = time.monotonic(), time.time()
        with self.ledger.lock:
            for uid, a in self.ledger.by_uid.items():
                if a.deleted is None and uid not in live:
                    a.deleted, a.deleted_wall = now, wall
                    if a.launched is None and a.end is None:
                        a.end, a.ended = "never-launched", now
                    run = self.ledger.runs[a.run]
                    if a.launched is not None and a.victim_of is None and run.grow_since is not None:
                        run.grow_waits.append(now - run.grow_since)     # a running attempt stopped: a grow back
                        run.grow_since, run.grow_longest = None, 0.0

    def _tail(self) -> None:
        """The played ranks' audit lines, into the ledger (every 0.1 s)."""
        while not self.stop.wait(0.1):
            with self.ledger.lock:
                runs = [r for r in self.plan if r.attempts and not (r.gone and r.audited < 0)]
            for run in runs:
                self._read_audit(run)

    def _read_audit(self, run: RunRec) -> None:
        path = self.audit_path(run.name)
        try:
            with open(path, "rb") as fh:
                fh.seek(run.audited)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        if not end:
            return
        with self.ledger.lock:
            run.audited += end
            for line in data[:end].splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    self.ledger.errors.append(f"{run.name}: unreadable audit line {line[:80]!r}")
                    continue
                a = run.attempts.get(e.get("attempt"))
                if a is None:
                    self.ledger.errors.append(f"{run.name}: audit of an unknown attempt {e}")
                    continue
                t = e["t"] - self.offset
                if e["what"] == "fence":
                    a.fence = (e["t0"], e["t1"])
                    self.ledger.went_ahead += bool(e.get("fenced_holder"))
                elif e["what"] == "launch":
                    a.launched, a.resume, a.launch = t, e["resume"], e
                    if a.end == "never-launched":
                        a.end = None
                elif e["what"] == "first_step":
                    a.first_step = t
                elif e["what"] == "commit":
                    a.commits.append(e["step"])
                elif e["what"] == "end":
                    a.end, a.ended = e["how"], t

    # -- room, at every tick of the cluster: a free node for a stage waiting to continue; room for a
    # smaller shape for a pending attempt; a larger shape for a shrunk one
    def observe(self, nodes: dict[str, dict], pods: list[dict], queue: dict[str, float], now: float) -> None:
        """The cluster as the tick's scheduler finds it, and as it leaves it: each pending pod (whole-node
        pods, in the scheduler's order) takes a free node while there is one."""
        free = capacity.free_nodes(list(nodes.values()), pods, gpus=self.gpus_per_node, own=set())
        pending = sorted((p for p in pods if not p["spec"].get("nodeName") and not p["metadata"].get(
            "deletionTimestamp") and (p.get("status") or {}).get("phase", "Pending") == "Pending"),
            key=lambda p: (queue.get(p["metadata"]["uid"], now), p["metadata"]["name"]))
        binds = {p["metadata"]["uid"] for p in pending[:free]}
        free -= len(binds)
        bound, waiting = Counter(), Counter()
        for p in pods:
            owner = next((r["uid"] for r in p["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
            if owner is None or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if p["spec"].get("nodeName") or p["metadata"]["uid"] in binds:
                bound[owner] += 1
            elif not p["metadata"].get("deletionTimestamp"):
                waiting[owner] += 1
        mono = time.monotonic()
        settle = self.args.heartbeat + self.args.tick + 1.0     # a returned node's first beat and its listing
        for name, node in nodes.items():   # a node the bench did not lose, not Ready: the harness fell behind
            kubelet = self.nodes.kubelets.get(name)
            ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                          if c.get("type") == "Ready"), None)
            if kubelet is not None and kubelet.state == "up" and ready not in (None, "True") \
                    and mono - self.returned.get(name, -1e9) > settle:
                if mono - self.spurious.get(name, -1e9) > 2 * self.args.node_grace:
                    self.spurious_losses.append(f"{name} {ready} at +{mono - self.started:.1f}s")
                self.spurious[name] = mono
        with self.ledger.lock:
            for uid, a in self.ledger.by_uid.items():
                if a.deleted is None:
                    a.bound, a.pending = bound.get(uid, 0), waiting.get(uid, 0)
            if self.ledger.down and self.ledger.down[-1][1] is None:   # the operator is down: no stretch counts
                for item in [*self.ledger.kills, *(a for r in self.plan for a in r.attempts.values())]:
                    item.room_since = None
                for run in self.plan:
                    run.grow_since = None
                return
            for kill in self.ledger.kills:
                if not kill.victims or self._continued(kill, kill.victims[0]) is not None:
                    kill.room_since = None
                    continue
                if free >= 1:
                    kill.room_since = kill.room_since or mono
                    kill.room_longest = max(kill.room_longest, mono - kill.room_since)
                else:
                    kill.room_since = None
            for run in self.plan:
                a = self.ledger.current(run)
                if a is not None and a.pending and a.deleted is None and a.nodes > run.shapes[-1] \
                        and free + a.bound >= run.shapes[-1]:
                    a.room_since = a.room_since or mono
                    a.room_longest = max(a.room_longest, mono - a.room_since)
                elif a is not None:
                    a.room_since = None
                if run.finished is not None or a is None or a.launched is None or a.end is not None \
                        or a.deleted is not None or a.nodes >= run.planned or a.victim_of is not None:
                    run.grow_since = None
                    continue
                larger = min(n for n in run.shapes if n > a.nodes)
                el = ((run.status.get("stages") or [{}])[0].get("elastic") or {})
                changed = parse_iso(el.get("changedAt")) or 0.0    # the operator's own clock (seconds)
                if time.time() >= changed + self.args.min_between and free + a.nodes >= larger:
                    if run.grow_since is None:
                        run.grow_since, run.grow_longest = mono, 0.0
                    waited = mono - run.grow_since
                    if waited > self.grow_bound and run.grow_longest <= self.grow_bound:
                        run.grow_missed.append(f"{run.name} attempt {a.attempt} on {a.nodes} node(s): room for "
                                               f"{larger} for {waited:.1f}s without a grow")
                    run.grow_longest = waited
                else:
                    run.grow_since = None

    # -- the node faults
    def _kinds(self, rng: random.Random) -> list[str]:
        """The kinds in turn, each block of len(KINDS) shuffled: each kind within one of every other."""
        out: list[str] = []
        while len(out) < self.args.node_kills:
            block = list(KINDS)
            rng.shuffle(block)
            out += block
        return out[:self.args.node_kills]

    def _faults(self, started: float) -> None:
        args, rng = self.args, random.Random(self.args.seed + 3)
        first_window = min(args.active, args.runs)
        while not self.stop.is_set():   # the first loss once half the first window has a checkpoint
            with self.ledger.lock:
                ready = sum(1 for r in self.plan if any(a.commits for a in r.attempts.values()))
            if ready >= first_window // 2 or time.monotonic() - started > 60:
                break
            time.sleep(0.2)
        op_marks = set(rng.sample(range(1, args.node_kills + 1), min(args.operator_kills, args.node_kills)))
        kinds = self._kinds(rng)
        done, next_at = 0, time.monotonic()
        while done < args.node_kills and not self.stop.is_set():
            time.sleep(0.1)
            with self.ledger.lock:
                down = {k.node for k in self.ledger.kills if k.back is None}
                if all(r.finished is not None for r in self.plan):
                    return
            if time.monotonic() < next_at or len(down) >= args.max_down:
                continue
            busy = self.nodes.busy()   # (the cluster's lock, then the ledger's: never the other way round)
            with self.ledger.lock:   # an attempt with a checkpoint and time left to be hit in (not its last seconds)
                candidates = sorted(n for n, a in busy.items() if n not in down and (
                    a.resume > 0 or a.commits) and self._left(a) >= args.min_left)
            if not candidates:
                continue
            node, how = rng.choice(candidates), kinds[done]
            at, wall = time.monotonic(), time.time()
            victims = self.nodes.fail(node, how)
            kill = Kill(node, how, at, wall, victims)
            with self.ledger.lock:
                self.ledger.kills.append(kill)
            done += 1
            _say(f"node loss {done}/{args.node_kills}: {node} ({how}) at {at - started:.1f}s, "
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

    def _left(self, a: Attempt) -> float:
        """About how many seconds of training the attempt has left (from its newest checkpoint)."""
        run = self.ledger.runs[a.run]
        accumulation = run.planned * ACCUMULATION // a.nodes
        return (self.args.steps - max([a.resume, *a.commits])) * self.args.step_seconds * accumulation

    def _restore(self, kill: Kill) -> None:
        self.nodes.restore(kill.node, kill.how)
        with self.ledger.lock:
            kill.back = time.monotonic()
            self.returned[kill.node] = kill.back

    def _continued(self, kill: Kill, victim: tuple[str, int, int]) -> Attempt | None:
        run = self.ledger.runs[victim[0]]
        later = [a for n, a in sorted(run.attempts.items()) if n > victim[1] and a.first_step is not None]
        return later[0] if later else None

    # -- the users and the operator
    def _drive(self, started: float) -> None:
        deadline = started + self.args.timeout
        created, last = 0, -1e9
        while time.monotonic() < deadline:
            with self.ledger.lock:
                done = sum(1 for r in self.plan[:created] if r.finished is not None)
                if self.ledger.down and self.ledger.down[-1][1] is None and self.op.ready():
                    self.ledger.down[-1][1] = self.op.starts[-1]["first_200"]
            if created < len(self.plan) and created - done < self.args.active and \
                    time.monotonic() >= last + self.args.create_every:
                run = self.plan[created]
                run.created = last = time.monotonic()
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
                  "step_seconds_per_accumulation": args.step_seconds, "launch_seconds": args.launch_seconds,
                  "shrink_after_seconds": args.shrink_after, "min_seconds_between_changes": args.min_between,
                  "node_lost_seconds": args.node_lost_seconds,
                  "cluster": {"variant": "faithful", "tick": args.tick, "heartbeat": args.heartbeat,
                              "node_grace": args.node_grace, "toleration_seconds": args.toleration_seconds,
                              "termination_grace": args.termination_grace, "podgc_delay": args.podgc_delay},
                  "down_seconds": list(args.down), "max_down": args.max_down, "kill_every_seconds": args.kill_every,
                  "fresh_listing_seconds": args.fresh_listing_seconds, "machine": f"{os.cpu_count()} cores",
                  "planned_nodes": dict(sorted(Counter(r.planned for r in self.plan).items())),
                  "bounds": {"continue_seconds": self.continue_bound, "grow_seconds": self.grow_bound,
                             "shrink_seconds": self.shrink_bound}}
        started = time.monotonic()
        stalls = StallProbe(self.stop, True)
        stalls.start()
        with emulated_cluster([CRD, ANCHORS / "kubeflow.org_pytorchjobs.yaml"], self.tmp) as cluster:
            self.world = World(cluster, self.storage)
            self.probe = DecisionProbe(cluster.emulator, self.gpus_per_node)
            cluster.emulator.faults.append(self.probe)
            self.sched = Scheduler(self.stop)
            self.nodes = PlayedNodes(self)
            watch = Watch(cluster.url, self.world.runs_path, self.on_run, self.stop)
            watch.start()
            watch.ready.wait(10)
            log = open(self.tmp / "operator.log", "w")  # noqa: SIM115
            env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "SOLAR_OPERATOR_POLL_SECONDS": str(self.poll),
                   "SOLAR_OPERATOR_READ_NODES": "1"}
            self.op = Operator(self.storage, self.world.namespace, env, log, self.poll)
            threads = [threading.Thread(target=self._faults, args=(started,), daemon=True),
                       threading.Thread(target=self._tail, daemon=True)]
            try:
                with self.nodes:
                    for i in range(args.nodes):
                        self.nodes.add(f"node-{i:03d}", self.gpus_per_node)
                    self.op.start()
                    threading.Thread(target=self.op.probe, args=(self.stop,), daemon=True).start()
                    for t in threads:
                        t.start()
                    self._drive(started)
                    result["seconds"] = round(time.monotonic() - started, 1)
                    time.sleep(1.0)           # the last exits and audit lines
                    for run in self.plan:
                        self._read_audit(run)
                    self.stop.set()
                    for t in threads:
                        t.join(10)
                    events = self.events = self.world.events()
                    reasons = Counter(e["reason"] for e in events)
            finally:
                self.stop.set()
                self.op.stop()
                log.close()
            result["operator_log"] = str(self.tmp / "operator.log")
            result["harness_errors"] = (self.sched.errors + self.nodes.errors + self.probe.errors
                                        + self.ledger.errors)[:20]
            result["harness_stalls"] = stalls.report()
            result["cluster_tick_seconds"] = _seconds(self.nodes.tick_seconds)
            result["harness_node_losses"] = self.spurious_losses[:20]   # not Ready without the bench: it fell behind
        result["event_reasons"] = {k: reasons.get(k, 0) for k in (
            "TopologyShrunk", "TopologyGrown", "StageDisrupted", "StageStarted", "StageStopped", "JobFailed",
            "JobAdopted")}
        result.update(self.report(events))
        return result

    # -- the report
    def _checkpoints(self, run: RunRec) -> dict[int, tuple[int | None, float]]:
        """The stage's checkpoints: step -> (the attempt that committed it, when it was renamed into place:
        the directory's ctime, which the rename sets)."""
        out = {}
        root = self.storage / run.name / STAGE / "checkpoints"
        for entry in root.iterdir() if root.is_dir() else []:
            match = ckpt.STEP_DIR.match(entry.name)
            if not match:
                continue
            try:
                committer = json.loads((entry / "manifest.json").read_text())["trainer_state"].get("attempt")
            except (OSError, ValueError, KeyError):
                committer = None
            out[int(match.group(1))] = (committer, entry.stat().st_ctime)
        return out

    def _late(self, run: RunRec, committed: tuple[int | None, float], launch: Attempt) -> bool:
        """A checkpoint committed by an earlier attempt on a lost node (nobody waits for its pods) after the
        operator had created ``launch``'s job (so it could not resume it): docs/elastic.md's stated gap."""
        committer = run.attempts.get(committed[0]) if committed[0] is not None else None
        return committer is not None and committer.attempt < launch.attempt and committer.victim_of is not None \
            and committed[1] >= launch.admitted_wall - self.args.late_slack

    def _history(self, run: RunRec, cps: dict[int, tuple[int | None, float]]) -> dict:
        """Rank 0's step events and the stage's checkpoints: the launches, the committed history, what was
        redone, the resumes behind a late commit, the problems."""
        path = self.storage / run.name / STAGE / "events" / "rank-00000.jsonl"
        launches: list[dict] = []
        try:
            lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            return {"problems": [f"{run.name}: step events unreadable: {exc}"], "launches": [], "checkpoints": [],
                    "lost": self.args.steps, "repeated": 0, "redone": {}, "late": 0}
        checkpoints = []   # (wall time, step)
        problems = []
        for e in lines:
            if e["event"] == "launch":
                launches.append({"attempt": e["attempt"], "resume": e["resume_step"], "steps": [], "stopped": False,
                                 "nodes": e["nodes"]})
            elif not launches or e.get("attempt") != launches[-1]["attempt"]:
                continue          # a replaced attempt's line after its successor's launch: counted as stale
            elif e["event"] == "step":
                launches[-1]["steps"].append(e["step"])
            elif e["event"] == "checkpoint":
                checkpoints.append((e["time"], e["step"]))
            elif e["event"] == "stopped":
                launches[-1]["stopped"] = True
        final = self.args.steps
        late = 0
        for launch in launches:     # each launch's resume against the checkpoints committed before its token
            steps, resume = launch["steps"], launch["resume"]
            a = run.attempts.get(launch["attempt"])
            before = a.fence[0] if a is not None and a.fence else None
            launch["behind"] = False
            if resume and (resume not in cps or (before is not None and cps[resume][1] > before)):
                problems.append(f"{run.name} attempt {launch['attempt']}: resumed step {resume}, not a checkpoint "
                                "committed before it")
            newer = {s: c for s, c in cps.items() if s > resume and before is not None and c[1] < before}
            if newer and a is not None and all(self._late(run, c, a) for c in newer.values()):
                late += 1
                launch["behind"] = True
            elif newer:
                problems.append(f"{run.name} attempt {launch['attempt']}: resumed step {resume}, but " + ", ".join(
                    f"step {s} (attempt {c[0]}, {a.admitted_wall - c[1] if a else 0.0:.2f}s before its job was seen)"
                    for s, c in sorted(newer.items())) + " was committed before it")
            if steps != list(range(resume + 1, resume + 1 + len(steps))):
                problems.append(f"{run.name} attempt {launch['attempt']}: steps not consecutive from {resume + 1}")
        history = []
        redone = {"killed": 0, "stopped": 0, "behind_a_late_commit": 0}
        for i, launch in enumerate(launches):
            upto = launches[i + 1]["resume"] if i + 1 < len(launches) else final
            history += [s for s in launch["steps"] if s <= upto]
            if i + 1 < len(launches):
                key = "behind_a_late_commit" if launches[i + 1]["behind"] else \
                    "stopped" if launch["stopped"] else "killed"
                redone[key] += sum(1 for s in launch["steps"] if s > upto)
        lost = sorted(set(range(1, final + 1)) - set(history))
        repeated = len(history) - len(set(history))
        if lost:
            problems.append(f"{run.name}: steps lost {lost[:5]}{'...' if len(lost) > 5 else ''}")
        if repeated:
            problems.append(f"{run.name}: {repeated} steps repeated in the committed history")
        return {"launches": launches, "checkpoints": checkpoints, "lost": len(lost), "repeated": repeated,
                "redone": redone, "problems": problems, "late": late,
                "steps_run": sum(len(x["steps"]) for x in launches)}

    def _stale(self, run: RunRec, cps: dict[int, tuple[int | None, float]]) -> dict:
        """What a replaced attempt committed or wrote after a newer attempt recorded its token: definite
        (later than the record's end) or ambiguous (during it)."""
        fences = {n: a.fence for n, a in run.attempts.items() if a.fence}
        inf = float("inf")

        def newer(attempt: int) -> tuple[float, float]:
            later = [f for n, f in fences.items() if n > attempt]
            return (min(f[0] for f in later), min(f[1] for f in later)) if later else (inf, inf)

        commits, writes, ambiguous = [], [], 0
        stage = self.storage / run.name / STAGE
        for path in sorted((stage / "events").glob("*.jsonl")):
            seen = 0
            for line in path.read_text().splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                a = e.get("attempt")
                if not isinstance(a, int):
                    continue
                t0, t1 = newer(a)
                if a < seen or e["time"] > t1:
                    writes.append(f"{run.name} {path.name}: attempt {a}'s {e['event']} {e.get('step', '')} "
                                  f"{e['time'] - t1:+.3f}s after attempt {min(n for n in fences if n > a)} recorded "
                                  f"its token" if t1 < inf else f"{run.name} {path.name}: attempt {a}'s {e['event']} "
                                  f"after attempt {seen}'s lines")
                elif e["time"] > t0:
                    ambiguous += 1
                seen = max(seen, a)
        for step, (a, ctime) in sorted(cps.items()):
            if a is None:
                continue
            t0, t1 = newer(a)
            if ctime > t1:
                commits.append(f"{run.name}: checkpoint step {step} of attempt {a} renamed into place "
                               f"{ctime - t1:.3f}s after a newer attempt recorded its token")
            elif ctime > t0:
                ambiguous += 1
        for name, attempt_of in (("run-result.json", lambda d: (d.get("final") or {}).get("attempt")),
                                 ("launch-manifest.json", lambda d: d.get("attempt"))):
            path = stage / name
            try:
                a, mtime = attempt_of(json.loads(path.read_text())), path.stat().st_mtime
            except (OSError, ValueError):
                continue
            if not isinstance(a, int):
                continue
            t0, t1 = newer(a)
            if mtime > t1:
                commits.append(f"{run.name}: {name} of attempt {a} written {mtime - t1:.3f}s after a newer attempt "
                               "recorded its token")
            elif mtime > t0:
                ambiguous += 1
        return {"commits": commits, "writes": writes, "ambiguous": ambiguous}

    def _measured_disruption(self, run: RunRec, kills: list[Kill], shrinks: list[Attempt]) -> list[float]:
        """The time the stage's disruptions cost, as the status means it: from each loss that hit one of its
        attempts (or each unschedulable shrink's decision) to the first step of the next attempt that
        trained, overlapping windows merged (wall clock)."""
        windows = []
        for k in kills:
            for victim in k.victims:
                nxt = self._continued(k, victim) if victim[0] == run.name else None
                if nxt is not None:
                    windows.append((k.wall, nxt.first_step + self.offset))
        for a in shrinks:
            nxt = next((b for n, b in sorted(run.attempts.items()) if n > a.attempt and b.first_step is not None), None)
            if nxt is not None and a.deleted_wall is not None:
                windows.append((a.deleted_wall, nxt.first_step + self.offset))
        merged: list[list[float]] = []
        for begin, end in sorted(windows):
            if merged and begin <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([begin, end])
        return [end - begin for begin, end in merged]

    @staticmethod
    def _decisions(events: list[dict]) -> dict[tuple[str, int], str]:
        """(run, attempt) -> "grow" (a running attempt stopped to grow back) or "unschedulable" (an attempt
        shrunk because its pods stayed unschedulable), from the operator's own events."""
        out = {}
        for e in events:
            run, message = e["involvedObject"]["name"], e.get("message") or ""
            grown = re.search(r"attempt (\d+) stops after its step", message)
            stuck = re.search(r"attempt (\d+)'s pods stayed unschedulable", message)
            if e["reason"] == "TopologyGrown" and grown:
                out[(run, int(grown.group(1)))] = "grow"
            elif e["reason"] == "TopologyShrunk" and stuck:
                out[(run, int(stuck.group(1)))] = "unschedulable"
        return out

    def report(self, events: list[dict]) -> dict:
        led, args = self.ledger, self.args
        reasons = Counter(e["reason"] for e in events)
        out: dict = {}
        failures = Counter()
        details: dict[str, list[str]] = {}

        def fail(kind: str, text: str) -> None:
            failures[kind] += 1
            details.setdefault(kind, []).append(text)

        found, noted = Counter(), {}

        def find(kind: str, text: str) -> None:   # the operator's behaviour worth a look, not (yet) a failure
            found[kind] += 1
            noted.setdefault(kind, []).append(text)

        # 1. the runs' outcomes and their status against the jobs
        histories, stale, regrown = {}, {}, 0
        for run in self.plan:
            st = run.status
            stage = (st.get("stages") or [{}])[0]
            if run.finished is None:
                fail("runs_stuck", f"{run.name}: {st.get('phase')} {stage.get('reason')} {stage.get('message')}")
            elif st.get("phase") != "Succeeded":
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
            el = stage.get("elastic") or {}
            pairs = _regrown(shapes, el.get("shrinks", 0), el.get("grows", 0))
            if pairs is None:
                fail("shape_changes_mismatch", f"{run.name}: status shrinks {el.get('shrinks', 0)} grows "
                                               f"{el.get('grows', 0)}, attempts {shapes}")
            regrown += pairs or 0
            cps = self._checkpoints(run)
            histories[run.name] = self._history(run, cps)
            for problem in histories[run.name]["problems"]:
                fail("step_history", problem)
            stale[run.name] = self._stale(run, cps)
            for text in stale[run.name]["commits"]:
                fail("stale_commits", text)
            for text in stale[run.name]["writes"]:
                fail("stale_writes", text)
            for a in run.attempts.values():      # what the played rank 0 read from its arguments
                if not a.launch:
                    continue
                x, batch = a.launch, run.planned * self.gpus_per_node * ACCUMULATION
                if x["world"] != a.nodes * x["nproc"] or x["nproc"] != self.gpus_per_node:
                    fail("trainer_refused", f"{run.name} attempt {a.attempt}: world_size {x['world']} on {a.nodes} "
                                            f"pods of {x['nproc']}")
                if x["world"] * x["accumulation"] != x["global_batch"] or x["global_batch"] != batch:
                    fail("trainer_refused", f"{run.name} attempt {a.attempt}: world {x['world']} x accumulation "
                                            f"{x['accumulation']} is not the global batch {batch}")
                if a.nodes not in run.shapes:
                    fail("trainer_refused", f"{run.name} attempt {a.attempt}: {a.nodes} nodes is not an allowed "
                                            f"shape {run.shapes}")
                if x["resume"] and x["mode"] != "full_resume":
                    fail("trainer_refused", f"{run.name} attempt {a.attempt}: a resume without "
                                            "checkpoint.mode=full_resume")
        if reasons.get("JobFailed") or reasons.get("BackoffLimitExceeded"):
            fail("failures_counted", f"events: JobFailed {reasons.get('JobFailed')}, "
                                     f"BackoffLimitExceeded {reasons.get('BackoffLimitExceeded')}")

        # 2. every attempt a lost node hit continues
        kills = [k for k in led.kills if k.victims]
        by_kind: dict[str, list[float]] = {}
        decided_by_kind: dict[str, list[float]] = {}
        cont, late_waits, smaller, same, via_unschedulable, at_smallest = [], [], 0, 0, 0, 0
        slowest, raced, finished_first, larger = [], [], 0, 0
        for k in kills:
            bound = self.continue_bound[k.how]
            for victim in k.victims:
                run = led.runs[victim[0]]
                nxt = self._continued(k, victim)
                killed_attempt = run.attempts[victim[1]]
                if victim[2] == run.shapes[-1]:
                    at_smallest += 1
                if nxt is None and killed_attempt.end == "complete":
                    finished_first += 1      # its pods ran on (a NotReady node, a dead kubelet): it trained its last step
                    continue
                if nxt is None:
                    fail("never_continued", f"{victim[0]} attempt {victim[1]} lost on {k.node} ({k.how}): no later "
                                            "attempt trained a step")
                    continue
                took = nxt.first_step - k.at - down_overlap(led.down, k.at, nxt.first_step)
                by_kind.setdefault(k.how, []).append(took)
                between = [a for n, a in run.attempts.items() if victim[1] < n < nxt.attempt]
                if killed_attempt.deleted is not None and killed_attempt.deleted > k.at:
                    decided_by_kind.setdefault(k.how, []).append(killed_attempt.deleted - k.at)
                steps = [f"lose {k.node} ({k.how})"] + [
                    f"attempt {a.attempt} on {a.nodes}: admitted +{a.admitted - k.at:.1f}s"
                    + (f", job deleted +{a.deleted - k.at:.1f}s" if a.deleted else "")
                    + (f", launched +{a.launched - k.at:.1f}s" if a.launched else "")
                    for a in [killed_attempt, *between, nxt]]
                slowest.append((took, f"{victim[0]} attempt {victim[1]}: {took:.1f}s: " + "; ".join(steps)))
                via_unschedulable += bool(between)
                smaller += nxt.nodes < victim[2]
                same += nxt.nodes == victim[2]
                if nxt.nodes > run.planned:
                    fail("continued_larger", f"{victim[0]} attempt {victim[1]} on {victim[2]} -> {nxt.nodes}")
                larger += nxt.nodes > victim[2]    # the lost node back, or others, before the start: TopologyGrown
                pended = max(a.room_longest for a in [*between, nxt])   # a replacement pending with room
                if took <= bound:
                    cont.append(took)
                elif pended > self.shrink_bound:
                    fail("continued_late_with_room", f"{victim[0]} attempt {victim[1]} ({k.node}, {k.how}): "
                                                     f"{took:.1f}s, a replacement pending {pended:.1f}s with room")
                elif k.room_longest > bound:
                    raced.append(took)      # each replacement shrank in time; the room it was sized for went first
                else:
                    late_waits.append(took)
        exits = {}
        for r in self.plan:
            for a in r.attempts.values():
                for code in a.exits.values():
                    if code == 3:
                        key = a.victim_of or "no loss (a replaced attempt)"
                        exits[key] = exits.get(key, 0) + 1
        out["node_kills"] = {"done": len(led.kills), "hit_an_attempt": len(kills),
                             "by_kind": dict(Counter(k.how for k in led.kills)),
                             "hit_by_kind": dict(Counter(k.how for k in kills)),
                             "victims_at_smallest_shape": at_smallest,
                             "victims_that_finished_before_they_were_replaced": finished_first}
        out["continued"] = {
            "by_kind": {kind: _seconds(by_kind.get(kind, [])) for kind in KINDS},
            "bound_seconds_by_kind": self.continue_bound,
            "within_bound": _seconds(cont), "smaller_shape": smaller, "same_shape": same, "larger_shape": larger,
            "after_an_unschedulable_attempt": via_unschedulable,
            "waited_for_capacity": _seconds(late_waits), "room_taken_first": _seconds(raced),
            "all": _seconds(cont + late_waits + raced),
            "loss_to_decision_by_kind": {kind: _seconds(decided_by_kind.get(kind, [])) for kind in KINDS},
            "slowest": [text for _, text in sorted(slowest, reverse=True)[:5]]}

        # 3. grow back: the room each was decided with, at the operator's DELETE
        decided = self._decisions(events)    # (run, attempt) -> what the operator's event says it did to it
        grows = [(r, r.attempts[n], r.attempts[n + 1]) for r in self.plan for n in sorted(r.attempts)
                 if decided.get((r.name, n)) == "grow" and n + 1 in r.attempts]
        grow_keys = {(r.name, a.attempt) for r, a, _ in grows}
        short_raw, decided_short, ages, collisions_raw, collisions_later = 0, set(), [], 0, 0
        window = args.fresh_listing_seconds
        for r, a, nxt in grows:
            seen = self.probe.deletes.get(a.job)
            if seen is None:
                fail("decided_without_room_then", f"{r.name} attempt {a.attempt}: its job's delete was not seen")
                continue
            if seen["listing_age"] is not None:
                ages.append(seen["listing_age"])
            if seen["room"] < nxt.nodes:
                short_raw += 1
                fresh = seen["listing_age"] is not None and seen["listing_age"] <= window and \
                    seen["listing_room"] >= nxt.nodes
                if not fresh:
                    decided_short.add((r.name, a.attempt))
                    fail("decided_without_room_then", f"{r.name} attempt {a.attempt} on {a.nodes} -> {nxt.nodes}: "
                                                      f"room {seen['room']} at the delete, the operator's last "
                                                      f"listing {seen['listing_age'] or 0.0:.2f}s before it held "
                                                      f"{seen['listing_room']}")
            after = r.attempts.get(nxt.attempt + 1)
            if decided.get((r.name, nxt.attempt)) == "unschedulable" and after is not None:   # the grown one shrank
                collisions_raw += 1
                if (r.name, a.attempt) in decided_short:
                    fail("collisions", f"{r.name} attempt {nxt.attempt} on {nxt.nodes}: grown without room, "
                                       f"shrank again to {after.nodes}")
                else:
                    collisions_later += 1
                    find("collisions_after_a_grow_decided_with_room", f"{r.name} attempt {nxt.attempt} on {nxt.nodes}: "
                                                                      f"room {seen['room']} at the grow's delete")
        stopped = [a for _, a, _ in grows if a.end == "stopped"]
        grow_cost = [nxt.first_step - a.deleted for r, a, nxt in grows if nxt.first_step is not None and a.deleted]
        grow_waits = [w for r in self.plan for w in r.grow_waits]
        for r in self.plan:
            for miss in r.grow_missed:
                fail("grow_missed", miss)
        victims = {v[0] for k in kills for v in k.victims}
        back_to_plan = sum(1 for name in victims if led.runs[name].attempts and
                           led.current(led.runs[name]).nodes == led.runs[name].planned and
                           any(a.nodes < led.runs[name].planned for a in led.runs[name].attempts.values()))
        out["grow_back"] = {
            "grows": len(grows), "shrinks_grown_back_before_the_attempt_started": regrown, "grows_status": sum(
                (r.status.get("stages") or [{}])[0].get("elastic", {}).get("grows", 0) for r in self.plan),
            "attempts_stopped_for_them": len(stopped),
            "room_to_decision": _seconds(grow_waits),
            "decided_before_a_sample_saw_room": len(grows) - len(grow_waits),
            "stop_to_first_step_grown": _seconds(grow_cost), "bound_seconds": self.grow_bound,
            "runs_hit_then_finished_at_planned_shape": back_to_plan, "runs_hit": len(victims),
            "operator_listing_age_at_decision": _seconds(ages),
            "no_room_at_the_delete": short_raw,
            "no_room_at_the_delete_but_the_fresh_listing_had_it": short_raw - len(decided_short),
            "decided_without_room_then": len(decided_short),
            "collisions_all": collisions_raw, "collisions_after_a_grow_decided_with_room": collisions_later}

        # 4. shrinks while unschedulable (pending or partly placed attempts replaced by smaller ones), by what
        # the pending attempt was: a run's first, a grow back's, the continuation of a lost one
        pending, late, causes, unschedulable, placed_shrinks = [], [], Counter(), {}, 0
        for r in self.plan:
            for n, a in sorted(r.attempts.items()):
                nxt, before = r.attempts.get(n + 1), r.attempts.get(n - 1)
                if decided.get((r.name, n)) != "unschedulable" or nxt is None or not a.deleted:
                    continue
                seen = self.probe.deletes.get(a.job)
                if seen is not None and seen["unbound"] == 0 and not (
                        seen["listing_age"] is not None and seen["listing_age"] <= window and seen["listing_unbound"]):
                    placed_shrinks += 1     # every pod bound at the delete, and in the operator's last listing too
                    find("shrunk_with_every_pod_placed", f"{r.name} attempt {n} on {a.nodes} -> {nxt.nodes}: every pod "
                                                         f"bound at the operator's delete "
                                                         f"({'its ranks launched' if a.launched else 'not launched'}); "
                                                         f"its last listing {seen['listing_age'] or 0.0:.2f}s before it held "
                                                         f"{seen['listing_unbound']} unbound")
                cause = "first" if before is None else "grow" if (r.name, before.attempt) in grow_keys else \
                    "after_loss" if before.victim_of else "after_shrink"
                causes[cause] += 1
                unschedulable.setdefault(r.name, []).append(a)
                wait = a.deleted - a.admitted - down_overlap(led.down, a.admitted, a.deleted)
                if wait <= self.shrink_bound:
                    pending.append(wait)
                elif a.room_longest > self.shrink_bound:
                    fail("shrink_late_with_room", f"{r.name} attempt {n} on {a.nodes}: replaced after {wait:.1f}s, "
                                                  f"room for a smaller shape for {a.room_longest:.1f}s of it")
                else:
                    late.append(wait)
        out["unschedulable_shrinks"] = {"count": sum(causes.values()), "by_pending_attempt": dict(causes),
                                        "with_every_pod_placed_at_the_decision": placed_shrinks,
                                        "admitted_to_replaced": _seconds(pending), "bound_seconds": self.shrink_bound,
                                        "waited_for_capacity": _seconds(late)}

        # 5. the steps, and what replaced attempts wrote
        redone = Counter()
        for h in histories.values():
            redone.update(h["redone"])
        if redone["stopped"]:
            fail("redone_after_graceful_stop", f"{redone['stopped']} steps")
        killed_launches = sum(1 for r in self.plan for a in r.attempts.values() if a.end in ("killed", "stale", "failed")
                              and a.launched is not None)
        out["steps"] = {
            "committed": sum(self.args.steps - h["lost"] for h in histories.values()),
            "run": sum(h.get("steps_run", 0) for h in histories.values()),
            "lost": sum(h.get("lost", 0) for h in histories.values()),
            "repeated_in_history": sum(h.get("repeated", 0) for h in histories.values()),
            "redone_after_lost_launches": redone["killed"], "launches_lost": killed_launches,
            "redone_per_lost_launch": round(redone["killed"] / killed_launches, 1) if killed_launches else None,
            "redone_after_graceful_stops": redone["stopped"],
            "resumed_behind_a_late_commit": sum(h.get("late", 0) for h in histories.values()),
            "redone_behind_a_late_commit": redone["behind_a_late_commit"],
            "launches": sum(len(h["launches"]) for h in histories.values()),
            "launches_resuming_the_last_step": sum(1 for h in histories.values() for x in h["launches"]
                                                   if x["resume"] == self.args.steps)}
        out["fence"] = {
            "stale_commits": sum(len(s["commits"]) for s in stale.values()),
            "stale_writes": sum(len(s["writes"]) for s in stale.values()),
            "during_a_newer_record": sum(s["ambiguous"] for s in stale.values()),
            "stale_exits_by_kind": exits,
            "launches_that_went_ahead_of_a_fenced_lock_holder": led.went_ahead}

        # 6. disruption seconds: the status against the measured (a loss whose attempt saved on SIGTERM, the
        # operator's StageStopped, apart: the status counts no disruption for it)
        stopped_by_signal = {(e["involvedObject"]["name"], int(m.group(1))) for e in events
                             if e["reason"] == "StageStopped" and (m := re.search(r"attempt (\d+) was stopped",
                                                                                  e.get("message") or ""))}
        diffs, status_total, measured_total = [], 0.0, 0.0
        for r in self.plan:
            mine = [k for k in kills if any(v[0] == r.name for v in k.victims)]
            windows = self._measured_disruption(r, mine, unschedulable.get(r.name, []))
            counted = self._measured_disruption(r, [k for k in mine if not any(
                (v[0], v[1]) in stopped_by_signal for v in k.victims)], unschedulable.get(r.name, []))
            measured = sum(windows)
            status = ((r.status.get("stages") or [{}])[0].get("elastic") or {}).get("disruptionSeconds", 0.0)
            status_total += status
            measured_total += measured
            if (measured > 0) != (status > 0) and not (status == 0 and not counted):
                fail("disruption_unaccounted", f"{r.name}: status {status}s, measured {measured:.1f}s "
                                               f"({len(windows)} windows)")
            elif (measured > 0) != (status > 0):
                find("stopped_by_signal_without_disruption_seconds",
                     f"{r.name}: a loss's attempt saved on SIGTERM (StageStopped): {measured:.1f}s from the loss to "
                     "the next attempt's first step, status 0")
            if measured > 0 or status > 0:
                diffs.append(status - measured)
        out["disruption_seconds"] = {"status_total": round(status_total, 1), "measured_total": round(measured_total, 1),
                                     "runs": len(diffs),
                                     "status_minus_measured": _seconds(diffs),
                                     "status_minus_measured_abs": _seconds([abs(d) for d in diffs])}
        out["operator_kills"] = len(led.down)
        for text in self.spurious_losses:    # the emulation fell behind: the operator saw a loss nobody made
            fail("harness_node_losses", text)
        out["failures"] = {k: failures.get(k, 0) for k in (
            "runs_not_succeeded", "runs_stuck", "failures_counted", "attempts_mismatch", "shape_changes_mismatch",
            "step_history", "trainer_refused", "never_continued", "continued_larger", "continued_late_with_room",
            "shrink_late_with_room", "grow_missed", "decided_without_room_then", "collisions",
            "redone_after_graceful_stop", "stale_commits", "stale_writes", "disruption_unaccounted",
            "harness_node_losses")}
        for r in self.plan:
            for launch in histories[r.name]["launches"]:
                if launch["resume"] == args.steps:
                    find("launches_resuming_the_last_step", f"{r.name} attempt {launch['attempt']} on {launch['nodes']}: "
                                                            f"resumed step {args.steps} of {args.steps}")
        out["details"] = {k: v[:10] for k, v in details.items()}
        out["findings"] = {k: found.get(k, 0) for k in (
            "shrunk_with_every_pod_placed", "stopped_by_signal_without_disruption_seconds",
            "launches_resuming_the_last_step", "collisions_after_a_grow_decided_with_room")}
        out["finding_details"] = {k: v[:10] for k, v in noted.items()}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=120)
    parser.add_argument("--node-kills", type=int, default=110, help="node losses, the kinds in turn")
    parser.add_argument("--operator-kills", type=int, default=0,
                        help="SIGKILLs of the operator, each after a random node loss")
    parser.add_argument("--nodes", type=int, default=32,
                        help="nodes in the cluster (the runs' planned shapes need about 3.25 x --active)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node = per pod (one pod per node)")
    parser.add_argument("--active", type=int, default=10, help="unfinished runs at most at a time")
    parser.add_argument("--steps", type=int, default=600, help="train.max_steps")
    parser.add_argument("--save-every", type=int, default=25, help="runtime.save_every")
    parser.add_argument("--step-seconds", type=float, default=0.02,
                        help="seconds per step per accumulation micro-batch")
    parser.add_argument("--launch-seconds", type=float, default=1.0, help="ranks' start to their first step's start")
    parser.add_argument("--shrink-after", type=int, default=5, help="elastic.shrinkAfterSeconds")
    parser.add_argument("--min-between", type=int, default=5, help="elastic.minSecondsBetweenChanges")
    parser.add_argument("--node-lost-seconds", type=int, default=10, help="elastic.nodeLostSeconds [60]")
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="SOLAR_OPERATOR_POLL_SECONDS")
    parser.add_argument("--tick", type=float, default=0.25, help="the emulated controllers' loop")
    parser.add_argument("--heartbeat", type=float, default=2.0, help="the kubelets' status and Lease period [10]")
    parser.add_argument("--node-grace", type=float, default=8.0, help="node-monitor-grace-period [40-50]")
    parser.add_argument("--toleration-seconds", type=float, default=120.0,
                        help="the default tolerationSeconds admission adds [300]: longer than a node stays away")
    parser.add_argument("--termination-grace", type=float, default=3.0, help="the kubelets' termination grace [30]")
    parser.add_argument("--podgc-delay", type=float, default=4.0, help="PodGC's quarantine of a deleted node's pods [40]")
    parser.add_argument("--kill-every", type=float, default=4.0, help="seconds between node losses (x0.5-1.5)")
    parser.add_argument("--down", type=float, nargs=2, default=(20.0, 32.0), metavar=("MIN", "MAX"),
                        help="seconds a lost node stays away")
    parser.add_argument("--min-left", type=float, default=16.0,
                        help="lose only nodes of attempts with about this many seconds of training left")
    parser.add_argument("--max-down", type=int, default=5, help="nodes away at most at a time")
    parser.add_argument("--fresh-listing-seconds", type=float, default=0.5,
                        help="a grow whose larger shape did not fit at its DELETE still counts as decided with room "
                             "when the operator's own listing this recent held it")
    parser.add_argument("--late-slack", type=float, default=1.0,
                        help="a commit this long before the next attempt's job was seen counts as after its creation")
    parser.add_argument("--create-every", type=float, default=0.5,
                        help="seconds between two runs created (the first window's pods do not all start in one tick)")
    parser.add_argument("--linger", type=float, default=2.0, help="seconds a finished run stays before its deletion")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--dump", type=Path, help="also write every attempt and loss here (JSON)")
    args = parser.parse_args()
    bench = Bench(args, Path(tempfile.mkdtemp(prefix="solar-elastic-chaos-")))
    result = bench.run()
    if args.dump:
        from dataclasses import asdict

        args.dump.write_text(json.dumps({"kills": [asdict(k) for k in bench.ledger.kills], "attempts": [
            asdict(a) for r in bench.plan for a in r.attempts.values()], "decisions": bench.probe.deletes,
            "offset": bench.offset, "events": [{k: e.get(k) for k in ("reason", "message", "involvedObject")}
                                               for e in bench.events]}, default=str) + "\n")
    finish(result, args.out)


if __name__ == "__main__":
    main()
