"""``solar_operator.capacity``: what an elastic stage's pods say (disrupted, unschedulable, alive) and how
many nodes could hold one of its pods, from plain Kubernetes API documents; ``View``'s cached listing."""

from __future__ import annotations

from solar.run.pods import Pods
from solar_operator import capacity
from solar_operator.capacity import CACHE_SECONDS, View, disruption, free_nodes, quantity, stage_pods, unschedulable

ATTEMPT = "example.com/attempt"  # stage_pods matches the label it is given, whatever its name


def _pod(name: str = "p", *, phase: str = "Running", node: str | None = None, gpus: int = 0, uid: str | None = None,
         attempt: int | None = None, conditions: tuple[dict, ...] = (), reason: str | None = None,
         message: str | None = None) -> dict:
    meta = {"name": name, "uid": uid or f"uid-{name}"}
    if attempt is not None:
        meta["labels"] = {ATTEMPT: str(attempt)}
    spec = {"containers": [{"name": "c", "resources": {"limits": {capacity.GPU: str(gpus)}} if gpus else {}}]}
    if node:
        spec["nodeName"] = node
    status = {"phase": phase, "conditions": list(conditions)}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {"metadata": meta, "spec": spec, "status": status}


def _node(name: str, *, gpus: int | str = 8, ready: bool = True, cordoned: bool = False) -> dict:
    return {"metadata": {"name": name}, "spec": {"unschedulable": True} if cordoned else {},
            "status": {"allocatable": {capacity.GPU: str(gpus), "cpu": "64"},
                       "conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True" if ready else "False"}]}}


def _nodes(*nodes: dict) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in nodes}


NOW = 1_800_000_000.0


def _why(pod: dict, nodes: dict | None) -> str | None:
    """Why ``pod`` is disrupted now (a node lost for longer than 60 s), or None."""
    found = disruption(pod, nodes, now=NOW, lost_after=60)
    return found[0] if found else None


def _stage_pods(pods: list[dict], attempt: int | None, nodes: dict | None, label: str) -> Pods:
    return stage_pods(pods, attempt, nodes, label, now=NOW, lost_after=60)


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}


# disruption


def test_a_disruption_target_condition_names_the_pod_and_its_reason():
    pod = _pod("job-worker-1", conditions=({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                                            "message": "preempted by team-b/big"},))
    why = _why(pod, None)
    assert why is not None and "job-worker-1" in why and "PreemptionByScheduler" in why and "team-b/big" in why


def test_a_disruption_target_condition_that_is_not_true_is_no_disruption():
    pod = _pod(conditions=({"type": "DisruptionTarget", "status": "False", "reason": "PreemptionByScheduler"},))
    assert _why(pod, None) is None


def test_an_evicted_pod_is_named_with_its_reason():
    pod = _pod("job-master-0", phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    why = _why(pod, None)
    assert why is not None and "job-master-0" in why and "Evicted" in why and "low on resource" in why


def test_a_pod_on_a_node_that_is_gone_is_named_only_when_nodes_are_read():
    pod = _pod("job-worker-0", node="gpu-3")
    why = _why(pod, _nodes(_node("gpu-1")))
    assert why is not None and "job-worker-0" in why and "gpu-3" in why and "gone" in why
    assert _why(pod, None) is None


def test_a_pod_on_a_not_ready_node_is_named_only_when_nodes_are_read():
    pod = _pod("job-worker-0", node="gpu-1")
    why = _why(pod, _nodes(_node("gpu-1", ready=False)))
    assert why is not None and "job-worker-0" in why and "gpu-1" in why and "not Ready" in why
    assert _why(pod, None) is None


def test_a_healthy_pod_is_not_disrupted():
    pod = _pod(node="gpu-1", conditions=({"type": "Ready", "status": "True"},))
    assert _why(pod, _nodes(_node("gpu-1"))) is None
    assert _why(pod, None) is None
    assert _why(_pod(phase="Pending"), _nodes(_node("gpu-1"))) is None  # not bound to a node yet


def test_a_cordoned_but_ready_node_does_not_disrupt_its_pods():
    """Cordoning stops new pods; a drain then evicts them, which says so itself (DisruptionTarget)."""
    assert _why(_pod(node="gpu-1"), _nodes(_node("gpu-1", cordoned=True))) is None


# a node lost on a real cluster's timeline (issue 51): the grace counts from its kubelet's last heartbeat


def _iso(t: float) -> str:
    from solar.run.machine import iso

    return iso(t)


def _lost_node(name: str, *, heartbeat: float, transition: float, status: str = "Unknown") -> dict:
    """A node as the node lifecycle controller leaves it: Ready Unknown since ``transition``, the last
    heartbeat its kubelet posted kept, the unreachable NoExecute taint added."""
    node = _node(name)
    node["status"]["conditions"][1] = {"type": "Ready", "status": status, "reason": "NodeStatusUnknown",
                                       "lastHeartbeatTime": _iso(heartbeat), "lastTransitionTime": _iso(transition)}
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                               "timeAdded": _iso(transition)}]
    return node


