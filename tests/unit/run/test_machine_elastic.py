"""Elastic training stages in the state machine (issue 45 items 2, 3 and 5), pure: a stage whose pods
were disrupted or stay unschedulable continues at a smaller allowed shape, not counted as a failure;
one that runs shrunk grows back when the cluster holds more, at most once per minSecondsBetweenChanges;
the status keeps each attempt's shape, reason and GPU-hours, and what the disruptions cost."""

from __future__ import annotations

import copy

import yaml

from solar.run.pods import Pods
from solar.run.machine import ATTEMPTS_KEPT, JobState, Observation, iso, reconcile
from solar.run.observe import StageFiles
from solar.run.plan import plan_run
from solar.run.spec import SolarRun
from tests.conftest import REPO
from tests.unit.run.executor import carry_out

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
T0 = 1_800_000_000.0


def _spec(**elastic):
    doc = copy.deepcopy(MANIFEST)
    # 4 nodes x 2 GPUs, global batch 8: 4 nodes (accumulation 1), 2 (2) and 1 (4) keep it
    doc["spec"]["topology"] = {"nodes": 4, "gpusPerNode": 2, "elastic": {"minNodes": 1, **elastic}}
    doc["spec"]["runPolicy"]["backoffLimit"] = 0
    doc["spec"]["stages"][0]["set"].append("train.max_steps=100")   # checkpoints 6-11 are not its last
    return SolarRun.model_validate(doc).spec


class Sim:
    """reconcile driven like the operator: jobs, pods and capacity are what the test says."""

    def __init__(self, spec=None, **elastic):
        self.spec = spec or _spec(**elastic)
        self.plan = plan_run(self.spec, "/runs/tiny-wan", repo=REPO, environ={})
        self.status, self.now = None, T0
        self.jobs: dict[str, JobState] = {}
        self.pods: dict[str, Pods] = {}
        self.capacity: dict[str, int] = {}
        self.latest: int | None = None
        self.last_step: tuple[int, float] | None = None   # rank 0's newest step record
        self.result: str | None = None                     # run-result.json's status
        self.usage: dict | None = None                     # ... and its usage (each launch's start)
        self.files_extra: dict = {}                        # other StageFiles fields
        self.created, self.deleted, self.events = [], [], []
        self.changes, self.costs = [], []

    def step(self, advance: float = 0.0):
        self.now += advance
        files = {"fm": StageFiles(exists=self.latest is not None, launched=self.latest is not None,
                                  latest=self.latest, last_activity=self.now, last_step=self.last_step,
                                  result=self.result, usage=self.usage, **self.files_extra)}
        obs = Observation("tiny-wan", 1, self.now, plan=self.plan, jobs=dict(self.jobs), files=files,
                          pods=dict(self.pods), capacity=dict(self.capacity))
        d = reconcile(self.spec, self.status, obs)
        carry_out(d, self.jobs, self.created, self.deleted)
        self.events += d.events
        self.changes += d.shape_changes
        self.costs += d.disruption_costs
        self.status = d.status
        return d

    def shrunk_to_one_node(self, latest: int = 6):
        """Attempt 1 failed with a node deleted, attempt 2 created and running at one node."""
        self.step()
        self.latest = latest
        self.set_job("Failed")
        self.pods["fm"] = Pods(disrupted="node n2 deleted")
        self.capacity["fm"] = 1
        self.step(1)
        self.pods["fm"] = Pods()
        self.step(1)
        self.set_job("Running")

    def lost_while_running(self, why: str, *, since_ago: float | None = None, capacity: int = 3,
                           after: float = 60, latest: int = 10):
        """Attempt 1 runs and commits ``latest``; ``after`` s later its pods are found disrupted (the job
        still Running), the loss ``since_ago`` s before that pass, the cluster holding ``capacity`` nodes."""
        self.step()
        self.set_job("Running")
        self.latest = latest
        self.step(after)
        self.pods["fm"] = Pods(disrupted=why, since=None if since_ago is None else self.now + 1 - since_ago)
        self.capacity["fm"] = capacity
        return self.step(1)

    def set_job(self, phase, **kw):
        job = self.jobs["fm"]
        self.jobs["fm"] = JobState(job.name, phase, attempt=job.attempt, **kw)

    @property
    def fm(self):
        return self.status.stage("fm")

    def reasons(self):
        return [reason for _, reason, _ in self.events]


