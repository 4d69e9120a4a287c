"""Issue 52 items 2 and 3 in the state machine, pure: a stage that never committed a checkpoint starts
over (StageRestarted, an attempt like any other: a failure counts, a disruption does not), and a stage
whose set names one of its own checkpoints (checkpoint.mode=full_resume, checkpoint.path) rewinds to it
once (StageRewound; a running attempt is stopped for it first, StageRewinding), later attempts resuming
the newest checkpoint as always."""

from __future__ import annotations

import copy

import yaml

from solar.run.machine import JobState, Observation, reconcile
from solar.run.observe import StageFiles
from solar.run.plan import plan_run
from solar.run.pods import Pods
from solar.run.spec import SolarRun
from tests.conftest import REPO
from tests.unit.run.executor import carry_out

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
T0 = 1_800_000_000.0
FM = "/runs/tiny-wan/fm"


def _spec(*fm_set, **policy):
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["runPolicy"].update(policy)
    doc["spec"]["stages"][0]["set"] += list(fm_set)
    return SolarRun.model_validate(doc).spec


REWIND_2 = ("checkpoint.mode=full_resume", f"checkpoint.path={FM}/checkpoints/step_00000002")


class Sim:
    """reconcile driven like an executor; ``respec`` is a spec edit (a new generation)."""

    def __init__(self, spec):
        self.generation = 1
        self.respec(spec, bump=False)
        self.status = None
        self.jobs: dict[str, JobState] = {}
        self.files: dict[str, StageFiles] = {}
        self.pods: dict[str, Pods] = {}
        self.created, self.deleted, self.events = [], [], []

    def respec(self, spec, bump=True):
        self.spec = spec
        self.plan = plan_run(spec, "/runs/tiny-wan", repo=REPO, environ={})
        self.generation += bump

    def step(self):
        obs = Observation("tiny-wan", self.generation, T0, plan=self.plan, jobs=dict(self.jobs),
                          files=dict(self.files), pods=dict(self.pods))
        d = reconcile(self.spec, self.status, obs)
        carry_out(d, self.jobs, self.created, self.deleted)
        self.events += d.events
        self.status = d.status
        return d

    def job(self, phase, message=""):
        job = self.jobs["fm"]
        self.jobs["fm"] = JobState(job.name, phase, message, attempt=job.attempt)

    def fm(self):
        return self.status.stage("fm")

    def reasons(self, d):
        return [e[1] for e in d.events]


def _ran(**files):
    """What fm's directory says after launches that committed no checkpoint (or, with latest, some)."""
    return StageFiles(exists=True, launched=True, last_activity=T0, **{"launches": 1, **files})


def test_a_failed_attempt_without_a_checkpoint_is_retried_over_from_step_0_and_counted():
    sim = Sim(_spec(backoffLimit=1))
    sim.step()
    sim.files["fm"] = _ran(result="failed", result_error="data")
    sim.job("Failed", "exit code 1")
    d = sim.step()
    assert sim.reasons(d) == ["JobFailed"] and sim.fm().failures == 1
    d = sim.step()                                               # the failed job is gone: attempt 2
    (create,) = d.actions
    assert (create.kind, create.attempt, create.resume_from) == ("create_job", 2, None)
    assert sim.reasons(d) == ["StageRestarted"]
    assert "attempt 2 starts over from step 0" in d.events[0][2] and "attempt 1: JobFailed" in d.events[0][2]
    assert sim.status.conditions and next(c for c in sim.status.conditions if c.type == "Progressing").reason == \
        "StageRestarted"
    sim.files["fm"] = _ran(result="failed", launches=2)          # it failed again, still before its first save
    sim.job("Failed", "exit code 1")
    d = sim.step()
    assert sim.status.phase == "Failed" and sim.fm().failures == 2 and sim.reasons(d) == ["BackoffLimitExceeded"]


def test_a_disruption_before_the_first_checkpoint_restarts_the_stage_without_spending_a_retry():
    sim = Sim(_spec(backoffLimit=0))
    sim.step()
    sim.job("Running")
    sim.files["fm"] = _ran()
    sim.pods["fm"] = Pods(disrupted="pod tiny-wan-fm-1-master-0: DisruptionTarget (DeletionByTaintManager)")
    d = sim.step()
    assert sim.reasons(d) == ["StageDisrupted"] and [a.kind for a in d.actions] == ["delete_job"]
    assert "starts over from step 0" in d.events[0][2]            # what the next attempt does, said now
    sim.pods["fm"] = Pods()
    d = sim.step()
    assert [(a.kind, a.attempt, a.resume_from) for a in d.actions] == [("create_job", 2, None)]
    assert sim.reasons(d) == ["StageRestarted"] and "attempt 1: StageDisrupted" in d.events[0][2]
    assert sim.fm().failures == 0 and sim.status.phase == "Running"


def test_a_failed_run_that_committed_nothing_starts_over_once_its_spec_changes_with_any_recipe():
    """The trainer takes any config for a SolarRun stage's restart: no RecipeChanged hold when nothing is
    resumed, whatever the directory's latest launch recorded."""
    sim = Sim(_spec(backoffLimit=0))
    sim.step()
    old = copy.deepcopy(sim.plan.stage("fm").resolved)
    old["train"]["optimizer"]["lr"] = 0.5
    sim.files["fm"] = _ran(result="failed", config=old)
    sim.job("Failed", "exit code 1")
    sim.step()
    assert sim.status.phase == "Failed" and sim.fm().reason == "BackoffLimitExceeded"
    sim.respec(_spec("data.num_workers=2", backoffLimit=0))
    d = sim.step()
    assert sim.reasons(d) == ["SpecChanged"] and [a.kind for a in d.actions] == ["delete_job"]
    d = sim.step()
    assert [(a.kind, a.attempt, a.resume_from) for a in d.actions] == [("create_job", 2, None)]
    assert sim.reasons(d) == ["StageRestarted"] and sim.fm().failures == 0
    assert next(c for c in sim.status.conditions if c.type == "Validated").status == "True"