def test_a_silent_node_disrupts_its_pods_once_its_kubelet_has_been_quiet_longer_than_the_grace():
    pod = _pod("job-worker-1", node="gpu-2")
    lost_at = NOW - 61
    nodes = _nodes(_lost_node("gpu-2", heartbeat=lost_at, transition=lost_at + 45))   # Unknown 45 s later
    found = disruption(pod, nodes, now=NOW, lost_after=60)
    assert found is not None and found[1] == lost_at            # the loss began at the last heartbeat
    assert "gpu-2" in found[0] and "Unknown" in found[0] and "61 s" in found[0] and "nodeLostSeconds 60" in found[0]
    assert disruption(pod, nodes, now=NOW - 2, lost_after=60) is None   # 59 s: within the grace
    assert disruption(pod, nodes, now=NOW, lost_after=120) is None      # a longer grace


def test_a_node_its_kubelet_reports_not_ready_counts_from_the_transition():
    pod = _pod("job-worker-1", node="gpu-2")
    nodes = _nodes(_lost_node("gpu-2", heartbeat=NOW - 1, transition=NOW - 70, status="False"))
    found = disruption(pod, nodes, now=NOW, lost_after=60)
    assert found is not None and found[1] == NOW - 70 and "not Ready for 70 s" in found[0]


def test_a_disruption_target_dates_the_loss_from_the_earlier_of_its_condition_and_the_node():
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
               "lastTransitionTime": _iso(NOW - 5)}
    pod = _pod("job-worker-1", node="gpu-2", conditions=(evicted,))
    assert disruption(pod, None, now=NOW, lost_after=60) == (
        "pod job-worker-1: DisruptionTarget (DeletionByTaintManager)", NOW - 5)
    nodes = _nodes(_lost_node("gpu-2", heartbeat=NOW - 345, transition=NOW - 300))
    assert disruption(pod, nodes, now=NOW, lost_after=60)[1] == NOW - 345


def test_pods_on_a_lost_node_are_not_alive_they_never_confirm_their_deletion():
    """The taint manager's eviction leaves a pod Terminating, phase Running, on a node that does not
    answer: a new attempt must not wait for it (the fence keeps its processes from committing)."""
    terminating = _pod("a1-1", attempt=1, node="gpu-2")
    terminating["metadata"]["deletionTimestamp"] = _iso(NOW - 10)
    saving = _pod("a1-0", attempt=1, node="gpu-1")            # a healthy node's pod: still saving, wait
    nodes = _nodes(_node("gpu-1"), _lost_node("gpu-2", heartbeat=NOW - 400, transition=NOW - 355))
    assert _stage_pods([terminating, saving], 1, nodes, ATTEMPT).alive == 1
    assert _stage_pods([terminating], 1, nodes, ATTEMPT).alive == 0
    gone = _nodes(_node("gpu-1"))                              # the node object deleted
    assert _stage_pods([terminating], 1, gone, ATTEMPT).alive == 0
    young = _nodes(_lost_node("gpu-2", heartbeat=NOW - 20, transition=NOW - 1))   # within the grace: wait
    assert _stage_pods([terminating], 1, young, ATTEMPT).alive == 1
    assert _stage_pods([terminating], 1, None, ATTEMPT).alive == 1                # nodes not read: wait