def test_the_plan_lists_the_allowed_shapes_and_an_attempt_at_another_shape_carries_it():
    sim = Sim()
    assert [(s.nodes, s.accumulation) for s in sim.plan.stage("fm").elastic] == [(4, 1), (2, 2), (1, 4)]
    from solar.run.elastic import shaped

    two = shaped(sim.plan.stage("fm"), 2)
    assert (two.nodes, two.world_size, two.accumulation) == (2, 4, 2)
    assert "distributed.world_size=4" in two.sets and "train.gradient_accumulation=2" in two.sets
    assert "distributed.world_size=8" not in two.sets and "train.gradient_accumulation=1" not in two.sets


def test_a_disrupted_attempt_shrinks_to_what_the_cluster_holds_without_spending_a_retry():
    sim = Sim()
    sim.step()
    assert sim.created[-1].nodes is None                    # the declared 4 nodes
    sim.set_job("Running")
    sim.latest = 10
    sim.step(60)
    sim.set_job("Failed", message="exit code 1")
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-worker-1: node n3 NotReady")
    sim.capacity["fm"] = 3                                  # one node lost: 3 of 4 hold a pod
    d = sim.step(5)
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")]
    assert sim.status.phase == "Running" and sim.fm.failures == 0    # backoffLimit 0, still running
    assert sim.fm.reason == "TopologyShrunk" and sim.fm.elastic.nodes == 2 and sim.fm.elastic.shrinks == 1
    message = sim.fm.message
    assert "4 nodes (world 8, accumulation 1) -> 2 nodes (world 4, accumulation 2)" in message
    assert "node n3 NotReady" in message and "not counted as a failure" in message
    assert sim.changes == [("fm", "shrink")] and "TopologyShrunk" in sim.reasons()
    sim.pods["fm"] = Pods(alive=1)                          # the lost node's pod is not gone yet: wait
    d = sim.step(1)
    assert not d.actions
    sim.pods["fm"] = Pods()
    d = sim.step(1)
    create = d.actions[0]
    assert (create.kind, create.attempt, create.nodes) == ("create_job", 2, 2)
    assert create.resume_from == "/runs/tiny-wan/fm/checkpoints/step_00000010"
    first, second = sim.fm.attempts
    assert (first.topology.nodes, second.topology.nodes, second.topology.gradientAccumulation) == (4, 2, 2)
    assert second.topology.globalBatchSize == first.topology.globalBatchSize == 8
    assert second.reason.startswith("TopologyShrunk: attempt 1's pods were disrupted")
    assert first.endTime is not None and first.gpuHours == round(8 * 67 / 3600, 4)
    # the cost of the disruption ends at the first checkpoint committed after it
    sim.set_job("Running")
    sim.step(30)
    assert sim.costs == [] and sim.fm.elastic.disruptedAt is not None
    sim.latest = 11
    sim.step(30)
    assert sim.costs == [("fm", 62.0)] and sim.fm.elastic.disruptionSeconds == 62.0   # from 65 s to 127 s
    assert sim.fm.elastic.disruptedAt is None


def test_a_disruption_with_room_for_the_same_shape_retries_it_and_without_nodes_read_goes_one_smaller():
    sim = Sim()
    sim.step()
    sim.latest = 4
    sim.set_job("Failed")
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-master-0: evicted")
    sim.capacity["fm"] = 4                                   # a spare node took its place
    sim.step(1)
    assert sim.fm.reason == "StageDisrupted" and sim.fm.elastic.nodes == 4 and sim.fm.failures == 0
    sim.pods["fm"] = Pods()
    sim.step(1)
    assert sim.created[-1].nodes is None and sim.created[-1].attempt == 2
    # the operator cannot read nodes (no capacity figure): the next smaller allowed shape
    sim.set_job("Failed")
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-worker-0: DisruptionTarget (DeletionByTaintManager)")
    del sim.capacity["fm"]
    sim.step(1)
    assert sim.fm.elastic.nodes == 2 and sim.fm.reason == "TopologyShrunk"


