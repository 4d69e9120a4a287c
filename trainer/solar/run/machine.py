"""The SolarRun state machine: (spec, previous status, observations) -> (status, actions, events).

Pure: no clock, no API, no files. The operator and ``solar run`` observe (jobs or local process
groups, stage directories), call ``reconcile`` and carry out its actions. The rules live one per
module (``success``, ``failure``, ``progress_deadline``, ``resume``, ``suspend``); reasons and
messages in ``conditions``. Stages run in order; the current stage is the first not Succeeded.

    spec does not resolve (any stage)          -> Failed, Validated=False/<reason>; no job
    spec.runPolicy.suspend                     -> delete the current job; Suspended (stages whose job
                                                  succeeded unrecorded are recorded first)
    current stage has no job                   -> create one (resume.py: fresh, from the newest
                                                  verified checkpoint, over from step 0 when its
                                                  directory committed none: StageRestarted, or from
                                                  the step its set rewinds it to: StageRewound),
                                                  recording the attempt's topology; resuming at another shape
                                                  (reshape.py): TopologyChanged, or, when the global
                                                  batch would change, no job: Validated=False/
                                                  TopologyMismatch, the stage Pending until the spec
                                                  is fixed (also reported while suspended)
    a job the status does not know about       -> adopt it (an operator restarted between creating
                                                  a job and recording it)
    job being deleted                          -> wait for it to go
    job the operator suspended, run resumed    -> delete it; the next attempt resumes from the checkpoint
    job suspended by someone else (Kueue)      -> Pending, Progressing=True/Queued; no progress deadline
                                                  (it runs from the admission); suspend is left alone;
                                                  suspended again after its admission (preempted): deleted,
                                                  the next attempt resumes from the checkpoint
    job Succeeded                              -> stage Succeeded if success.py agrees, else Failed
                                                  with its reason; then the next stage at once
    job Failed                                 -> failure.py: delete and retry (counted once: the
                                                  status is written before the delete), or
                                                  BackoffLimitExceeded (the job is kept);
                                                  StorageFull/StorageError at once (run-result's class)
    job created/pending/running/restarting     -> Pending|Running; progress_deadline.py may fail it
                                                  (ProgressDeadlineExceeded, job deleted)
    every stage Succeeded                      -> Succeeded, Ready=True
    finished, status.jobsToDelete              -> delete those jobs (still there), clear the list

Failed and Succeeded are final: a finished run is never restarted (create a new SolarRun). A
final verdict that deletes jobs is written before they go, listing them in ``jobsToDelete`` (the
operator does that: ``solar_operator.runs``); a pass over the finished run deletes what is left.
Every stage transition produces an event.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from solar.run import conditions as C
from solar.run import elastic, failure, progress_deadline, reshape, resume, success, suspend
from solar.run.pods import Pods
from solar.run.observe import StageFiles
from solar.run.plan import RunInvalid, RunPlan, StagePlan, job_name
from solar.run.spec import (
    AttemptUsage,
    CheckpointStatus,
    ElasticStatus,
    MemoryStatus,
    SolarRunSpec,
    SolarRunStatus,
    StageAttempt,
    StageStatus,
    StageUsage,
    StatusTopology,
    ValidationStatus,
)

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class JobState:
    name: str
    phase: str | None          # Created|Running|Restarting|Succeeded|Failed|Suspended; None: no condition yet
    message: str = ""
    deleting: bool = False     # deletion requested (deletionTimestamp set): wait until it is gone
    attempt: int | None = None  # the attempt it runs (the job's solarwm.io/attempt label)
    created: float | None = None  # when it was created (epoch seconds)
    suspended: bool = False    # the job's own suspend flag is set (a queue holds it, or the operator did)
    suspended_by_operator: bool = False  # ... because the operator suspended it (SolarRun suspend)
    resumed: float | None = None  # when the job controller last reported it resumed (epoch seconds)
    version: str | None = None  # the API object's resourceVersion (an unchanged job needs no second look)
    refused: bool = False       # the trainer refused its input before writing anything (solar run: exit 2 with
                                # no new launch record; the operator: its pods' termination message)


@dataclass
class Observation:
    run: str
    generation: int
    now: float                                          # epoch seconds
    plan: RunPlan | None = None
    invalid: RunInvalid | None = None
    jobs: Mapping[str, JobState] = field(default_factory=dict)     # stage -> its job, when it exists
    files: Mapping[str, StageFiles] = field(default_factory=dict)  # stage -> its directory
    # stage -> one line of `solar diagnose` on its directory, asked only when a stage fails
    diagnose: Callable[[str], str | None] = lambda stage: None
    # stage -> what its pods say (the operator reads them; absent: nothing known, as under solar run);
    # elastic stages: stage -> how many nodes could hold one of its pods now, counting those its own
    # running pods hold (absent: unknown)
    pods: Mapping[str, Pods] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)
    # whether the stages run on GPUs: solar run on a machine without one says False, and no GPU memory
    # forecast is reported (it would forecast memory no device has)
    gpus: bool = True


@dataclass(frozen=True)
class Action:
    kind: str                  # create_job | delete_job | suspend_job (the backend deletes or suspends it)
    stage: str
    job: str
    attempt: int = 0
    resume_from: str | None = None
    nodes: int | None = None   # an elastic stage's attempt at another node count than the plan's


@dataclass
class Decision:
    status: SolarRunStatus
    actions: list[Action] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)   # (Normal|Warning, reason, message)
    transitions: list[tuple[str, str]] = field(default_factory=list)   # (stage, to_phase)
    job_failures: list[tuple[str, str]] = field(default_factory=list)  # (stage, run-result error_type)
    shape_changes: list[tuple[str, str]] = field(default_factory=list)  # (stage, shrink|grow)
    disruption_costs: list[tuple[str, float]] = field(default_factory=list)  # (stage, seconds to recover)


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


class _Run:
    """The status under construction, with the bookkeeping every transition shares."""

    def __init__(self, spec: SolarRunSpec | None, previous: SolarRunStatus | None, now: float,
                 generation: int, run: str = "") -> None:
        self.now, self.generation, self.run = now, generation, run
        status = previous.model_copy(deep=True) if previous else SolarRunStatus()
        known = {s.name: s for s in status.stages}
        if spec is not None:  # None: a spec that does not even parse (reported invalid)
            status.stages = [known.get(s.name) or StageStatus(name=s.name) for s in spec.stages]
        status.observedGeneration = generation
        self.status = status
        self.decision = Decision(status)
        self.diagnose: Callable[[str], str | None] = lambda stage: None
        self.plan: RunPlan | None = None

    def explained(self, stage: str, message: str) -> str:
        """A failure message with the stage directory's diagnosis appended, when it has one."""
        found = self.diagnose(stage)
        return f"{message}; diagnosis: {found}" if found else message

    def condition(self, type_: str, value: str, reason: C.Reason | str, message: str = "") -> None:
        C.set_condition(self.status.conditions, type_, value, reason, message, now=iso(self.now),
                        generation=self.generation)

    def event(self, kind: str, reason: C.Reason | str, message: str) -> None:
        self.decision.events.append((kind, reason.name if isinstance(reason, C.Reason) else reason, message))

    def stage_phase(self, st: StageStatus, phase: str) -> bool:
        changed = st.phase != phase
        if changed:
            self.decision.transitions.append((st.name, phase))
        st.phase = phase
        return changed

    def fail(self, st: StageStatus | None, reason: C.Reason | str, message: str) -> Decision:
        name = reason.name if isinstance(reason, C.Reason) else reason
        if st is not None:
            self.stage_phase(st, "Failed")
            st.reason, st.message, st.completionTime = name, message, iso(self.now)
        self.status.phase = "Failed"
        self.condition(C.FAILED, "True", name, message)
        self.condition(C.READY, "False", name, message)
        self.event("Warning", name, message)
        return self.decision