def test_a_partly_placed_attempt_is_unschedulable_and_its_disruption_dated():
    running = _pod("a2-0", attempt=2, node="gpu-1")
    pending = _pod("a2-1", attempt=2, phase="Pending", conditions=(UNSCHEDULABLE,))
    pods = _stage_pods([running, pending], 2, _nodes(_node("gpu-1")), ATTEMPT)
    assert pods == Pods(alive=2, unschedulable=True, disrupted=None, since=None, placed=("gpu-1",))


# unschedulable


def test_a_pending_pod_the_scheduler_could_not_place_is_unschedulable():
    assert unschedulable(_pod(phase="Pending", conditions=(UNSCHEDULABLE,)))


def test_scheduled_or_running_pods_are_not_unschedulable():
    scheduled = {"type": "PodScheduled", "status": "True"}
    assert not unschedulable(_pod(phase="Pending", conditions=(scheduled,)))
    assert not unschedulable(_pod(phase="Pending"))  # not looked at by the scheduler yet
    assert not unschedulable(_pod(phase="Running", conditions=(UNSCHEDULABLE,)))  # a stale condition
    other = dict(UNSCHEDULABLE, reason="SchedulingGated")
    assert not unschedulable(_pod(phase="Pending", conditions=(other,)))


# stage_pods


def test_alive_counts_every_attempts_pods_that_have_not_finished():
    pods = [_pod("a1-0", attempt=1, phase="Running"), _pod("a1-1", attempt=1, phase="Succeeded"),
            _pod("a2-0", attempt=2, phase="Pending"), _pod("a2-1", attempt=2, phase="Failed"),
            _pod("a2-2", attempt=2, phase="Running")]
    assert _stage_pods(pods, 2, None, ATTEMPT).alive == 3


def test_only_the_current_attempts_pods_make_the_stage_unschedulable():
    old = _pod("a1-0", attempt=1, phase="Pending", conditions=(UNSCHEDULABLE,))
    assert _stage_pods([old, _pod("a2-0", attempt=2)], 2, None, ATTEMPT).unschedulable is False
    new = _pod("a2-1", attempt=2, phase="Pending", conditions=(UNSCHEDULABLE,))
    assert _stage_pods([old, _pod("a2-0", attempt=2), new], 2, None, ATTEMPT).unschedulable is True


def test_only_the_current_attempts_pods_make_the_stage_disrupted():
    old = _pod("a1-0", attempt=1, phase="Failed", reason="Evicted")
    assert _stage_pods([old, _pod("a2-0", attempt=2)], 2, None, ATTEMPT).disrupted is None
    new = _pod("a2-1", attempt=2, node="gpu-9")
    why = _stage_pods([old, _pod("a2-0", attempt=2), new], 2, _nodes(_node("gpu-1")), ATTEMPT).disrupted
    assert why is not None and "a2-1" in why and "gpu-9" in why


def test_the_attempt_is_matched_by_the_label_given():
    pod = _pod("a2-0", attempt=2, phase="Failed", reason="Evicted")
    assert _stage_pods([pod], 2, None, ATTEMPT).disrupted is not None
    assert _stage_pods([pod], 2, None, "solarwm.io/attempt").disrupted is None  # another label: not this attempt's


def test_without_a_current_attempt_every_pod_counts_as_current():
    pods = [_pod("a1-0", attempt=1, phase="Pending", conditions=(UNSCHEDULABLE,)), _pod("x")]
    assert _stage_pods(pods, None, None, ATTEMPT) == Pods(alive=2, unschedulable=True, disrupted=None)


def test_no_pods_say_nothing():
    assert _stage_pods([], 3, {}, ATTEMPT) == Pods()


# free_nodes


def test_ready_schedulable_nodes_with_enough_gpus_are_free():
    nodes = [_node("a"), _node("b"), _node("small", gpus=4)]
    assert free_nodes(nodes, [], gpus=8, own=set()) == 2
    assert free_nodes(nodes, [], gpus=4, own=set()) == 3