def test_an_ordinary_failure_of_an_elastic_stage_still_counts_against_the_backoff_limit():
    sim = Sim()
    sim.step()
    sim.set_job("Failed", message="exit code 1")
    sim.pods["fm"] = Pods()                                  # no disruption: the trainer failed
    sim.step(1)
    assert sim.status.phase == "Failed" and sim.fm.reason == "BackoffLimitExceeded"


def test_pods_unschedulable_for_shrink_after_seconds_shrink_the_stage_to_what_fits():
    sim = Sim(shrinkAfterSeconds=300)
    sim.step()
    sim.pods["fm"] = Pods(unschedulable=True)
    sim.capacity["fm"] = 2
    sim.step(10)
    assert sim.fm.elastic.unschedulableSince is not None and not sim.deleted
    sim.step(200)
    assert not sim.deleted                                   # 200 s < 300 s
    sim.pods["fm"] = Pods()                                  # scheduled after all: the clock resets
    sim.step(50)
    assert sim.fm.elastic.unschedulableSince is None
    sim.pods["fm"] = Pods(unschedulable=True)
    sim.step(10)
    sim.step(299)
    assert not sim.deleted
    d = sim.step(2)
    assert [a.kind for a in d.actions] == ["delete_job"] and sim.fm.elastic.nodes == 2
    assert "stayed unschedulable for 301 s (shrinkAfterSeconds 300)" in sim.fm.message
    sim.pods["fm"] = Pods()
    sim.step(1)
    assert sim.created[-1].nodes == 2
    # nothing smaller fits either: it keeps waiting rather than thrash
    sim.pods["fm"] = Pods(unschedulable=True)
    sim.capacity["fm"] = 0
    sim.step(1)
    sim.step(400)
    assert len(sim.deleted) == 1


def test_a_shrunk_stage_grows_back_when_the_cluster_holds_more_at_most_once_per_interval():
    sim = Sim(minSecondsBetweenChanges=600)
    sim.shrunk_to_one_node()
    assert sim.created[-1].nodes == 1
    sim.capacity["fm"] = 4                                   # the nodes are back at once
    sim.step(100)
    assert len(sim.deleted) == 1                             # but the last change was 100 s ago
    d = sim.step(500)
    assert [a.kind for a in d.actions] == ["delete_job"]     # stops after its step and saves (SIGTERM)
    assert sim.fm.reason == "TopologyGrown" and sim.fm.elastic.nodes == 4 and sim.fm.elastic.grows == 1
    assert "1 node (world 2, accumulation 4) -> 4 nodes (world 8, accumulation 1)" in sim.fm.message
    assert sim.changes == [("fm", "shrink"), ("fm", "grow")] and sim.status.phase == "Running"
    sim.pods["fm"] = Pods(alive=1)                           # its pod is saving: no new attempt yet
    assert not sim.step(5).actions
    sim.pods["fm"] = Pods()
    sim.latest = 9                                           # the checkpoint saved on stop
    d = sim.step(5)
    assert d.actions[0].nodes is None and d.actions[0].resume_from.endswith("step_00000009")
    assert sim.fm.attempts[-1].reason.startswith("TopologyGrown")
    assert sim.fm.failures == 0


def test_grow_back_off_keeps_the_smaller_shape():
    sim = Sim(growBack=False)
    sim.step()
    sim.set_job("Failed")
    sim.pods["fm"] = Pods(disrupted="preempted")
    sim.capacity["fm"] = 2
    sim.step(1)
    sim.pods["fm"] = Pods()
    sim.step(1)
    sim.set_job("Running")
    sim.capacity["fm"] = 4
    sim.step(10_000)
    assert sim.fm.elastic.nodes == 2 and len(sim.deleted) == 1