def reconcile(spec: SolarRunSpec | None, previous: SolarRunStatus | None, obs: Observation) -> Decision:
    """``spec`` None means it does not parse; ``obs.invalid`` then says why."""
    if spec is None and obs.invalid is None:
        raise ValueError("reconcile without a spec needs obs.invalid")
    reopening = reopens(previous, obs.generation)
    r = _Run(spec, previous, obs.now, obs.generation, obs.run)
    r.diagnose = obs.diagnose
    r.plan = obs.plan
    status = r.status
    if reopening:
        _reopen(r)
    elif previous is not None and previous.phase in TERMINAL:
        for job in previous.jobsToDelete or []:  # the verdict is out, its jobs' deletes are not done yet
            if job in {j.name for j in obs.jobs.values() if not j.deleting}:
                stage = next((s.name for s in status.stages if s.job == job), "")
                r.decision.actions.append(Action("delete_job", stage, job))
        status.jobsToDelete = None
        return r.decision
    if obs.invalid is not None:
        st = status.stage(obs.invalid.stage) if obs.invalid.stage else None
        r.condition(C.VALIDATED, "False", obs.invalid.reason, obs.invalid.message)
        return r.fail(st, obs.invalid.reason, obs.invalid.message)
    plan = obs.plan
    current = next((st for st in status.stages if st.phase != "Succeeded"), None)
    refused = _refused(plan, current, obs)
    if refused is not None:   # no new attempt of the stage until the spec keeps its global batch
        _mismatch(r, refused)
    else:
        refused = _recipe_refused(plan, current, obs)
        if refused is not None:   # nor until it keeps the recipe the stage's checkpoints were trained with
            _hold(r, C.RECIPE_CHANGED, refused)
    message = C.RESOLVED.message(stages=len(plan.stages))
    if refused is None and (previous is None or not C.is_true(previous.conditions, C.VALIDATED)):
        r.event("Normal", C.RESOLVED, message)
        forecasts = [f"{p.name} {_size(p.memory_peak)}" + (f" of {_size(p.gpu_memory)}" if p.gpu_memory else "")
                     for p in plan.stages if p.memory_peak is not None]
        if forecasts and obs.gpus:
            r.event("Normal", C.MEMORY_FORECAST, C.MEMORY_FORECAST.message(detail=", ".join(forecasts)))
    for p in plan.stages:
        if p.memory_peak is not None:
            status.stage(p.name).memory = MemoryStatus(peakBytes=p.memory_peak, gpuMemoryBytes=p.gpu_memory)
    if refused is None:
        r.condition(C.VALIDATED, "True", C.RESOLVED, message)
    status.topology = StatusTopology(worldSize=plan.world_size, logicalDataParallelSize=plan.logical_dp,
                                     globalBatchSize=plan.global_batch)
    if current is None:
        return _succeeded(r)
    mode = suspend.suspended(spec.runPolicy.suspend, previous.phase if previous else None)
    if mode == "suspend":
        current = _settle_succeeded(r, plan, current, obs)
        if current is None:
            return _succeeded(r)
        return _suspend(r, current, obs.jobs.get(current.name))
    if mode == "resume":
        r.condition(C.SUSPENDED, "False", C.RESUMED, C.RESUMED.message(stage=current.name))
        r.event("Normal", C.RESUMED, C.RESUMED.message(stage=current.name))
    for st in status.stages:
        if st.phase == "Succeeded":
            continue
        if not _advance(r, spec, st, plan.stage(st.name), obs):
            return r.decision
    return _succeeded(r)


