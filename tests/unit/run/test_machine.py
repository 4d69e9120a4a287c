"""The SolarRun state machine, transition by transition (pure: observations in, status out)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from solar.run.machine import JobState, Observation, reconcile
from solar.run.observe import StageFiles
from solar.run.plan import RunInvalid, plan_run
from solar.run.spec import SolarRun
from tests.conftest import REPO
from tests.unit.run.executor import carry_out

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
T0 = 1_800_000_000.0


def _spec(**policy):
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["runPolicy"].update(policy)
    return SolarRun.model_validate(doc).spec


PLAN = plan_run(_spec(), "/runs/tiny-wan", repo=REPO, environ={})


def _done(stage, *, final="verified", validation="complete", result="complete", problems=()):
    p = PLAN.stage(stage)
    return StageFiles(exists=True, launched=True, result=result,
                      latest=p.final_step if final == "verified" and p.final_step else None,
                      final=final if p.final_step else None, final_problems=problems,
                      marker=validation is not None, marker_status=validation, last_activity=T0)


class Sim:
    """Drives reconcile like an executor: carries out its actions on a fake job table."""

    def __init__(self, spec=None):
        self.spec = spec or _spec()
        self.status = None
        self.jobs: dict[str, JobState] = {}
        self.files: dict[str, StageFiles] = {}
        self.now = T0
        self.created, self.deleted, self.events = [], [], []

    def step(self, invalid=None, generation=1):
        obs = Observation("tiny-wan", generation, self.now, plan=None if invalid else PLAN, invalid=invalid,
                          jobs=dict(self.jobs), files=dict(self.files))
        d = reconcile(self.spec, self.status, obs)
        carry_out(d, self.jobs, self.created, self.deleted, attempts=False)
        self.events += d.events
        self.status = d.status
        return d

    def condition(self, type_):
        return next(c for c in self.status.conditions if c.type == type_)

    def succeed(self, stage, **files):
        self.jobs[stage] = JobState(self.jobs[stage].name, "Succeeded")
        self.files[stage] = _done(stage, **files)


def test_a_run_advances_stage_by_stage_to_succeeded():
    sim = Sim()
    d = sim.step()
    assert [a.stage for a in d.actions] == ["fm"] and d.actions[0].job == "tiny-wan-fm-1"
    assert sim.status.phase == "Running" and sim.status.currentStage == "fm"
    assert sim.condition("Validated").status == "True" and sim.condition("Progressing").reason == "StageStarted"
    assert sim.status.topology.worldSize == 1 and sim.status.stages[0].attempt == 1
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running")
    sim.step()
    assert sim.status.stages[0].phase == "Running" and not sim.created[1:]
    for stage, nxt in (("fm", "anyflow"), ("anyflow", "dmd"), ("dmd", "generate")):
        sim.succeed(stage)
        d = sim.step()
        assert sim.status.stage(stage).phase == "Succeeded"
        assert sim.status.stage(stage).checkpoint.step == PLAN.stage(stage).final_step
        assert sim.status.stage(stage).validation.complete
        assert [a.stage for a in d.actions] == [nxt] and sim.status.currentStage == nxt  # the next job at once
        assert d.actions[0].resume_from is None
    sim.succeed("generate")
    sim.step()
    assert sim.status.phase == "Succeeded" and sim.condition("Ready").status == "True"
    assert [e[1] for e in sim.events].count("StageSucceeded") == 4 and sim.events[-1][1] == "Completed"
    before = sim.status.model_dump()
    assert not sim.step().actions and sim.status.model_dump() == before  # final


@pytest.mark.parametrize("reason", ["UnsupportedRoute", "UnresolvedPlaceholder", "TopologyMismatch", "InvalidInit",
                                    "InvalidSpec", "InsufficientGPUMemory", "InsufficientHostMemory"])
def test_an_invalid_run_fails_without_a_job(reason):
    sim = Sim()
    d = sim.step(invalid=RunInvalid(reason, "spec.stages[1] (anyflow): something", "anyflow"))
    assert not d.actions and sim.status.phase == "Failed"
    assert (sim.condition("Validated").status, sim.condition("Validated").reason) == ("False", reason)
    assert sim.condition("Failed").reason == reason and sim.status.stage("anyflow").phase == "Failed"
    assert d.events[-1][0] == "Warning"


@pytest.mark.parametrize("files, reason", [
    (dict(final="missing"), "CheckpointMissing"),
    (dict(final="incomplete", problems=("no COMPLETE.json",)), "CheckpointIncomplete"),
    (dict(final="unverifiable", problems=("member model/live.safetensors has 3 bytes",)), "CheckpointUnverifiable"),
    (dict(validation=None), "ValidationIncomplete"),
    (dict(result="failed"), "ResultIncomplete"),
])
def test_a_succeeded_job_does_not_make_a_succeeded_stage_without_its_files(files, reason):
    sim = Sim()
    sim.step()
    sim.succeed("fm", **files)
    d = sim.step()
    assert not d.actions and sim.status.phase == "Failed"
    assert sim.status.stage("fm").phase == "Failed" and sim.status.stage("fm").reason == reason
    assert sim.condition("Failed").reason == reason


def test_failed_jobs_retry_from_the_last_checkpoint_until_the_backoff_limit():
    sim = Sim(_spec(backoffLimit=1))
    sim.step()
    sim.files["fm"] = StageFiles(exists=True, launched=True, result="failed", result_error="non_finite",
                                 latest=2, last_activity=T0)
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1")
    d = sim.step()
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")]
    assert d.job_failures == [("fm", "non_finite")]  # counted once, by the trainer's error type
    assert sim.condition("Progressing").reason == "StageRetrying" and sim.status.phase == "Running"
    d = sim.step()  # the job is gone: the next attempt resumes
    assert not d.job_failures
    assert d.actions[0].kind == "create_job" and d.actions[0].attempt == 2
    assert d.actions[0].resume_from == "/runs/tiny-wan/fm/checkpoints/step_00000002"
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1")
    sim.step()
    assert sim.status.phase == "Failed" and sim.condition("Failed").reason == "BackoffLimitExceeded"
    assert "failed 2 times" in sim.status.stage("fm").message


def _failed_past_the_limit(sim):
    """fm failed once with backoffLimit 0: the run is Failed, the failed job kept."""
    sim.step()
    sim.files["fm"] = StageFiles(exists=True, launched=True, result="failed", result_error="non_finite",
                                 latest=2, last_activity=T0)
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1", attempt=1)
    sim.step()
    assert sim.status.phase == "Failed" and "tiny-wan-fm-1" in [j.name for j in sim.jobs.values()]


def test_a_failed_run_continues_when_its_spec_changes():
    sim = Sim(_spec(backoffLimit=0))
    _failed_past_the_limit(sim)
    assert not sim.step().actions and sim.status.phase == "Failed"   # the same generation: final
    d = sim.step(generation=2)                                          # the spec was edited
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")] and not d.job_failures  # not counted again
    assert [e[1] for e in d.events] == ["SpecChanged"] and sim.condition("Failed").status == "False"
    assert sim.status.phase != "Failed" and sim.status.stage("fm").failures == 0
    d = sim.step(generation=2)
    assert d.actions[0].kind == "create_job" and d.actions[0].attempt == 2
    assert d.actions[0].resume_from == "/runs/tiny-wan/fm/checkpoints/step_00000002"
    sim.jobs["fm"] = JobState("tiny-wan-fm-2", "Failed", "exit code 1", attempt=2)
    sim.step(generation=2)
    assert sim.status.phase == "Failed" and sim.status.stage("fm").failures == 1  # its backoffLimit again


def test_a_trainer_that_refused_its_input_is_not_retried():
    sim = Sim(_spec(backoffLimit=3))
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1: data.root /nope does not exist", attempt=1,
                              refused=True)
    d = sim.step()
    assert sim.status.phase == "Failed" and sim.condition("Failed").reason == "InputRefused"
    assert "data.root /nope does not exist" in sim.status.stage("fm").message and not d.actions  # kept, not retried


def _resumable(sim, **recorded):
    """fm stopped at step 2 (its job gone) with a launch whose config differs from the plan's by ``recorded``."""
    sim.step()
    old = copy.deepcopy(PLAN.stage("fm").resolved)
    for key, value in recorded.items():
        block, *path = key.split(".")
        node = old[block]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    sim.files["fm"] = StageFiles(exists=True, launched=True, result="stopped", latest=2, last_activity=T0, config=old)
    sim.jobs.pop("fm")


