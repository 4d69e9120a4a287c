"""Resuming a stage at another topology (reshape.py) and what the state machine does with it."""

from __future__ import annotations

import copy

import pytest
import yaml

from solar.run import reshape
from solar.run.machine import JobState, Observation, reconcile
from solar.run.observe import StageFiles
from solar.run.plan import plan_run
from solar.run.spec import AttemptTopology, SolarRun, StageAttempt
from tests.conftest import REPO

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
T0 = 1_800_000_000.0


def _spec(suspend=False, **topology):
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["topology"].update(topology)
    doc["spec"]["runPolicy"]["suspend"] = suspend
    return SolarRun.model_validate(doc).spec


def _plan(**topology):
    return plan_run(_spec(**topology), "/runs/tiny-wan", repo=REPO, environ={})


def _position(step=2, world=2, sp=1, micro=1, accumulation=1, nproc=2, global_batch=None, epochs=(0, 1)):
    return reshape.DataPosition.model_validate({
        "schema": "solar.data-position.v1", "step": step,
        "global_batch_size": global_batch or world // sp * micro * accumulation,
        "saved_with": {"world_size": world, "sequence_parallel_size": sp, "micro_batch_size": micro,
                       "gradient_accumulation": accumulation, "nproc_per_node": nproc},
        "epochs": list(epochs)})


def _attempt(n=1, world=2, micro=1, accumulation=1):
    return StageAttempt(attempt=n, topology=AttemptTopology(
        nodes=1, gpusPerNode=world, worldSize=world, sequenceParallelSize=1, microBatchSize=micro,
        gradientAccumulation=accumulation, globalBatchSize=world * micro * accumulation))


@pytest.mark.parametrize("new, position, attempts, expect", [
    # same global batch, another shape: resumed at the new shape
    ({"gpusPerNode": 1, "gradientAccumulation": 2}, _position(), None, "changed"),
    ({"gpusPerNode": 1, "microBatchSize": 2}, _position(), None, "changed"),
    ({"gpusPerNode": 4, "gradientAccumulation": 1}, _position(world=2, accumulation=2), None, "changed"),
    # the same shape: nothing to say
    ({"gpusPerNode": 2}, _position(), None, "same"),
    # another global batch: refused
    ({"gpusPerNode": 1}, _position(), None, "refused"),
    ({"gpusPerNode": 2, "gradientAccumulation": 2}, _position(), None, "refused"),
    # no position file: the last recorded attempt is the reference
    ({"gpusPerNode": 1, "gradientAccumulation": 2}, None, [_attempt(1, world=2)], "changed"),
    ({"gpusPerNode": 1}, None, [_attempt(1, world=1, accumulation=2), _attempt(2, world=2)], "refused"),
    # the position file wins over the status (it is what the trainer compares)
    ({"gpusPerNode": 1, "gradientAccumulation": 2}, _position(), [_attempt(1, world=1)], "changed"),
    # neither: unknown, left to the trainer
    ({"gpusPerNode": 1}, None, None, None),
    # a position file of another step than the checkpoint resumed is not this checkpoint's
    ({"gpusPerNode": 1}, _position(step=4), None, None),
])
def test_the_next_attempts_shape_against_its_checkpoints(new, position, attempts, expect):
    p = _plan(**new).stage("fm")
    found = reshape.verdict(p, 2, position, attempts)
    if expect is None:
        assert found is None
        return
    got = "refused" if found.refused else "changed" if found.changed else "same"
    assert got == expect, found


def test_nothing_is_compared_for_a_fresh_start_or_an_inference_stage():
    plan = _plan(gpusPerNode=1)
    assert reshape.verdict(plan.stage("fm"), None, _position(), None) is None
    assert reshape.verdict(plan.stage("generate"), 2, _position(), [_attempt()]) is None


@pytest.mark.parametrize("old_batch, new, fix", [
    (2, reshape.Shape(1, 1, 1, 1), "{gradientAccumulation: 2, microBatchSize: 1} or {gradientAccumulation: 1, "
                                   "microBatchSize: 2}"),
    (8, reshape.Shape(2, 1, 2, 1), "{gradientAccumulation: 2, microBatchSize: 2} or {gradientAccumulation: 1, "
                                   "microBatchSize: 4}"),
    (4, reshape.Shape(4, 2, 1, 3), "{gradientAccumulation: 2, microBatchSize: 1}"),
    (6, reshape.Shape(2, 1, 4, 4), "{gradientAccumulation: 3, microBatchSize: 1}"),   # keeps neither
    (2, reshape.Shape(4, 1, 1, 1), "no microBatchSize x gradientAccumulation gives 2 over data parallel 4"),
])
def test_the_refusal_names_what_keeps_the_global_batch(old_batch, new, fix):
    text = reshape.keeping(old_batch, new, "spec.topology")
    assert fix in text