def _advance(r: _Run, spec: SolarRunSpec, st: StageStatus, p: StagePlan, obs: Observation) -> bool:
    """One stage's step; True when it succeeded and the next stage may go on in this reconcile."""
    status = r.status
    status.currentStage = st.name
    status.phase = "Running"
    files = obs.files.get(st.name) or StageFiles(exists=False)
    _note_usage(status, st, files.usage)
    if p.action == "train":
        status.step = files.latest
        _note_checkpoint(r, st, p, files.latest)
        if p.rewind is not None and p.rewind in files.rewinds:
            st.rewoundTo = p.rewind                      # the trainer recorded the set's rewind: done
    if p.elastic:
        _note_recovery(r, st, files)
    job = obs.jobs.get(st.name)
    pods = obs.pods.get(st.name, Pods())
    if job is not None and job.deleting:
        return False                                     # the previous attempt's job is still going away
    if job is None:
        if pods.alive:
            return False                                 # its pods are still going (saving on SIGTERM); those
        if p.elastic:                                    # on a lost node are not counted: they never confirm
            _regrow(r, spec, st, p, obs.capacity.get(st.name))
        _start(r, st, p, files)
        return False
    _adopt(r, st, job)
    if job.suspended_by_operator:                        # suspended for a SolarRun suspend that ended
        r.decision.actions.append(Action("delete_job", st.name, job.name))
        r.stage_phase(st, "Pending")
        return False
    if job.suspended and job.phase not in ("Succeeded", "Failed"):
        if st.admittedTime is not None or st.phase == "Running":  # preempted: its pods would restart with
            _preempted(r, st, job)                                # this attempt's arguments, not the checkpoint
        else:
            _queued(r, st, job)
        return False
    if st.reason == C.QUEUED.name:                       # admitted since the last look
        st.reason = st.message = None
        st.admittedTime = iso(r.now)
    if pods.placed and st.attempts and st.attempts[-1].attempt == st.attempt and job.attempt in (None, st.attempt):
        st.attempts[-1].nodeNames = sorted(set(st.attempts[-1].nodeNames or ()) | set(pods.placed))
    finished = job.phase == "Succeeded" and files.result != "stopped"
    if pods.disrupted and not finished and job.attempt in (None, st.attempt) and not job.refused:
        # whatever the job's phase: a real cluster's job reads Running until the taint manager's
        # eviction, minutes after the node was lost (solar.run.pods); an evicted attempt that saved on
        # its SIGTERM is still a disruption (its shape, its cost), resumed from what it saved
        if files.result == "complete" and success.completion_problem(p, files) is None:
            # ... but one whose files prove the stage complete (a dead kubelet's ranks finished while
            # their job still read Running: no kubelet reported the exit) is done: no launch to run none
            r.decision.actions.append(Action("delete_job", st.name, job.name))
            _stage_done(r, st, p, files)
            return True
        _disrupted(r, st, p, job, pods, obs.capacity.get(st.name), files)
        return False
    if job.phase in ("Succeeded", "Failed") and _stopped(r, st, p, job, files):
        return False
    if job.phase == "Succeeded":
        problem = success.completion_problem(p, files)
        if problem:
            r.fail(st, *problem)
            return False
        _stage_done(r, st, p, files)
        return True
    if job.phase == "Failed":
        _job_failed(r, spec, st, job, files)
        return False
    phase = "Running" if job.phase in ("Running", "Restarting") else "Pending"
    if p.elastic and _elastic_change(r, spec, st, p, job, phase, obs, files):
        return False
    if _rewinding(r, st, p, job, files):
        return False
    if r.stage_phase(st, phase) and phase == "Running":
        r.event("Normal", C.STAGE_RUNNING, C.STAGE_RUNNING.message(stage=st.name, attempt=st.attempt))
    limit = spec.runPolicy.progressDeadlineSeconds
    started = job.created if job.created is not None else parse_iso(st.startTime)
    marks = [t for t in (started, parse_iso(st.admittedTime), job.resumed) if t is not None]
    started = max(marks) if marks else None              # time in a queue does not count
    idle = progress_deadline.exceeded(obs.now, last_activity=files.last_activity, attempt_started=started, limit=limit)
    if idle is not None:
        r.decision.actions.append(Action("delete_job", st.name, job.name))
        r.fail(st, C.PROGRESS_DEADLINE_EXCEEDED, r.explained(
            st.name, C.PROGRESS_DEADLINE_EXCEEDED.message(stage=st.name, idle=f"{idle:.0f}", limit=limit)))
        return False
    if phase == "Running":  # while its pods are pending, Progressing keeps saying how the attempt started
        r.condition(C.PROGRESSING, "True", C.STAGE_RUNNING, C.STAGE_RUNNING.message(stage=st.name, attempt=st.attempt))
    return False


