"""What an elastic stage's pods say, and how many nodes could hold one of its pods now (issue 45).

``stage_pods``: the stage's pods (any attempt) not yet gone, whether a pending pod of the current
attempt is unschedulable (``PodScheduled=False/Unschedulable``, as the scheduler reports it), and why
the current attempt's pods were disrupted: a ``DisruptionTarget`` condition (eviction, preemption,
taint manager, node lifecycle: Kubernetes sets it before it deletes the pod), ``status.reason``
Evicted/Preempting/NodeLost, or, where nodes are read, a node that is gone or not Ready.

``free_nodes`` (only with ``--read-nodes``: cluster-scope get/list/watch on nodes and list on pods):
Ready, schedulable nodes whose allocatable ``nvidia.com/gpu`` less what the non-finished pods on
them request (this stage's own current pods not counted: they would move) holds one of the stage's
pods. Taints, node selectors and affinities are not modelled. Without nodes read, the figure is
unknown (None): a disrupted or unschedulable stage shrinks one allowed shape at a time and never
grows back (docs/elastic.md).

Pure functions over API documents; ``View`` does the listing, with a short cache so that many
elastic runs reconciling at once share one listing of nodes and pods.
"""

from __future__ import annotations

import threading
import time

from solar.run.elastic import Pods

GPU = "nvidia.com/gpu"
DISRUPTED_REASONS = ("Evicted", "Preempting", "NodeLost", "NodeShutdown", "Terminated")
CACHE_SECONDS = 2.0


def _conditions(doc: dict) -> list[dict]:
    return (doc.get("status") or {}).get("conditions") or []


def node_ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in _conditions(node)) \
        and not (node.get("spec") or {}).get("unschedulable")


def _finished(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def quantity(text) -> int:
    """A GPU count quantity ("8", 8)."""
    try:
        return int(str(text))
    except ValueError:
        return 0


def pod_gpus(pod: dict) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        total += quantity((res.get("limits") or {}).get(GPU, (res.get("requests") or {}).get(GPU, 0)))
    return total


def disruption(pod: dict, nodes: dict[str, dict] | None) -> str | None:
    """Why this pod was disrupted, or None."""
    name = pod["metadata"]["name"]
    for c in _conditions(pod):
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            detail = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            return f"pod {name}: DisruptionTarget ({detail or 'no reason given'})"
    status = pod.get("status") or {}
    if status.get("reason") in DISRUPTED_REASONS:
        return f"pod {name}: {status['reason']}" + (f" ({status['message']})" if status.get("message") else "")
    node = (pod.get("spec") or {}).get("nodeName")
    if nodes is not None and node:
        if node not in nodes:
            return f"pod {name}: its node {node} is gone"
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in _conditions(nodes[node])):
            return f"pod {name}: its node {node} is not Ready"
    return None


def unschedulable(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase", "Pending") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in _conditions(pod))


def stage_pods(pods: list[dict], attempt: int | None, nodes: dict[str, dict] | None,
               attempt_label: str) -> Pods:
    """``Pods`` of one stage from its pods (every attempt's); ``attempt``: the current one's."""
    current = [p for p in pods if attempt is None or (p["metadata"].get("labels") or {}).get(attempt_label)
               == str(attempt)]
    why = next((w for w in (disruption(p, nodes) for p in current) if w), None)
    return Pods(alive=sum(not _finished(p) for p in pods), unschedulable=any(unschedulable(p) for p in current),
                disrupted=why)


def free_nodes(nodes: list[dict], pods: list[dict], *, gpus: int, own: set[str]) -> int:
    """Nodes that could hold one pod needing ``gpus`` GPUs now; pods whose uid is in ``own`` (the
    stage's current pods) do not count as using theirs."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not _finished(pod) and pod["metadata"].get("uid") not in own:
            used[node] = used.get(node, 0) + pod_gpus(pod)
    count = 0
    for node in nodes:
        if not node_ready(node):
            continue
        allocatable = quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        if allocatable - used.get(node["metadata"]["name"], 0) >= gpus:
            count += 1
    return count


class View:
    """The listings behind ``stage_pods`` and ``free_nodes`` (nodes and every pod only with
    ``read_nodes``), cached for ``CACHE_SECONDS``."""

    def __init__(self, kube, *, read_nodes: bool, clock=time.monotonic) -> None:
        self.kube, self.read_nodes, self.clock = kube, read_nodes, clock
        self._guard = threading.Lock()
        self._cluster: tuple[float, list[dict], list[dict]] | None = None

    def cluster(self, *, fresh: bool = False) -> tuple[list[dict], list[dict]] | None:
        """(nodes, every pod) or None without nodes read; ``fresh``: not from the cache (a disruption or a
        grow back is being decided on: the shape must fit the nodes as they are now)."""
        if not self.read_nodes:
            return None
        with self._guard:
            cached = self._cluster
        if not fresh and cached is not None and self.clock() - cached[0] < CACHE_SECONDS:
            return cached[1], cached[2]
        nodes, pods = self.kube.list_nodes(), self.kube.list_all_pods()
        with self._guard:
            self._cluster = (self.clock(), nodes, pods)
        return nodes, pods
