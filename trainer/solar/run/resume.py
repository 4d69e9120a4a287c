"""Where the next attempt of a stage starts.

- First attempt, or a stage directory nothing has been written to: fresh, with the planned init.
- Training stage with a verified checkpoint in its directory: a full resume from the newest one
  (the checkpoint at ``train.max_steps`` too: the trainer then only finishes that step's
  validation and its run-result).
- Training stage whose directory holds a launched run but no verified checkpoint: refused
  (``NothingToResume``): the trainer will not start over in a used directory, and silently starting
  fresh elsewhere would lose track of what ran.
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
    how: str                     # for messages: fresh | continuing | from <path>


def next_start(plan: StagePlan, files: StageFiles, attempt: int) -> Start | None:
    """How attempt ``attempt`` starts, or None when it cannot (NothingToResume)."""
    if plan.action == "train":
        if files.latest is not None:
            path = plan.checkpoint_dir(files.latest)
            return Start(path, f"from {path}")
        if files.launched:
            return None
        return Start(None, "fresh")
    return Start(None, "continuing" if files.launched else "fresh")


def planned_start(plan: StagePlan, files: StageFiles) -> Start:
    """How a stage's next job would start as seen before any job exists (the dry runs); RunInvalid
    NothingToResume when it cannot."""
    start = next_start(plan, files, 1)
    if start is None:
        raise RunInvalid(C.NOTHING_TO_RESUME.name, C.NOTHING_TO_RESUME.message(stage=plan.name, attempt=1,
                                                                              dir=plan.stage_dir))
    return start


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