def _stopped(r: _Run, st: StageStatus, p: StagePlan, job: JobState, files: StageFiles) -> bool:
    """A training attempt whose ranks stopped on a signal after a checkpoint newer than the one it resumed
    (run-result.json ``stopped``: SIGTERM from an eviction, a drain, a preemption; the pods exit 0 after
    such a stop, so its job may read Succeeded): the next attempt resumes from that checkpoint, not counted
    against backoffLimit. A stop that saved nothing new is left to the job's own verdict (a Failed job
    is retried and counted; a Succeeded one fails as ResultIncomplete). True when handled."""
    if p.action != "train" or files.result != "stopped" or files.result_problem or files.latest is None \
            or job.attempt not in (None, st.attempt):
        return False
    current = st.attempts[-1] if st.attempts and st.attempts[-1].attempt == st.attempt else None
    if current is None or files.latest <= (current.resumedFrom or 0):
        return False
    launch = (((files.usage or {}).get("attempts") or [{}])[-1] or {}).get("started")
    try:
        launched, started = parse_iso(launch), parse_iso(current.startTime)
    except ValueError:
        return False
    if launched is None or started is None or launched < started:
        return False                     # the stop is an earlier launch's: this one wrote no result
    message = C.STAGE_STOPPED.message(stage=st.name, attempt=st.attempt, step=files.latest, phase=job.phase)
    _replaced(r, st, job, C.STAGE_STOPPED, message, "Warning")
    return True


def _replaced(r: _Run, st: StageStatus, job: JobState, reason, message: str, event_type: str) -> None:
    """The attempt's job goes and the stage waits for its next attempt (not counted as a failure),
    ``reason`` in the status, the Progressing condition and an event."""
    r.decision.actions.append(Action("delete_job", st.name, job.name))
    r.stage_phase(st, "Pending")
    st.reason, st.message = reason.name, message
    r.condition(C.PROGRESSING, "True", reason, message)
    r.event(event_type, reason, message)


def _rewinding(r: _Run, st: StageStatus, p: StagePlan, job: JobState, files: StageFiles) -> bool:
    """A live attempt of a training stage whose set now rewinds it (the spec was edited while it ran): it is
    stopped (SIGTERM: its ranks finish the step and save) and the next attempt rewinds, not counted as a
    failure. An attempt that itself started from that rewind (or one the status does not know yet) goes on.
    True when it is being stopped."""
    if p.action != "train" or p.rewind is None or job.attempt not in (None, st.attempt) or not st.attempts \
            or st.attempts[-1].attempt != st.attempt:
        return False
    if st.attempts[-1].resumedFrom == p.rewind or not resume.rewind_pending(p, files, st.rewoundTo):
        return False
    message = C.STAGE_REWINDING.message(stage=st.name, attempt=st.attempt, path=p.checkpoint_dir(p.rewind))
    _replaced(r, st, job, C.STAGE_REWINDING, message, "Normal")
    return True


def _queued(r: _Run, st: StageStatus, job: JobState) -> None:
    """A job its queue holds suspended (Kueue): waiting for admission is neither progress nor idleness."""
    message = C.QUEUED.message(stage=st.name, attempt=st.attempt, job=job.name)
    r.stage_phase(st, "Pending")
    if st.reason != C.QUEUED.name:
        st.reason, st.message = C.QUEUED.name, message
        r.event("Normal", C.QUEUED, message)
    r.condition(C.PROGRESSING, "True", C.QUEUED, message)


def _preempted(r: _Run, st: StageStatus, job: JobState) -> None:
    """A queue took an admitted job back: replace it (the next attempt resumes from the newest
    checkpoint and waits in the queue again); the operator still never touches its ``suspend``."""
    message = C.PREEMPTED.message(stage=st.name, attempt=st.attempt, job=job.name)
    _replaced(r, st, job, C.PREEMPTED, message, "Warning")


def _note_usage(status: SolarRunStatus, st: StageStatus, usage: dict | None) -> None:
    """The stage's GPU time from its run-result.json (every launch so far), and the run's total."""
    if not usage:
        return
    try:
        st.usage = StageUsage(gpuSeconds=usage["gpu_seconds"], attempts=[
            AttemptUsage(status=a.get("status", "unknown"), worldSize=a.get("world_size", 0),
                         gpuSeconds=a.get("gpu_seconds", 0.0), started=a.get("started"), ended=a.get("ended"))
            for a in usage.get("attempts", [])])
    except (KeyError, TypeError, ValueError):  # a run-result from another version: say nothing rather than guess
        return
    status.gpuHours = round(sum(s.usage.gpuSeconds for s in status.stages if s.usage) / 3600, 4)


def _size(n: int) -> str:
    """A forecast in GiB, or MiB under one GiB (a tiny config's forecast is not ``0.0 GiB``)."""
    from solar.config.memory import size_text

    return size_text(n)


def _refused(plan: RunPlan, current: StageStatus | None, obs: Observation) -> reshape.Reshape | None:
    """The current stage's next attempt, when it would change the global batch of the checkpoint it
    resumes (asked only while no attempt of it runs: suspended, or its job failed or is gone)."""
    if not _between_attempts(current, obs):
        return None
    p = plan.stage(current.name)
    files = obs.files.get(current.name) or StageFiles(exists=False)
    found = reshape.of_stage(p, files.latest, files.position, current)
    return found if found is not None and found.refused else None


def _between_attempts(current: StageStatus | None, obs: Observation) -> bool:
    """The current stage has no attempt running (suspended, or its job failed, is going or gone): what a
    next attempt would do may be judged now."""
    if current is None:
        return False
    job = obs.jobs.get(current.name)
    return job is None or job.deleting or job.suspended_by_operator or job.phase == "Failed"


def _mismatch(r: _Run, found: reshape.Reshape) -> str:
    """Validated=False/TopologyMismatch (and its Warning once per message)."""
    return _hold(r, C.TOPOLOGY_MISMATCH, found.mismatch())


