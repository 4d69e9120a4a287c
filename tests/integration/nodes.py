"""Nodes for the emulated cluster, and the parts of Kubernetes nobody else plays here: the scheduler,
the training operators (Kubeflow's PyTorchJob controller, Trainer v2's TrainJob), the kubelets and, in
the faithful variant, the node lifecycle controller, the taint manager and the pod garbage collector.

Two variants, chosen by ``Nodes(world, logs, faithful=...)``:

**Fast** (``faithful=False``, the default; what the elastic e2e test and the chaos bench use): a gang
scheduler (all of a job's pods bound to Ready nodes with free ``nvidia.com/gpu``, or the unbound ones
left Pending with ``PodScheduled=False/Unschedulable``), the training operators (a PyTorchJob's pods per
replica, a TrainJob's ``numNodes`` pods once its queue admits it; the job's Running/Succeeded/Failed
conditions, from the exit of its ranks), and the kubelets as one ``torchrun --standalone`` of the job's
whole world on this machine over gloo. ``kill_node`` is a node failure as an instant: the node turns
NotReady (or is deleted), its pods fail at once (with ``DisruptionTarget`` unless ``how="silent"``) and
the job's torchrun gets SIGKILL. A deleted job's torchrun gets SIGTERM (what the kubelet sends a pod's
main process) and its pods stay until it has exited. Pods go with a force deletion.

**Faithful** (``faithful=True``): each piece follows Kubernetes' documented behaviour, every duration
a constructor parameter scaled down for tests (``/work/shared/spec/kubernetes.md``, "Node loss as a real
cluster shows it"):

- *kubelet* (one per node): posts the node's ``Ready`` condition (``lastHeartbeatTime``) and renews its
  Lease in ``kube-node-lease`` every ``heartbeat`` s; starts the container of every pod bound to its node
  (each pod ITS OWN process session: ``torchrun`` of the container's args, as ``python -m
  torch.distributed.run``, with the ``PET_*`` rendezvous variables the training operator injected, so
  ``--nnodes`` = pods over a static rendezvous at 127.0.0.1); reports ``Running``, then
  ``Succeeded``/``Failed`` with ``containerStatuses`` (exit code, the termination message from the
  file ``SOLAR_TERMINATION_LOG`` names); for a pod with a ``deletionTimestamp`` sends SIGTERM to the
  container's main process, SIGKILL to all of its processes after the grace period, reports the final
  phase and confirms the deletion (DELETE with ``gracePeriodSeconds=0``) once they exited
  (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination).
- *node lifecycle controller*: a node whose kubelet has posted nothing (no new ``lastHeartbeatTime``,
  no Lease renewal, as observed on its own clock) for ``node_grace`` s (node-monitor-grace-period, 40-50
  s real) gets ``Ready=Unknown`` (reason ``NodeStatusUnknown``, ``lastHeartbeatTime`` left as the kubelet
  wrote it); ``node.kubernetes.io/unreachable`` taints (``NoSchedule`` and ``NoExecute``, with
  ``timeAdded``) when Ready is Unknown, ``node.kubernetes.io/not-ready`` when the kubelet itself reports
  ``Ready=False``; the pods on a node that stops being Ready get ``Ready=False``
  (https://kubernetes.io/docs/concepts/architecture/nodes/#node-controller,
  https://kubernetes.io/docs/reference/labels-annotations-taints/).
- *admission* (DefaultTolerationSeconds): every pod created without them gets the ``not-ready`` and
  ``unreachable`` ``NoExecute`` tolerations with ``tolerationSeconds`` = ``toleration_seconds`` (300 real).
- *taint manager*: a pod on a node with a ``NoExecute`` taint it does not tolerate is evicted at once,
  one it tolerates for ``tolerationSeconds`` after that long: ``DisruptionTarget=True`` (reason
  ``DeletionByTaintManager``) and a graceful DELETE; on an unreachable node nobody confirms it, so it
  stays Terminating with its phase unchanged (https://kubernetes.io/docs/concepts/scheduling-eviction/
  taint-and-toleration/#taint-based-evictions, .../pod-lifecycle/#pod-disruption-conditions).
- *PodGC*: the pods of a deleted Node get ``DisruptionTarget=True`` (reason ``DeletionByPodGC``), phase
  Failed, and are force-deleted (a tick later: the training operator sees the failed pod first).
- *scheduler* (kube-scheduler's default): binds pending pods ONE AT A TIME, in the order it first saw
  them, to the node with the most free GPUs among the Ready, schedulable nodes whose ``NoSchedule``/
  ``NoExecute`` taints the pod tolerates, whose labels match its ``nodeSelector`` and whose
  allocatable ``nvidia.com/gpu`` less what the unfinished pods on it (Terminating ones included) request
  holds the pod's; a pod that fits nowhere gets ``PodScheduled=False``, reason ``Unschedulable``, with a
  message like the real one. ``gang=True`` binds a job's pods all or none (a gang scheduler).
- *PyTorchJob controller* (kubeflow.org/v1, training-operator v1.9): once not suspended, one pod per
  replica (``<job>-master-0``, ``<job>-worker-<i>``: a name still held by another job's Terminating pod
  is retried, as the real one does on AlreadyExists) with the template's labels and env plus
  ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK`` and ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
  ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` (127.0.0.1), ``PET_MASTER_PORT`` (a free port per job); a
  missing pod is created again while the job runs; conditions ``Created``; ``Running`` while the master
  runs (a worker may be Pending); ``Failed`` when a pod failed or is Terminating while Running (counted
  failed: "orphan pods that never reach the Failed phase"), unless the job is being deleted;
  ``Succeeded`` when the master succeeded; ``Suspended`` (pods deleted) while ``runPolicy.suspend``; a
  finished job's pods deleted as ``runPolicy.cleanPodPolicy`` says (Running, the default: its running
  and pending pods). ``replicaStatuses`` counts active, succeeded, failed.
- *TrainJob* (trainer.kubeflow.org/v1alpha1, Trainer v2.3.0 over JobSet and an Indexed Job):
  ``numNodes`` pods ``<trainjob>-node-0-<index>-<random>`` of the runtime's ``node`` job (the
  ClusterTrainingRuntime's template, the TrainJob's ``runtimePatches``, its ``trainer`` image, command,
  args, env and ``resourcesPerNode``) with the torch plugin's ``PET_*``; ``status.jobsStatus`` for the
  child Job ``node`` (active: the child Job has a pod pending or running and not marked for deletion;
  ready; succeeded; failed: a pod failed or was deleted before succeeding, backoffLimit 0; suspended);
  conditions ``Complete``, ``Failed`` (the child Job's other active pods then deleted), ``Suspended``.
- *garbage collector*: the pods of a deleted job are deleted gracefully (background propagation).

Node losses (``lose_node(name, how)``; ``return_node(name)`` brings it back):

- ``not-ready``: the kubelet reports ``Ready=False`` (reason ``KubeletNotReady``) and goes on: its
  containers keep running, it still reports and confirms deletions, so the taint manager's eviction
  stops the pod (SIGTERM, SIGKILL after the grace) and it goes.
- ``silent`` (power or network loss): the kubelet posts nothing and every process of the node's pods
  gets SIGSTOP: its ranks neither answer nor reset connections, so the survivors on other nodes block
  in their collective, as over a real network. Evicted pods stay Terminating.
- ``dead-kubelet``: the kubelet posts and confirms nothing; its processes keep running (and writing).
- ``deleted``: the Node object is deleted (PodGC as above) and its processes SIGKILLed: the machine
  is gone.

``return_node``: SIGCONT, the kubelet posts ``Ready=True`` again (the controller removes the taints),
stops the containers of pods deleted meanwhile (SIGTERM, SIGKILL after the grace) and confirms their
deletion, and stops those whose pods are no longer in the API (force-deleted); a deleted node registers
again. ``kill_node``/``ready`` keep their fast meaning, and in the faithful variant map to
``lose_node``/``return_node``, so a test written for the fast variant runs on the faithful one with
``Nodes(world, logs, faithful=True, ...)``.

Use (faithful)::

    with Nodes(world, logs, faithful=True, node_grace=2, toleration_seconds=3) as nodes, world.operator(...):
        nodes.add("n1", gpus=1); nodes.add("n2", gpus=1)
        ...; nodes.lose_node("n2", "silent"); ...; nodes.return_node("n2")

``jobs`` (job uid -> its record: ``name``, ``kind``, ``pods`` created, ``nodes`` its containers ran on,
``world``, ``port``, ``conflicts``: pod creations refused AlreadyExists), ``ran`` ((job, world, exit
code) once a finished or deleted job's containers all exited), ``logs`` ((pod, exit code, the tail of
its output) per container; the whole output under ``log_dir``) and ``errors`` (the harness's own). Each
kubelet sends two requests per ``heartbeat`` (a Lease renewal, and a status update when its second
changed): with many nodes, raise ``heartbeat`` (and ``node_grace`` with it).

Not modelled: restart policies other than Never (a failed pod is not restarted), init and sidecar
containers (the first container runs), volumes (pods share this machine's file system), affinity,
preemption, priorities, ``activeDeadlineSeconds``, TTLs, Services and DNS, the Job controller's
tracking finalizer, PodGC's quarantine of orphan pods (40 s real: ``podgc_delay``) and its
``out-of-service`` taint handling.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO
from tests.e2e.helpers import env
from tests.integration.world import World
from tests.support.kube import KubeHTTPError

GPU = "nvidia.com/gpu"
NOT_READY, UNREACHABLE = "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"
LOSSES = ("not-ready", "silent", "dead-kubelet", "deleted")
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
FINISHED = ("Succeeded", "Failed")
TERMINATION_MESSAGE_LIMIT = 4096   # bytes the kubelet keeps of a container's termination message


def _now(later: float = 0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + later))


def _micro_now() -> str:
    """A MicroTime (a Lease's renewTime): RFC 3339 with microseconds."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conditions(doc: dict) -> list[dict]:
    return (doc.get("status") or {}).get("conditions") or []


def _condition(doc: dict, kind: str) -> dict | None:
    return next((c for c in _conditions(doc) if c.get("type") == kind), None)


def set_condition(status: dict, kind: str, value: str, reason: str | None = None, message: str | None = None) -> None:
    """Set a condition in ``status`` (a pod's or a node's), in place: lastTransitionTime only when the
    status changes."""
    conditions = status.setdefault("conditions", [])
    old = next((c for c in conditions if c.get("type") == kind), None)
    new = {"type": kind, "status": value,
           "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == value
           and old.get("lastTransitionTime") else _now()}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    if old is None:
        conditions.append(new)
    else:
        old.clear()
        old.update(new)


def tolerates(toleration: dict, taint: dict) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint`` (an empty key with ``Exists`` tolerates every taint)."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and toleration.get("value", "") == taint.get("value", "")


def _exit_code(returncode: int) -> int:
    """A container's exit code: 128 + N for a process ended by signal N (137 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


# --- processes ----------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if rest[0] == "Z":
        return None
    return int(rest[1]), int(rest[19])


def _processes() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every live process: (parent pid -> children, pid -> start time)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                parents.setdefault(found[0], []).append(int(entry))
                starts[int(entry)] = found[1]
    return parents, starts


def _tree(root: int, table: tuple[dict[int, list[int]], dict[int, int]] | None = None) -> dict[int, int]:
    """The live processes under ``root`` (itself included): pid -> start time."""
    parents, starts = table or _processes()
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in out:
            out[pid] = starts[pid]
            todo += parents.get(pid, [])
    return out


@dataclass
class Container:
    """A pod's main container: its process session (torchrun's ranks start sessions of their own, so
    the container's processes are tracked as the tree under its main process, as a cgroup holds them)."""

    pod: str
    uid: str
    node: str
    job: str | None            # the owning job's uid (PyTorchJob or TrainJob)
    name: str
    image: str
    proc: subprocess.Popen | None
    log: Path
    termination_log: Path
    fallback_to_logs: bool
    grace: float               # the pod's terminationGracePeriodSeconds (for a pod gone from the API)
    started: str = field(default_factory=_now)
    pids: dict[int, int] = field(default_factory=dict)
    code: int | None = None    # its exit code once it exited
    finished: str | None = None
    term_at: float | None = None
    kill_at: float | None = None
    reported: bool = False     # its exit reported in the pod's status
    stopped: bool = False      # SIGSTOPped (a silent node)
    logged: bool = False       # its exit noted in Nodes.logs

    def refresh(self, table=None) -> dict[int, int]:
        if self.proc is not None and self.proc.poll() is None:
            self.pids.update(_tree(self.proc.pid, table))
        return self.pids

    def signal(self, sig: int, *, main_only: bool = False) -> None:
        """``sig`` to the main process, or to every process of the container (refreshed first; a
        stopped tree is scanned again after the signal, for a child started meanwhile)."""
        if self.proc is None:
            return
        if main_only:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, sig)
            return
        for _ in range(2 if sig == signal.SIGSTOP else 1):
            for pid, start in list(self.refresh().items()):
                found = _stat(pid)
                if found is None or found[1] != start:
                    self.pids.pop(pid, None)
                    continue
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    self.pids.pop(pid, None)

    def poll(self) -> int | None:
        if self.code is None and self.proc is not None and self.proc.poll() is not None:
            self.code = _exit_code(self.proc.returncode)
            self.finished = _now()
            self.signal(signal.SIGKILL)   # the main process gone, the rest of its container goes too
        return self.code

    def message(self) -> str:
        """The termination message: the file, or (``FallbackToLogsOnError``, failed and no file) the
        log's last lines, as the kubelet reads them."""
        try:
            text = self.termination_log.read_bytes()[:TERMINATION_MESSAGE_LIMIT].decode("utf-8", "replace")
        except OSError:
            text = ""
        if not text and self.fallback_to_logs and self.code:
            text = "\n".join(self.tail().splitlines()[-80:])[-2048:]
        return text

    def tail(self, limit: int = 4000) -> str:
        try:
            return self.log.read_bytes()[-limit:].decode("utf-8", "replace")
        except OSError:
            return ""


