"""Node loss on a real cluster's timeline (issue 51), with the real trainer and the real operator
(``--read-nodes``) against the faithful emulated cluster (``tests.integration.nodes``, ``faithful=True``:
kubelets that heartbeat, the node lifecycle controller, the taint manager, PodGC, a scheduler that binds
one pod at a time, the training operators' phases, each pod its own torchrun over a rendezvous).

Times are scaled down and stated: the node-monitor grace 2 s (40-50 s real), the kubelets' heartbeat
0.5 s (10 s), the taint manager's default tolerationSeconds 120 s (300 s), the kubelets' termination grace
3 s (30 s), ``nodeLostSeconds`` 3 s (60 s). So the eviction comes long after the operator must have
acted: a test that waits for it fails by its own bounds.

- A silent node (its ranks SIGSTOPped, the survivor blocked in its collective) and a dead kubelet (its
  ranks run on) are replaced while the job still reads Running, the stage continues on the other node
  without waiting for the lost node to return, and trains what the uninterrupted run trains; when the
  silent node comes back, its woken rank commits nothing and writes nothing the live attempt reads.
- A PyTorchJob or TrainJob whose second pod stays Pending while its first runs (the job reads Running)
  shrinks after ``shrinkAfterSeconds``.
- A stage that is not elastic is replaced at its own shape while its job reads Running, without
  spending a retry (``StageDisrupted``).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.helpers import steps, train
from tests.integration.nodes import Nodes
from tests.integration.world import World, crds, load_case
from tests.support.kube import emulated_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 16
CLUSTER = dict(faithful=True, heartbeat=0.5, node_grace=2.0, toleration_seconds=120.0, termination_grace=3.0)
LOST_AFTER = 3          # spec.topology.elastic.nodeLostSeconds / --node-lost-seconds
TOLERATION = CLUSTER["toleration_seconds"]


def _doc(storage: Path, data: Path, *, name: str, elastic: dict | None, steps_: int = STEPS) -> dict:
    doc = load_case("three-stage")
    doc["metadata"]["name"] = name
    doc["spec"]["topology"] = {"nodes": 2, "gpusPerNode": 1, **({"elastic": elastic} if elastic else {})}
    doc["spec"]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    doc["spec"]["storage"].update(mountPath=str(storage), path=name)
    doc["spec"]["volumes"] = []
    doc["spec"]["runPolicy"]["backoffLimit"] = 0     # a disruption must not spend a retry
    doc["spec"]["stages"] = [dict(doc["spec"]["stages"][0], set=[
        f"data.root={data}", "runtime.validate_every=0", f"train.max_steps={steps_}", "runtime.save_every=1"])]
    return doc


def _slow_steps(monkeypatch) -> None:
    """Every step of the emulated pods' trainers takes a second more (the trainer's drill
    ``SOLAR_SLOW_STEP_SECONDS``, in the kubelet's pod environment). Where the lost node's ranks go on
    training (a dead kubelet; a node NotReady with its processes alive) the survivor trains with them
    until the operator acts, and at full speed the stage could finish first: 13 steps left after the
    loss then take 13 s, the operator about 6."""
    import tests.integration.nodes as kubelets

    plain = kubelets.env
    monkeypatch.setattr(kubelets, "env", lambda extra=None: {
        **plain(extra), "SOLAR_ALLOW_FAULTS": "1", "SOLAR_SLOW_STEP_SECONDS": "1"})


def _fm(status: dict) -> dict:
    """The stage's status (empty before the operator's first pass)."""
    return (status.get("stages") or [{}])[0]


def _latest(stage_dir: Path) -> int:
    found = sorted(p.name for p in (stage_dir / "checkpoints").glob("step_*") if (p / "COMPLETE.json").is_file())
    return int(found[-1].split("_")[1]) if found else 0


def _first_step_of_launch(stage_dir: Path, n: int) -> dict | None:
    """Rank 0's first step record of its ``n``-th launch (1-based), in file order: with a dead kubelet the
    first launch's ranks go on stepping after the loss, so a step's time alone does not say whose it is."""
    path = stage_dir / "events" / "rank-00000.jsonl"
    started = 0
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            e = json.loads(line)
        except json.JSONDecodeError:     # a line being written
            return None
        started += e["event"] == "start"
        if started == n and e["event"] == "step":
            return e
    return None


def _config() -> Path:
    from tests.conftest import REPO

    return REPO / load_case("three-stage")["spec"]["stages"][0]["config"]


@pytest.fixture(scope="module")
def reference(wan_data, tmp_path_factory) -> dict[int, dict]:
    """The uninterrupted two-rank run of the same stage: step -> its step record."""
    out = tmp_path_factory.mktemp("node-loss-reference") / "fm"
    storage = out.parent / "plan"
    doc = _doc(storage, wan_data, name="reference", elastic=None)
    from solar.run.plan import plan_run
    from solar.run.spec import SolarRun
    from tests.conftest import REPO

    spec = SolarRun.model_validate(doc).spec
    sets = [s for s in plan_run(spec, str(storage / "reference"), repo=REPO, environ={}).stage("fm").sets
            if not s.startswith("runtime.output_dir=")] + [f"runtime.output_dir={out}"]
    proc = train(_config(), sets, nproc=2, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {e["step"]: e for e in steps(out)}


def _same_training(stage_dir: Path, reference: dict[int, dict]) -> None:
    got: dict[int, dict] = {}
    for event in steps(stage_dir):      # a step done again after the loss equals the first time
        if event["step"] in got:
            assert event["loss_mean"] == pytest.approx(got[event["step"]]["loss_mean"], rel=1e-5)
        got[event["step"]] = event
    assert sorted(got) == sorted(reference) == list(range(1, STEPS + 1))
    for step, want in reference.items():
        assert got[step]["loss_mean"] == pytest.approx(want["loss_mean"], rel=1e-5), step
        assert got[step]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), step


def _snapshot(stage_dir: Path) -> dict[str, bytes]:
    """Every file of the stage a live attempt reads or writes (heartbeats aside: no one trusts a stale
    one's time), by content."""
    out = {}
    for path in sorted(stage_dir.rglob("*")):
        rel = path.relative_to(stage_dir).as_posix()
        if path.is_file() and not rel.startswith(("heartbeat/", "logs/")) and rel != ".writer.lock":
            out[rel] = path.read_bytes()
    return out


@pytest.mark.parametrize("how", ["silent", "dead-kubelet"])
def test_a_lost_node_is_replaced_while_the_job_still_runs_and_the_stage_goes_on_without_it(
        how, wan_data, reference, tmp_path, monkeypatch):
    if how == "dead-kubelet":
        _slow_steps(monkeypatch)
    storage = tmp_path / "runs"
    fm = storage / "lost" / "fm"
    logs: list = []
    doc = _doc(storage, wan_data, name="lost", elastic={
        "minNodes": 1, "shrinkAfterSeconds": 30, "growBack": False, "nodeLostSeconds": LOST_AFTER})
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        with Nodes(world, logs, **CLUSTER) as nodes, world.operator(backends=("PyTorchJob",), read_nodes=True):
            nodes.add("n1")
            nodes.add("n2")
            world.apply(doc)
            wait_for(lambda: _latest(fm) >= 3, timeout=180, interval=0.05, message="two-node steps")
            lost_at = time.time()
            nodes.lose_node("n2", how)
            shrunk = world.wait_status("lost", lambda s: (_fm(s).get("elastic") or {}).get("nodes") == 1,
                                       "the stage shrunk to one node", timeout=TOLERATION / 4)
            decided = time.time() - lost_at
            job = world.jobs().get("lost-fm")
            first = wait_for(lambda: _first_step_of_launch(fm, 2),
                             timeout=120, interval=0.1, message="the one-node attempt's first step")
            recovered = first["time"] - lost_at
            if how == "silent":      # the node comes back: its woken rank must leave the stage as it is
                wait_for(lambda: _latest(fm) >= first["step"] + 1, timeout=120, interval=0.05,
                         message="a checkpoint of the live attempt")
                before = _snapshot(fm)
                nodes.return_node("n2")
                time.sleep(4)        # SIGCONT, then the kubelet's SIGTERM and, 3 s later, SIGKILL
                after = _snapshot(fm)
                live_board = max((k for k in after if k.startswith("tensorboard/")), default="\0")   # the live launch's file
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                                 and not k.startswith(("events/rank-00000", "checkpoints/step_", live_board)))
                if "run-result.json" in changed:     # the live attempt finished meanwhile
                    assert json.loads(after["run-result.json"])["status"] == "complete"
                    changed.remove("run-result.json")
                assert changed == [], changed       # the live attempt (world 1) writes only rank 0's files
                woken = "\n".join(tail for _pod, _code, tail in logs)
                assert "of stage fm is stale: attempt 2 took over" in woken and "(exit status 3)" in woken
            status = world.wait_phase("lost", "Succeeded", timeout=300)
            pods = cluster.list(f"/api/v1/namespaces/{world.namespace}/pods")["items"]
    st = status["stages"][0]
    assert shrunk["stages"][0]["reason"] == "TopologyShrunk" and "n2" in shrunk["stages"][0]["message"]
    assert "has been Unknown" in shrunk["stages"][0]["message"]
    # acted on the node, long before the taint manager's eviction would have failed the job
    assert decided < LOST_AFTER + 2 * CLUSTER["node_grace"] + 3, decided
    assert job is None or job["metadata"].get("deletionTimestamp") or "Failed" not in json.dumps(job.get("status"))
    # the grace, the survivor's termination grace (its rank is blocked in a collective) and one launch
    assert recovered < 60, recovered
    assert [a["topology"]["nodes"] for a in st["attempts"]] == [2, 1]
    assert st["failures"] == 0 and st["elastic"]["shrinks"] == 1
    # the cost runs from the loss (the node's last heartbeat) to that first step, as measured here
    assert st["elastic"]["disruptionSeconds"] == pytest.approx(recovered, abs=3.0)
    _same_training(fm, reference)
    assert json.loads((fm / "run-result.json").read_text())["status"] == "complete"
    if how == "dead-kubelet":    # its rank ran on unconfirmed: its pod stays Terminating on the node
        stale = [p for p in pods if p["spec"].get("nodeName") == "n2" and p["metadata"]["name"].startswith("lost-fm")]
        assert stale and all(p["metadata"].get("deletionTimestamp") for p in stale), stale


