"""Nodes for the emulated cluster, and the parts nobody else plays for a PyTorchJob's pods: the
scheduler (all of a job's pods bound to Ready nodes with free ``nvidia.com/gpu``, or the unbound ones
left Pending with ``PodScheduled=False/Unschedulable``), the training operators (a PyTorchJob's pods
per replica, a TrainJob's ``numNodes`` pods once its queue admits it; the job's Running/Succeeded/
Failed conditions) and the kubelets (the job's container command run on this
machine as one torchrun of the job's whole world over gloo). ``kill_node`` is a node failure: the
node turns NotReady, its pods get ``DisruptionTarget`` and fail, and the job's processes die at once
(SIGKILL), as the other nodes' ranks do when a peer vanishes. A deleted job's torchrun gets SIGTERM
(what the kubelet sends a pod's main process) and its pods stay until it has exited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from tests.conftest import REPO
from tests.e2e.helpers import env
from tests.integration.world import World

GPU = "nvidia.com/gpu"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Nodes:
    def __init__(self, world: World, logs) -> None:
        self.world, self.logs = world, logs
        self.cluster, self.ns = world.cluster, world.namespace
        self.pods_path = f"/api/v1/namespaces/{self.ns}/pods"
        self.jobs: dict[str, dict] = {}      # job uid -> {"name", "pods": [names], "proc", "started", "world"}
        self.ran: list[tuple[str, int, int]] = []   # (job, world, exit code)
        self._stop = threading.Event()
        self._lock = threading.RLock()   # the bench takes it around kill_node too
        self._thread = threading.Thread(target=self._loop, name="nodes", daemon=True)
        self._free_now: dict[str, int] | None = None

    # -- nodes ------------------------------------------------------------------------------------
    def add(self, name: str, gpus: int = 1) -> None:
        self.cluster.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        self.ready(name, True, gpus)

    def ready(self, name: str, ready: bool, gpus: int = 1) -> None:
        self.cluster.patch(f"/api/v1/nodes/{name}/status", {"status": {
            "allocatable": {GPU: str(gpus), "cpu": "8"}, "capacity": {GPU: str(gpus), "cpu": "8"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                            "lastTransitionTime": _now()}]}})

    def kill_node(self, name: str, *, how: str = "not-ready", gpus: int = 1) -> list[str]:
        """The node fails: its pods fail and the job's ranks are gone (SIGKILL). ``how``: ``not-ready``
        (the node turns NotReady, the taint manager marks its pods ``DisruptionTarget``), ``deleted``
        (the node object is removed, the pod garbage collector marks them) or ``silent`` (NotReady, its
        pods fail with no condition: only the node says why). Returns the names of the jobs it hit."""
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

    def _signal(self, job: dict, sig: int, *, group: bool = True) -> None:
        """A signal to the job's ranks: the process group (a node failure) or torchrun alone (the
        kubelet's SIGTERM, which torchrun passes on)."""
        (os.killpg if group else os.kill)(job["proc"].pid, sig)

    # -- the loop ---------------------------------------------------------------------------------
    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        for job in self.jobs.values():
            proc = job.get("proc")
            if proc is not None and proc.poll() is None:
                self._signal(job, signal.SIGKILL)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._tick()
            except Exception as exc:  # noqa: BLE001 - a test harness: say it and go on
                print(f"nodes harness: {type(exc).__name__}: {exc}", file=sys.stderr)
            time.sleep(0.1)

    def _tick(self) -> None:
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
        """The job's ranks: one torchrun of its whole world on this machine."""
        return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

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
        limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
        return int(limits.get(GPU, 0))

    def _pod(self, name: str) -> dict | None:
        try:
            return self.cluster.get(f"{self.pods_path}/{name}")
        except Exception:  # noqa: BLE001 - gone
            return None

    def _pod_status(self, name: str, phase: str, conditions: list | None = None) -> None:
        status = {"phase": phase}
        if conditions is not None:
            status["conditions"] = conditions
        try:
            self.cluster.patch(f"{self.pods_path}/{name}/status", {"status": status})
        except Exception:  # noqa: BLE001 - the pod went meanwhile
            pass

    def _delete_pod(self, name: str) -> None:
        try:
            self.cluster.delete(f"{self.pods_path}/{name}")
        except Exception:  # noqa: BLE001 - not there
            pass