def test_not_ready_and_cordoned_nodes_are_not_free():
    nodes = [_node("a"), _node("down", ready=False), _node("cordoned", cordoned=True)]
    assert free_nodes(nodes, [], gpus=8, own=set()) == 1
    no_conditions = {"metadata": {"name": "new"}, "status": {"allocatable": {capacity.GPU: "8"}}}
    assert free_nodes([no_conditions], [], gpus=8, own=set()) == 0


def test_nodes_without_gpus_are_not_free():
    bare = {"metadata": {"name": "cpu"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert free_nodes([bare], [], gpus=1, own=set()) == 0


def test_gpus_of_running_pods_bound_to_a_node_are_used():
    nodes = [_node("a"), _node("b")]
    pods = [_pod("x", node="a", gpus=4), _pod("y", node="b", gpus=8)]
    assert free_nodes(nodes, pods, gpus=8, own=set()) == 0
    assert free_nodes(nodes, pods, gpus=4, own=set()) == 1  # exactly enough left on a


def test_pods_on_one_node_add_up():
    pods = [_pod("x", node="a", gpus=2), _pod("y", node="a", gpus=3)]
    assert free_nodes([_node("a")], pods, gpus=3, own=set()) == 1
    assert free_nodes([_node("a")], pods, gpus=4, own=set()) == 0


def test_finished_pods_use_no_gpus():
    pods = [_pod("done", node="a", gpus=8, phase="Succeeded"), _pod("failed", node="b", gpus=8, phase="Failed")]
    assert free_nodes([_node("a"), _node("b")], pods, gpus=8, own=set()) == 2


def test_pods_not_bound_to_a_node_use_no_gpus():
    assert free_nodes([_node("a")], [_pod("pending", phase="Pending", gpus=8)], gpus=8, own=set()) == 1


def test_the_stages_own_pods_do_not_count_as_using_gpus():
    pods = [_pod("mine", node="a", gpus=8, uid="u-1"), _pod("theirs", node="b", gpus=8, uid="u-2")]
    assert free_nodes([_node("a"), _node("b")], pods, gpus=8, own={"u-1"}) == 1


def test_gpu_requests_count_when_there_is_no_limit_and_containers_add_up():
    pod = _pod("x", node="a")
    pod["spec"]["containers"] = [{"name": "c1", "resources": {"requests": {capacity.GPU: "3"}}},
                                 {"name": "c2", "resources": {"limits": {capacity.GPU: 2}}}]
    assert free_nodes([_node("a")], [pod], gpus=3, own=set()) == 1
    assert free_nodes([_node("a")], [pod], gpus=4, own=set()) == 0


# quantity


def test_quantity_reads_gpu_counts_and_anything_else_as_zero():
    assert quantity("8") == 8 and quantity(8) == 8 and quantity("0") == 0
    assert quantity("") == 0 and quantity(None) == 0 and quantity("lots") == 0


# View.cluster


class _Kube:
    """The two listings View asks the Kube client for; every call counted, each answer a new list."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_nodes(self) -> list[dict]:
        self.calls.append("nodes")
        return [_node(f"n{len(self.calls)}")]

    def list_all_pods(self) -> list[dict]:
        self.calls.append("pods")
        return [_pod(f"p{len(self.calls)}")]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_without_read_nodes_the_cluster_is_unknown_and_nothing_is_listed():
    kube = _Kube()
    view = View(kube, read_nodes=False, clock=_Clock())
    assert view.cluster() is None and view.cluster(fresh=True) is None
    assert kube.calls == []


def test_the_cluster_listing_is_cached_for_cache_seconds():
    kube, clock = _Kube(), _Clock()
    view = View(kube, read_nodes=True, clock=clock)
    first = view.cluster()
    assert kube.calls == ["nodes", "pods"]
    nodes, pods = first
    assert [n["metadata"]["name"] for n in nodes] == ["n1"] and [p["metadata"]["name"] for p in pods] == ["p2"]
    clock.now += CACHE_SECONDS - 0.01
    assert view.cluster() == first and len(kube.calls) == 2
    clock.now += 0.01
    again = view.cluster()
    assert len(kube.calls) == 4 and again != first


def test_fresh_lists_again_within_the_cache_and_refreshes_it():
    kube, clock = _Kube(), _Clock()
    view = View(kube, read_nodes=True, clock=clock)
    first = view.cluster()
    clock.now += 0.5
    fresh = view.cluster(fresh=True)
    assert len(kube.calls) == 4 and fresh != first
    clock.now += CACHE_SECONDS - 0.01  # within the fresh listing's time: it is the one kept
    assert view.cluster() == fresh and len(kube.calls) == 4


# the operator's view of an elastic stage: a grow back is decided on the nodes as they are now


class _Cluster:
    """Kube for ``Reconciler._pods_view``: the stage's own pods, and nodes and pods that change
    between listings (``listings``: one (nodes, pods) per listing, the last repeated)."""

    def __init__(self, own: list[dict], listings: list[tuple[list[dict], list[dict]]]) -> None:
        self.own, self.listings, self.calls = own, listings, 0

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        return self.own

    def list_nodes(self) -> list[dict]:
        self.calls += 1
        return self.listings[min(self.calls, len(self.listings)) - 1][0]

    def list_all_pods(self) -> list[dict]:
        return self.listings[min(self.calls, len(self.listings)) - 1][1]


def _elastic_run():
    """tiny-wan with fm on 4 nodes x 2 GPUs (4, 2 or 1 node keep its batch), shrunk to 1 node, attempt 3
    running on n1; its plan."""
    import copy

    import yaml

    from solar.run.plan import plan_run
    from solar.run.spec import ElasticStatus, SolarRun, SolarRunStatus, StageStatus
    from tests.conftest import REPO

    doc = copy.deepcopy(yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text()))
    doc["spec"]["topology"] = {"nodes": 4, "gpusPerNode": 2, "elastic": {"minNodes": 1}}
    doc["spec"]["resources"] = {"limits": {capacity.GPU: 2}}
    spec = SolarRun.model_validate(doc).spec
    plan = plan_run(spec, "/runs/tiny-wan", repo=REPO, environ={})
    shrunk = SolarRunStatus(stages=[StageStatus(name="fm", phase="Running", attempt=3,
                                                elastic=ElasticStatus(nodes=1, shrinks=1))])
    run = {"metadata": {"name": "tiny-wan", "namespace": "ns", "uid": "u"}}
    return run, spec, plan, shrunk


def _view_of(kube):
    from solar_operator.runs import Reconciler

    clock = _Clock()
    reconciler = Reconciler(kube, backend=None, storage_root="/runs", repo=".", read_nodes=True)
    reconciler.capacity = View(kube, read_nodes=True, clock=clock)
    reconciler.capacity.cluster()        # a listing another run's pass made a moment ago
    clock.now += CACHE_SECONDS / 2
    return reconciler


def test_a_grow_the_cached_listing_allows_is_decided_on_a_fresh_one():
    from solar.run.machine import JobState

    run, spec, plan, shrunk = _elastic_run()
    mine = _pod("tiny-wan-fm-master-0", node="n1", gpus=2, uid="mine")
    mine["metadata"].update(namespace="ns", labels={"solarwm.io/attempt": "3", "solarwm.io/run": "tiny-wan",
                                                      "solarwm.io/stage": "fm"})
    nodes = [_node(f"n{i}", gpus=2) for i in range(1, 5)]
    taken = [_pod(f"other-{i}", node=f"n{i}", gpus=2) for i in (2, 3, 4)]   # a pending job bound since
    kube = _Cluster([mine], [(nodes, [mine]), (nodes, [mine, *taken])])
    reconciler = _view_of(kube)
    jobs = {"fm": JobState("tiny-wan-fm", "Running", attempt=3)}
    _, room = reconciler._pods_view(run, spec, plan, shrunk, jobs, NOW)
    assert kube.calls == 2 and room["fm"] == 1   # the cache said 4: listed again, the stage stays on 1


def test_a_stage_that_cannot_grow_is_decided_on_the_cached_listing():
    from solar.run.machine import JobState
    from solar.run.spec import SolarRunStatus, StageStatus

    run, spec, plan, shrunk = _elastic_run()
    mine = _pod("tiny-wan-fm-master-0", node="n1", gpus=2, uid="mine")
    mine["metadata"].update(namespace="ns", labels={"solarwm.io/attempt": "3", "solarwm.io/run": "tiny-wan",
                                                      "solarwm.io/stage": "fm"})
    nodes = [_node(f"n{i}", gpus=2) for i in range(1, 5)]
    kube = _Cluster([mine], [(nodes, [mine]), ([], [])])
    jobs = {"fm": JobState("tiny-wan-fm", "Running", attempt=3)}
    at_plan = SolarRunStatus(stages=[StageStatus(name="fm", phase="Running", attempt=3)])   # never shrunk
    for previous, job in ((at_plan, jobs), (shrunk, {"fm": JobState("tiny-wan-fm", "Created", attempt=3)})):
        kube.calls = 0
        reconciler = _view_of(kube)
        _, room = reconciler._pods_view(run, spec, plan, previous, job, NOW)
        assert kube.calls == 1 and room["fm"] == 4


def test_a_failed_attempt_whose_pods_are_gone_was_disrupted_when_a_node_it_ran_on_is_gone():
    """PodGC marks a deleted node's pods and force-deletes them at once; the status recorded the nodes."""
    master = _pod("a2-0", attempt=2, phase="Failed", node="gpu-1")
    nodes = _nodes(_node("gpu-1"))
    found = _stage_pods([master], 2, nodes, ATTEMPT)
    assert found.disrupted is None and found.placed == ("gpu-1",)
    found = stage_pods([master], 2, nodes, ATTEMPT, now=NOW, lost_after=60, ran_on=("gpu-1", "gpu-2"))
    assert found.disrupted == "its pods are gone, and node gpu-2, which it ran on, is gone"
    assert stage_pods([master], 2, None, ATTEMPT, now=NOW, lost_after=60, ran_on=("gpu-2",)).disrupted is None


def test_an_unschedulable_shrink_the_cached_listing_allows_is_decided_on_a_fresh_one():
    """A listing up to CACHE_SECONDS old may show pods pending that were bound since: the shrink would stop
    an attempt whose ranks run (helper-found in the elastic chaos bench: 6 of 22 such shrinks)."""
    from solar.run.machine import JobState, iso
    from solar.run.spec import ElasticStatus, SolarRunStatus, StageStatus

    run, spec, plan, _ = _elastic_run()
    labels = {"solarwm.io/attempt": "3", "solarwm.io/run": "tiny-wan", "solarwm.io/stage": "fm"}
    pending = _pod("tiny-wan-fm-3-worker-1", phase="Pending", gpus=2, uid="w1", conditions=(UNSCHEDULABLE,))
    bound = _pod("tiny-wan-fm-3-worker-1", node="n2", gpus=2, uid="w1")
    for pod in (pending, bound):
        pod["metadata"].update(namespace="ns", labels=labels)
    nodes = [_node(f"n{i}", gpus=2) for i in range(1, 5)]
    waited = SolarRunStatus(stages=[StageStatus(name="fm", phase="Running", attempt=3, elastic=ElasticStatus(
        nodes=4, unschedulableSince=iso(NOW - 400)))])        # shrinkAfterSeconds 300 has passed
    kube = _Cluster([], [(nodes, [pending]), (nodes, [bound])])
    reconciler = _view_of(kube)
    pods, _ = reconciler._pods_view(run, spec, plan, waited, {"fm": JobState("tiny-wan-fm-3", "Running", attempt=3)},
                                    NOW)
    assert kube.calls == 2 and not pods["fm"].unschedulable and pods["fm"].placed == ("n2",)
    # not yet due: the cached listing serves
    young = waited.model_copy(deep=True)
    young.stages[0].elastic.unschedulableSince = iso(NOW - 10)
    kube = _Cluster([], [(nodes, [pending]), (nodes, [bound])])
    reconciler = _view_of(kube)
    pods, _ = reconciler._pods_view(run, spec, plan, young, {"fm": JobState("tiny-wan-fm-3", "Running", attempt=3)},
                                    NOW)
    assert kube.calls == 1 and pods["fm"].unschedulable