@pytest.mark.parametrize("backend", ["PyTorchJob", "TrainJob"])
def test_a_partly_placed_attempt_that_reads_running_shrinks_after_shrink_after_seconds(backend, wan_data, tmp_path):
    """One node holds a GPU: the scheduler binds the first pod and leaves the second Pending
    (Unschedulable); the PyTorchJob reads Running (its master runs), the TrainJob's child job counts the
    pending pod active. The clock starts from the pods."""
    storage = tmp_path / "runs"
    fm = storage / "partial" / "fm"
    logs: list = []
    doc = _doc(storage, wan_data, name="partial", elastic={"minNodes": 1, "shrinkAfterSeconds": 3, "growBack": False},
               steps_=3)
    doc["spec"]["backend"] = backend
    with emulated_cluster(crds(backend), tmp_path) as cluster, ExitStack():
        world = World(cluster, storage, backend=backend)
        if backend == "TrainJob":
            world.install_runtime()
        with Nodes(world, logs, **CLUSTER) as nodes, world.operator(backends=(backend,), read_nodes=True):
            nodes.add("n1")
            nodes.add("gpu-less", gpus=0)
            world.apply(doc)
            def first_attempt_unschedulable():
                status, jobs = world.status("partial"), list(world.jobs().values())
                first = [j for j in jobs if j["metadata"]["labels"].get("solarwm.io/attempt") == "1"]
                return (status, first[0]) if first and (_fm(status).get("elastic") or {}).get(
                    "unschedulableSince") else None
            seen, job = wait_for(first_attempt_unschedulable, timeout=60, message="the pods' Unschedulable seen")
            status = world.wait_phase("partial", "Succeeded", timeout=240)
    assert seen["stages"][0]["phase"] in ("Pending", "Running")
    if backend == "PyTorchJob":
        assert any(c["type"] == "Running" and c["status"] == "True" for c in job["status"]["conditions"])
    else:
        assert job["status"]["jobsStatus"][0]["active"] == 1    # its one child Job, a pod of it pending
    st = status["stages"][0]
    assert [a["topology"]["nodes"] for a in st["attempts"]] == [2, 1]
    assert "stayed unschedulable" in st["attempts"][1]["reason"] and st["failures"] == 0
    assert [e["step"] for e in steps(fm)] == [1, 2, 3]