def test_the_attempts_list_keeps_the_last_fifty_and_counts_the_rest():
    sim = Sim()
    sim.step()
    for _ in range(ATTEMPTS_KEPT + 7):
        sim.set_job("Failed")
        sim.pods["fm"] = Pods(disrupted="evicted")
        sim.capacity["fm"] = 4
        sim.step(1)
        sim.pods["fm"] = Pods()
        sim.step(1)
    assert len(sim.fm.attempts) == ATTEMPTS_KEPT and sim.fm.attemptsDropped == 8
    assert sim.fm.attempts[-1].attempt == ATTEMPTS_KEPT + 8 and sim.fm.failures == 0
    size = len(sim.status.model_dump_json())
    assert size < 64 * 1024   # far under the API server's 1.5 MiB object limit


# a real cluster's timeline (issue 51): the job still reads Running when a node is lost


def test_a_running_attempt_whose_node_was_lost_is_replaced_at_once_and_the_cost_runs_from_the_loss():
    sim = Sim()
    d = sim.lost_while_running("pod tiny-wan-fm-1-worker-1: its node n2 has been Unknown for 61 s",
                               since_ago=6)                     # the node's kubelet last spoke then
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")]
    assert sim.fm.reason == "TopologyShrunk" and sim.fm.elastic.nodes == 2 and sim.fm.failures == 0
    assert sim.fm.elastic.disruptedAt == "2027-01-15T08:00:55Z"   # T0 + 55: the loss, not the decision
    sim.pods["fm"] = Pods()                                     # its pods are gone (or on the lost node)
    d = sim.step(1)
    assert d.actions[0].kind == "create_job" and d.actions[0].nodes == 2
    sim.set_job("Running")
    sim.last_step = (10, sim.now + 5)                           # the old attempt's step: no
    sim.step(10)
    assert sim.costs == []
    sim.last_step = (11, sim.now + 20)                          # the first step past checkpoint 10
    sim.step(30)
    assert sim.costs == [("fm", 37.0)] and sim.fm.elastic.disruptionSeconds == 37.0   # 55 s -> 92 s


def test_a_dead_kubelets_old_attempt_saving_after_the_loss_does_not_end_the_disruption():
    """Its ranks keep running and may commit a checkpoint after the loss: the cost ends only with a step
    of an attempt started since, past the checkpoint that attempt resumed."""
    sim = Sim()
    sim.lost_while_running("pod tiny-wan-fm-1-worker-1: its node n2 has been Unknown for 61 s", since_ago=62)
    sim.pods["fm"] = Pods(alive=1)                              # the healthy node's pod is saving
    sim.latest, sim.last_step = 12, (12, sim.now + 1)           # ... and commits step 12 (the old attempt)
    sim.step(5)
    assert sim.costs == [] and sim.fm.elastic.disruptedAt is not None
    sim.pods["fm"] = Pods()
    d = sim.step(5)
    assert d.actions[0].resume_from.endswith("step_00000012")
    sim.set_job("Running")
    sim.step(20)
    assert sim.costs == []
    sim.last_step = (13, sim.now)
    sim.step(1)
    assert sim.costs == [("fm", 92.0)]


def test_a_stage_that_is_not_elastic_waits_for_its_shape_after_a_disruption_not_counting_it():
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["topology"] = {"nodes": 2, "gpusPerNode": 1}
    doc["spec"]["runPolicy"]["backoffLimit"] = 0
    sim = Sim(spec=SolarRun.model_validate(doc).spec)
    sim.step()
    sim.set_job("Running")
    sim.latest = 2
    sim.step(30)
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-worker-0: DisruptionTarget (DeletionByTaintManager)")
    d = sim.step(1)
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")]
    assert sim.fm.reason == "StageDisrupted" and sim.fm.failures == 0 and sim.status.phase == "Running"
    assert "attempt 1's pods were disrupted" in sim.fm.message and "at 2 nodes (world 2" in sim.fm.message
    assert "resumes the newest verified checkpoint" in sim.fm.message and sim.fm.elastic is None
    assert sim.reasons()[-1] == "StageDisrupted"
    sim.pods["fm"] = Pods(alive=1)
    assert not sim.step(1).actions                              # its other pod is still going
    sim.pods["fm"] = Pods()
    d = sim.step(1)
    assert (d.actions[0].kind, d.actions[0].attempt, d.actions[0].nodes) == ("create_job", 2, None)
    assert d.actions[0].resume_from.endswith("step_00000002")
    sim.set_job("Failed", message="exit code 1")                # a failure of its own is still counted
    sim.step(1)
    assert sim.status.phase == "Failed" and sim.fm.reason == "BackoffLimitExceeded"


