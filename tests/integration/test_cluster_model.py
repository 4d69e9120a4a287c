"""The faithful emulated cluster itself (``tests.integration.nodes.Nodes(faithful=True)``), without the
operator: each row of kubernetes.md's "Node loss as a real cluster shows it", with real processes.

Times are scaled down (``CLUSTER``): kubelet heartbeat 0.2 s (10 s real), node-monitor grace 1 s (40-50 s
real), tolerationSeconds 1 s (300 s real), termination grace 1 s (30 s real). Containers are small
Python scripts where torchrun is not the point (``WORKER``: writes its progress to ``$OUT/<pod>``), and
one torchrun per pod over a static rendezvous where it is (``ALL_REDUCE``)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from solar_operator import jobs as pytorchjobs
from solar_operator import trainjobs
from tests.integration.nodes import GPU, NOT_READY, UNREACHABLE, Nodes
from tests.integration.world import World, crds
from tests.support.kube import KubeHTTPError, emulated_cluster, wait_for

pytestmark = pytest.mark.timeout(60)

CLUSTER = {"faithful": True, "tick": 0.05, "heartbeat": 0.2, "node_grace": 1.0, "toleration_seconds": 1}

# A container that counts: $OUT/<pod> holds how many times it woke (every 0.05 s); with STEPS it exits
# after that many with EXIT; IGNORE_TERM: it ignores SIGTERM (only SIGKILL stops it).
WORKER = """
import os, signal, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
path, steps, n = os.path.join(os.environ["OUT"], os.environ["HOSTNAME"]), int(os.environ.get("STEPS", "0")), 0
while not steps or n < steps:
    n += 1
    with open(path + ".tmp", "w") as fh:
        fh.write(str(n))
    os.replace(path + ".tmp", path)
    time.sleep(0.05)
if os.environ.get("MESSAGE"):
    with open(os.environ["SOLAR_TERMINATION_LOG"], "w") as fh:
        fh.write(os.environ["MESSAGE"])
sys.exit(int(os.environ.get("EXIT", "0")))
"""

# A rank under torchrun: all_reduce of rank + 1 over gloo, STEPS times (0: until stopped), its progress
# in $OUT/rank-<rank>.json.
ALL_REDUCE = """
import json, os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, steps, i = dist.get_rank(), int(os.environ.get("STEPS", "0")), 0
while not steps or i < steps:
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    i += 1
    with open(os.path.join(os.environ["OUT"], f"rank-{rank}.json"), "w") as fh:
        json.dump({"step": i, "sum": t.item(), "world": dist.get_world_size(), "pgid": os.getpgid(0),
                   "pod": os.environ["HOSTNAME"]}, fh)
    time.sleep(0.05)