def _hold(r: _Run, reason: C.Reason, message: str) -> str:
    """Validated=False with ``reason`` (and its Warning once per message)."""
    before = C.find(r.status.conditions, C.VALIDATED)
    if before is None or before.status != "False" or before.message != message:
        r.event("Warning", reason, message)
    r.condition(C.VALIDATED, "False", reason, message)
    return message


def recipe_problem(p: StagePlan, files: StageFiles, rewound: int | None = None) -> str | None:
    """The trainer's own refusal of resuming this training stage's directory with the plan's config
    (``solar.config.changes``: a recipe key changed and not listed in checkpoint.accept_changes, or
    train.max_steps below the completed step: the checkpoint the next attempt resumes, resume.py, with
    ``rewound`` the stage's StageStatus.rewoundTo), or None. Schedule and execution changes pass, and so
    does anything when the next attempt resumes nothing (it starts over)."""
    if p.action != "train" or p.resolved is None or files.config is None:
        return None
    from solar.config import changes
    from solar.run import resume

    step = resume.next_start(p, files, 0, rewound).step
    if step is None:
        return None
    try:
        changes.review(files.config, p.resolved, completed_step=step, where=p.stage_dir)
    except ValueError as exc:
        return str(exc)
    return None


def _recipe_refused(plan: RunPlan, current: StageStatus | None, obs: Observation) -> str | None:
    """The current stage's recipe refusal (``recipe_problem``), asked as ``_refused`` is: only while no
    attempt of it runs."""
    if not _between_attempts(current, obs):
        return None
    problem = recipe_problem(plan.stage(current.name), obs.files.get(current.name) or StageFiles(exists=False),
                             current.rewoundTo)
    return C.RECIPE_CHANGED.message(stage=current.name, detail=problem) if problem else None


def reopens(previous: SolarRunStatus | None, generation: int) -> bool:
    """A Failed run whose spec changed since it failed (a newer generation) continues: re-validated,
    its failed stage resumed from its newest verified checkpoint with its failures counted anew."""
    return previous is not None and previous.phase == "Failed" and not previous.jobsToDelete \
        and generation > (previous.observedGeneration or 0)


def _reopen(r: _Run) -> None:
    status = r.status
    failed = next((st for st in status.stages if st.phase == "Failed"), None)
    status.phase = "Pending"
    stage = failed.name if failed is not None else (status.currentStage or "-")
    message = C.REOPENED.message(generation=r.generation, stage=stage)
    r.condition(C.FAILED, "False", C.REOPENED, message)
    r.event("Normal", C.REOPENED, message)
    if failed is not None:
        r.stage_phase(failed, "Pending")
        failed.failures, failed.completionTime = 0, None
        # a kept job of the failed attempt is deleted without counting it again (_job_failed)
        failed.reason, failed.message = C.JOB_FAILED.name, message


ATTEMPTS_KEPT = 50   # status.stages[].attempts keeps the newest; the rest are counted (elastic.attemptsDropped)


def _record_attempt(st: StageStatus, p: StagePlan, attempt: int, resumed_from: int | None, started: str) -> None:
    """The topology an attempt starts at (once per attempt); the attempt before it ends then (its GPU-hours
    from its start to now at its world size)."""
    if any(a.attempt == attempt for a in st.attempts or []):
        return
    attempts = list(st.attempts or [])
    if attempts and attempts[-1].endTime is None:
        last = attempts[-1]
        last.endTime = started
        began, ended = parse_iso(last.startTime), parse_iso(started)
        if began is not None and ended is not None:
            last.gpuHours = round(last.topology.worldSize * max(0.0, ended - began) / 3600, 4)
    attempts.append(StageAttempt(attempt=attempt, topology=reshape.attempt_topology(p), resumedFrom=resumed_from,
                                 startTime=started))
    if len(attempts) > ATTEMPTS_KEPT:
        dropped = len(attempts) - ATTEMPTS_KEPT
        attempts = attempts[dropped:]
        st.attemptsDropped = (st.attemptsDropped or 0) + dropped
    st.attempts = attempts


def _start(r: _Run, st: StageStatus, p: StagePlan, files: StageFiles) -> None:
    planned_nodes = p.nodes
    if p.elastic and st.elastic is not None:
        p = elastic.shaped(p, st.elastic.nodes)
    attempt = st.attempt + 1
    start = resume.next_start(p, files, attempt, st.rewoundTo)
    found = reshape.of_stage(p, start.step, files.position, st) if start.resume_from else None
    held = None
    problem = recipe_problem(p, files, st.rewoundTo) if start.resume_from else None
    if found is not None and found.refused:
        held = (C.TOPOLOGY_MISMATCH, _mismatch(r, found))
    elif problem:
        held = (C.RECIPE_CHANGED, _hold(r, C.RECIPE_CHANGED, C.RECIPE_CHANGED.message(stage=st.name, detail=problem)))
    if held is not None:
        reason, message = held
        r.stage_phase(st, "Pending")
        st.reason, st.message = reason.name, message
        r.status.phase = "Pending"
        r.condition(C.PROGRESSING, "False", reason, message)
        return
    name = job_name(r.run, st.name, attempt)
    r.decision.actions.append(Action("create_job", st.name, name, attempt, start.resume_from,
                                     p.nodes if p.nodes != planned_nodes else None))
    _record_attempt(st, p, attempt, start.step, iso(r.now))
    if resume.settles(p, files, st.rewoundTo):
        st.rewoundTo = p.rewind          # nothing after the set's step to move aside: resuming it is the rewind
    why = f"{files.launches} earlier launch{'es' if files.launches != 1 else ''}" + \
        (f"; attempt {st.attempt}: {st.reason}" if st.reason and st.attempt else "")
    if st.elastic is not None:
        st.elastic.unschedulableSince = None
        if st.elastic.nextReason and st.attempts and st.attempts[-1].attempt == attempt:
            st.attempts[-1].reason = st.elastic.nextReason
        st.elastic.nextReason = None
    st.job, st.attempt = name, attempt
    st.startTime = st.startTime or iso(r.now)
    st.admittedTime = None
    st.reason = st.message = None
    r.stage_phase(st, "Pending")
    if start.restart:        # counted as any attempt: its failure counts against backoffLimit, a disruption not
        reason = C.STAGE_RESTARTED
        message = reason.message(stage=st.name, attempt=attempt, dir=p.stage_dir, why=why, job=name)
    elif start.rewind:
        reason = C.STAGE_REWOUND
        message = reason.message(stage=st.name, attempt=attempt, path=start.resume_from, step=start.step, job=name,
                                 newest=f"step {files.latest}" if files.latest is not None else "none verified")
    else:
        reason = C.STAGE_STARTED
        message = reason.message(stage=st.name, attempt=attempt, how=start.how, job=name)
    r.condition(C.PROGRESSING, "True", reason, message)
    r.event("Normal", reason, message)
    if found is not None and found.changed:
        r.event("Normal", C.TOPOLOGY_CHANGED, C.TOPOLOGY_CHANGED.message(detail=f"attempt {attempt}: {found.summary()}"))
    if start.resume_from and files.skipped and not start.rewind:
        r.event("Warning", C.CHECKPOINT_SKIPPED, C.CHECKPOINT_SKIPPED.message(
            stage=st.name, attempt=attempt, path=start.resume_from, skipped="; ".join(files.skipped)))


