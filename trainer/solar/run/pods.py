"""What a stage's pods say, as the operator reads them (``solar_operator.capacity``; ``solar run`` has
none): the state machine's observation of a stage's pods on a real cluster's timeline (issue 51).

A node lost to a real cluster does not fail its pods at once: the node lifecycle controller marks it
``Ready=Unknown`` about 40-50 s after its kubelet last spoke, the taint manager evicts its pods after
their ``tolerationSeconds`` (300 s by default), and an evicted pod on an unreachable node stays
Terminating until its node returns or is deleted, because no kubelet confirms the deletion. The
training operators report the job Running all the while. So the operator decides from the pods and
nodes, not from the job: an attempt is ``disrupted`` once a pod has ``DisruptionTarget=True`` (or an
eviction's ``status.reason``) or sits on a node that is gone or not Ready for longer than the
stage's grace (``nodeLostSeconds``), whatever its job's phase; and a pod on such a lost node is not
``alive``: it will never confirm its deletion, and the fence (``solar.storage.fence``) keeps the
processes it may still run from committing anything once the next attempt has started.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pods:
    """``alive``: pods of any attempt not yet gone, those on a lost node excepted (a new attempt waits
    for the rest: the old ranks may still be saving); ``unschedulable``: a pod of the current attempt is
    Pending with ``PodScheduled=False/Unschedulable`` (whatever the job's phase says: the scheduler
    binds pods one at a time, so an attempt may be partly placed); ``disrupted``: why the current
    attempt's pods were disrupted, or None; ``since``: when that disruption began (epoch seconds: the
    pod's ``DisruptionTarget`` transition or its node's loss, whichever is first; None when not known);
    ``placed``: the nodes the current attempt's pods are bound to (the state machine keeps them in the
    attempt's record: PodGC force-deletes a deleted node's pods moments after marking them, so the
    operator may see only the failed job, and then the recorded node, gone, says why)."""
    alive: int = 0
    unschedulable: bool = False
    disrupted: str | None = None
    since: float | None = None
    placed: tuple[str, ...] = ()