def test_the_messages_name_both_shapes_both_batches_and_the_stream_position():
    p = _plan(gpusPerNode=1).stage("fm")
    found = reshape.verdict(p, 2, _position(epochs=(0, 1)), None)
    text = found.mismatch()
    assert "from 2 to 1" in text and "spec.topology" in text and "world 2 (1 node x 2)" in text
    assert "world 1 (1 node x 1)" in text and "{gradientAccumulation: 2, microBatchSize: 1}" in text
    assert "data/position.json" in text
    ok = reshape.verdict(_plan(gpusPerNode=1, gradientAccumulation=2).stage("fm"), 2, _position(epochs=(0, 1)), None)
    line = ok.summary()
    assert "world 2 (1 node x 2)" in line and "world 1 (1 node x 1)" in line and "gradientAccumulation 2" in line
    assert "step 2, 4 clips of the global order consumed (epochs 0-1)" in line and "global batch 2 kept" in line
    assert ok.as_dict()["streamPosition"] == {"step": 2, "clipsConsumed": 4, "epochs": [0, 1]}
    old = reshape.verdict(_plan(gpusPerNode=1, gradientAccumulation=2).stage("fm"), 2, None, [_attempt()])
    assert "position not recorded" in old.summary() and "attempt 1" in old.source


def test_a_stages_own_topology_is_the_field_named():
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["stages"][0]["topology"] = {"nodes": 1, "gpusPerNode": 1}
    p = plan_run(SolarRun.model_validate(doc).spec, "/runs/tiny-wan", repo=REPO, environ={}).stage("fm")
    assert "spec.stages[0].topology" in reshape.verdict(p, 2, _position(), None).mismatch()


class Sim:
    """The state machine driven by a spec that changes (a new plan for each)."""

    def __init__(self, **topology):
        self.status, self.jobs, self.created, self.events = None, {}, [], []
        self.files = {"fm": StageFiles(exists=False)}
        self.generation = 0
        self.set(**topology)

    def set(self, suspend=False, **topology):
        self.spec = _spec(suspend=suspend, **topology)
        self.plan = plan_run(self.spec, "/runs/tiny-wan", repo=REPO, environ={})
        self.generation += 1

    def step(self):
        d = reconcile(self.spec, self.status, Observation("tiny-wan", self.generation, T0, plan=self.plan,
                                                          jobs=dict(self.jobs), files=dict(self.files)))
        for a in d.actions:
            if a.kind == "create_job":
                self.created.append(a)
                self.jobs[a.stage] = JobState(a.job, "Created", attempt=a.attempt)
            else:
                self.jobs.pop(a.stage, None)
        self.events += d.events
        self.status = d.status
        return d

    def condition(self, type_):
        return next(c for c in self.status.conditions if c.type == type_)


def test_a_suspended_stage_resumes_at_a_new_shape_and_a_batch_change_waits_for_a_fix():
    sim = Sim(gpusPerNode=2)
    sim.step()
    fm = sim.status.stage("fm")
    assert fm.attempts[0].topology.worldSize == 2 and fm.attempts[0].resumedFrom is None
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running", attempt=1)
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0)   # no position file
    sim.set(suspend=True, gpusPerNode=2)
    sim.step()
    assert sim.status.phase == "Suspended" and "fm" not in sim.jobs
    # a change of the global batch while suspended: reported at once, nothing else changes
    sim.set(suspend=True, gpusPerNode=1)
    d = sim.step()
    assert sim.status.phase == "Suspended" and not d.actions
    validated = sim.condition("Validated")
    assert (validated.status, validated.reason) == ("False", "TopologyMismatch")
    assert "from 2 to 1" in validated.message and "gradientAccumulation: 2" in validated.message
    # resumed unfixed: no job, the stage waits
    sim.set(suspend=False, gpusPerNode=1)
    d = sim.step()
    assert not [a for a in d.actions if a.kind == "create_job"] and sim.status.phase == "Pending"
    assert sim.status.stage("fm").reason == "TopologyMismatch" and sim.condition("Progressing").status == "False"
    sim.step()
    assert [e[1] for e in sim.events].count("TopologyMismatch") == 1   # one Warning per message
    assert not sim.created[1:]
    # fixed: the next attempt resumes the checkpoint at the new shape
    sim.set(suspend=False, gpusPerNode=1, gradientAccumulation=2)
    d = sim.step()
    (create,) = [a for a in d.actions if a.kind == "create_job"]
    assert create.attempt == 2 and create.resume_from.endswith("fm/checkpoints/step_00000002")
    assert sim.condition("Validated").status == "True" and sim.status.phase == "Running"
    fm = sim.status.stage("fm")
    assert fm.reason is None and [(a.attempt, a.topology.worldSize, a.topology.gradientAccumulation, a.resumedFrom)
                                  for a in fm.attempts] == [(1, 2, 1, None), (2, 1, 2, 2)]
    changed = [m for kind, reason, m in sim.events if reason == "TopologyChanged"]
    assert len(changed) == 1 and "world 2 (1 node x 2)" in changed[0] and "world 1 (1 node x 1)" in changed[0]
    p = sim.plan.stage("fm")
    assert "distributed.world_size=1" in p.arguments() and "train.gradient_accumulation=2" in p.arguments()