def test_a_stage_whose_recipe_changed_waits_with_the_trainers_refusal_and_no_job():
    sim = Sim()
    _resumable(sim, **{"train.optimizer.lr": 0.5})
    d = sim.step()
    assert not d.actions and sim.status.stage("fm").phase == "Pending" and sim.status.phase == "Pending"
    validated = sim.condition("Validated")
    assert (validated.status, validated.reason) == ("False", "RecipeChanged")
    assert "train.optimizer.lr 0.5 -> " in validated.message and "checkpoint.accept_changes" in validated.message
    assert not sim.step().events   # reported once
    sim.files["fm"] = dataclasses.replace(sim.files["fm"], config=copy.deepcopy(PLAN.stage("fm").resolved))
    d = sim.step()                 # the spec (here: the recorded run) agrees again
    assert d.actions[0].kind == "create_job" and sim.condition("Validated").status == "True"


def test_a_longer_schedule_resumes_without_a_hold():
    sim = Sim()
    _resumable(sim, **{"train.max_steps": 2})   # the run was planned for 2 steps; the spec now trains longer
    d = sim.step()
    assert d.actions[0].kind == "create_job" and d.actions[0].resume_from.endswith("step_00000002")


@pytest.mark.parametrize("error_type, reason", [("storage_full", "StorageFull"), ("storage_error", "StorageError")])
def test_a_stage_that_met_a_full_or_failing_volume_fails_without_spending_its_retries(error_type, reason):
    sim = Sim(_spec(backoffLimit=3))
    sim.step()
    message = "rank 0: checkpoint step 4: no space left on the volume of /runs/tiny-wan/fm/checkpoints (0 B free)"
    sim.files["fm"] = StageFiles(exists=True, launched=True, result="failed", result_error=error_type,
                                 result_message=message, latest=2, last_activity=T0)
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1")
    d = sim.step()
    assert not d.actions  # no delete, no retry: the job is kept for inspection
    assert d.job_failures == [("fm", error_type)]
    assert sim.status.phase == "Failed" and sim.condition("Failed").reason == reason
    assert "/runs/tiny-wan/fm/checkpoints" in sim.condition("Failed").message
    assert "not retried" in sim.status.stage("fm").message