def test_a_partly_placed_attempt_that_reads_running_shrinks_after_shrink_after_seconds():
    sim = Sim(shrinkAfterSeconds=30)
    sim.step()
    sim.set_job("Running")                                      # the master runs; a worker is Pending
    sim.pods["fm"] = Pods(unschedulable=True)
    sim.capacity["fm"] = 3
    sim.step(1)
    assert sim.fm.elastic.unschedulableSince is not None and not sim.deleted
    sim.step(20)
    assert not sim.deleted
    d = sim.step(11)
    assert [a.kind for a in d.actions] == ["delete_job"] and sim.fm.reason == "TopologyShrunk"
    assert sim.fm.elastic.nodes == 2 and "stayed unschedulable for 31 s" in sim.fm.message


def test_no_grow_back_once_the_last_step_is_committed():
    sim = Sim(minSecondsBetweenChanges=0)
    sim.shrunk_to_one_node()
    sim.latest = 100                                             # train.max_steps: validation may still run
    sim.capacity["fm"] = 4
    sim.step(1)
    assert len(sim.deleted) == 1 and sim.fm.elastic.grows == 0
    sim.latest = 99                                              # (a step before it would grow)
    sim.step(1)
    assert len(sim.deleted) == 2 and sim.fm.elastic.grows == 1


def test_an_attempt_stopped_by_a_signal_after_saving_resumes_whatever_its_job_reads_and_is_not_counted():
    """Its pods exit 0 after a stop (python -m solar.launch.torchrun), so a drained node's job may read
    Succeeded: not a finished stage, not a failure."""
    for phase in ("Succeeded", "Failed"):
        sim = Sim()
        sim.step()
        sim.set_job("Running")
        sim.latest = 10
        sim.step(30)
        sim.latest, sim.result = 12, "stopped"                  # SIGTERM: the step finished and saved
        sim.usage = {"attempts": [{"started": iso(sim.now - 60)}]}     # before attempt 1 started: not its
        sim.set_job(phase)
        sim.step(0)
        assert sim.fm.reason == ("ResultIncomplete" if phase == "Succeeded" else "BackoffLimitExceeded"), phase
        sim = Sim()
        sim.step()
        sim.set_job("Running")
        sim.latest = 10
        sim.step(30)
        sim.latest, sim.result = 12, "stopped"
        sim.usage = {"attempts": [{"started": iso(sim.now - 25)}]}     # this attempt's launch
        sim.set_job(phase)
        d = sim.step(1)
        assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")], phase
        assert sim.fm.reason == "StageStopped" and sim.fm.failures == 0 and sim.status.phase == "Running"
        assert "saved at step 12" in sim.fm.message and f"reads {phase}" in sim.fm.message
        d = sim.step(1)
        assert d.actions[0].kind == "create_job" and d.actions[0].resume_from.endswith("step_00000012")
        sim.usage = {"attempts": [*sim.usage["attempts"], {"started": iso(sim.now)}]}
        sim.set_job(phase)                                      # stopped again before saving anything new
        sim.step(1)
        assert sim.status.phase == "Failed", phase             # backoffLimit 0: counted this time
        assert sim.fm.reason == ("ResultIncomplete" if phase == "Succeeded" else "BackoffLimitExceeded")