def elastic_settings(spec: SolarRunSpec, stage: str):
    """The stage's ``topology.elastic`` settings (its own topology's, else the run's), or None."""
    own = next(s for s in spec.stages if s.name == stage).topology
    return (own or spec.topology).elastic


def _elastic_now(st: StageStatus, p: StagePlan) -> ElasticStatus:
    """The stage's elastic status, made at the shape its latest attempt started with (else the plan's)."""
    if st.elastic is None:
        nodes = st.attempts[-1].topology.nodes if st.attempts else p.nodes
        st.elastic = ElasticStatus(nodes=nodes if elastic.shape_at(p.elastic, nodes) else p.nodes)
    return st.elastic


def _change_shape(r: _Run, st: StageStatus, p: StagePlan, nodes: int, reason: C.Reason, why: str,
                  job: JobState | None, since: float | None = None) -> None:
    """Record the next attempt's node count and why (its job, when given, is deleted: a running one stops
    after its step and saves on SIGTERM, a failed or disrupted one is gone); a disruption's cost starts
    counting (from ``since``, when the loss began, else now)."""
    el = _elastic_now(st, p)
    old = el.nodes
    then = (f"attempt {st.attempt} stops after its step and saves, and the next resumes from that checkpoint"
            if job is not None else "the next attempt starts at it from the newest verified checkpoint")
    message = reason.message(stage=st.name, old=elastic.describe(p, old), new=elastic.describe(p, nodes), why=why,
                             attempt=st.attempt, shape=elastic.describe(p, nodes), next=_next_start(p), then=then)
    if job is not None:
        r.decision.actions.append(Action("delete_job", st.name, job.name))
    if nodes != old:
        el.nodes, el.changedAt = nodes, iso(r.now)
        if nodes < old:
            el.shrinks += 1
        else:
            el.grows += 1
        el.nextReason = f"{reason.name}: {why}"
        r.decision.shape_changes.append((st.name, "shrink" if nodes < old else "grow"))
    grown = reason is C.TOPOLOGY_GROWN
    if not grown and el.disruptedAt is None:
        el.disruptedAt, el.disruptedAttempt = iso(min(r.now, since) if since is not None else r.now), st.attempt
    el.unschedulableSince = None
    r.stage_phase(st, "Pending")
    st.reason, st.message = reason.name, message
    r.condition(C.PROGRESSING, "True", reason, message)
    r.event("Normal" if grown else "Warning", reason, message)


def _next_start(p: StagePlan, files: StageFiles | None = None) -> str:
    """What the next attempt does, for messages (``files``: the stage directory, when known)."""
    if p.action != "train":
        return "continues where this one stopped"
    if files is not None and files.latest is None and files.launched and p.rewind is None:
        return "starts over from step 0 (no checkpoint committed yet)"
    return "resumes the newest verified checkpoint"


def _regrow(r: _Run, spec: SolarRunSpec, st: StageStatus, p: StagePlan, capacity: int | None) -> None:
    """Before an elastic stage's next attempt that a shrink sized: when the cluster holds a larger allowed
    shape again (the lost node came back while the old attempt's pods went), start at that one instead
    (``TopologyGrown``): a start stops nothing, so minSecondsBetweenChanges does not hold it back, and a
    grow-back later would cost one more relaunch."""
    el = st.elastic
    settings = elastic_settings(spec, st.name)
    if el is None or capacity is None or el.nodes >= p.nodes or not (settings and settings.growBack) \
            or not (el.nextReason or "").startswith(C.TOPOLOGY_SHRUNK.name):
        return
    target = elastic.grown(p.elastic, nodes=el.nodes, capacity=capacity)
    if target is not None:
        _change_shape(r, st, p, target.nodes, C.TOPOLOGY_GROWN, f"the cluster holds {capacity} node"
                      f"{'s' if capacity != 1 else ''} for it again before attempt {st.attempt + 1} started", None)