dist.destroy_process_group()
"""


@pytest.fixture
def cluster(tmp_path):
    with emulated_cluster(crds("PyTorchJob", "TrainJob"), tmp_path) as running:
        yield running


def _world(cluster, tmp_path, backend: str = "PyTorchJob") -> World:
    world = World(cluster, tmp_path / "storage", backend=backend)
    if backend == "TrainJob":
        world.install_runtime()
    return world


def _script(tmp_path, text: str, name: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _env(out, **extra) -> list[dict]:
    return [{"name": "OUT", "value": str(out)}, *({"name": k, "value": str(v)} for k, v in extra.items())]


def pytorchjob(name: str, command: list[str], env: list[dict], *, workers: int = 1, gpus: int = 1, grace: int = 1,
               clean: str = "Running", master_env: list[dict] | None = None) -> dict:
    def template(replica: str) -> dict:
        return {"metadata": {"labels": {"app": name, "replica": replica}},
                "spec": {"terminationGracePeriodSeconds": grace, "containers": [{
                    "name": "pytorch", "image": "trainer:dev", "command": command[:1], "args": command[1:],
                    "env": (master_env if replica == "master" and master_env is not None else env),
                    "resources": {"limits": {GPU: gpus}}}]}}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template("master")}}
    if workers:
        replicas["Worker"] = {"replicas": workers, "restartPolicy": "Never", "template": template("worker")}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": replicas, "runPolicy": {"cleanPodPolicy": clean}}}


def _pods(world: World) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in world.cluster.list(f"/api/v1/namespaces/{world.namespace}/pods")["items"]}


def _pod(world: World, name: str) -> dict | None:
    return _pods(world).get(name)


def _cond(doc: dict | None, kind: str) -> dict:
    return next((c for c in ((doc or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _node(world: World, name: str) -> dict | None:
    try:
        return world.cluster.get(f"/api/v1/nodes/{name}")
    except KubeHTTPError:
        return None


def _taints(node: dict | None) -> dict[tuple[str, str], dict]:
    return {(t["key"], t["effect"]): t for t in ((node or {}).get("spec") or {}).get("taints") or []}


def _count(out, pod: str) -> int:
    try:
        return int((out / pod).read_text())
    except (OSError, ValueError):
        return 0


def _growing(out, pod: str, seconds: float = 0.5) -> bool:
    before = _count(out, pod)
    time.sleep(seconds)
    return _count(out, pod) > before


def _phase(world: World, job: str) -> str | None:
    doc = world.jobs().get(job)
    return (trainjobs.state(doc) if world.backend == "TrainJob" else pytorchjobs.state(doc)).phase if doc else None


def _started(world: World, nodes: Nodes, out, job: str, pods: list[str]) -> None:
    wait_for(lambda: all(_count(out, p) > 0 for p in pods), timeout=15, message=f"{pods} running")
    wait_for(lambda: _phase(world, job) == "Running", timeout=5, message=f"{job} Running")


def _two_node_job(world: World, nodes: Nodes, out, cmd: list[str], **job) -> str:
    """Nodes n1 and n2 of one GPU, the PyTorchJob ``job`` (a master and a worker) running on them; the
    worker's node."""
    nodes.add("n1")
    nodes.add("n2")
    world.cluster.create(world.jobs_path, pytorchjob("job", cmd, **job))
    _started(world, nodes, out, "job", ["job-master-0", "job-worker-0"])
    return _pod(world, "job-worker-0")["spec"]["nodeName"]