def test_a_stage_that_is_not_elastic_is_replaced_at_its_shape_while_its_job_runs(wan_data, reference, tmp_path,
                                                                                  monkeypatch):
    _slow_steps(monkeypatch)
    storage = tmp_path / "runs"
    fm = storage / "fixed" / "fm"
    logs: list = []
    doc = _doc(storage, wan_data, name="fixed", elastic=None)
    with emulated_cluster(crds("PyTorchJob"), tmp_path) as cluster:
        world = World(cluster, storage)
        with Nodes(world, logs, **CLUSTER) as nodes, world.operator(backends=("PyTorchJob",), read_nodes=True,
                                                                    node_lost_seconds=LOST_AFTER):
            for name in ("n1", "n2", "n3"):
                nodes.add(name)
            world.apply(doc)
            wait_for(lambda: _latest(fm) >= 3, timeout=180, interval=0.05, message="steps")
            used = {p["spec"].get("nodeName") for p in cluster.list(f"/api/v1/namespaces/{world.namespace}/pods")[
                "items"] if p["spec"].get("nodeName")}
            victim = sorted(used)[-1]
            lost_at = time.time()
            nodes.lose_node(victim, "not-ready")
            disrupted = world.wait_status("fixed", lambda s: _fm(s).get("reason") == "StageDisrupted",
                                          "StageDisrupted", timeout=TOLERATION / 4)
            decided = time.time() - lost_at
            status = world.wait_phase("fixed", "Succeeded", timeout=300)
            reasons = world.event_reasons("fixed")
    assert decided < LOST_AFTER + 5, decided
    assert "attempt 1's pods were disrupted" in disrupted["stages"][0]["message"] and victim in \
        disrupted["stages"][0]["message"]
    st = status["stages"][0]
    assert st["failures"] == 0 and st["attempt"] == 2 and st.get("elastic") is None
    assert "StageDisrupted" in reasons and "StageRetrying" not in reasons
    _same_training(fm, reference)