def test_a_shrunk_attempt_starts_at_the_larger_shape_when_the_nodes_came_back_before_it_started():
    """The lost node returned while the old attempt's pods went: starting shrunk would cost a relaunch
    later (a grow back after minSecondsBetweenChanges)."""
    sim = Sim(minSecondsBetweenChanges=600)
    sim.lost_while_running("pod tiny-wan-fm-1-worker-1: its node n2 has been Unknown for 61 s", after=30)
    assert sim.fm.elastic.nodes == 2 and sim.fm.elastic.shrinks == 1
    sim.pods["fm"] = Pods(alive=1)                             # a survivor's pod is still going
    sim.capacity["fm"] = 4                                     # ... and n2 is back
    assert not sim.step(5).actions
    sim.pods["fm"] = Pods()
    d = sim.step(1)
    create = d.actions[-1]
    assert (create.kind, create.nodes) == ("create_job", None)     # the declared 4 nodes
    assert sim.fm.elastic.nodes == 4 and sim.fm.elastic.grows == 1 and sim.changes == [("fm", "shrink"), ("fm", "grow")]
    assert sim.fm.attempts[-1].reason.startswith("TopologyGrown: the cluster holds 4 nodes for it again before "
                                                  "attempt 2 started")
    assert sim.reasons()[-2:] == ["TopologyGrown", "StageStarted"]
    # without room it starts at the shape the shrink chose
    sim2 = Sim()
    sim2.lost_while_running("evicted", after=0)
    sim2.pods["fm"] = Pods()
    assert sim2.step(1).actions[-1].nodes == 2 and sim2.fm.elastic.grows == 0


def test_the_nodes_an_attempt_ran_on_are_recorded_once_seen():
    """What says why a failed attempt whose pods PodGC force-deleted was disrupted (the operator
    reads the recorded nodes back: solar_operator.capacity)."""
    sim = Sim()
    sim.step()
    sim.set_job("Running")
    sim.pods["fm"] = Pods(alive=2, placed=("n1", "n2"))
    sim.step(1)
    sim.pods["fm"] = Pods(alive=4, placed=("n1", "n3", "n4"))
    sim.step(1)
    assert sim.fm.attempts[-1].nodeNames == ["n1", "n2", "n3", "n4"]


def test_an_evicted_attempt_that_saved_on_its_sigterm_is_a_disruption_sized_to_the_cluster():
    """The taint manager's eviction sends SIGTERM: the ranks finish their step, save and exit 0, the job
    may read Succeeded; its pods say why (DisruptionTarget): a shrink to what the cluster holds, its cost
    counted, not a StageStopped at the old shape."""
    sim = Sim()
    sim.step()
    sim.set_job("Running")
    sim.latest = 10
    sim.step(30)
    sim.latest, sim.result = 12, "stopped"
    sim.usage = {"attempts": [{"started": iso(sim.now - 25)}]}
    sim.set_job("Succeeded")
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-1-worker-1: DisruptionTarget (DeletionByTaintManager)",
                          since=sim.now - 2)
    sim.capacity["fm"] = 3
    sim.step(1)
    assert sim.fm.reason == "TopologyShrunk" and sim.fm.elastic.nodes == 2 and sim.fm.elastic.disruptedAt
    sim.pods["fm"] = Pods()
    assert sim.step(1).actions[0].resume_from.endswith("step_00000012")
    # a stage that completed is done, whatever a pod evicted at its end says
    sim = Sim()
    sim.step()
    sim.latest, sim.result = 100, "complete"
    sim.set_job("Succeeded")
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-1-worker-1: DisruptionTarget (DeletionByTaintManager)")
    sim.step(1)
    assert sim.fm.phase != "Pending" and sim.fm.reason != "TopologyShrunk"


def test_a_disrupted_attempt_whose_files_prove_the_stage_complete_is_done_not_relaunched():
    """A dead kubelet's ranks finished the stage while its job still read Running (no kubelet reported
    the exit): a new attempt would resume the last step and train none."""
    sim = Sim()
    sim.step()
    sim.set_job("Running")
    sim.step(30)
    sim.latest, sim.result = 100, "complete"
    sim.files_extra = {"final": "verified", "marker": True, "marker_status": "complete"}
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-1-worker-1: its node n2 has been Unknown for 61 s")
    sim.capacity["fm"] = 3
    d = sim.step(1)
    assert ("delete_job", "fm") in [(a.kind, a.stage) for a in d.actions]
    assert sim.fm.phase == "Succeeded" and not [a for a in d.actions if a.kind == "create_job" and a.stage == "fm"]