def test_a_node_whose_kubelet_dies_turns_unknown_after_the_grace_is_tainted_and_keeps_its_processes(cluster, tmp_path):
    """dead-kubelet: Ready=Unknown (NodeStatusUnknown) only after node_grace, lastHeartbeatTime as the
    kubelet last wrote it, the unreachable taints, its pod Ready=False; the container keeps running.
    not-ready: the kubelet itself reports Ready=False (KubeletNotReady): the not-ready taints."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], **CLUSTER) as nodes:
        nodes.add("n1")
        nodes.add("n2")
        assert _cond(_node(world, "n1"), "Ready")["status"] == "True"
        assert cluster.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1")["spec"]["renewTime"]
        cluster.create(world.jobs_path, pytorchjob("job", cmd, _env(out)))
        _started(world, nodes, out, "job", ["job-master-0", "job-worker-0"])
        worker_node = _pod(world, "job-worker-0")["spec"]["nodeName"]
        master_node = _pod(world, "job-master-0")["spec"]["nodeName"]
        assert worker_node != master_node                     # one GPU each
        before = _cond(_node(world, worker_node), "Ready")

        assert nodes.lose_node(worker_node, "dead-kubelet") == ["job"]
        lost = time.monotonic()
        time.sleep(0.6)
        assert _cond(_node(world, worker_node), "Ready")["status"] == "True"   # within the grace: nothing yet
        wait_for(lambda: _cond(_node(world, worker_node), "Ready")["status"] == "Unknown", timeout=5,
                 message="Ready=Unknown")
        assert time.monotonic() - lost >= 1.0
        node = _node(world, worker_node)
        ready = _cond(node, "Ready")
        assert ready["reason"] == "NodeStatusUnknown" and ready["message"] == "Kubelet stopped posting node status."
        assert ready["lastHeartbeatTime"] <= ready["lastTransitionTime"]
        assert ready["lastHeartbeatTime"] >= before["lastHeartbeatTime"]
        wait_for(lambda: {(UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")} <= set(_taints(
            _node(world, worker_node))), timeout=3, message="unreachable taints")
        assert _taints(_node(world, worker_node))[(UNREACHABLE, "NoExecute")]["timeAdded"]
        wait_for(lambda: _cond(_pod(world, "job-worker-0"), "Ready")["status"] == "False", timeout=3,
                 message="the lost node's pod Ready=False")
        assert _cond(_pod(world, "job-master-0"), "Ready")["status"] == "True"
        assert _growing(out, "job-worker-0")                 # a dead kubelet: its container runs on

        nodes.lose_node(master_node, "not-ready")
        wait_for(lambda: _cond(_node(world, master_node), "Ready").get("reason") == "KubeletNotReady", timeout=3,
                 message="Ready=False from the kubelet")
        assert _cond(_node(world, master_node), "Ready")["status"] == "False"
        wait_for(lambda: {(NOT_READY, "NoExecute"), (NOT_READY, "NoSchedule")} <= set(_taints(
            _node(world, master_node))), timeout=3, message="not-ready taints")
        assert _growing(out, "job-master-0")                 # NotReady keeps its containers

        nodes.return_node(worker_node)
        wait_for(lambda: _cond(_node(world, worker_node), "Ready")["status"] == "True"
                 and not _taints(_node(world, worker_node)), timeout=3, message="back: Ready, untainted")


def test_the_taint_manager_evicts_after_toleration_and_the_pod_stays_terminating_failing_the_job(cluster, tmp_path):
    """Admission gave every pod the not-ready/unreachable NoExecute tolerations (toleration_seconds);
    after them the taint manager marks the pod DisruptionTarget (DeletionByTaintManager) and deletes it;
    no kubelet confirms (silent node), so it stays Terminating with phase Running, and the PyTorchJob
    counts it failed: Failed, and its other pods deleted (cleanPodPolicy Running)."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], **CLUSTER) as nodes:
        node = _two_node_job(world, nodes, out, cmd, env=_env(out))
        tolerations = _pod(world, "job-worker-0")["spec"]["tolerations"]
        assert {(t["key"], t["effect"], t["tolerationSeconds"]) for t in tolerations} == {
            (NOT_READY, "NoExecute", 1), (UNREACHABLE, "NoExecute", 1)}
        nodes.lose_node(node, "silent")
        lost = time.monotonic()
        time.sleep(0.3)
        assert not _growing(out, "job-worker-0", 0.3)          # SIGSTOPped
        wait_for(lambda: _pod(world, "job-worker-0")["metadata"].get("deletionTimestamp"), timeout=6,
                 message="the eviction")
        assert time.monotonic() - lost >= 2.0                   # grace (1 s) + tolerationSeconds (1 s)
        evicted = _pod(world, "job-worker-0")
        target = _cond(evicted, "DisruptionTarget")
        assert (target["status"], target["reason"]) == ("True", "DeletionByTaintManager")
        assert target["message"] == "Taint manager: deleting due to NoExecute taint"
        assert evicted["metadata"]["deletionGracePeriodSeconds"] == 1
        wait_for(lambda: _phase(world, "job") == "Failed", timeout=3, message="the job Failed")
        job = world.jobs()["job"]
        assert _cond(job, "Failed")["message"] == "PyTorchJob job is failed because 1 Worker replica(s) failed."
        assert _cond(job, "Running")["status"] == "False"
        assert job["status"]["replicaStatuses"]["Worker"] == {"failed": 1}
        # the master: deleted by cleanPodPolicy, stopped by its kubelet (SIGTERM), confirmed: gone
        wait_for(lambda: "job-master-0" not in _pods(world), timeout=5, message="the master pod gone")
        time.sleep(1.5)                                          # well past the grace: nobody confirms
        still = _pod(world, "job-worker-0")
        assert still["status"]["phase"] == "Running" and still["metadata"]["deletionTimestamp"]
        nodes.return_node(node)
        wait_for(lambda: "job-worker-0" not in _pods(world), timeout=5, message="confirmed once back")


