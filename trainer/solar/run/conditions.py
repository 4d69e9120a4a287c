"""Condition types and every reason a SolarRun reports, with the one function that changes a condition.

Each ``Reason`` pairs the machine-readable reason (what ``kubectl wait --for=condition=...`` and
alerts key on) with the message template users read. Policies never spell a reason as a string.

``set_condition`` follows the Kubernetes API conventions: ``lastTransitionTime`` moves only when
the status flips (a new reason or message alone keeps it), and the exclusive types move together
(``Ready=True`` clears ``Failed``; ``Failed=True`` clears ``Ready`` and ``Progressing``).
"""

from __future__ import annotations

from typing import NamedTuple

from solar.run.spec import Condition

VALIDATED, PROGRESSING, READY, FAILED, SUSPENDED = "Validated", "Progressing", "Ready", "Failed", "Suspended"


class Reason(NamedTuple):
    name: str
    template: str

    def message(self, **values) -> str:
        return self.template.format(**values)


# Validation (the Validated condition; RunInvalid carries one of these names)
RESOLVED = Reason("Resolved", "{stages} stages resolved")
UNSUPPORTED_ROUTE = Reason("UnsupportedRoute", "{detail}")
UNRESOLVED_PLACEHOLDER = Reason("UnresolvedPlaceholder", "{detail}")
TOPOLOGY_MISMATCH = Reason("TopologyMismatch", "{detail}")
RECIPE_CHANGED = Reason("RecipeChanged", "stage {stage}: {detail}")
INVALID_INIT = Reason("InvalidInit", "{detail}")
INVALID_SPEC = Reason("InvalidSpec", "{detail}")
INSUFFICIENT_GPU_MEMORY = Reason("InsufficientGPUMemory", "{detail}")
INSUFFICIENT_HOST_MEMORY = Reason("InsufficientHostMemory", "{detail}")
BACKEND_UNAVAILABLE = Reason("BackendUnavailable", "{detail}")
VALIDATION_REASONS = tuple(r.name for r in (UNSUPPORTED_ROUTE, UNRESOLVED_PLACEHOLDER, TOPOLOGY_MISMATCH, RECIPE_CHANGED,
                                            INVALID_INIT, INVALID_SPEC, INSUFFICIENT_GPU_MEMORY,
                                            INSUFFICIENT_HOST_MEMORY, BACKEND_UNAVAILABLE))
MEMORY_FORECAST = Reason("MemoryForecast", "GPU memory per GPU forecast: {detail}")

# Progress
STAGE_STARTED = Reason("StageStarted", "stage {stage} attempt {attempt} ({how}): job {job}")
QUEUED = Reason("Queued", "stage {stage} attempt {attempt}: job {job} is held suspended by its queue "
                          "(admission pending; the progress deadline waits)")
PREEMPTED = Reason("StagePreempted", "stage {stage} attempt {attempt}: its queue suspended job {job} after admitting "
                                     "it (preemption); a new attempt resumes from the newest checkpoint when "
                                     "admitted again (not counted as a failure)")
STAGE_RUNNING = Reason("StageRunning", "stage {stage} attempt {attempt}")
STAGE_RETRYING = Reason("StageRetrying", "stage {stage} attempt {attempt} failed: {detail}; retrying "
                                         "({failures} of backoffLimit {limit})")
STAGE_SUCCEEDED = Reason("StageSucceeded", "stage {stage} succeeded{what}")
COMPLETED = Reason("Completed", "every stage succeeded")
TOPOLOGY_CHANGED = Reason("TopologyChanged", "{detail}")
TOPOLOGY_SHRUNK = Reason("TopologyShrunk", "stage {stage}: {old} -> {new}: {why}; the next attempt resumes the "
                                           "newest verified checkpoint with the same global batch (not counted "
                                           "as a failure)")
TOPOLOGY_GROWN = Reason("TopologyGrown", "stage {stage}: {old} -> {new}: {why}; {then}")
STAGE_DISRUPTED = Reason("StageDisrupted", "stage {stage} attempt {attempt}: {why}; the next attempt {next} at "
                                           "{shape} (not counted as a failure)")
STAGE_STOPPED = Reason("StageStopped", "stage {stage} attempt {attempt} was stopped by a signal and saved at step "
                                       "{step} (its job reads {phase}: an eviction, a drain or a preemption sends "
                                       "SIGTERM); the next attempt resumes from it (not counted as a failure)")
STAGE_RESTARTED = Reason("StageRestarted", "stage {stage} attempt {attempt} starts over from step 0 (its "
                                           "initialisation): {dir} holds no committed checkpoint ({why}); its "
                                           "earlier launches stay there as history: job {job}")
STAGE_REWOUND = Reason("StageRewound", "stage {stage} attempt {attempt} rewinds to {path} (the stage's set: "
                                       "checkpoint.path): the trainer moves its checkpoints after step {step} "
                                       "({newest} the newest) to checkpoints/superseded/ (kept) before its first "
                                       "step: job {job}")