def test_a_retry_passing_over_a_corrupt_newer_checkpoint_says_so():
    sim = Sim(_spec(backoffLimit=2))
    sim.step()
    bad = "/runs/tiny-wan/fm/checkpoints/step_00000003: member model/live.safetensors has 10 bytes"
    sim.files["fm"] = StageFiles(exists=True, launched=True, result="failed", result_error="error", latest=2,
                                 skipped=(bad,), last_activity=T0)
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1")
    sim.step()
    d = sim.step()
    assert d.actions[0].resume_from == "/runs/tiny-wan/fm/checkpoints/step_00000002"
    (warning,) = [e for e in d.events if e[1] == "CheckpointSkipped"]
    assert warning[0] == "Warning" and bad in warning[2] and "step_00000002" in warning[2]


def test_a_retry_waits_for_the_old_job_to_go_and_starts_a_stage_that_committed_nothing_over():
    """Issue 52 item 2: a used directory without a committed checkpoint is started over (from the stage's
    initialisation, its earlier launches kept as history), the restart counted as an attempt; never
    NothingToResume."""
    sim = Sim(_spec(backoffLimit=1))
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1", deleting=True)
    assert not sim.step().actions
    sim.jobs.pop("fm")
    sim.files["fm"] = StageFiles(exists=True, launched=True, result="failed", launches=1)
    d = sim.step()
    assert [(a.kind, a.stage, a.attempt, a.resume_from) for a in d.actions] == [("create_job", "fm", 2, None)]
    assert sim.status.phase == "Running" and sim.status.stage("fm").attempt == 2
    restarted = [e for e in d.events if e[1] == "StageRestarted"]
    assert len(restarted) == 1 and "StageStarted" not in [e[1] for e in d.events]
    assert "starts over from step 0" in restarted[0][2] and "/runs/tiny-wan/fm holds no committed checkpoint" in \
        restarted[0][2] and "1 earlier launch" in restarted[0][2] and "tiny-wan-fm-2" in restarted[0][2]
    assert sim.condition("Progressing").reason == "StageRestarted"
    assert sim.status.stage("fm").attempts[-1].resumedFrom is None
    assert "NothingToResume" not in [e[1] for e in sim.events]


def test_progress_deadline_fails_a_silent_stage_and_deletes_its_job():
    sim = Sim(_spec(progressDeadlineSeconds=600))
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running")
    sim.files["fm"] = StageFiles(exists=True, launched=True, last_activity=T0 + 100)
    sim.now = T0 + 650
    assert not sim.step().actions and sim.status.phase == "Running"  # heartbeat 550 s ago
    sim.now = T0 + 701
    d = sim.step()
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")]
    assert sim.condition("Failed").reason == "ProgressDeadlineExceeded"


