"""What a stage's pods say, and how many nodes could hold one of its pods now (issues 45 and 51).

``stage_pods``: the stage's pods (any attempt) not yet gone, those on a lost node excepted (they never
confirm their deletion: solar.run.pods), whether a pod of the current attempt is unschedulable
(``PodScheduled=False/Unschedulable``, as the scheduler reports it, whatever the job's phase), and why
and since when the current attempt's pods were disrupted: a ``DisruptionTarget`` condition (eviction,
preemption, taint manager, node lifecycle: Kubernetes sets it before it deletes the pod),
``status.reason`` Evicted/Preempting/NodeLost, or, where nodes are read, a node that is gone or has
not been Ready for longer than the stage's grace (``lost_after``), counted from its kubelet's last
heartbeat (``lastHeartbeatTime`` of its Ready condition; the node lifecycle controller marks the node
``Unknown`` about 40-50 s after it and leaves that time as it was).

``free_nodes`` (only with ``--read-nodes``: cluster-scope get/list/watch on nodes and list on pods):
Ready, schedulable nodes whose allocatable ``nvidia.com/gpu`` less what the non-finished pods on
them request (this stage's own current pods not counted: they would move) holds one of the stage's
pods. Taints, node selectors and affinities are not modelled. Without nodes read, the figure is
unknown (None): a disrupted or unschedulable stage shrinks one allowed shape at a time and never
grows back (docs/elastic.md).

Pure functions over API documents; ``View`` does the listing, with a short cache so that many
runs reconciling at once share one listing of nodes and pods.
"""

from __future__ import annotations

import threading
import time

from solar.run.machine import parse_iso
from solar.run.pods import Pods

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


def _time(text) -> float | None:
    try:
        return parse_iso(text)
    except (TypeError, ValueError):
        return None


def lost_since(node: dict) -> float | None:
    """When a node that is not Ready was last known well (epoch seconds): the earlier of its Ready
    condition's last heartbeat (what the node lifecycle controller keeps when it marks the node
    Unknown) and its transition (a kubelet reporting Ready=False itself keeps heartbeating); None when
    the node is Ready, or says nothing of when."""
    ready = next((c for c in _conditions(node) if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") == "True":
        return None
    times = [t for t in (_time((ready or {}).get("lastHeartbeatTime")),
                         _time((ready or {}).get("lastTransitionTime"))) if t is not None]
    return min(times) if times else None


def node_lost(name: str | None, nodes: dict[str, dict] | None, *, now: float, lost_after: float) -> str | None:
    """How the node ``name`` is lost ("is gone", "has been Unknown ... for N s": not Ready for longer than
    ``lost_after`` seconds), or None: not lost, not yet, or nodes not read."""
    if nodes is None or not name:
        return None
    if name not in nodes:
        return "is gone"
    ready = next((c for c in _conditions(nodes[name]) if c.get("type") == "Ready"), {})
    if ready.get("status") == "True":
        return None
    since = lost_since(nodes[name])
    state = "Unknown (its kubelet stopped reporting)" if ready.get("status") == "Unknown" else "not Ready"
    if since is None:      # a Ready condition without times: how long is not known, so no grace either
        return f"is {state}"
    if now - since <= lost_after:
        return None
    return f"has been {state} for {now - since:.0f} s (nodeLostSeconds {lost_after:g})"


def disruption(pod: dict, nodes: dict[str, dict] | None, *, now: float, lost_after: float
               ) -> tuple[str, float | None] | None:
    """Why this pod was disrupted and since when (epoch seconds, None when not known), or None."""
    name = pod["metadata"]["name"]
    node = (pod.get("spec") or {}).get("nodeName")
    since = [t for t in ([lost_since(nodes[node])] if nodes and node in nodes else []) if t is not None]
    for c in _conditions(pod):
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            detail = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            when = since + [t for t in (_time(c.get("lastTransitionTime")),) if t is not None]
            return f"pod {name}: DisruptionTarget ({detail or 'no reason given'})", min(when) if when else None
    status = pod.get("status") or {}
    if status.get("reason") in DISRUPTED_REASONS:
        return f"pod {name}: {status['reason']}" + (f" ({status['message']})" if status.get("message") else ""), \
            min(since) if since else None
    lost = node_lost(node, nodes, now=now, lost_after=lost_after)
    if lost:
        return f"pod {name}: its node {node} {lost}", min(since) if since else None
    return None


def unschedulable(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase", "Pending") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in _conditions(pod))


def stage_pods(pods: list[dict], attempt: int | None, nodes: dict[str, dict] | None, attempt_label: str, *,
               now: float, lost_after: float, ran_on: tuple[str, ...] = ()) -> Pods:
    """``Pods`` of one stage from its pods (every attempt's); ``attempt``: the current one's; a node is lost
    ``lost_after`` seconds after its kubelet last reported; ``ran_on``: the nodes the status recorded the
    current attempt's pods on."""
    current = [p for p in pods if attempt is None or (p["metadata"].get("labels") or {}).get(attempt_label)
               == str(attempt)]
    found = [d for d in (disruption(p, nodes, now=now, lost_after=lost_after) for p in current) if d]
    times = [t for _, t in found if t is not None]
    alive = sum(not _finished(p) and not node_lost((p.get("spec") or {}).get("nodeName"), nodes, now=now,
                                                   lost_after=lost_after) for p in pods)
    placed = sorted({n for p in current if (n := (p.get("spec") or {}).get("nodeName"))})
    if not found:    # its pods may be gone already (PodGC): the nodes it was seen on speak for them
        for name in ran_on:
            lost = None if name in placed else node_lost(name, nodes, now=now, lost_after=lost_after)
            if lost:
                since = lost_since(nodes[name]) if name in nodes else None
                found.append((f"its pods are gone, and node {name}, which it ran on, {lost}", since))
                if since is not None:
                    times.append(since)
                break
    return Pods(alive=alive, unschedulable=any(unschedulable(p) for p in current),
                disrupted=found[0][0] if found else None, since=min(times) if times else None,
                placed=tuple(placed))


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