STAGE_REWINDING = Reason("StageRewinding", "stage {stage} attempt {attempt}: the stage's set now rewinds it to "
                                           "{path}; the attempt stops after its step and saves, and the next "
                                           "rewinds (not counted as a failure)")
REOPENED = Reason("SpecChanged", "spec changed (generation {generation}): the failed run continues; stage {stage} "
                                  "resumes from its newest verified checkpoint (or starts over when it committed "
                                  "none), its failures counted anew")
JOB_ADOPTED = Reason("JobAdopted", "stage {stage}: found its job {job} (attempt {attempt}) and continued watching it")

# Stage success (success.py): a succeeded job is not yet a succeeded stage
STAGE_DIRECTORY_MISSING = Reason("StageDirectoryMissing", "stage {stage}: the job succeeded but its directory {dir} "
                                                         "is not visible where the run volume should be (the "
                                                         "operator's --storage-root)")
RESULT_INCOMPLETE = Reason("ResultIncomplete", "stage {stage}: the job succeeded but run-result.json says {result}")
CHECKPOINT_MISSING = Reason("CheckpointMissing", "stage {stage}: the final checkpoint {path} does not exist")
CHECKPOINT_INCOMPLETE = Reason("CheckpointIncomplete", "stage {stage}: the final checkpoint {path} is incomplete: "
                                                       "{problems}")
CHECKPOINT_UNVERIFIABLE = Reason("CheckpointUnverifiable", "stage {stage}: the final checkpoint {path} does not "
                                                           "verify: {problems}")
EVIDENCE_INVALID = Reason("EvidenceInvalid", "stage {stage}: {problem}; nothing was deleted")
VALIDATION_INCOMPLETE = Reason("ValidationIncomplete", "stage {stage}: {where} has no COMPLETE.json")

# Failure (failure.py, progress_deadline.py)
JOB_FAILED = Reason("JobFailed", "stage {stage} attempt {attempt} failed: {detail}")
BACKOFF_LIMIT_EXCEEDED = Reason("BackoffLimitExceeded", "stage {stage} failed {failures} times (backoffLimit "
                                                        "{limit}): {detail}")
STORAGE_FULL = Reason("StorageFull", "stage {stage} attempt {attempt} failed on a full volume, not retried (a retry "
                                    "would fill it again): {detail}")
STORAGE_ERROR = Reason("StorageError", "stage {stage} attempt {attempt} failed on a failing volume, not retried: "
                                      "{detail}")
INPUT_REFUSED = Reason("InputRefused", "stage {stage} attempt {attempt}: the trainer refused its input (exit code 2), "
                                       "not retried (a retry would meet it again): {detail}; fix the spec and the run "
                                       "continues")
PROGRESS_DEADLINE_EXCEEDED = Reason("ProgressDeadlineExceeded", "stage {stage}: no checkpoint, heartbeat or event for "
                                                                "{idle}s (progressDeadlineSeconds {limit}); its job was "
                                                                "deleted")
CHECKPOINT_SKIPPED = Reason("CheckpointSkipped", "stage {stage}: attempt {attempt} resumes from {path}, passing over "
                                                "newer checkpoints that do not verify (kept, not deleted): {skipped}")
JOB_REJECTED = Reason("JobRejected", "stage {stage}: the API server rejected job {job}: {detail}")
JOB_NAME_TAKEN = Reason("JobNameTaken", "stage {stage}: {detail}")

# Suspend (suspend.py)
SUSPEND_REQUESTED = Reason("SuspendRequested", "spec.runPolicy.suspend is true; stage {stage} resumes from its last "
                                               "checkpoint")
RESUMED = Reason("Resumed", "spec.runPolicy.suspend is false; resuming stage {stage}")

# Types that cannot both be True: setting the key True sets the others False with the same reason.
EXCLUSIVE = {READY: (FAILED, PROGRESSING), FAILED: (READY, PROGRESSING)}


def set_condition(conditions: list[Condition], type_: str, status: str, reason: Reason | str, message: str, *,
                  now: str, generation: int | None) -> None:
    """Set one condition in place (and, when it becomes True, clear the types exclusive with it)."""
    name = reason.name if isinstance(reason, Reason) else reason
    _set(conditions, type_, status, name, message, now, generation)
    if status == "True":
        for other in EXCLUSIVE.get(type_, ()):
            current = find(conditions, other)
            if current is not None and current.status == "True":
                _set(conditions, other, "False", name, message, now, generation)


def _set(conditions: list[Condition], type_: str, status: str, reason: str, message: str, now: str,
         generation: int | None) -> None:
    current = find(conditions, type_)
    if current is None:
        conditions.append(Condition(type=type_, status=status, reason=reason, message=message,
                                    lastTransitionTime=now, observedGeneration=generation))
        return
    if current.status != status:
        current.lastTransitionTime = now
    current.status, current.reason, current.message, current.observedGeneration = status, reason, message, generation


def find(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: list[Condition], type_: str) -> bool:
    c = find(conditions, type_)
    return c is not None and c.status == "True"