def _disrupted(r: _Run, st: StageStatus, p: StagePlan, job: JobState, pods: Pods, capacity: int | None,
               files: StageFiles | None = None) -> None:
    """An attempt whose pods were disrupted (its job failed or, on a real cluster, still reads Running) is
    replaced, not counted against backoffLimit. An elastic stage continues at the largest allowed shape
    the cluster holds now (never larger than this one; without a capacity figure, the next smaller
    allowed one); any other stage waits for its own shape (``StageDisrupted``)."""
    why = f"attempt {st.attempt}'s pods were disrupted ({pods.disrupted})"
    if not p.elastic:
        message = C.STAGE_DISRUPTED.message(stage=st.name, attempt=st.attempt, why=why,
                                            shape=elastic.describe(p, p.nodes), next=_next_start(p, files))
        _replaced(r, st, job, C.STAGE_DISRUPTED, message, "Warning")
        return
    el = _elastic_now(st, p)
    if capacity is not None:
        target = elastic.largest(p.elastic, at_most=min(capacity, el.nodes)) or p.elastic[-1]
    else:
        target = elastic.largest(p.elastic, at_most=None, below=el.nodes) or elastic.shape_at(p.elastic, el.nodes)
    reason = C.TOPOLOGY_SHRUNK if target.nodes < el.nodes else C.STAGE_DISRUPTED
    _change_shape(r, st, p, target.nodes, reason, why, job, pods.since)


def _elastic_change(r: _Run, spec: SolarRunSpec, st: StageStatus, p: StagePlan, job: JobState, phase: str,
                    obs: Observation, files: StageFiles) -> bool:
    """An elastic stage's live attempt: shrink when a pod of it stays unschedulable for shrinkAfterSeconds
    (read from the pods, whatever the job's phase: a partly placed attempt reads Running), grow back when
    it runs shrunk, wholly placed, its last step not yet committed, and the cluster holds a larger allowed
    shape (at most one change per minSecondsBetweenChanges). True when the attempt is being replaced."""
    settings = elastic_settings(spec, st.name)
    el = _elastic_now(st, p)
    pods = obs.pods.get(st.name, Pods())
    capacity = obs.capacity.get(st.name)
    if pods.unschedulable:
        since = parse_iso(el.unschedulableSince)
        if since is None:
            el.unschedulableSince = iso(r.now)
            return False
        waited = r.now - since
        if waited < settings.shrinkAfterSeconds:
            return False
        target = elastic.largest(p.elastic, at_most=capacity, below=el.nodes)
        if target is None:
            return False   # nothing smaller fits either: keep waiting for nodes
        _change_shape(r, st, p, target.nodes, C.TOPOLOGY_SHRUNK,
                      f"attempt {st.attempt}'s pods stayed unschedulable for {waited:.0f} s "
                      f"(shrinkAfterSeconds {settings.shrinkAfterSeconds})", job)
        return True
    el.unschedulableSince = None
    if phase != "Running" or not settings.growBack:
        return False
    if p.final_step is not None and files.latest is not None and files.latest >= p.final_step:
        return False       # the last step is committed: a larger shape would run no step
    target = elastic.grown(p.elastic, nodes=el.nodes, capacity=capacity)
    if target is None:
        return False
    changed = parse_iso(el.changedAt)
    if changed is not None and r.now - changed < settings.minSecondsBetweenChanges:
        return False
    _change_shape(r, st, p, target.nodes, C.TOPOLOGY_GROWN, f"the cluster holds {capacity} node"
                  f"{'s' if capacity != 1 else ''} for it now", job)
    return True


def _note_recovery(r: _Run, st: StageStatus, files: StageFiles) -> None:
    """A disruption's cost runs from the loss to the first step past the newest checkpoint at the new
    shape: the first step the stage's rank 0 records after an attempt started since the disruption
    (past the checkpoint that attempt resumed); where no step record is read, the first checkpoint
    that attempt commits."""
    el = st.elastic
    if el is None or el.disruptedAt is None or not st.attempts:
        return
    began, attempt = parse_iso(el.disruptedAt), st.attempts[-1]
    started = parse_iso(attempt.startTime)
    if began is None or started is None or attempt.attempt <= (el.disruptedAttempt or 0):
        return                           # no attempt since the disruption yet (the old one may still write)
    base = attempt.resumedFrom or 0
    if files.last_step is not None and files.last_step[0] > base and files.last_step[1] >= started:
        end = files.last_step[1]
    elif files.latest is not None and files.latest > base:
        end = r.now
    else:
        return
    cost = max(0.0, end - began)
    el.disruptionSeconds = round(el.disruptionSeconds + cost, 3)
    el.disruptedAt = el.disruptedAttempt = None
    r.decision.disruption_costs.append((st.name, cost))


def _note_checkpoint(r: _Run, st: StageStatus, p: StagePlan, step: int | None) -> None:
    """The stage's newest verified checkpoint, stamped when the operator first saw it verified
    (what checkpoint-age panels and alerts read)."""
    if step is not None and (st.checkpoint is None or st.checkpoint.step != step):
        st.checkpoint = CheckpointStatus(step=step, path=p.checkpoint_dir(step), verifiedAt=iso(r.now))


