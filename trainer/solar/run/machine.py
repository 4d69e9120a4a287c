"""The SolarRun state machine: (spec, previous status, observations) -> (status, actions, events).

Pure: no clock, no API, no files. The operator and ``solar run`` observe (jobs or local process
groups, stage directories), call ``reconcile`` and carry out its actions.

Stages run in order; the current stage is the first that has not succeeded.

- Invalid spec (any stage fails to resolve)        -> Failed, Validated=False/<reason>; no job.
- spec.runPolicy.suspend                            -> delete the current job; Suspended.
- current stage has no job                          -> create it: attempt 1 fresh; a later attempt
                                                       resumes from the stage's newest verified
                                                       checkpoint (training) or continues
                                                       (inference); nothing to resume from in a
                                                       used directory -> Failed/NothingToResume.
- job Succeeded                                     -> the stage succeeds only if run-result.json
                                                       says complete, the final checkpoint verifies
                                                       and the expected validation marker exists;
                                                       otherwise Failed with ResultIncomplete,
                                                       CheckpointMissing|Incomplete|Unverifiable or
                                                       ValidationIncomplete. Then the next stage.
- job Failed                                        -> delete it and retry while its failures <=
                                                       backoffLimit, else Failed/BackoffLimitExceeded
                                                       (suspending and resuming costs no retry).
- job pending or running                            -> Running; no checkpoint, heartbeat or event
                                                       for progressDeadlineSeconds ->
                                                       Failed/ProgressDeadlineExceeded (job deleted).
- every stage succeeded                             -> Succeeded, Ready=True.

Failed and Succeeded are final: a finished run is never restarted (create a new SolarRun).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from solar.run.observe import StageFiles
from solar.run.plan import RunInvalid, RunPlan, job_name
from solar.run.spec import (
    CheckpointStatus, Condition, SolarRunSpec, SolarRunStatus, StageStatus, StatusTopology, ValidationStatus,
)

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class JobState:
    name: str
    phase: str | None          # Created|Running|Restarting|Succeeded|Failed|Suspended; None: no condition yet
    message: str = ""
    deleting: bool = False     # deletion requested (deletionTimestamp set): wait until it is gone


@dataclass
class Observation:
    run: str
    generation: int
    now: float                                  # epoch seconds
    plan: RunPlan | None = None
    invalid: RunInvalid | None = None
    jobs: dict[str, JobState] = field(default_factory=dict)      # stage -> its job, when it exists
    files: dict[str, StageFiles] = field(default_factory=dict)   # stage -> its directory


@dataclass(frozen=True)
class Action:
    kind: str                  # create_job | delete_job
    stage: str
    job: str
    attempt: int = 0
    resume_from: str | None = None


@dataclass
class Decision:
    status: SolarRunStatus
    actions: list[Action] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)   # (Normal|Warning, reason, message)
    transitions: list[tuple[str, str]] = field(default_factory=list)   # (stage, to_phase)


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


class _Run:
    """The status under construction, with the bookkeeping every transition shares."""

    def __init__(self, spec: SolarRunSpec, previous: SolarRunStatus | None, obs: Observation) -> None:
        self.spec, self.obs = spec, obs
        status = previous.model_copy(deep=True) if previous else SolarRunStatus()
        known = {s.name: s for s in status.stages}
        if spec is not None:  # None: a spec that does not even parse (reported invalid)
            status.stages = [known.get(s.name) or StageStatus(name=s.name) for s in spec.stages]
        status.observedGeneration = obs.generation
        self.status = status
        self.decision = Decision(status)

    def condition(self, type_: str, value: str, reason: str, message: str = "") -> None:
        now = iso(self.obs.now)
        for c in self.status.conditions:
            if c.type == type_:
                if c.status != value:
                    c.lastTransitionTime = now
                c.status, c.reason, c.message, c.observedGeneration = value, reason, message, self.obs.generation
                return
        self.status.conditions.append(Condition(type=type_, status=value, reason=reason, message=message,
                                                lastTransitionTime=now, observedGeneration=self.obs.generation))

    def event(self, kind: str, reason: str, message: str) -> None:
        self.decision.events.append((kind, reason, message))

    def stage_phase(self, st: StageStatus, phase: str) -> None:
        if st.phase != phase:
            self.decision.transitions.append((st.name, phase))
        st.phase = phase

    def fail(self, st: StageStatus | None, reason: str, message: str) -> None:
        if st is not None:
            self.stage_phase(st, "Failed")
            st.reason, st.message, st.completionTime = reason, message, iso(self.obs.now)
        self.status.phase = "Failed"
        self.condition("Failed", "True", reason, message)
        self.condition("Progressing", "False", reason, message)
        self.condition("Ready", "False", reason, message)
        self.event("Warning", reason, message)


def reconcile(spec: SolarRunSpec | None, previous: SolarRunStatus | None, obs: Observation) -> Decision:
    """``spec`` None means it does not parse; ``obs.invalid`` then says why."""
    if spec is None and obs.invalid is None:
        raise ValueError("reconcile without a spec needs obs.invalid")
    r = _Run(spec, previous, obs)
    status = r.status
    if previous is not None and previous.phase in TERMINAL:
        return r.decision
    if obs.invalid is not None:
        st = status.stage(obs.invalid.stage) if obs.invalid.stage else None
        r.condition("Validated", "False", obs.invalid.reason, obs.invalid.message)
        r.fail(st, obs.invalid.reason, obs.invalid.message)
        return r.decision
    plan = obs.plan
    if previous is None or not any(c.type == "Validated" and c.status == "True" for c in previous.conditions):
        r.event("Normal", "Validated", f"{len(plan.stages)} stages resolved")
    r.condition("Validated", "True", "Resolved", f"{len(plan.stages)} stages resolved")
    status.topology = StatusTopology(worldSize=plan.world_size, logicalDataParallelSize=plan.logical_dp,
                                     globalBatchSize=plan.global_batch)
    policy = spec.runPolicy
    current = next((st for st in status.stages if st.phase != "Succeeded"), None)
    if current is None:
        return _succeeded(r)
    if policy.suspend:
        return _suspend(r, current)
    if previous is not None and previous.phase == "Suspended":
        r.condition("Suspended", "False", "Resumed", "spec.runPolicy.suspend is false")
        r.event("Normal", "Resumed", f"resuming stage {current.name}")
    for st in status.stages:
        if st.phase == "Succeeded":
            continue
        status.currentStage = st.name
        p = plan.stage(st.name)
        files = obs.files.get(st.name) or StageFiles(exists=False)
        if files.latest:
            status.step = files.latest[0]
        job = obs.jobs.get(st.name)
        if job is not None and job.deleting:
            status.phase = "Running"
            return r.decision      # the previous attempt's job is still going away
        if job is None:
            _start(r, st, p, files)
            return r.decision
        if job.phase == "Succeeded":
            problem = _completion_problem(p, files)
            if problem:
                reason, _, message = problem.partition(": ")
                r.fail(st, reason, f"stage {st.name}: {message}")
                return r.decision
            _stage_done(r, st, p, files)
            continue
        if job.phase == "Failed":
            detail = "; ".join(x for x in (job.message, files.result_message) if x)
            st.failures += 1
            if st.failures <= policy.backoffLimit:
                r.decision.actions.append(Action("delete_job", st.name, job.name))
                st.reason, st.message = "JobFailed", f"attempt {st.attempt} failed: {detail or 'no message'}; retrying"
                r.condition("Progressing", "True", "StageRetrying", st.message)
                r.event("Warning", "JobFailed", f"stage {st.name} {st.message}")
                status.phase = "Running"
                return r.decision
            r.fail(st, "BackoffLimitExceeded", f"stage {st.name} failed {st.failures} times "
                                               f"(backoffLimit {policy.backoffLimit}): {detail or 'no message'}")
            return r.decision
        # created, pending, running, restarting
        r.stage_phase(st, "Running" if job.phase == "Running" else "Pending")
        status.phase = "Running"
        last = max(x for x in (files.last_activity, parse_iso(st.startTime), 0.0) if x is not None)
        if obs.now - last > policy.progressDeadlineSeconds:
            r.decision.actions.append(Action("delete_job", st.name, job.name))
            r.fail(st, "ProgressDeadlineExceeded",
                   f"stage {st.name}: no checkpoint, heartbeat or event for {obs.now - last:.0f}s "
                   f"(progressDeadlineSeconds {policy.progressDeadlineSeconds}); its job was deleted")
            return r.decision
        r.condition("Progressing", "True", "StageRunning", f"stage {st.name} attempt {st.attempt}")
        return r.decision
    return _succeeded(r)


def _start(r: _Run, st: StageStatus, p, files: StageFiles) -> None:
    attempt = st.attempt + 1
    resume = None
    if p.action == "train" and files.latest is not None:
        resume = files.latest[1]
    elif p.action == "train" and files.launched:
        r.fail(st, "NothingToResume", f"stage {st.name}: attempt {st.attempt} left a run directory without a "
                                      "verified checkpoint; a restart would not continue it")
        return
    name = job_name(r.obs.run, st.name)
    r.decision.actions.append(Action("create_job", st.name, name, attempt, resume))
    st.job, st.attempt = name, attempt
    st.startTime = st.startTime or iso(r.obs.now)
    st.reason = st.message = None
    r.stage_phase(st, "Pending")
    r.status.phase = "Running"
    r.status.currentStage = st.name
    what = f"from {resume}" if resume else ("continuing" if attempt > 1 else "fresh")
    r.condition("Progressing", "True", "StageStarted", f"stage {st.name} attempt {attempt} ({what})")
    r.event("Normal", "StageStarted", f"stage {st.name} attempt {attempt} ({what}): job {name}")


def _completion_problem(p, files: StageFiles) -> str | None:
    if files.result != "complete":
        return f"ResultIncomplete: the job succeeded but run-result.json says {files.result or 'nothing'}"
    if p.final_step is not None and files.final_problem:
        return files.final_problem
    if (p.validation_step is not None or p.generation) and files.validation is None:
        where = f"validation step {p.validation_step}" if p.validation_step else "generation"
        return f"ValidationIncomplete: {where} has no COMPLETE.json"
    return None


def _stage_done(r: _Run, st: StageStatus, p, files: StageFiles) -> None:
    now = iso(r.obs.now)
    r.stage_phase(st, "Succeeded")
    st.completionTime = now
    st.reason, st.message = "Completed", None
    if p.final_step is not None:
        st.checkpoint = CheckpointStatus(step=p.final_step, path=f"{p.stage_dir}/checkpoints/step_{p.final_step:08d}",
                                         verifiedAt=now)
        r.status.step = p.final_step
    if files.validation is not None:
        st.validation = ValidationStatus(step=p.validation_step, complete=files.validation[1] == "complete")
    r.event("Normal", "StageSucceeded", f"stage {st.name} succeeded")


def _succeeded(r: _Run) -> Decision:
    r.status.phase = "Succeeded"
    r.condition("Ready", "True", "Completed", "every stage succeeded")
    r.condition("Progressing", "False", "Completed", "every stage succeeded")
    r.event("Normal", "Completed", "every stage succeeded")
    return r.decision


def _suspend(r: _Run, current: StageStatus) -> Decision:
    job = r.obs.jobs.get(current.name)
    if job is not None:
        r.decision.actions.append(Action("delete_job", current.name, job.name))
    if r.status.phase != "Suspended":
        r.event("Normal", "Suspended", f"stage {current.name} suspended; it resumes from its last checkpoint")
    r.stage_phase(current, "Suspended")
    r.status.phase = "Suspended"
    r.status.currentStage = current.name
    r.condition("Suspended", "True", "SuspendRequested", "spec.runPolicy.suspend is true")
    r.condition("Progressing", "False", "Suspended", "spec.runPolicy.suspend is true")
    return r.decision