@dataclass
class Kubelet:
    name: str
    gpus: int
    labels: dict
    state: str = "up"          # up | not-ready | silent | dead-kubelet | deleted
    last_beat: float = -1e9
    containers: dict[str, Container] = field(default_factory=dict)   # pod uid -> container

    @property
    def alive(self) -> bool:
        return self.state in ("up", "not-ready")


class Nodes:
    def __init__(self, world: World, logs, *, faithful: bool = False, gang: bool | None = None,
                 tick: float = 0.1, heartbeat: float = 0.25, node_grace: float = 1.5,
                 toleration_seconds: float = 2, termination_grace: float | None = None,
                 podgc_delay: float = 0.0, log_dir: Path | None = None) -> None:
        """``faithful``: the faithful variant (module docstring), else the fast one. Its times, in
        seconds (real values in brackets): ``tick`` the controllers' loop; ``heartbeat`` the kubelets'
        status and Lease period [10]; ``node_grace`` node-monitor-grace-period [40-50]; the default
        ``toleration_seconds`` admission adds [300]; ``termination_grace`` the grace the kubelets give a
        deleted pod's container instead of its ``deletionGracePeriodSeconds`` (None: that one) [30];
        ``podgc_delay`` before PodGC handles a deleted node's pods [40]. ``gang``: bind a job's pods all
        or none (default: in the fast variant only). ``log_dir``: the containers' logs and termination
        messages (a temporary directory by default)."""
        self.world, self.logs = world, logs
        self.cluster, self.ns = world.cluster, world.namespace
        self.pods_path = f"/api/v1/namespaces/{self.ns}/pods"
        self.jobs: dict[str, dict] = {}      # job uid -> {"name", "pods": [names], "proc", "started", "world", ...}
        self.ran: list[tuple[str, int, int]] = []   # (job, world, exit code)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.RLock()   # the bench takes it around kill_node too
        self._thread = threading.Thread(target=self._loop, name="nodes", daemon=True)
        self._free_now: dict[str, int] | None = None
        self.faithful = faithful
        self.gang = (not faithful) if gang is None else gang
        self.tick, self.heartbeat, self.node_grace = tick, heartbeat, node_grace
        self.toleration_seconds, self.termination_grace, self.podgc_delay = \
            toleration_seconds, termination_grace, podgc_delay
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="nodes-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.kubelets: dict[str, Kubelet] = {}
        self._probe: dict[str, tuple[tuple, float, str | None]] = {}   # node -> (heartbeat seen, when, Ready status)
        self._tainted: dict[tuple[str, str], float] = {}   # (node, NoExecute taint) -> when the taint manager saw it
        self._orphans: dict[str, float] = {}               # pod uid -> when PodGC first saw its node gone
        self._podgc_marked: set[str] = set()
        self._queue: dict[str, float] = {}                 # pending pod uid -> when the scheduler first saw it
        self._child_jobs: dict[str, str] = {}              # a TrainJob's child Job uid -> the TrainJob's uid
        self._scanned = -1e9
        self._webhook = None

    # -- nodes ------------------------------------------------------------------------------------
    def add(self, name: str, gpus: int = 1, labels: dict | None = None) -> None:
        """A node of ``gpus`` GPUs (its kubelet registers it and, faithful, heartbeats from now on)."""
        if not self.faithful:
            self.cluster.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
            self.ready(name, True, gpus)
            return
        with self._lock:
            kubelet = self.kubelets.get(name) or Kubelet(name, gpus, dict(labels or {}))
            kubelet.gpus, kubelet.state = gpus, "up"
            self.kubelets[name] = kubelet
            self._register(kubelet)
            self._beat(kubelet, None)

    def ready(self, name: str, ready: bool, gpus: int = 1) -> None:
        """Fast: set the node's Ready condition. Faithful: ``return_node`` (True) or ``lose_node(name,
        "not-ready")`` (False)."""
        if self.faithful:
            return self.return_node(name) if ready else self.lose_node(name, "not-ready")
        self.cluster.patch(f"/api/v1/nodes/{name}/status", {"status": {
            "allocatable": {GPU: str(gpus), "cpu": "8"}, "capacity": {GPU: str(gpus), "cpu": "8"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                            "lastTransitionTime": _now()}]}})

    def kill_node(self, name: str, *, how: str = "not-ready", gpus: int = 1) -> list[str]:
        """Fast: the node fails: its pods fail and the job's ranks are gone (SIGKILL). ``how``:
        ``not-ready`` (the node turns NotReady, the taint manager marks its pods ``DisruptionTarget``),
        ``deleted`` (the node object is removed, the pod garbage collector marks them) or ``silent``
        (NotReady, its pods fail with no condition: only the node says why). Faithful: ``lose_node``.
        Returns the names of the jobs it hit."""
        if self.faithful:
            return self.lose_node(name, how)
        hit = []
        with self._lock:
            if how == "deleted":
                self.cluster.delete(f"/api/v1/nodes/{name}")
            else:
                self.ready(name, False, gpus)
            reason, manager = ("DeletionByPodGC", "PodGC: node no longer exists") if how == "deleted" else \
                ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
            for job in self.jobs.values():
                on = [p for p in job["pods"] if self._pod(p) and self._pod(p)["spec"].get("nodeName") == name]
                if not on:
                    continue
                hit.append(job["name"])
                for pod in on:
                    self._pod_status(pod, "Failed", conditions=[] if how == "silent" else [{
                        "type": "DisruptionTarget", "status": "True", "reason": reason,
                        "message": f"{manager} (node {name} unreachable)", "lastTransitionTime": _now()}])
                if job.get("proc") is not None and job["proc"].poll() is None:
                    self._signal(job, signal.SIGKILL)
        return hit

    def lose_node(self, name: str, how: str) -> list[str]:
        """Faithful: lose node ``name`` (``how`` in ``LOSSES``, module docstring). Returns the names of
        the jobs whose pods run there."""
        if how not in LOSSES:
            raise ValueError(f"how must be one of {LOSSES}, not {how!r}")
        with self._lock:
            kubelet = self.kubelets[name]
            hit = sorted({self.jobs[c.job]["name"] for c in kubelet.containers.values()
                          if c.job in self.jobs and c.code is None})
            was, kubelet.state = kubelet.state, how
            for c in kubelet.containers.values():
                if how == "silent":
                    c.signal(signal.SIGSTOP)
                    c.stopped = True
                elif how == "deleted":
                    c.signal(signal.SIGKILL)
                    c.signal(signal.SIGCONT)
                    c.stopped = False
                elif c.stopped:
                    c.signal(signal.SIGCONT)
                    c.stopped = False
            if how == "deleted" and was != "deleted":
                self._quiet(lambda: self.cluster.delete(f"/api/v1/nodes/{name}"))
                self._quiet(lambda: self.cluster.delete(f"{LEASES}/{name}"))
            elif how == "not-ready":
                self._beat(kubelet, None)
        return hit

    def return_node(self, name: str) -> None:
        """Faithful: the node is back (module docstring)."""
        with self._lock:
            kubelet = self.kubelets[name]
            if kubelet.state == "deleted":
                kubelet.containers = {uid: c for uid, c in kubelet.containers.items() if c.poll() is None}
                self._register(kubelet)
            for c in kubelet.containers.values():
                if c.stopped:
                    c.signal(signal.SIGCONT)
                    c.stopped = False
            kubelet.state = "up"
            self._beat(kubelet, None)

    def _signal(self, job: dict, sig: int, *, group: bool = True) -> None:
        """Fast: a signal to the job's ranks: the process group (a node failure) or torchrun alone (the
        kubelet's SIGTERM, which torchrun passes on)."""
        (os.killpg if group else os.kill)(job["proc"].pid, sig)

    # -- the loop ---------------------------------------------------------------------------------
    def __enter__(self):
        if self.faithful:
            self._webhook = self._default_tolerations
            self.cluster.emulator.webhooks.append(self._webhook)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._webhook is not None and self._webhook in self.cluster.emulator.webhooks:
            self.cluster.emulator.webhooks.remove(self._webhook)
        for job in self.jobs.values():
            proc = job.get("proc")
            if proc is not None and proc.poll() is None:
                self._signal(job, signal.SIGKILL)
        for kubelet in self.kubelets.values():
            for c in kubelet.containers.values():
                c.signal(signal.SIGKILL)
                c.signal(signal.SIGCONT)
                if c.proc is not None:
                    try:
                        c.proc.wait(10)
                    except subprocess.TimeoutExpired:
                        pass

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._tick()
            except Exception as exc:  # noqa: BLE001 - a test harness: say it and go on
                self.errors.append(f"{type(exc).__name__}: {exc}"[:500])
                print(f"nodes harness: {type(exc).__name__}: {exc}", file=sys.stderr)
            time.sleep(self.tick if self.faithful else 0.1)

    def _tick(self) -> None:
        if self.faithful:
            self._cluster_tick()
        else:
            self._fast_tick()

    # == the fast variant =========================================================================
    def _fast_tick(self) -> None:
        self._free_now = None   # the nodes' free GPUs, listed once per tick and kept up to date by the bindings
        live = {j["metadata"]["uid"]: j for j in self.world.jobs().values()}
        for uid, job in list(self.jobs.items()):
            proc = job.get("proc")
            if uid not in live:                      # deleted: SIGTERM its torchrun, pods go once it exited
                if proc is not None and proc.poll() is None:
                    if not job.get("terminated"):
                        self._signal(job, signal.SIGTERM, group=False)
                        job["terminated"] = True
                    continue
                self._reap(job, proc)
                for pod in job["pods"]:
                    self._delete_pod(pod)
                del self.jobs[uid]
            elif proc is not None and proc.poll() is not None and not job.get("reaped"):
                self._reap(job, proc)
                code = proc.returncode
                self.world.set_job(job["name"], "Succeeded" if code == 0 else "Failed", f"exit code {code}")
        for uid, doc in live.items():
            if uid not in self.jobs:
                if self._suspended(doc):
                    continue
                self._admit(uid, doc)
            job = self.jobs[uid]
            if job.get("proc") is None:
                self._schedule(job, doc)

    def _reap(self, job: dict, proc) -> None:
        if proc is None or job.get("reaped"):
            return
        job["reaped"] = True
        code = proc.wait()
        self.ran.append((job["name"], job["world"], code))
        self.logs.append((job["name"], code, proc.stderr.read()[-4000:] if proc.stderr else ""))
        for pod in job["pods"]:
            current = self._pod(pod)
            if current and current["status"].get("phase") not in ("Failed", "Succeeded"):
                self._pod_status(pod, "Succeeded" if code == 0 else "Failed")

    @staticmethod
    def _replicas(doc: dict) -> tuple[list[tuple[str, dict, dict]], int, list[str]]:
        """A job's pods (name, labels, resources), processes per pod and container args: a PyTorchJob's
        Master and Workers, or a TrainJob's ``numNodes`` pods of the runtime's ``node`` job (labels from
        the operator's runtime patch, resources from ``resourcesPerNode``)."""
        name = doc["metadata"]["name"]
        if doc["kind"] == "TrainJob":
            trainer = doc["spec"]["trainer"]
            node = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
            labels = node["template"]["spec"]["template"]["metadata"]["labels"]
            pods = [(f"{name}-node-0-{i}", labels, trainer.get("resourcesPerNode") or {})
                    for i in range(trainer["numNodes"])]
            return pods, int(trainer["numProcPerNode"]), trainer["args"]
        specs, pods = doc["spec"]["pytorchReplicaSpecs"], []
        for kind, replica in specs.items():
            template = replica["template"]
            container = template["spec"]["containers"][0]
            pods += [(f"{name}-{kind.lower()}-{i}", template["metadata"]["labels"], container.get("resources") or {})
                     for i in range(replica.get("replicas", 1))]
        return pods, int(doc["spec"]["nprocPerNode"]), specs["Master"]["template"]["spec"]["containers"][0]["args"]

    @staticmethod
    def _suspended(doc: dict) -> bool:
        """Held by its queue (Kueue): no pods until it is admitted."""
        spec = doc["spec"]
        return bool(spec.get("suspend") if doc["kind"] == "TrainJob" else (spec.get("runPolicy") or {}).get("suspend"))

    def _admit(self, uid: str, doc: dict) -> None:
        """The training operator: one pod per replica, labels and resources from the job."""
        replicas, nproc, args = self._replicas(doc)
        pods = []
        for pod, labels, resources in replicas:
            self._delete_pod(pod)                # the last attempt's pod of that name
            self.cluster.create(self.pods_path, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod, "labels": labels},
                "spec": {"containers": [{"name": "trainer", "image": "solar-trainer:dev", "resources": resources}]}})
            self._pod_status(pod, "Pending")
            pods.append(pod)
        needs = {pod: self._gpus({"spec": {"containers": [{"resources": resources}]}})
                 for pod, _, resources in replicas}
        self.jobs[uid] = {"name": doc["metadata"]["name"], "pods": pods, "proc": None, "world": nproc * len(pods),
                          "args": args, "needs": needs}

    def _schedule(self, job: dict, doc: dict) -> None:
        """Bind every pod of the job or none (gang); start its torchrun once all are bound. Pods that do
        not fit are marked unschedulable once (until they are bound)."""
        if self._free_now is None:
            self._free_now = self._free()
        free = dict(self._free_now)
        binding = {}
        for pod in job["pods"]:
            need = job["needs"][pod]
            node = next((n for n, f in sorted(free.items()) if f >= need), None)
            if node is None:
                break
            free[node] -= need
            binding[pod] = node
        if len(binding) < len(job["pods"]):
            if not job.get("unschedulable"):
                job["unschedulable"] = True
                for pod in job["pods"]:
                    self._pod_status(pod, "Pending", conditions=[{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": f"0/{len(free)} nodes are available: insufficient {GPU}",
                        "lastTransitionTime": _now()}])
            return
        self._free_now = free
        for pod, node in binding.items():
            self.cluster.patch(f"{self.pods_path}/{pod}", {"spec": {"nodeName": node}})
            self._pod_status(pod, "Running", conditions=[{"type": "PodScheduled", "status": "True",
                                                          "lastTransitionTime": _now()}])
        args = [a for a in job["args"] if not a.startswith("--nproc-per-node=")]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={job['world']}",
               *args]
        self.world.set_job(job["name"], "Running")
        job["nodes"] = sorted(set(binding.values()))
        job["proc"] = self._launch(job, cmd)

    def _launch(self, job: dict, cmd: list[str]):
        """Fast: the job's ranks: one torchrun of its whole world on this machine."""
        return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

    # == the faithful variant =====================================================================
    def _cluster_tick(self) -> None:
        now = time.monotonic()
        nodes = {n["metadata"]["name"]: n for n in self.cluster.list("/api/v1/nodes")["items"]}
        leases = {x["metadata"]["name"]: x for x in self.cluster.list(LEASES)["items"]}
        pods = self.cluster.list(self.pods_path)["items"]
        jobs = list(self.world.jobs().values())
        if now - self._scanned >= 1.0:   # the containers' processes, for those left when a main process ends
            self._scanned, table = now, _processes()
            for kubelet in self.kubelets.values():
                for c in kubelet.containers.values():
                    c.refresh(table)
        for kubelet in self.kubelets.values():
            for c in kubelet.containers.values():
                if c.poll() is not None:
                    self._finished(c)
        for kubelet in self.kubelets.values():
            if kubelet.alive:
                self._kubelet(kubelet, nodes.get(kubelet.name), [p for p in pods if p["spec"].get("nodeName")
                                                                 == kubelet.name], now)
        self._node_lifecycle(nodes, leases, pods, now)
        self._taint_manager(nodes, pods, now)
        self._podgc(nodes, pods, now)
        self._garbage_collector(jobs, pods)
        for job in jobs:
            owned = [p for p in pods if self._owner(p) == job["metadata"]["uid"]]
            if job["kind"] == "TrainJob":
                self._trainjob(job, owned)
            else:
                self._pytorchjob(job, owned)
        self._note_runs(jobs)
        self._scheduler(nodes, pods, now)

    # -- the kubelet --------------------------------------------------------------------------------
    def _register(self, kubelet: Kubelet) -> None:
        """The kubelet registers its Node (and its Lease) when they are not there."""
        labels = {"kubernetes.io/hostname": kubelet.name, **kubelet.labels}
        try:
            self.cluster.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                  "metadata": {"name": kubelet.name, "labels": labels}})
        except KubeHTTPError as exc:
            if exc.status != 409:
                raise
        try:
            self.cluster.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                         "metadata": {"name": kubelet.name},
                                         "spec": {"holderIdentity": kubelet.name, "leaseDurationSeconds": 40}})
        except KubeHTTPError as exc:
            if exc.status != 409:
                raise

    def _beat(self, kubelet: Kubelet, node: dict | None) -> None:
        """The kubelet's heartbeat: its node status (Ready True, or False when it reports NotReady)
        with a new lastHeartbeatTime, and a renewal of its Lease."""
        if node is None:
            node = self._get(f"/api/v1/nodes/{kubelet.name}")
            if node is None:
                return
        ready = "True" if kubelet.state == "up" else "False"
        old = _condition(node, "Ready") or {}
        condition = {"type": "Ready", "status": ready,
                     "reason": "KubeletReady" if ready == "True" else "KubeletNotReady",
                     "message": "kubelet is posting ready status" if ready == "True" else
                     "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady",
                     "lastHeartbeatTime": _now(),
                     "lastTransitionTime": old["lastTransitionTime"] if old.get("status") == ready
                     and old.get("lastTransitionTime") else _now()}
        quantity = {GPU: str(kubelet.gpus), "cpu": "8"}
        status = {"capacity": quantity, "allocatable": quantity, "conditions": [condition],
                  "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                {"type": "Hostname", "address": kubelet.name}]}
        if any((node.get("status") or {}).get(k) != v for k, v in status.items()):   # else a no-op: not sent
            self.cluster.patch(f"/api/v1/nodes/{kubelet.name}/status", {"status": status})
        self._quiet(lambda: self.cluster.patch(f"{LEASES}/{kubelet.name}", {"spec": {"renewTime": _micro_now()}}))
        kubelet.last_beat = time.monotonic()

    def _kubelet(self, kubelet: Kubelet, node: dict | None, pods: list[dict], now: float) -> None:
        if node is not None and now - kubelet.last_beat >= self.heartbeat:
            self._beat(kubelet, node)
        here = {p["metadata"]["uid"]: p for p in pods}
        for uid, pod in here.items():
            c = kubelet.containers.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if c is None or c.code is not None:
                    if c is not None and not c.reported:
                        self._report_exit(c)
                    self._confirm(pod)
                    kubelet.containers.pop(uid, None)
                else:
                    grace = self.termination_grace if self.termination_grace is not None else \
                        pod["metadata"].get("deletionGracePeriodSeconds", c.grace)
                    self._stop_container(c, grace, now)
            elif c is None and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                self._start(kubelet, pod)
            elif c is None and (pod.get("status") or {}).get("phase") == "Running":
                self._lost_container(pod)     # a pod it ran before its machine went: nothing runs it now
            elif c is not None and c.code is not None and not c.reported:
                self._report_exit(c)
        for uid, c in list(kubelet.containers.items()):
            if uid in here:
                continue
            if c.code is None:      # its pod is gone from the API (force-deleted): stop what still runs
                self._stop_container(c, self.termination_grace if self.termination_grace is not None else c.grace,
                                     now)
            else:
                del kubelet.containers[uid]

    def _stop_container(self, c: Container, grace: float, now: float) -> None:
        """SIGTERM to the main process, SIGKILL to every process of the container after ``grace`` (from
        the SIGTERM; a later, shorter grace shortens it)."""
        if c.term_at is None:
            c.term_at, c.kill_at = now, now + float(grace)
            if c.stopped:
                c.signal(signal.SIGCONT)
                c.stopped = False
            c.signal(signal.SIGTERM if grace > 0 else signal.SIGKILL, main_only=grace > 0)
            return
        if c.kill_at is not None:
            c.kill_at = min(c.kill_at, c.term_at + float(grace))
            if now >= c.kill_at:
                c.signal(signal.SIGKILL)
                c.kill_at = None

    def _confirm(self, pod: dict) -> None:
        """The kubelet's confirmation of a deletion: DELETE that very pod with grace 0."""
        self._quiet(lambda: self.cluster.delete(f"{self.pods_path}/{pod['metadata']['name']}", {
            "gracePeriodSeconds": 0, "preconditions": {"uid": pod["metadata"]["uid"]}}))

    def _command(self, container: dict) -> list[str]:
        """The container's command line: ``torchrun`` as ``python -m torch.distributed.run``, ``python``
        as this interpreter."""
        cmd = [*(container.get("command") or []), *(container.get("args") or [])]
        if not cmd:
            raise ValueError(f"container {container.get('name')} has no command (images are not run here)")
        if cmd[0] == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", *cmd[1:]]
        if cmd[0] in ("python", "python3"):
            return [sys.executable, *cmd[1:]]
        return cmd

    def _start(self, kubelet: Kubelet, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        stem = self.log_dir / f"{meta['name']}-{meta['uid'][:8]}"
        c = Container(meta["name"], meta["uid"], kubelet.name, self._owner(pod), container.get("name", ""),
                      container.get("image", ""), None, stem.with_suffix(".log"),
                      stem.with_suffix(".termination-log"),
                      container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
                      float(spec.get("terminationGracePeriodSeconds", 30)))
        kubelet.containers[meta["uid"]] = c
        environ = env({item["name"]: str(item.get("value", "")) for item in container.get("env") or []
                       if "value" in item})
        environ["SOLAR_TERMINATION_LOG"] = str(c.termination_log)
        c.termination_log.write_bytes(b"")      # the kubelet creates the file the container writes its message to
        environ["HOSTNAME"] = spec.get("hostname") or meta["name"]   # as the container runtime sets it
        try:
            c.proc = self._launch_container(pod, self._command(container), environ, c.log)
        except (OSError, ValueError) as exc:
            c.code, c.finished = 128, _now()
            c.log.write_text(f"{type(exc).__name__}: {exc}\n")
            self._report_exit(c, reason="StartError")
            return
        c.refresh()

        def running(status: dict) -> dict:
            status.update(phase="Running", hostIP="127.0.0.1", podIP="127.0.0.1", startTime=c.started)
            for kind in ("Initialized", "ContainersReady", "Ready"):
                set_condition(status, kind, "True")
            status["containerStatuses"] = [{"name": c.name, "image": c.image, "imageID": "", "ready": True,
                                            "started": True, "restartCount": 0,
                                            "containerID": f"emulated://{c.proc.pid}",
                                            "state": {"running": {"startedAt": c.started}}}]
            return status
        self._update_status(meta["name"], meta["uid"], running)

    def _lost_container(self, pod: dict) -> None:
        """A running pod whose container this kubelet does not have (its node was deleted and came back
        before PodGC): Failed, as a kubelet reports a container it cannot find."""
        def failed(status: dict) -> dict:
            status["phase"] = "Failed"
            for kind in ("ContainersReady", "Ready"):
                set_condition(status, kind, "False", "PodFailed")
            for item in status.get("containerStatuses") or []:
                item.update(ready=False, started=False, state={"terminated": {
                    "exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": _now(),
                    "message": "The container could not be located when the pod was terminated"}})
            return status
        self._update_status(pod["metadata"]["name"], pod["metadata"]["uid"], failed)

    def _launch_container(self, pod: dict, cmd: list[str], environ: dict, log: Path) -> subprocess.Popen:
        """A container's main process, in a session of its own, its output to ``log``."""
        with open(log, "ab") as out:
            return subprocess.Popen(cmd, cwd=REPO, env=environ, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def _finished(self, c: Container) -> None:
        """A container exited (seen whatever its kubelet's state): its log in ``logs`` once."""
        if not c.logged:
            c.logged = True
            self.logs.append((c.pod, c.code, c.tail()))

    def _report_exit(self, c: Container, reason: str | None = None) -> None:
        c.reported = True
        message = c.message()

        def terminated(status: dict) -> dict:
            phase = "Succeeded" if c.code == 0 else "Failed"
            status.update(phase=phase)
            status.setdefault("startTime", c.started)
            for kind in ("ContainersReady", "Ready"):
                set_condition(status, kind, "False", "PodCompleted" if phase == "Succeeded" else "PodFailed")
            state = {"exitCode": c.code, "reason": reason or ("Completed" if c.code == 0 else "Error"),
                     "startedAt": c.started, "finishedAt": c.finished or _now()}
            if message:
                state["message"] = message
            if c.proc is not None:
                state["containerID"] = f"emulated://{c.proc.pid}"
            status["containerStatuses"] = [{"name": c.name, "image": c.image, "imageID": "", "ready": False,
                                            "started": False, "restartCount": 0, "state": {"terminated": state}}]
            return status
        self._update_status(c.pod, c.uid, terminated)

    # -- the node lifecycle controller ----------------------------------------------------------------
    def _node_lifecycle(self, nodes: dict[str, dict], leases: dict[str, dict], pods: list[dict], now: float) -> None:
        for name, node in nodes.items():
            ready = _condition(node, "Ready") or {}
            seen = (ready.get("lastHeartbeatTime"), ((leases.get(name) or {}).get("spec") or {}).get("renewTime"))
            probe = self._probe.get(name)
            observed = probe[2] if probe else None
            heard = now if probe is None or probe[0] != seen else probe[1]   # on its own clock, as the real one
            status = ready.get("status")
            if status != "Unknown" and now - heard > self.node_grace:
                status = "Unknown"
                condition = dict(ready, type="Ready", status="Unknown", reason="NodeStatusUnknown",
                                 message="Kubelet stopped posting node status.", lastTransitionTime=_now())
                others = [c for c in _conditions(node) if c.get("type") != "Ready"]
                self._quiet(lambda: self.cluster.patch(f"/api/v1/nodes/{name}/status",
                                                       {"status": {"conditions": [condition, *others]}}))
            self._taint(node, status)
            if observed == "True" and status != "True":      # MarkPodsNotReady
                for pod in pods:
                    if pod["spec"].get("nodeName") == name and (pod.get("status") or {}).get("phase") not in FINISHED:
                        self._update_status(pod["metadata"]["name"], pod["metadata"]["uid"],
                                            lambda s: (set_condition(s, "Ready", "False"), s)[1], seen=pod)
            self._probe[name] = (seen, heard, status)
        for name in set(self._probe) - set(nodes):
            del self._probe[name]

    def _taint(self, node: dict, ready: str | None) -> None:
        """The not-ready / unreachable taints (NoSchedule by condition, NoExecute for eviction)."""
        want = {NOT_READY} if ready == "False" else {UNREACHABLE} if ready in ("Unknown", None) else set()
        taints = (node.get("spec") or {}).get("taints") or []
        keep = [t for t in taints if t.get("key") not in (NOT_READY, UNREACHABLE) or t.get("key") in want]
        have = {(t.get("key"), t.get("effect")) for t in keep}
        added = [{"key": key, "effect": effect, **({"timeAdded": _now()} if effect == "NoExecute" else {})}
                 for key in sorted(want) for effect in ("NoSchedule", "NoExecute") if (key, effect) not in have]
        if added or len(keep) != len(taints):
            name = node["metadata"]["name"]
            self._quiet(lambda: self.cluster.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": keep + added}}))

    # -- the taint manager --------------------------------------------------------------------------
    def _taint_manager(self, nodes: dict[str, dict], pods: list[dict], now: float) -> None:
        current = set()
        for name, node in nodes.items():
            for taint in (node.get("spec") or {}).get("taints") or []:
                if taint.get("effect") == "NoExecute":
                    current.add((name, taint["key"]))
                    self._tainted.setdefault((name, taint["key"]), now)
        for key in set(self._tainted) - current:
            del self._tainted[key]
        for pod in pods:
            node = nodes.get(pod["spec"].get("nodeName") or "")
            if node is None or pod["metadata"].get("deletionTimestamp"):
                continue
            taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
            if not taints:
                continue
            tolerations = pod["spec"].get("tolerations") or []
            used = [[t for t in tolerations if tolerates(t, taint)] for taint in taints]
            if not all(used):
                due = now              # a taint it does not tolerate: evicted at once
            else:                      # getMinTolerationTime: the least tolerationSeconds of those used
                seconds = [float(t["tolerationSeconds"]) for ts in used for t in ts
                           if t.get("tolerationSeconds") is not None]
                since = min(self._tainted[(node["metadata"]["name"], t["key"])] for t in taints)
                due = since + max(0.0, min(seconds)) if seconds else float("inf")
            if now >= due:
                self._evict(pod, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")

    def _evict(self, pod: dict, reason: str, message: str) -> None:
        meta = pod["metadata"]
        self._update_status(meta["name"], meta["uid"],
                            lambda s: (set_condition(s, "DisruptionTarget", "True", reason, message), s)[1])
        self._delete(pod)

    # -- PodGC --------------------------------------------------------------------------------------
    def _podgc(self, nodes: dict[str, dict], pods: list[dict], now: float) -> None:
        live = set()
        for pod in pods:
            node, uid = pod["spec"].get("nodeName"), pod["metadata"]["uid"]
            if not node or node in nodes:
                continue
            live.add(uid)
            if uid in self._podgc_marked:       # marked failed a tick ago: now force-deleted
                self._delete(pod, grace=0)
                continue
            first = self._orphans.setdefault(uid, now)
            if now - first < self.podgc_delay:
                continue

            def failed(status: dict) -> dict:
                set_condition(status, "DisruptionTarget", "True", "DeletionByPodGC", "PodGC: node no longer exists")
                if status.get("phase") not in FINISHED:
                    status["phase"] = "Failed"
                return status
            self._update_status(pod["metadata"]["name"], uid, failed)
            self._podgc_marked.add(uid)
        self._orphans = {u: t for u, t in self._orphans.items() if u in live}
        self._podgc_marked &= live

    # -- the garbage collector ------------------------------------------------------------------------
    def _garbage_collector(self, jobs: list[dict], pods: list[dict]) -> None:
        """Pods whose owning job is gone are deleted (background propagation: gracefully)."""
        live = {j["metadata"]["uid"] for j in jobs}
        for pod in pods:
            owner = self._owner(pod)
            if owner is not None and owner not in live and not pod["metadata"].get("deletionTimestamp"):
                self._delete(pod)

    def _owner(self, pod: dict) -> str | None:
        """The uid of the job that controls the pod (a TrainJob's pods: through its child Job)."""
        ref = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        if ref is None:
            return None
        return self._child_jobs.get(ref["uid"], ref["uid"])

    # -- the training operators ----------------------------------------------------------------------
    def _record(self, doc: dict, world: int) -> dict:
        uid = doc["metadata"]["uid"]
        if uid not in self.jobs:
            self.jobs[uid] = {"name": doc["metadata"]["name"], "kind": doc["kind"], "pods": [], "world": world,
                              "nodes": [], "port": _free_port(), "cleaned": set(), "conflicts": 0}
        return self.jobs[uid]

    def _create_pod(self, rec: dict, body: dict) -> None:
        try:
            created = self.cluster.create(self.pods_path, body)
        except KubeHTTPError as exc:
            if exc.status != 409:
                raise
            rec["conflicts"] += 1    # a pod of that name is still there (another job's, Terminating)
            return
        rec["pods"].append(created["metadata"]["name"])

    def _pytorchjob(self, doc: dict, pods: list[dict]) -> None:
        meta, spec = doc["metadata"], doc["spec"]
        replicas = spec["pytorchReplicaSpecs"]
        counts = {kind: int(r.get("replicas", 1)) for kind, r in replicas.items()}
        nnodes = sum(counts.values())
        nproc = int(spec["nprocPerNode"]) if str(spec.get("nprocPerNode", "1")).isdigit() else 1
        rec = self._record(doc, nnodes * nproc)
        if meta.get("deletionTimestamp"):
            return
        status = copy.deepcopy(doc.get("status") or {})
        conditions = status.setdefault("conditions", [])
        name = meta["name"]
        if not any(c["type"] == "Created" for c in conditions):
            _job_condition(conditions, "Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
        status.setdefault("startTime", _now())
        finished = any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in conditions)
        policy = spec.get("runPolicy") or {}
        if finished:   # runPolicy.cleanPodPolicy (DeletePodsAndServices)
            clean = policy.get("cleanPodPolicy", "Running")
            if clean != "None":
                self._clean(rec, pods, every=clean == "All")
            return
        if policy.get("suspend"):
            for pod in pods:
                if not pod["metadata"].get("deletionTimestamp"):
                    self._delete(pod)
            if not _true(conditions, "Suspended"):
                _job_condition(conditions, "Suspended", "PyTorchJobSuspended", f"PyTorchJob {name} is suspended.")
                for c in conditions:
                    if c["type"] == "Running":
                        c["status"] = "False"
            return self._write_status(doc, status)
        if _true(conditions, "Suspended"):
            _job_condition(conditions, "Suspended", "PyTorchJobResumed", f"PyTorchJob {name} is resumed.", "False")
        port, rank = rec["port"], 0
        for kind in sorted(replicas, key=lambda k: k != "Master"):
            template = replicas[kind]["template"]
            for index in range(counts[kind]):
                pod_name = f"{name}-{kind.lower()}-{index}"
                if not any(p["metadata"]["name"] == pod_name for p in pods):
                    extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(nnodes * nproc),
                             "RANK": str(rank), "PYTHONUNBUFFERED": "1", "PET_MASTER_ADDR": "127.0.0.1",
                             "PET_MASTER_PORT": str(port), "PET_NNODES": str(nnodes), "PET_NODE_RANK": str(rank),
                             "PET_NPROC_PER_NODE": str(spec.get("nprocPerNode", nproc))}
                    labels = {**(template.get("metadata") or {}).get("labels", {}),
                              "training.kubeflow.org/job-name": name,
                              "training.kubeflow.org/operator-name": "pytorchjob-controller",
                              "training.kubeflow.org/replica-type": kind.lower(),
                              "training.kubeflow.org/replica-index": str(index)}
                    if kind == "Master":
                        labels["training.kubeflow.org/job-role"] = "master"
                    self._create_pod(rec, _pod(template, pod_name, labels, extra, _owner_ref(doc),
                                               replicas[kind].get("restartPolicy")))
                rank += 1
        # replica statuses (v1.9 updateJobReplicaStatuses) and the job's conditions (UpdateJobStatus)
        stats = {kind: {"active": 0, "succeeded": 0, "failed": 0} for kind in replicas}
        for pod in pods:
            kind = next((k for k in replicas if (pod["metadata"].get("labels") or {}).get(
                "training.kubeflow.org/replica-type") == k.lower()), None)
            if kind is None:
                continue
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Running":
                stats[kind]["failed" if pod["metadata"].get("deletionTimestamp") else "active"] += 1
            elif phase == "Succeeded":
                stats[kind]["succeeded"] += 1
            elif phase == "Failed":
                stats[kind]["failed"] += 1
        status["replicaStatuses"] = {kind: {k: v for k, v in s.items() if v} for kind, s in stats.items()}
        lead = "Master" if "Master" in replicas else "Worker"
        for kind in sorted(replicas, key=lambda k: k != lead):
            s = stats[kind]
            if kind == lead:
                if s["active"] > 0:
                    _job_condition(conditions, "Running", "PyTorchJobRunning", f"PyTorchJob {name} is running.")
                if counts[kind] - s["succeeded"] == 0:
                    _job_condition(conditions, "Succeeded", "PyTorchJobSucceeded",
                                   f"PyTorchJob {name} is successfully completed.")
                    status.setdefault("completionTime", _now())
                    break
            if s["failed"] > 0:
                _job_condition(conditions, "Failed", "PyTorchJobFailed",
                               f"PyTorchJob {name} is failed because {s['failed']} {kind} replica(s) failed.")
                status.setdefault("completionTime", _now())
                break
        self._write_status(doc, status)

    def _runtime_template(self, doc: dict) -> dict:
        """The pod template of the TrainJob's ``node`` job: its runtime's, with the runtime patches."""
        ref = doc["spec"].get("runtimeRef") or {}
        runtime = self._get(f"/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/{ref.get('name')}") \
            if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime" else None
        template: dict = {"metadata": {}, "spec": {"containers": [{"name": "node"}]}}
        jobs = (((runtime or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("replicatedJobs") or []
        node = next((j for j in jobs if j.get("name") == "node"), None)
        if node is not None:
            template = copy.deepcopy(node["template"]["spec"]["template"])
        for patch in doc["spec"].get("runtimePatches") or []:
            for job in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
                    "replicatedJobs") or []:
                if job.get("name") == "node":
                    template = _merge(template, ((job.get("template") or {}).get("spec") or {}).get("template") or {})
        return template

    def _trainjob(self, doc: dict, pods: list[dict]) -> None:
        meta, spec = doc["metadata"], doc["spec"]
        trainer = spec.get("trainer") or {}
        nnodes, nproc = int(trainer.get("numNodes", 1)), trainer.get("numProcPerNode", 1)
        rec = self._record(doc, nnodes * (int(nproc) if str(nproc).isdigit() else 1))
        child = rec.setdefault("child", str(uuid.uuid5(uuid.NAMESPACE_OID, meta["uid"])))
        self._child_jobs[child] = meta["uid"]
        if meta.get("deletionTimestamp"):
            return
        status = copy.deepcopy(doc.get("status") or {})
        conditions = status.setdefault("conditions", [])
        name, job = meta["name"], f"{meta['name']}-node-0"
        finished = _true(conditions, "Complete") or _true(conditions, "Failed")
        if finished:   # a failed Job's remaining active pods are deleted; a finished one's counts stay
            if _true(conditions, "Failed"):
                self._clean(rec, pods)
            return
        if spec.get("suspend"):   # a suspended Job deletes its active pods (not counted as failed)
            for pod in pods:
                if not pod["metadata"].get("deletionTimestamp"):
                    rec.setdefault("suspended_pods", set()).add(pod["metadata"]["uid"])
                    self._delete(pod)
            set_condition(status, "Suspended", "True", "Suspended", "TrainJob is suspended")
            status["jobsStatus"] = [{"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 0,
                                     "suspended": 1}]
            return self._write_status(doc, status)
        if _true(conditions, "Suspended"):
            set_condition(status, "Suspended", "False", "Resumed", "TrainJob is resumed")
        pods = [p for p in pods if p["metadata"]["uid"] not in rec.get("suspended_pods", ())]
        port = rec["port"]
        for index in range(nnodes):
            if any((p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-completion-index")
                   == str(index) for p in pods):
                continue     # an Indexed Job keeps one pod per index (backoffLimit 0: never replaced)
            template = self._runtime_template(doc)
            containers = template.setdefault("spec", {}).setdefault("containers", [{"name": "node"}])
            main = next((c for c in containers if c.get("name") == "node"), containers[0])
            for key in ("image", "command", "args"):
                if trainer.get(key) is not None:
                    main[key] = copy.deepcopy(trainer[key])
            main["env"] = [*(main.get("env") or []), *copy.deepcopy(trainer.get("env") or [])]
            if trainer.get("resourcesPerNode"):
                main["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
            extra = {"PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(index),
                     "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
            labels = {**(template.get("metadata") or {}).get("labels", {}),
                      "batch.kubernetes.io/job-completion-index": str(index), "batch.kubernetes.io/job-name": job,
                      "job-name": job, "jobset.sigs.k8s.io/jobset-name": name,
                      "jobset.sigs.k8s.io/replicatedjob-name": "node"}
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": child, "controller": True,
                     "blockOwnerDeletion": True}
            body = _pod(template, None, labels, extra, owner, "Never")
            body["metadata"]["generateName"] = f"{job}-{index}-"
            body["metadata"].setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(index)
            body["spec"].update(hostname=f"{job}-{index}", subdomain=name)
            self._create_pod(rec, body)
        # the child Job's counts (the Job controller: a pod deleted before it succeeded counts as failed)
        # and the JobSet's replicatedJobsStatus, which the TrainJob's jobsStatus carries
        active = failed = succeeded = ready = 0
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase", "Pending")
            deleting = pod["metadata"].get("deletionTimestamp")
            if phase == "Succeeded":
                succeeded += 1
            elif phase == "Failed" or deleting:
                failed += 1
            else:
                active += 1
                ready += (_condition(pod, "Ready") or {}).get("status") == "True"
        job_failed, job_complete = failed > 0, failed == 0 and succeeded >= nnodes
        status["jobsStatus"] = [{"name": "node", "active": int(active > 0 and not job_failed and not job_complete),
                                 "ready": int(ready + succeeded >= nnodes and not job_failed),
                                 "succeeded": int(job_complete), "failed": int(job_failed), "suspended": 0}]
        if job_failed:
            set_condition(status, "Failed", "True", "JobsFailed",
                          f"jobset {name}: job {job} failed: {failed} pod(s) failed")
            self._clean(rec, pods)
        elif job_complete:
            set_condition(status, "Complete", "True", "JobsCompleted", f"jobset {name} completed")
        self._write_status(doc, status)

    def _clean(self, rec: dict, pods: list[dict], every: bool = False) -> None:
        """The pods of a finished job that still run or wait (``every``: all of them) are deleted, once each."""
        for pod in pods:
            if (every or (pod.get("status") or {}).get("phase", "Pending") in ("Running", "Pending")) and \
                    pod["metadata"]["uid"] not in rec["cleaned"]:
                rec["cleaned"].add(pod["metadata"]["uid"])
                self._delete(pod)

    def _write_status(self, doc: dict, status: dict) -> None:
        if status != (doc.get("status") or {}):
            path = f"{self.world.jobs_path}/{doc['metadata']['name']}/status"
            self._quiet(lambda: self.cluster.replace(path, {**doc, "status": status}))

    def _note_runs(self, jobs: list[dict]) -> None:
        """``ran``: (job, world, exit code) once a job is finished or gone and all its containers
        exited (0 when each exited 0, else the first other code in pod order); ``jobs[...]['nodes']``."""
        live = {j["metadata"]["uid"]: j for j in jobs}
        containers = [c for k in self.kubelets.values() for c in k.containers.values()]
        for uid, rec in list(self.jobs.items()):
            if rec.get("proc") is not None or "port" not in rec:
                continue
            mine = [c for c in containers if c.job == uid]
            rec["containers"] = rec.get("containers", {}) | {c.uid: c for c in mine}
            rec["nodes"] = sorted({c.node for c in rec["containers"].values()})
            doc = live.get(uid)
            over = doc is None or any(c.get("status") == "True" and c.get("type") in ("Succeeded", "Failed", "Complete")
                                      for c in _conditions(doc))
            started = list(rec["containers"].values())
            if over and not rec.get("ran") and started and all(c.code is not None for c in started):
                rec["ran"] = True
                codes = [c.code for c in sorted(started, key=lambda c: c.pod)]
                self.ran.append((rec["name"], rec["world"], next((x for x in codes if x), 0)))
            if doc is None and (rec.get("ran") or not started) and not any(c.code is None for c in mine):
                del self.jobs[uid]

    # -- the scheduler -------------------------------------------------------------------------------
    def _scheduler(self, nodes: dict[str, dict], pods: list[dict], now: float) -> None:
        used: dict[str, int] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in FINISHED:
                used[node] = used.get(node, 0) + self._gpus(pod)
        free = {name: int(((n.get("status") or {}).get("allocatable") or {}).get(GPU, "0")) - used.get(name, 0)
                for name, n in nodes.items()}
        pending = [p for p in pods if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        for pod in pending:
            self._queue.setdefault(pod["metadata"]["uid"], now)
        self._queue = {p["metadata"]["uid"]: self._queue[p["metadata"]["uid"]] for p in pending}
        pending.sort(key=lambda p: (self._queue[p["metadata"]["uid"]], p["metadata"]["name"]))
        groups: list[list[dict]] = []
        if self.gang:
            by_owner: dict[str, list[dict]] = {}
            for pod in pending:
                by_owner.setdefault(self._owner(pod) or pod["metadata"]["uid"], []).append(pod)
            groups = list(by_owner.values())
        else:
            groups = [[pod] for pod in pending]
        for group in groups:
            trial, binding, why = dict(free), {}, {}
            for pod in group:
                node, why = self._place(pod, nodes, trial)
                if node is None:
                    break
                trial[node] -= self._gpus(pod)
                binding[pod["metadata"]["uid"]] = node
            if len(binding) < len(group):
                message = _unschedulable_message(len(nodes), why)
                for pod in group:
                    self._update_status(pod["metadata"]["name"], pod["metadata"]["uid"], lambda s: (set_condition(
                        s, "PodScheduled", "False", "Unschedulable", message), s.setdefault("phase", "Pending"), s)[2],
                        seen=pod)
                continue
            for pod in group:
                name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                try:   # the binding: refused when the pod changed meanwhile (a new one of that name, bound)
                    self.cluster.patch(f"{self.pods_path}/{name}", {
                        "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
                        "spec": {"nodeName": binding[uid]}})
                except KubeHTTPError as exc:
                    if exc.status not in (404, 409):
                        raise
                    continue
                free[binding[uid]] -= self._gpus(pod)
                self._update_status(name, uid, lambda s: (set_condition(s, "PodScheduled", "True"),
                                                          s.setdefault("phase", "Pending"), s)[2])

    def _place(self, pod: dict, nodes: dict[str, dict], free: dict[str, int]) -> tuple[str | None, dict[str, int]]:
        """The node for ``pod`` (most free GPUs, then name), or None and why each node would not do."""
        need, why, fits = self._gpus(pod), {}, []
        selector = pod["spec"].get("nodeSelector") or {}
        tolerations = pod["spec"].get("tolerations") or []
        for name, node in sorted(nodes.items()):
            untolerated = next((t for t in (node.get("spec") or {}).get("taints") or []
                                if t.get("effect") in ("NoSchedule", "NoExecute")
                                and not any(tolerates(x, t) for x in tolerations)), None)
            if (node.get("spec") or {}).get("unschedulable"):
                reason = "node(s) were unschedulable"
            elif untolerated is not None:
                reason = f"node(s) had untolerated taint {{{untolerated['key']}: {untolerated.get('value', '')}}}"
            elif (_condition(node, "Ready") or {}).get("status") != "True":
                reason = "node(s) were not ready"
            elif any((node["metadata"].get("labels") or {}).get(k) != v for k, v in selector.items()):
                reason = "node(s) didn't match Pod's node affinity/selector"
            elif free.get(name, 0) < need:
                reason = f"Insufficient {GPU}"
            else:
                fits.append((-free[name], name))
                continue
            why[reason] = why.get(reason, 0) + 1
        return (min(fits)[1] if fits else None), why

    # -- admission ---------------------------------------------------------------------------------
    def _default_tolerations(self, res, namespace, body) -> None:
        """DefaultTolerationSeconds: the not-ready and unreachable NoExecute tolerations, for
        ``toleration_seconds``, on every pod that has none of its own for them."""
        if (res.group, res.plural) != ("", "pods"):
            return
        spec = body.setdefault("spec", {})
        tolerations = spec.setdefault("tolerations", [])
        for key in (NOT_READY, UNREACHABLE):
            if not any(tolerates(t, {"key": key, "effect": "NoExecute"}) for t in tolerations):
                seconds = self.toleration_seconds
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                    "tolerationSeconds": int(seconds) if float(seconds).is_integer() else seconds})

    # -- API helpers ------------------------------------------------------------------------------
    def _free(self) -> dict[str, int]:
        nodes = self.cluster.list("/api/v1/nodes")["items"]
        used: dict[str, int] = {}
        for pod in self.cluster.list(self.pods_path)["items"]:
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + self._gpus(pod)
        out = {}
        for node in nodes:
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                name = node["metadata"]["name"]
                out[name] = int(node["status"]["allocatable"].get(GPU, "0")) - used.get(name, 0)
        return out

    @staticmethod
    def _gpus(pod: dict | None) -> int:
        if not pod:
            return 0
        total = 0
        for container in pod["spec"].get("containers") or []:
            resources = container.get("resources") or {}
            total += int((resources.get("limits") or {}).get(GPU, (resources.get("requests") or {}).get(GPU, 0)))
        return total

    def _get(self, path: str) -> dict | None:
        try:
            return self.cluster.get(path)
        except KubeHTTPError as exc:
            if exc.status == 404:
                return None
            raise

    def _pod(self, name: str) -> dict | None:
        try:
            return self.cluster.get(f"{self.pods_path}/{name}")
        except Exception:  # noqa: BLE001 - gone
            return None

    @staticmethod
    def _quiet(call) -> None:
        """An API call whose object may be gone meanwhile (404) or changed (409): the next tick sees."""
        try:
            call()
        except KubeHTTPError as exc:
            if exc.status not in (404, 409):
                raise

    def _update_status(self, name: str, uid: str, change, seen: dict | None = None) -> None:
        """Read the pod, ``change(status)`` -> the new status, replace it (optimistic concurrency: a
        conflict reads again). ``seen``: the pod as listed; nothing is read when the change would not
        change that."""
        if seen is not None:
            before = seen.get("status") or {}
            if change(copy.deepcopy(before)) == before:
                return
        for _ in range(5):
            pod = self._get(f"{self.pods_path}/{name}")
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            new = change(copy.deepcopy(pod.get("status") or {}))
            if new == (pod.get("status") or {}):
                return
            try:
                self.cluster.replace(f"{self.pods_path}/{name}/status", {**pod, "status": new})
                return
            except KubeHTTPError as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise

    def _delete(self, pod: dict, grace: int | None = None) -> None:
        """DELETE that very pod (graceful unless ``grace`` is 0)."""
        meta = pod["metadata"]
        body: dict = {"preconditions": {"uid": meta["uid"]}}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        self._quiet(lambda: self.cluster.delete(f"{self.pods_path}/{meta['name']}", body))

    def _pod_status(self, name: str, phase: str, conditions: list | None = None) -> None:
        status = {"phase": phase}
        if conditions is not None:
            status["conditions"] = conditions
        try:
            self.cluster.patch(f"{self.pods_path}/{name}/status", {"status": status})
        except Exception:  # noqa: BLE001 - the pod went meanwhile
            pass

    def _delete_pod(self, name: str) -> None:
        """Fast: the pod goes at once (a force deletion)."""
        try:
            self.cluster.delete(f"{self.pods_path}/{name}", {"gracePeriodSeconds": 0})
        except Exception:  # noqa: BLE001 - not there
            pass


# --- manifests ----------------------------------------------------------------------------------

def _true(conditions: list[dict], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _job_condition(conditions: list[dict], kind: str, reason: str, message: str, value: str = "True") -> None:
    """training-operator v1.9's ``UpdateJobConditions``: unchanged when that condition already says so;
    else the old one of that type is dropped (Running with it when Restarting comes, and the other way
    round; Running turned False when Succeeded or Failed comes) and the new one appended."""
    old = next((c for c in conditions if c["type"] == kind), None)
    if old is not None and old["status"] == value and old.get("reason") == reason:
        return
    kept = []
    for c in conditions:
        if c["type"] == kind or {kind, c["type"]} == {"Running", "Restarting"}:
            continue
        if kind in ("Succeeded", "Failed") and c["type"] == "Running":
            c = dict(c, status="False")
        kept.append(c)
    now = _now()
    kept.append({"type": kind, "status": value, "reason": reason, "message": message, "lastUpdateTime": now,
                 "lastTransitionTime": now})
    conditions[:] = kept


def _owner_ref(doc: dict) -> dict:
    return {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "name": doc["metadata"]["name"],
            "uid": doc["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _pod(template: dict, name: str | None, labels: dict, extra_env: dict, owner: dict,
         restart: str | None) -> dict:
    """A pod from a pod template, its containers given ``extra_env`` (the controller's own variables win
    over the template's of the same name)."""
    spec = copy.deepcopy(template.get("spec") or {})
    for container in spec.get("containers") or []:
        container["env"] = [e for e in container.get("env") or [] if e.get("name") not in extra_env] + \
            [{"name": k, "value": v} for k, v in extra_env.items()]
    spec["restartPolicy"] = "Never" if restart in (None, "Never", "ExitCode") else restart
    meta = {"labels": labels, "ownerReferences": [owner]}
    if name:
        meta["name"] = name
    annotations = (template.get("metadata") or {}).get("annotations")
    if annotations:
        meta["annotations"] = copy.deepcopy(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _merge(base, patch):
    """A runtime patch onto a pod template: maps merged, lists of named items (containers, volumes, env,
    volumeMounts) merged by name, other lists appended."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = _merge(out.get(key), value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        if all(isinstance(x, dict) and "name" in x for x in base + patch):
            out = copy.deepcopy(base)
            for item in patch:
                at = next((i for i, x in enumerate(out) if x["name"] == item["name"]), None)
                if at is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[at] = _merge(out[at], item)
            return out
        return copy.deepcopy(base) + copy.deepcopy(patch)
    return copy.deepcopy(patch)


def _unschedulable_message(total: int, why: dict[str, int]) -> str:
    """The scheduler's FitError message."""
    reasons = ", ".join(sorted(f"{count} {reason}" for reason, count in why.items()))
    return (f"0/{total} nodes are available: {reasons}. preemption: 0/{total} nodes are available: "
            f"{total} Preemption is not helpful for scheduling.")