def test_a_deleted_node_s_pods_are_failed_and_force_deleted_by_podgc(cluster, tmp_path):
    """The Node object deleted: its pod gets DisruptionTarget (DeletionByPodGC) and phase Failed, then
    is force-deleted; its process is gone with the machine; the job fails. The node registers again
    when it returns."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    pods = f"/api/v1/namespaces/{world.namespace}/pods"
    with Nodes(world, [], **CLUSTER) as nodes:
        node = _two_node_job(world, nodes, out, cmd, env=_env(out))
        rv = cluster.list(pods)["metadata"]["resourceVersion"]
        nodes.lose_node(node, "deleted")
        assert _node(world, node) is None
        wait_for(lambda: "job-worker-0" not in _pods(world), timeout=3, message="PodGC")
        assert not _growing(out, "job-worker-0", 0.3)           # killed with the machine
        seen = [e for e in cluster.watch(pods, timeout=0.5, resourceVersion=rv)
                if e["object"]["metadata"]["name"] == "job-worker-0"]
        failed = next(e["object"] for e in seen if e["object"]["status"].get("phase") == "Failed")
        target = _cond(failed, "DisruptionTarget")
        assert (target["status"], target["reason"], target["message"]) == (
            "True", "DeletionByPodGC", "PodGC: node no longer exists")
        assert seen[-1]["type"] == "DELETED" and not seen[-1]["object"]["metadata"].get("deletionTimestamp")
        wait_for(lambda: _phase(world, "job") == "Failed", timeout=3, message="the job Failed")
        nodes.return_node(node)
        wait_for(lambda: _cond(_node(world, node), "Ready")["status"] == "True", timeout=3, message="registered")


def test_one_pod_at_a_time_a_pytorchjob_runs_with_a_worker_pending(cluster, tmp_path):
    """One node of one GPU, a job of two one-GPU pods: the default scheduler binds the master (the pod it
    saw first) and leaves the worker Pending, Unschedulable; the job reads Running."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], **CLUSTER) as nodes:
        nodes.add("n1")
        cluster.create(world.jobs_path, pytorchjob("job", cmd, _env(out)))
        wait_for(lambda: _count(out, "job-master-0") > 0, timeout=15, message="the master runs")
        wait_for(lambda: _cond(_pod(world, "job-worker-0"), "PodScheduled").get("reason") == "Unschedulable",
                 timeout=3, message="the worker unschedulable")
        worker = _pod(world, "job-worker-0")
        assert "nodeName" not in worker["spec"] and worker["status"]["phase"] == "Pending"
        assert _cond(worker, "PodScheduled")["message"] == (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
            "1 Preemption is not helpful for scheduling.")
        wait_for(lambda: _phase(world, "job") == "Running", timeout=3, message="Running")
        assert world.jobs()["job"]["status"]["replicaStatuses"] == {"Master": {"active": 1}, "Worker": {}}
        # a second node: the worker is bound, the job still one Running
        nodes.add("n2")
        wait_for(lambda: _count(out, "job-worker-0") > 0, timeout=15, message="the worker runs on n2")
        assert _pod(world, "job-worker-0")["spec"]["nodeName"] == "n2"