def _adopt(r: _Run, st: StageStatus, job: JobState) -> None:
    """A job the status does not record (created just before an operator restart): take it as ours."""
    attempt = job.attempt or max(st.attempt, 1)
    if st.job == job.name and st.attempt == attempt:
        return
    if attempt != st.attempt:  # a new attempt, as _start records one: the last one's failure is not its own
        st.reason = st.message = None
    st.job, st.attempt = job.name, attempt
    if r.plan is not None:     # created from this plan just before the status that records it was lost
        _record_attempt(st, r.plan.stage(st.name), attempt, None, iso(job.created if job.created is not None
                                                                      else r.now))
    st.startTime = st.startTime or iso(job.created if job.created is not None else r.now)
    r.event("Normal", C.JOB_ADOPTED, C.JOB_ADOPTED.message(stage=st.name, job=job.name, attempt=attempt))


def _job_failed(r: _Run, spec: SolarRunSpec, st: StageStatus, job: JobState, files: StageFiles) -> None:
    limit = spec.runPolicy.backoffLimit
    if st.reason == C.JOB_FAILED.name and job.attempt in (None, st.attempt):
        # this attempt's failure is already counted (the status is written before its job is deleted,
        # and that delete did not happen yet): delete it again, count nothing twice
        r.decision.actions.append(Action("delete_job", st.name, job.name))
        return
    verdict = failure.on_job_failed(failures=st.failures, backoff_limit=limit, job_message=job.message,
                                    result_message=files.result_message, result_error=files.result_error)
    verdict = dataclasses.replace(verdict, detail=r.explained(st.name, verdict.detail))
    st.failures = verdict.failures
    r.decision.job_failures.append((st.name, files.result_error or "unknown"))
    if job.refused:
        r.fail(st, C.INPUT_REFUSED, C.INPUT_REFUSED.message(stage=st.name, attempt=st.attempt, detail=verdict.detail))
        return
    if files.result_error in failure.NOT_RETRIED:
        reason = C.STORAGE_FULL if files.result_error == "storage_full" else C.STORAGE_ERROR
        r.fail(st, reason, reason.message(stage=st.name, attempt=st.attempt, detail=verdict.detail))
        return
    if not verdict.retry:
        r.fail(st, C.BACKOFF_LIMIT_EXCEEDED, C.BACKOFF_LIMIT_EXCEEDED.message(
            stage=st.name, failures=verdict.failures, limit=limit, detail=verdict.detail))
        return
    r.decision.actions.append(Action("delete_job", st.name, job.name))
    st.reason = C.JOB_FAILED.name
    st.message = C.STAGE_RETRYING.message(stage=st.name, attempt=st.attempt, detail=verdict.detail,
                                          failures=verdict.failures, limit=limit)
    r.condition(C.PROGRESSING, "True", C.STAGE_RETRYING, st.message)
    r.event("Warning", C.JOB_FAILED, st.message)


def _stage_done(r: _Run, st: StageStatus, p: StagePlan, files: StageFiles) -> None:
    now = iso(r.now)
    r.stage_phase(st, "Succeeded")
    st.completionTime = now
    st.reason, st.message = C.STAGE_SUCCEEDED.name, None
    what = ""
    if p.final_step is not None:
        _note_checkpoint(r, st, p, p.final_step)
        r.status.step = p.final_step
        what = f" (checkpoint step {p.final_step})"
    if files.marker:
        st.validation = ValidationStatus(step=p.validation_step, complete=files.marker_status == "complete")
    r.event("Normal", C.STAGE_SUCCEEDED, C.STAGE_SUCCEEDED.message(stage=st.name, what=what))


def _succeeded(r: _Run) -> Decision:
    r.status.phase = "Succeeded"
    message = C.COMPLETED.message()
    r.condition(C.READY, "True", C.COMPLETED, message)
    r.condition(C.PROGRESSING, "False", C.COMPLETED, message)
    r.event("Normal", C.COMPLETED, message)
    return r.decision


def _settle_succeeded(r: _Run, plan: RunPlan, current: StageStatus, obs: Observation) -> StageStatus | None:
    """Before suspending: the stages whose job already succeeded, unrecorded (the status write of that
    reconcile failed, or the operator restarted before it), are recorded as Succeeded, so that the
    stage suspended is the one whose job runs now, never a finished one (its job would be deleted,
    the running one left alone, and the finished stage run again on resume)."""
    while current is not None:
        job = obs.jobs.get(current.name)
        p = plan.stage(current.name)
        files = obs.files.get(current.name) or StageFiles(exists=False)
        if job is None or job.deleting or job.phase != "Succeeded" or success.completion_problem(p, files):
            return current
        _adopt(r, current, job)
        _note_usage(r.status, current, files.usage)
        _stage_done(r, current, p, files)
        current = next((st for st in r.status.stages if st.phase != "Succeeded"), None)
    return None


def _suspend(r: _Run, current: StageStatus, job: JobState | None) -> Decision:
    if job is not None and not job.deleting and not job.suspended_by_operator:
        _adopt(r, current, job)  # an attempt the status did not record yet still counts: the next is a new one
        r.decision.actions.append(Action("suspend_job", current.name, job.name))
    message = C.SUSPEND_REQUESTED.message(stage=current.name)
    if r.stage_phase(current, "Suspended"):
        r.event("Normal", C.SUSPEND_REQUESTED, message)
    r.status.phase = "Suspended"
    r.status.currentStage = current.name
    r.condition(C.SUSPENDED, "True", C.SUSPEND_REQUESTED, message)
    r.condition(C.PROGRESSING, "False", C.SUSPEND_REQUESTED, message)
    return r.decision


def fail_stage(spec: SolarRunSpec, previous: SolarRunStatus, *, stage: str, reason: C.Reason, message: str,
               now: float, generation: int) -> Decision:
    """Fail a run from outside the observations (the API server rejected a job it asked for)."""
    r = _Run(spec, previous, now, generation)
    return r.fail(r.status.stage(stage), reason, message)
