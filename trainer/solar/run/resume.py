"""Where the next attempt of a stage starts.

- First attempt, or a stage directory nothing has been written to: fresh, with the planned init.
- Training stage with a verified checkpoint in its directory: a full resume from the newest one
  (the checkpoint at ``train.max_steps`` too: the trainer then only finishes that step's
  validation and its run-result).
- Training stage whose directory holds a launched run but no verified checkpoint (its launches
  failed, were refused, killed or disrupted before their first save): it starts over from its
  initialisation with the plan's config (``restart``); the trainer keeps the earlier launches'
  records, events and logs in the directory as history and moves what they left of checkpoints and
  validations to ``superseded/`` (``solar.storage.supersede``). An attempt like any other: a failure
  counts against backoffLimit, a disruption does not.
- Training stage whose set rewinds it (``StagePlan.rewind``: checkpoint.mode=full_resume with
  checkpoint.path at step s of its own directory): a full resume from step s while the rewind is
  pending, i.e. no launch record of the directory says a launch rewound it to s (``StageFiles.rewinds``)
  and the stage's status does not record it settled (``rewound``: the machine settles a rewind that
  found nothing newer than s to move). The trainer then moves the checkpoints after s aside before
  its first step. Once done, later attempts resume the newest checkpoint as any other (a disruption
  after the rewind does not rewind again). A step s whose checkpoint is not there is the trainer's
  to refuse (InputRefused: fix the spec).
- Inference stage: ``solar infer`` continues an unfinished generation in the same directory.
- A training stage resumed at another topology than its checkpoint's: ``reshape.py`` (refused when
  the global batch would change).
"""

from __future__ import annotations

from dataclasses import dataclass

from solar.run import conditions as C
from solar.run import reshape, success
from solar.run.observe import StageFiles
from solar.run.plan import RunInvalid, StagePlan
from solar.run.spec import SolarRunStatus


@dataclass(frozen=True)
class Start:
    resume_from: str | None      # a checkpoint of the stage's own directory, as the pods see it
    how: str                     # for messages: fresh | over | continuing | from <path> | rewinding to <path>
    step: int | None = None      # the step of resume_from
    restart: bool = False        # a training stage starting over: its directory committed no checkpoint
    rewind: bool = False         # a full resume from the stage set's rewind step, newer checkpoints moved aside


def rewind_pending(plan: StagePlan, files: StageFiles, rewound: int | None = None) -> bool:
    """Whether the stage's set rewinds it and that rewind is not done yet: no launch record says a launch
    rewound the directory to that step, the status (``rewound``: StageStatus.rewoundTo) does not record it
    settled, and the newest verified checkpoint is not that step itself (a resume from it then is no
    rewind: ``settles``)."""
    s = plan.rewind
    return plan.action == "train" and s is not None and s not in files.rewinds and rewound != s \
        and files.latest != s


def settles(plan: StagePlan, files: StageFiles, rewound: int | None = None) -> bool:
    """Whether an attempt starting now settles the set's rewind although no launch rewinds: its step is the
    newest verified checkpoint, nothing after it to move aside (recorded in the status, so that once the
    stage trains past it, a later attempt resumes its newest checkpoint instead of rewinding)."""
    s = plan.rewind
    return plan.action == "train" and s is not None and rewound != s and s not in files.rewinds \
        and files.latest == s


def next_start(plan: StagePlan, files: StageFiles, attempt: int, rewound: int | None = None) -> Start:
    """How attempt ``attempt`` starts (``rewound``: the step the stage's status records its set's rewind
    settled at, StageStatus.rewoundTo)."""
    if plan.action == "train":
        if rewind_pending(plan, files, rewound):
            path = plan.checkpoint_dir(plan.rewind)
            return Start(path, f"rewinding to {path}", plan.rewind, rewind=True)
        if files.latest is not None:
            path = plan.checkpoint_dir(files.latest)
            return Start(path, f"from {path}", files.latest)
        if files.launched:
            return Start(None, "over from step 0: no committed checkpoint", restart=True)
        return Start(None, "fresh")
    return Start(None, "continuing" if files.launched else "fresh")


def planned_start(plan: StagePlan, files: StageFiles, status: SolarRunStatus | None = None) -> Start:
    """How a stage's next job would start as seen before any job exists (the dry runs; ``status``: the
    run's, when there is one)."""
    stage = status.stage(plan.name) if status is not None else None
    return next_start(plan, files, 1, stage.rewoundTo if stage is not None else None)


def planned_reshape(plan: StagePlan, files: StageFiles, status: SolarRunStatus | None) -> reshape.Reshape | None:
    """For the dry runs: the stage's next attempt resuming its checkpoint at another shape, or None
    (nothing to resume, the old shape unknown, or the stage finished: Succeeded in ``status``, the
    run's status when there is one, else complete by its files). RunInvalid TopologyMismatch when
    the change would alter the global batch."""
    stage = status.stage(plan.name) if status is not None else None
    if (stage is not None and stage.phase == "Succeeded") or (
            stage is None and files.exists and success.completion_problem(plan, files) is None):
        return None
    found = reshape.of_stage(plan, files.latest, files.position, stage)
    if found is not None and found.refused:
        raise RunInvalid(C.TOPOLOGY_MISMATCH.name, found.mismatch(), plan.name)
    return found if found is not None and found.changed else None