def test_a_gang_scheduler_binds_all_or_none(cluster, tmp_path):
    """``gang=True``: the same job on one GPU has neither pod bound."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], gang=True, **CLUSTER) as nodes:
        nodes.add("n1")
        cluster.create(world.jobs_path, pytorchjob("job", cmd, _env(out)))
        wait_for(lambda: all(_cond(_pod(world, p), "PodScheduled").get("reason") == "Unschedulable"
                             for p in ("job-master-0", "job-worker-0")), timeout=5, message="both unschedulable")
        assert not any(p["spec"].get("nodeName") for p in _pods(world).values())
        assert _phase(world, "job") == "Created"
        nodes.add("n2")
        wait_for(lambda: _count(out, "job-master-0") and _count(out, "job-worker-0"), timeout=15,
                 message="both run once two nodes hold them")


def test_a_trainjob_counts_its_child_job_with_a_pending_pod_as_active(cluster, tmp_path):
    """A TrainJob of two nodes on a cluster with one free GPU: one pod runs, one is Pending and
    Unschedulable, and jobsStatus counts the child Job active: the TrainJob reads Running. Once the
    pods succeed it is Complete; the termination message is in the container status."""
    world, out = _world(cluster, tmp_path, "TrainJob"), tmp_path / "out"
    out.mkdir()
    with Nodes(world, [], **CLUSTER) as nodes:
        nodes.add("n1")
        cluster.create(world.jobs_path, {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj"},
            "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                    "name": "torch-distributed"},
                     "trainer": {"image": "trainer:dev", "command": ["python", _script(tmp_path, WORKER, "w.py")],
                                 "numNodes": 2, "numProcPerNode": 1, "resourcesPerNode": {"limits": {GPU: 1}},
                                 "env": _env(out, STEPS=20, MESSAGE="done")},
                     "runtimePatches": [{"manager": "test", "trainingRuntimeSpec": {"template": {"spec": {
                         "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                             "metadata": {"labels": {"app": "tj"}},
                             "spec": {"terminationGracePeriodSeconds": 1}}}}}]}}}}]}})
        wait_for(lambda: len(_pods(world)) == 2, timeout=5, message="two pods")
        names = sorted(_pods(world))
        assert all(n.startswith(("tj-node-0-0-", "tj-node-0-1-")) for n in names)
        wait_for(lambda: any(_cond(p, "PodScheduled").get("reason") == "Unschedulable"
                             for p in _pods(world).values()), timeout=5, message="one unschedulable")
        wait_for(lambda: world.jobs()["tj"].get("status", {}).get("jobsStatus"), timeout=3, message="jobsStatus")
        assert world.jobs()["tj"]["status"]["jobsStatus"][0]["active"] == 1
        assert _phase(world, "tj") == "Running"
        env = {e["name"]: e["value"] for p in _pods(world).values() for e in p["spec"]["containers"][0]["env"]
               if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"}
        assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == ("2", "1", "1")
        assert all(p["metadata"]["labels"]["app"] == "tj" for p in _pods(world).values())
        nodes.add("n2")
        wait_for(lambda: _phase(world, "tj") == "Succeeded", timeout=15, message="Complete")
        status = world.jobs()["tj"]["status"]
        assert status["jobsStatus"][0] == {"name": "node", "active": 0, "ready": 1, "succeeded": 1, "failed": 0,
                                           "suspended": 0}
        terminated = [p["status"]["containerStatuses"][0]["state"]["terminated"] for p in _pods(world).values()]
        assert [(t["exitCode"], t["reason"], t["message"]) for t in terminated] == [(0, "Completed", "done")] * 2


def test_a_failed_container_fails_its_pod_with_its_exit_code_and_termination_message(cluster, tmp_path):
    """The kubelet reports the exit: phase Failed, the container terminated with its exit code and the
    text the container left in the file SOLAR_TERMINATION_LOG names; the job Failed."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], **CLUSTER) as nodes:
        nodes.add("n1")
        cluster.create(world.jobs_path, pytorchjob("job", cmd, _env(out, STEPS=3, EXIT=2,
                                                                      MESSAGE="solar: refused: no data"), workers=0))
        wait_for(lambda: _phase(world, "job") == "Failed", timeout=15, message="Failed")
        pod = _pod(world, "job-master-0")
        assert pod["status"]["phase"] == "Failed" and _cond(pod, "Ready")["status"] == "False"
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (
            2, "Error", "solar: refused: no data")
        assert _cond(world.jobs()["job"], "Failed")["message"] == \
            "PyTorchJob job is failed because 1 Master replica(s) failed."
        wait_for(lambda: nodes.ran, timeout=3, message="ran")
        assert nodes.ran == [("job", 1, 2)]