def test_a_finished_run_deletes_the_jobs_its_verdict_still_lists_and_nothing_else():
    """The operator writes a final verdict with the jobs it deletes in ``jobsToDelete`` before the
    deletes; a pass over the finished run deletes those still there and clears the list, and never
    starts an attempt."""
    sim = Sim(_spec(progressDeadlineSeconds=600))
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running")
    sim.now = T0 + 700
    verdict = reconcile(sim.spec, sim.status, Observation("tiny-wan", 1, sim.now, plan=PLAN, jobs=dict(sim.jobs)))
    assert [(a.kind, a.job) for a in verdict.actions] == [("delete_job", "tiny-wan-fm-1")]
    assert verdict.status.phase == "Failed" and verdict.status.jobsToDelete is None  # the operator adds it
    written = verdict.status.model_copy(update={"jobsToDelete": ["tiny-wan-fm-1"]})
    for jobs, deletes in (({"fm": sim.jobs["fm"]}, ["tiny-wan-fm-1"]), ({}, []),
                          ({"fm": JobState("tiny-wan-fm-1", "Running", deleting=True)}, [])):
        d = reconcile(sim.spec, written, Observation("tiny-wan", 1, sim.now + 10, plan=PLAN, jobs=jobs))
        assert [(a.kind, a.stage, a.job) for a in d.actions] == [("delete_job", "fm", job) for job in deletes]
        assert d.status.jobsToDelete is None and d.status.phase == "Failed" and not d.events
        assert d.status.stages == written.stages and d.status.conditions == written.conditions
    d = reconcile(sim.spec, verdict.status, Observation("tiny-wan", 1, sim.now + 10, plan=PLAN, jobs=dict(sim.jobs)))
    assert not d.actions  # a finished run without the list: nothing to do, whatever exists


def test_suspend_deletes_the_job_and_resume_continues_from_the_checkpoint():
    sim = Sim()
    sim.step()
    sim.succeed("fm")
    sim.step()
    sim.jobs["anyflow"] = JobState("tiny-wan-anyflow-1", "Running")
    sim.files["anyflow"] = StageFiles(exists=True, launched=True, latest=2,
                                      last_activity=T0)
    sim.spec = _spec(suspend=True)
    d = sim.step(generation=2)
    assert [(a.kind, a.stage) for a in d.actions] == [("suspend_job", "anyflow")]  # PyTorchJob: deleted
    assert sim.status.phase == "Suspended" and sim.status.stage("anyflow").phase == "Suspended"
    assert sim.condition("Suspended").status == "True" and sim.status.observedGeneration == 2
    assert not sim.step(generation=2).actions  # stays suspended
    sim.spec = _spec(suspend=False)
    d = sim.step(generation=3)
    assert d.actions[0].kind == "create_job" and d.actions[0].resume_from.endswith("step_00000002")
    assert sim.condition("Suspended").status == "False" and sim.status.phase == "Running"
    assert sim.status.stage("anyflow").failures == 0  # suspending costs no retry
    assert sim.status.step == 2


def test_a_job_kept_suspended_by_the_operator_is_replaced_on_resume():
    """TrainJob: suspend sets the job's spec.suspend; resuming deletes that job (never unsuspends it)
    and the next attempt continues from the checkpoint."""
    sim = Sim()
    sim.step()
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0)
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running", attempt=1)
    sim.spec = _spec(suspend=True)
    d = sim.step(generation=2)
    assert [a.kind for a in d.actions] == ["suspend_job"]
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Suspended", attempt=1, suspended=True, suspended_by_operator=True)
    assert not sim.step(generation=2).actions and sim.status.phase == "Suspended"
    sim.spec = _spec(suspend=False)
    d = sim.step(generation=3)
    assert [(a.kind, a.job) for a in d.actions] == [("delete_job", "tiny-wan-fm-1")]
    assert "fm" not in sim.jobs and sim.status.phase == "Running"
    d = sim.step(generation=3)
    assert d.actions[0].kind == "create_job" and d.actions[0].resume_from.endswith("step_00000002")
    assert sim.status.stage("fm").attempt == 2 and sim.status.stage("fm").failures == 0