def test_a_retry_after_a_failure_resumes_at_the_new_shape_from_the_position_file():
    sim = Sim(gpusPerNode=1, gradientAccumulation=2)
    sim.step()
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0,
                                 position=_position(world=1, accumulation=2, nproc=1))
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1", attempt=1)
    sim.set(gpusPerNode=2, gradientAccumulation=1)   # more GPUs came back: same global batch
    sim.step()                                      # the failure counted, its job deleted
    d = sim.step()
    (create,) = [a for a in d.actions if a.kind == "create_job"]
    assert create.attempt == 2 and create.resume_from.endswith("step_00000002")
    assert [a.topology.worldSize for a in sim.status.stage("fm").attempts] == [1, 2]
    assert any(reason == "TopologyChanged" and "stream position step 2" in m for _, reason, m in sim.events)


def test_a_failed_attempt_then_a_batch_change_is_refused_before_any_job():
    sim = Sim(gpusPerNode=1)
    sim.step()
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0,
                                 position=_position(world=1, nproc=1))
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1", attempt=1)
    sim.set(gpusPerNode=2)
    sim.step()
    sim.step()
    assert len(sim.created) == 1 and sim.status.stage("fm").reason == "TopologyMismatch"
    assert sim.condition("Validated").reason == "TopologyMismatch"
    assert "{gradientAccumulation: 1, microBatchSize: 1}" not in sim.condition("Validated").message
    assert "no microBatchSize x gradientAccumulation gives 1 over data parallel 2" in sim.condition("Validated").message


def test_an_attempt_per_stage_keeps_its_own_gpu_time():
    from solar.run.machine import _note_usage
    from solar.run.spec import SolarRunStatus, StageStatus

    status = SolarRunStatus(stages=[StageStatus(name="fm")])
    usage = {"gpu_seconds": 3 * 3600.0, "attempts": [   # an hour at world 2, then an hour at world 1
        {"status": "stopped", "world_size": 2, "gpu_seconds": 7200.0},
        {"status": "complete", "world_size": 1, "gpu_seconds": 3600.0}]}
    _note_usage(status, status.stages[0], usage)
    assert [(a.worldSize, a.gpuSeconds) for a in status.stages[0].usage.attempts] == [(2, 7200.0), (1, 3600.0)]
    assert status.gpuHours == 3.0


def test_observe_reads_the_newest_checkpoints_position_and_ignores_a_bad_one(tmp_path):
    from solar.run.observe import observe_stage
    from tests.integration.world import write_checkpoint

    write_checkpoint(tmp_path, 2, saved_with={"world_size": 2, "nproc_per_node": 2})
    write_checkpoint(tmp_path, 3, saved_with={"world_size": 4, "nproc_per_node": 2, "sequence_parallel_size": 2,
                                              "micro_batch_size": 2, "gradient_accumulation": 3})
    files = observe_stage(tmp_path, final_step=None, validation_step=None, generation=False)
    p = files.position   # the newest checkpoint's, every field read from it (none a default, none step 2's)
    assert files.latest == 3 and p.step == 3 and p.global_batch_size == 4 // 2 * 2 * 3
    assert (p.saved_with.world_size, p.saved_with.nproc_per_node, p.saved_with.sequence_parallel_size,
            p.saved_with.micro_batch_size, p.saved_with.gradient_accumulation) == (4, 2, 2, 2, 3)
    write_checkpoint(tmp_path, 4)   # from before the file existed
    assert observe_stage(tmp_path, final_step=None, validation_step=None, generation=False).position is None
    bad = write_checkpoint(tmp_path, 6, saved_with={"world_size": 2, "nproc_per_node": 2})
    (bad / "data" / "position.json").chmod(0o644)
    doc = (bad / "data" / "position.json").read_text().replace('"global_batch_size": 2', '"global_batch_size": 0')
    (bad / "data" / "position.json").write_text(doc)   # not a position any more (it still verifies by size)
    files = observe_stage(tmp_path, final_step=None, validation_step=None, generation=False)
    assert files.latest == 6 and files.position is None