def test_two_pods_rendezvous_each_in_its_own_torchrun(cluster, tmp_path):
    """Each pod runs its own torchrun (--nnodes from PET_NNODES, a static rendezvous at the master's
    port) in its own process session: one world of two ranks, all_reduce = 1 + 2; both pods Succeeded
    (exit code 0), the job Succeeded, ``ran`` records it."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["torchrun", "--nproc-per-node=1", _script(tmp_path, ALL_REDUCE, "all_reduce.py")]
    with Nodes(world, logs := [], **CLUSTER) as nodes:
        nodes.add("n1")
        nodes.add("n2")
        cluster.create(world.jobs_path, pytorchjob("ar", cmd, _env(out, STEPS=3)))
        try:
            wait_for(lambda: _phase(world, "ar") == "Succeeded", timeout=40, message="Succeeded")
        except AssertionError:
            raise AssertionError(logs) from None
        ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
        assert [(r["step"], r["sum"], r["world"]) for r in ranks] == [(3, 3.0, 2)] * 2
        assert {r["pod"] for r in ranks} == {"ar-master-0", "ar-worker-0"}
        assert ranks[0]["pgid"] != ranks[1]["pgid"]
        # the job succeeds on its master's success (Kubeflow's default success policy); the worker's
        # kubelet reports its own exit a moment later
        wait_for(lambda: {p["status"]["phase"] for p in _pods(world).values()} == {"Succeeded"}, timeout=10,
                 message="both pods Succeeded")
        for pod in _pods(world).values():
            assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
        wait_for(lambda: nodes.ran, timeout=3, message="ran")
        assert nodes.ran == [("ar", 2, 0)]


def test_a_silent_node_blocks_the_survivor_and_its_return_stops_and_confirms_the_deleted_pod(cluster, tmp_path):
    """A two-pod torchrun job; the worker's node goes silent (SIGSTOP): the master's rank blocks in its
    all_reduce (as over a real network). Evicted after grace + tolerationSeconds, the worker's pod stays
    Terminating; the job fails and its master pod is deleted (its kubelet stops it). When the node
    returns: SIGCONT, its kubelet stops the deleted pod's container and confirms: the pod is gone."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["torchrun", "--nproc-per-node=1", _script(tmp_path, ALL_REDUCE, "all_reduce.py")]
    with Nodes(world, logs := [], **CLUSTER) as nodes:
        nodes.add("n1")
        nodes.add("n2")
        cluster.create(world.jobs_path, pytorchjob("ar", cmd, _env(out)))

        def step(rank: int) -> int:
            try:
                return json.loads((out / f"rank-{rank}.json").read_text())["step"]
            except (OSError, ValueError):
                return 0
        wait_for(lambda: step(0) > 3 and step(1) > 3, timeout=40, message=f"both ranks step: {logs}")
        node = _pod(world, "ar-worker-0")["spec"]["nodeName"]
        nodes.lose_node(node, "silent")
        time.sleep(0.5)
        blocked = step(0)
        time.sleep(1.0)
        assert step(0) <= blocked + 1                       # the survivor hangs in its collective
        wait_for(lambda: (_pod(world, "ar-worker-0") or {}).get("metadata", {}).get("deletionTimestamp"),
                 timeout=6, message="evicted")
        wait_for(lambda: _phase(world, "ar") == "Failed", timeout=3, message="Failed")
        wait_for(lambda: "ar-master-0" not in _pods(world), timeout=10, message="the master stopped and gone")
        assert _pod(world, "ar-worker-0")["status"]["phase"] == "Running"
        nodes.return_node(node)
        wait_for(lambda: "ar-worker-0" not in _pods(world), timeout=10, message="stopped and confirmed")
        wait_for(lambda: nodes.ran, timeout=5, message="ran")
        assert nodes.ran[0][:2] == ("ar", 2) and nodes.ran[0][2] != 0


def test_a_dead_kubelet_s_evicted_process_runs_on_until_it_returns_then_is_killed(cluster, tmp_path):
    """dead-kubelet: the evicted pod's process keeps running (and writing) after its eviction and after
    its job failed and was deleted; once the kubelet returns it stops the container (SIGTERM, ignored
    here: SIGKILL after the grace) and confirms the deletion. A pod force-deleted meanwhile: its
    process is killed when the kubelet returns."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], **CLUSTER) as nodes:
        nodes.add("n1")
        nodes.add("n2")
        nodes.add("n3")
        cluster.create(world.jobs_path, pytorchjob("job", cmd, _env(out, IGNORE_TERM=1), workers=2))
        _started(world, nodes, out, "job", ["job-master-0", "job-worker-0", "job-worker-1"])
        node = _pod(world, "job-worker-0")["spec"]["nodeName"]
        other = _pod(world, "job-worker-1")["spec"]["nodeName"]
        nodes.lose_node(node, "dead-kubelet")
        nodes.lose_node(other, "dead-kubelet")
        wait_for(lambda: _phase(world, "job") == "Failed", timeout=6, message="Failed")
        cluster.delete(f"{world.jobs_path}/job")                # as the operator does
        time.sleep(1.5)
        assert _pod(world, "job-worker-0")["metadata"]["deletionTimestamp"]
        assert _growing(out, "job-worker-0")                 # evicted, job gone: still writing
        pods = f"/api/v1/namespaces/{world.namespace}/pods"
        cluster.delete(f"{pods}/job-worker-1", {"gracePeriodSeconds": 0})      # a force deletion
        assert _growing(out, "job-worker-1")
        nodes.return_node(node)
        nodes.return_node(other)
        returned = time.monotonic()
        wait_for(lambda: "job-worker-0" not in _pods(world), timeout=6, message="killed and confirmed")
        assert time.monotonic() - returned >= 0.9            # SIGTERM ignored: SIGKILL after the 1 s grace
        assert not _growing(out, "job-worker-0", 0.3) and not _growing(out, "job-worker-1", 0.3)
        ends = {name: code for name, code, _ in nodes.logs}
        assert ends["job-worker-0"] == 128 + signal.SIGKILL


def test_a_not_ready_kubelet_stops_and_confirms_the_evicted_pod(cluster, tmp_path):
    """not-ready: the kubelet still works: the taint manager's eviction is carried out (SIGTERM, the
    container exits) and confirmed while the node stays NotReady. A deleted job's pods are deleted
    gracefully (the garbage collector) and stopped by their kubelets."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, logs := [], **CLUSTER) as nodes:
        node = _two_node_job(world, nodes, out, cmd, env=_env(out), clean="None")
        nodes.lose_node(node, "not-ready")
        wait_for(lambda: "job-worker-0" not in _pods(world), timeout=8, message="evicted, stopped, confirmed")
        assert _cond(_node(world, node), "Ready")["status"] == "False"
        assert dict((n, c) for n, c, _ in logs)["job-worker-0"] == 128 + signal.SIGTERM
        assert _phase(world, "job") == "Failed" and "job-master-0" in _pods(world)   # cleanPodPolicy None
        cluster.delete(f"{world.jobs_path}/job")
        wait_for(lambda: not _pods(world), timeout=5, message="the job's pods gone with it")
        assert not _growing(out, "job-master-0", 0.3)