def _failed_at(sim, latest, **files):
    sim.step()
    sim.files["fm"] = _ran(result="failed", latest=latest, **files)
    sim.job("Failed", "exit code 1")
    sim.step()


def test_a_stage_set_rewinds_a_failed_run_once_and_a_later_retry_resumes_the_newest():
    sim = Sim(_spec("train.max_steps=8", backoffLimit=0))
    _failed_at(sim, 6)
    assert sim.status.phase == "Failed"
    # rewind to step 2 with a schedule below the newest checkpoint (6) but above the rewind's step
    sim.respec(_spec("train.max_steps=5", *REWIND_2, backoffLimit=1))
    sim.step()                                                   # SpecChanged: the kept job deleted
    d = sim.step()
    (create,) = d.actions
    assert (create.attempt, create.resume_from) == (2, f"{FM}/checkpoints/step_00000002")
    assert sim.reasons(d) == ["StageRewound"] and "rewinds to /runs/tiny-wan/fm/checkpoints/step_00000002" in \
        d.events[0][2] and "step 6 the newest" in d.events[0][2]
    assert sim.fm().attempts[-1].resumedFrom == 2 and sim.fm().rewoundTo is None
    # the trainer rewound (its launch record says so), trained to step 3 and failed
    sim.files["fm"] = _ran(result="failed", latest=3, rewinds=(2,), launches=3)
    sim.job("Failed", "exit code 1")
    sim.step()
    assert sim.fm().rewoundTo == 2
    d = sim.step()
    assert [(a.attempt, a.resume_from) for a in d.actions] == [(3, f"{FM}/checkpoints/step_00000003")]
    assert sim.reasons(d) == ["StageStarted"]


def test_a_rewind_to_the_newest_checkpoint_is_settled_in_the_status_and_not_done_again_later():
    sim = Sim(_spec(backoffLimit=3))
    _failed_at(sim, 2)
    sim.respec(_spec(*REWIND_2, backoffLimit=3))
    d = sim.step()
    assert [(a.attempt, a.resume_from) for a in d.actions] == [(2, f"{FM}/checkpoints/step_00000002")]
    assert sim.reasons(d) == ["StageStarted"] and sim.fm().rewoundTo == 2   # nothing newer to move aside
    sim.files["fm"] = _ran(result="failed", latest=3, launches=2)           # no launch recorded a rewind
    sim.job("Failed", "exit code 1")
    sim.step()
    d = sim.step()
    assert [(a.attempt, a.resume_from) for a in d.actions] == [(3, f"{FM}/checkpoints/step_00000003")]


def test_a_running_stage_edited_to_rewind_is_stopped_and_rewound_not_counted():
    sim = Sim(_spec("train.max_steps=8", backoffLimit=0))
    sim.step()
    sim.job("Running")
    sim.files["fm"] = _ran(latest=4)
    sim.step()
    sim.respec(_spec("train.max_steps=8", *REWIND_2, backoffLimit=0))
    d = sim.step()
    assert [(a.kind, a.job) for a in d.actions] == [("delete_job", "tiny-wan-fm-1")]
    assert sim.reasons(d) == ["StageRewinding"] and sim.fm().reason == "StageRewinding"
    sim.files["fm"] = _ran(result="stopped", latest=5)                       # it saved on its SIGTERM
    d = sim.step()
    assert [(a.attempt, a.resume_from) for a in d.actions] == [(2, f"{FM}/checkpoints/step_00000002")]
    assert sim.reasons(d) == ["StageRewound"] and sim.fm().failures == 0
    sim.job("Running")
    d = sim.step()                                  # the rewinding attempt itself goes on before its record
    assert not d.actions and sim.fm().phase == "Running"
    sim.files["fm"] = _ran(latest=3, rewinds=(2,), launches=2)
    assert not sim.step().actions and sim.fm().rewoundTo == 2


def test_a_rewind_that_would_change_the_recipe_waits_unless_the_set_accepts_it():
    sim = Sim(_spec(backoffLimit=0))
    _failed_at(sim, 4, config=copy.deepcopy(Sim(_spec()).plan.stage("fm").resolved))
    sim.respec(_spec(*REWIND_2, "train.optimizer.lr=0.002", backoffLimit=0))
    sim.step()
    d = sim.step()
    assert not d.actions and sim.fm().reason == "RecipeChanged" and "train.optimizer.lr" in sim.fm().message
    sim.respec(_spec(*REWIND_2, "train.optimizer.lr=0.002", "checkpoint.accept_changes=[train.optimizer.lr]",
                     backoffLimit=0))
    d = sim.step()
    (create,) = d.actions
    assert create.resume_from == f"{FM}/checkpoints/step_00000002" and sim.reasons(d)[-1] == "StageRewound"
    assert "checkpoint.accept_changes=[train.optimizer.lr]" in sim.plan.stage("fm").arguments(create.resume_from)
