"""Time to recover from a lost node on a real cluster's timeline (issue 51 item 6).

One elastic SolarRun (the tiny Wan Stage0.5 through the real trainer, 2 nodes of 1 GPU, ``minNodes: 1``,
``growBack: false``) on the faithful emulated cluster (``tests.integration.nodes``, ``faithful=True``:
kubelets that heartbeat, the node lifecycle controller, the taint manager, PodGC, a one-pod-at-a-time
scheduler, the training operators' phases, each pod its own torchrun over a rendezvous) with the real
operator (``--read-nodes``). After a few committed steps one node is lost, one kind per case, and it
never comes back:

- ``deleted``: the Node object deleted (PodGC marks its pods and force-deletes them), its processes gone;
- ``not-ready``: its kubelet reports ``Ready=False`` and goes on (containers kept, deletions confirmed);
- ``silent``: its kubelet stops and its ranks are SIGSTOPped (power or network loss): the survivor
  blocks in its collective;
- ``dead-kubelet``: its kubelet stops, its ranks run on and keep writing.

Measured from the loss (seconds, this machine's clock): the operator's decision (the status shows the
shape change or StageDisrupted), the old attempt's last pod going (the survivor; a pod on the lost node
never goes), the next attempt's job created, its ranks' first ``start`` record, its first step.

Times are Kubernetes' defaults unless ``--scale`` shrinks every one of them: the kubelets' heartbeat
10 s, node-monitor grace 40 s, the taint manager's tolerationSeconds 300 s, the pods' termination grace
30 s, PodGC's quarantine of a deleted node's pods 40 s, ``nodeLostSeconds`` 60 s (the field's default). ``--tree DIR`` runs another checkout's trainer and
operator against the same cluster (the tree before issue 51: no ``nodeLostSeconds``), ``--cap`` bounds a
case that does not recover.

    .venv/bin/python bench/operator/node_loss_timeline.py --kinds deleted not-ready silent dead-kubelet
    PYTHONPATH=/work/old/trainer:/work/old/operator .venv/bin/python bench/operator/node_loss_timeline.py \\
        --tree /work/old --kinds silent --cap 480
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.integration.nodes import Nodes  # noqa: E402
from tests.integration.world import World, crds, load_case  # noqa: E402
from tests.support.kube import emulated_cluster, run_kopf_operator, wait_for  # noqa: E402

DEFAULTS = dict(heartbeat=10.0, node_grace=40.0, toleration_seconds=300.0, termination_grace=30.0, podgc_delay=40.0)
NODE_LOST_SECONDS = 60.0


def _say(text: str) -> None:
    print(f"node_loss_timeline: {text}", file=sys.stderr, flush=True)


def _doc(storage: Path, data: Path, lost_after: float | None) -> dict:
    doc = load_case("three-stage")
    doc["metadata"]["name"] = "lost"
    elastic = {"minNodes": 1, "growBack": False}
    if lost_after is not None:
        elastic["nodeLostSeconds"] = int(round(lost_after))
    doc["spec"]["topology"] = {"nodes": 2, "gpusPerNode": 1, "elastic": elastic}
    doc["spec"]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    doc["spec"]["storage"].update(mountPath=str(storage), path="lost")
    doc["spec"]["volumes"] = []
    doc["spec"]["runPolicy"]["backoffLimit"] = 0
    doc["spec"]["stages"] = [dict(doc["spec"]["stages"][0], set=[
        f"data.root={data}", "runtime.validate_every=0", "train.max_steps=100000", "runtime.save_every=1",
        "runtime.log_every=1000"])]
    return doc


def _records(stage_dir: Path, kind: str) -> list[dict]:
    path = stage_dir / "events" / "rank-00000.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == kind:
            out.append(record)
    return out


def _latest(stage_dir: Path) -> int:
    found = sorted(p.name for p in (stage_dir / "checkpoints").glob("step_*") if (p / "COMPLETE.json").is_file())
    return int(found[-1].split("_")[1]) if found else 0


def _operator(world: World, read_nodes: bool, lost_after: float):
    """The real operator's handlers and reconciler (another tree's, when PYTHONPATH says so)."""
    import kopf

    from solar_operator import handlers
    from solar_operator.main import reconciler

    kwargs = dict(url=world.cluster.url, default_backend="PyTorchJob", backends=("PyTorchJob",), read_nodes=read_nodes)
    if "node_lost_seconds" in inspect.signature(reconciler).parameters:
        kwargs["node_lost_seconds"] = lost_after
    world.reconciler = reconciler(world.storage, **kwargs)
    return run_kopf_operator(lambda registry: handlers.register(registry, poll_seconds=1.0, backends=("PyTorchJob",)),
                             world.cluster, memo=kopf.Memo(runs=world.reconciler))


def case(how: str, *, scale: float, cap: float, data: Path, work: Path, new_tree: bool) -> dict:
    times = {k: v * scale for k, v in DEFAULTS.items()}
    lost_after = NODE_LOST_SECONDS * scale
    storage = work / how / "runs"
    fm = storage / "lost" / "fm"
    logs: list = []
    out: dict = {"kind": how, "scale": scale, **{k: round(v, 2) for k, v in times.items()},
                 "node_lost_seconds": round(lost_after, 2) if new_tree else None}
    (work / how).mkdir(parents=True, exist_ok=True)
    with emulated_cluster(crds("PyTorchJob"), work / how) as cluster:
        world = World(cluster, storage)
        with Nodes(world, logs, faithful=True, tick=0.1, **times) as nodes, _operator(world, True, lost_after):
            nodes.add("n1")
            nodes.add("n2")
            world.apply(_doc(storage, data, lost_after if new_tree else None))
            wait_for(lambda: _latest(fm) >= 3, timeout=300, interval=0.1, message="two-node steps")
            pods = cluster.list(f"/api/v1/namespaces/{world.namespace}/pods")["items"]
            victim = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].endswith("-worker-0"))
            out["lost_node"] = victim
            t0 = time.time()
            nodes.lose_node(victim, how)
            _say(f"{how}: lost {victim} at step {_latest(fm)}")
            seen: dict[str, float] = {}
            deadline = t0 + cap
            while time.time() < deadline and "first_step" not in seen:
                now = time.time() - t0
                status = world.status("lost")
                stage = (status.get("stages") or [{}])[0]
                if "decided" not in seen and (stage.get("reason") in ("TopologyShrunk", "StageDisrupted") or (
                        stage.get("elastic") or {}).get("nodes") == 1):
                    seen["decided"] = now
                    out["reason"], out["message"] = stage.get("reason"), stage.get("message")
                jobs = world.jobs()
                if "job_deleted" not in seen and "decided" in seen and not any(
                        j["metadata"]["labels"].get("solarwm.io/attempt") == "1" and not j["metadata"].get(
                            "deletionTimestamp") for j in jobs.values()):
                    seen["job_deleted"] = now
                pods = cluster.list(f"/api/v1/namespaces/{world.namespace}/pods")["items"]
                old = [p for p in pods if p["metadata"]["labels"].get("solarwm.io/attempt") == "1"
                       and p["spec"].get("nodeName") != victim]
                if "survivor_gone" not in seen and "decided" in seen and not old:
                    seen["survivor_gone"] = now
                if "created" not in seen and any(j["metadata"]["labels"].get("solarwm.io/attempt") == "2"
                                                 for j in jobs.values()):
                    seen["created"] = now
                starts = [r for r in _records(fm, "start") if r["time"] > t0]
                if "ranks_started" not in seen and starts:
                    seen["ranks_started"] = starts[0]["time"] - t0
                steps = [r for r in _records(fm, "step") if r["time"] > t0 + seen.get("ranks_started", cap)]
                if steps:
                    seen["first_step"] = steps[0]["time"] - t0
                    out["first_step_number"] = steps[0]["step"]
                time.sleep(0.2)
            out.update({k: round(v, 1) for k, v in seen.items()})
            out["recovered"] = "first_step" in seen
            stage = (world.status("lost").get("stages") or [{}])[0]
            out["attempts"] = [a["topology"]["nodes"] for a in stage.get("attempts") or []]
            out["disruption_seconds"] = (stage.get("elastic") or {}).get("disruptionSeconds")
            if out["recovered"]:     # the status's account of the cost comes with the next observation of it
                try:
                    stage = world.wait_status("lost", lambda s: ((s.get("stages") or [{}])[0].get("elastic") or {})
                                              .get("disruptionSeconds"), "the cost recorded", timeout=15)["stages"][0]
                    out["disruption_seconds"] = stage["elastic"]["disruptionSeconds"]
                except AssertionError:
                    pass
            lost_pods = [p["metadata"]["name"] for p in cluster.list(f"/api/v1/namespaces/{world.namespace}/pods")[
                "items"] if p["spec"].get("nodeName") == victim]
            out["left_on_lost_node"] = lost_pods
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["deleted", "not-ready", "silent", "dead-kubelet"])
    parser.add_argument("--scale", type=float, default=1.0, help="every Kubernetes time x this (1: the defaults)")
    parser.add_argument("--cap", type=float, default=420.0, help="seconds a case may take to recover")
    parser.add_argument("--tree", default=None, help="another checkout run against the same cluster (its trainer "
                                                     "and operator on PYTHONPATH); recorded in the output")
    parser.add_argument("--out", default=None, help="append each case's JSON line to this file")
    args = parser.parse_args()
    from solar.data.synth import synthesize

    import solar_operator

    tree = str(Path(solar_operator.__file__).resolve().parents[2])
    new_tree = args.tree is None
    with tempfile.TemporaryDirectory(prefix="node-loss-") as tmp:
        work = Path(tmp)
        data = work / "data"
        synthesize("wan22_ti2v_5b", data, samples=4, seed=3)
        for how in args.kinds:
            result = case(how, scale=args.scale, cap=args.cap, data=data, work=work, new_tree=new_tree)
            result["tree"] = args.tree or tree
            line = json.dumps(result)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(line + "\n")


if __name__ == "__main__":
    main()