def test_a_pod_name_held_by_a_terminating_pod_is_retried(cluster, tmp_path):
    """A new job of the same name (as a SolarRun's next attempt is) cannot create its pod while the old
    one is Terminating on a lost node: the training operator retries (AlreadyExists) until it goes."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    cmd = ["python", _script(tmp_path, WORKER, "worker.py")]
    with Nodes(world, [], **CLUSTER) as nodes:
        node = _two_node_job(world, nodes, out, cmd, env=_env(out))
        nodes.lose_node(node, "silent")
        wait_for(lambda: _phase(world, "job") == "Failed", timeout=6, message="Failed")
        cluster.delete(f"{world.jobs_path}/job")
        wait_for(lambda: "job-master-0" not in _pods(world), timeout=5, message="the old master gone")
        nodes.add("n3")
        cluster.create(world.jobs_path, pytorchjob("job", cmd, _env(out), workers=1))
        uid = world.jobs()["job"]["metadata"]["uid"]
        wait_for(lambda: _pod(world, "job-master-0"), timeout=3, message="the new master")
        time.sleep(0.5)
        assert nodes.jobs[uid]["conflicts"] > 0
        assert _pod(world, "job-worker-0")["metadata"]["deletionTimestamp"]     # still the old one
        cluster.delete(f"/api/v1/namespaces/{world.namespace}/pods/job-worker-0", {"gracePeriodSeconds": 0})
        wait_for(lambda: (_pod(world, "job-worker-0") or {}).get("metadata", {}).get("ownerReferences", [{}])[0]
                 .get("uid") == uid, timeout=3, message="the new worker")
        nodes.return_node(node)


def test_the_fast_variant_is_kept(cluster, tmp_path):
    """The fast variant (the default): a gang, one standalone torchrun for the job, kill_node failing
    the pods at once."""
    world, out = _world(cluster, tmp_path), tmp_path / "out"
    out.mkdir()
    nodes = Nodes(world, [])
    assert not nodes.faithful and nodes.gang
    # its launch and signals are replaced here (no torch needed): a process that ends when signalled
    started = []

    class Proc:
        returncode = None
        pid = os.getpid()
        stderr = None

        def poll(self):
            return self.returncode

        def wait(self, timeout=None):
            return self.returncode

    def launch(job, cmd):
        started.append(cmd)
        return Proc()
    nodes._launch = launch
    nodes._signal = lambda job, sig, group=True: setattr(job["proc"], "returncode", -sig)
    with nodes:
        nodes.add("n1")
        nodes.add("n2")
        cluster.create(world.jobs_path, pytorchjob("job", ["torchrun", "--nproc-per-node=1", "x.py"], []))
        wait_for(lambda: started, timeout=5, message="launched")
        assert "--standalone" in started[0] and "--nproc-per-node=2" in started[0]
        assert nodes.kill_node("n2") == ["job"]
        wait_for(lambda: nodes.ran, timeout=5, message="ran")
        assert _cond(_node(world, "n2"), "Ready")["status"] == "False"
        # the job's controller fails it on its next pass over the failed pods
        wait_for(lambda: _phase(world, "job") == "Failed", timeout=5, message="the job Failed")