def test_a_job_its_queue_holds_is_queued_and_the_deadline_waits_for_admission():
    sim = Sim(_spec(progressDeadlineSeconds=600))
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Suspended", attempt=1, created=T0, suspended=True)
    sim.now = T0 + 3600  # an hour in the queue: longer than the deadline
    d = sim.step()
    assert not d.actions and sim.status.phase == "Running"
    assert sim.status.stage("fm").phase == "Pending" and sim.status.stage("fm").reason == "Queued"
    assert sim.condition("Progressing").reason == "Queued" and ("Normal", "Queued") in [e[:2] for e in d.events]
    assert not [e for e in sim.step().events if e[1] == "Queued"]  # said once
    sim.now = T0 + 3700  # admitted: the deadline runs from here
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running", attempt=1, created=T0)
    d = sim.step()
    assert not d.actions and sim.status.stage("fm").admittedTime is not None
    assert sim.status.stage("fm").reason is None and sim.condition("Progressing").reason == "StageRunning"
    sim.now = T0 + 3700 + 601
    d = sim.step()
    assert [a.kind for a in d.actions] == ["delete_job"]
    assert sim.condition("Failed").reason == "ProgressDeadlineExceeded"


def test_a_job_its_queue_takes_back_is_replaced_by_an_attempt_from_the_checkpoint():
    sim = Sim()
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running", attempt=1, created=T0)
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0)
    sim.step()
    assert sim.status.stage("fm").phase == "Running"
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Suspended", attempt=1, created=T0, suspended=True)  # preempted
    d = sim.step()
    assert [(a.kind, a.job) for a in d.actions] == [("delete_job", "tiny-wan-fm-1")]
    assert sim.condition("Progressing").reason == "StagePreempted" and sim.status.phase == "Running"
    d = sim.step()
    assert d.actions[0].kind == "create_job" and d.actions[0].resume_from.endswith("step_00000002")
    assert sim.status.stage("fm").attempt == 2 and sim.status.stage("fm").failures == 0


def test_a_suspend_suspends_the_running_stage_when_the_previous_success_was_not_recorded():
    """fm's job succeeded and anyflow's job was created, but the status write of that reconcile was
    lost (a 409/500, or an operator restart): a suspend must record fm as Succeeded and delete the
    job that runs (anyflow's), not fm's finished job, and a resume must not run fm again."""
    sim = Sim()
    sim.step()
    sim.succeed("fm")
    sim.jobs["anyflow"] = JobState("tiny-wan-anyflow-1", "Running", attempt=1)  # the status still says fm
    sim.spec = _spec(suspend=True)
    d = sim.step(generation=2)
    assert [(a.kind, a.stage) for a in d.actions] == [("suspend_job", "anyflow")]  # PyTorchJob: deleted
    assert sim.status.stage("fm").phase == "Succeeded" and sim.status.stage("anyflow").phase == "Suspended"
    assert sim.status.currentStage == "anyflow" and sim.status.phase == "Suspended"
    assert sim.status.stage("anyflow").attempt == 1  # the job that ran is adopted before it is deleted
    sim.spec = _spec(suspend=False)
    d = sim.step(generation=3)
    assert [(a.kind, a.stage, a.attempt) for a in d.actions] == [("create_job", "anyflow", 2)]
    assert [a.stage for a in sim.created] == ["fm", "anyflow"]


def test_a_failed_job_seen_again_after_its_failure_was_recorded_is_deleted_not_counted_twice():
    """The operator writes a retry's status before deleting the failed job; when that delete did not
    happen (the API server refused it, the operator restarted), the next pass deletes it again and
    counts nothing twice."""
    sim = Sim()
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1", attempt=1)
    d = sim.step()
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")]
    assert sim.status.stage("fm").failures == 1 and [e[1] for e in d.events] == ["JobFailed"]
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Failed", "exit code 1", attempt=1)  # the delete did not happen
    d = sim.step()
    assert [(a.kind, a.stage) for a in d.actions] == [("delete_job", "fm")] and not d.events
    assert sim.status.stage("fm").failures == 1 and sim.status.stage("fm").attempt == 1
    d = sim.step()  # gone now: the next attempt
    assert [(a.kind, a.stage, a.attempt) for a in d.actions] == [("create_job", "fm", 2)]
    assert sim.status.stage("fm").failures == 1
    # attempt 2 adopted from the jobs (the status write that recorded its start was lost) and failed:
    # a failure of its own, counted
    sim.status.stages[0].attempt, sim.status.stages[0].reason = 1, "JobFailed"
    sim.jobs["fm"] = JobState("tiny-wan-fm-2", "Running", attempt=2)
    sim.step()
    assert sim.status.stage("fm").attempt == 2 and sim.status.stage("fm").reason is None
    sim.jobs["fm"] = JobState("tiny-wan-fm-2", "Failed", "exit code 1", attempt=2)
    d = sim.step()
    assert sim.status.stage("fm").failures == 2 and [e[1] for e in d.events] == ["BackoffLimitExceeded"]  # limit 1



def test_conditions_keep_their_transition_time_while_unchanged():
    sim = Sim()
    sim.step()
    first = sim.condition("Validated").lastTransitionTime
    sim.now += 120
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running")
    sim.step()
    assert sim.condition("Validated").lastTransitionTime == first


def test_a_job_created_before_an_operator_restart_is_adopted_not_duplicated():
    sim = Sim()
    sim.step()
    sim.status = None  # the status patch never landed; the job did
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running", attempt=1, created=T0)
    d = sim.step()
    assert not d.actions and sim.status.stage("fm").job == "tiny-wan-fm-1" and sim.status.stage("fm").attempt == 1
    assert [e[1] for e in d.events] == ["Resolved", "MemoryForecast", "JobAdopted", "StageRunning"]
    assert not sim.step().events  # adopted once


def test_every_stage_transition_has_an_event():
    sim = Sim()
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running")
    sim.step()
    sim.succeed("fm")
    sim.step()
    reasons = [e[1] for e in sim.events]
    assert reasons == ["Resolved", "MemoryForecast", "StageStarted", "StageRunning", "StageSucceeded", "StageStarted"]


def test_the_deadline_of_a_retry_runs_from_its_own_job_not_the_stage_start():
    sim = Sim(_spec(progressDeadlineSeconds=600, backoffLimit=2))
    sim.step()
    sim.now = T0 + 5000
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Created", created=T0 + 4900)  # attempt 2's pods are pending
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0 + 1000)
    assert not sim.step().actions and sim.status.phase == "Running"
    sim.now = T0 + 5501
    assert [a.kind for a in sim.step().actions] == ["delete_job"]
    assert sim.condition("Failed").reason == "ProgressDeadlineExceeded" and "for 601s" in sim.condition("Failed").message


def test_status_step_is_the_current_stages_newest_checkpoint():
    sim = Sim()
    sim.step()
    sim.jobs["fm"] = JobState("tiny-wan-fm-1", "Running")
    sim.files["fm"] = StageFiles(exists=True, launched=True, latest=2, last_activity=T0)
    sim.step()
    assert sim.status.step == 2
    sim.succeed("fm")
    sim.step()
    assert sim.status.currentStage == "anyflow" and sim.status.step is None  # the new stage has none yet


def test_a_rejected_job_fails_the_run_with_the_servers_reason():
    from solar.run import conditions as C
    from solar.run.machine import fail_stage

    sim = Sim()
    sim.step()
    d = fail_stage(sim.spec, sim.status, stage="fm", reason=C.JOB_REJECTED,
                   message=C.JOB_REJECTED.message(stage="fm", job="tiny-wan-fm-1", detail="spec.volumes[0]: invalid"),
                   now=T0 + 1, generation=1)
    assert d.status.phase == "Failed" and d.status.stage("fm").reason == "JobRejected"
    assert next(c for c in d.status.conditions if c.type == "Failed").status == "True"


def test_a_stages_gpu_time_comes_from_its_run_result_and_adds_up_for_the_run():
    from solar.run.machine import _note_usage
    from solar.run.spec import SolarRunStatus, StageStatus

    status = SolarRunStatus(stages=[StageStatus(name="fm"), StageStatus(name="anyflow")])
    usage = {"gpu_seconds": 10800.0, "attempts": [
        {"status": "failed", "world_size": 8, "gpu_seconds": 3600.0, "started": "t0", "ended": "t1"},
        {"status": "complete", "world_size": 8, "gpu_seconds": 7200.0}]}
    _note_usage(status, status.stages[0], usage)
    assert status.stages[0].usage.gpuSeconds == 10800.0 and status.gpuHours == 3.0
    assert [(a.status, a.gpuSeconds) for a in status.stages[0].usage.attempts] == [("failed", 3600.0), ("complete", 7200.0)]
    _note_usage(status, status.stages[1], {"gpu_seconds": 1800.0, "attempts": []})
    assert status.gpuHours == 3.5
    _note_usage(status, status.stages[1], {"attempts": "not a list"})  # another version's document: left alone
    assert status.gpuHours == 3.5 and status.stages[1].usage.gpuSeconds == 1800.0
