"""Stage success: a succeeded job is a succeeded stage only when its directory proves it (contract.md §4).

The stage directory must exist (where the operator reads it) and hold ``run-result.json`` with status ``complete``; a training stage's final
checkpoint (``step_<train.max_steps>``) must verify; and when the stage validates (or is an inference
stage) the last validation step's (or the generation's) ``COMPLETE.json`` must exist. The first
unmet rule is the failure reason; a missing checkpoint is never read as "start fresh". A run-result.json
or COMPLETE.json that exists but is truncated, not JSON or not such a document fails the stage with
``EvidenceInvalid`` naming the file and what is wrong (never read as "not there yet").
"""

from __future__ import annotations

from solar.run import conditions as C
from solar.run.observe import StageFiles
from solar.run.plan import StagePlan

_FINAL = {"missing": C.CHECKPOINT_MISSING, "incomplete": C.CHECKPOINT_INCOMPLETE,
          "unverifiable": C.CHECKPOINT_UNVERIFIABLE}


def completion_problem(plan: StagePlan, files: StageFiles) -> tuple[C.Reason, str] | None:
    """(reason, message) for the first success rule the stage directory breaks, or None."""
    if not files.exists:
        return C.STAGE_DIRECTORY_MISSING, C.STAGE_DIRECTORY_MISSING.message(stage=plan.name, dir=plan.stage_dir)
    if files.result_problem:
        return C.EVIDENCE_INVALID, C.EVIDENCE_INVALID.message(stage=plan.name, problem=files.result_problem)
    if files.result != "complete":
        return C.RESULT_INCOMPLETE, C.RESULT_INCOMPLETE.message(stage=plan.name, result=files.result or "nothing "
                                                                "(no run-result.json)")
    if plan.final_step is not None and files.final != "verified":
        reason = _FINAL.get(files.final or "missing", C.CHECKPOINT_MISSING)
        return reason, reason.message(stage=plan.name, path=plan.checkpoint_dir(plan.final_step),
                                      problems="; ".join(files.final_problems) or "unknown")
    if (plan.validation_step is not None or plan.generation) and files.marker_problem:
        return C.EVIDENCE_INVALID, C.EVIDENCE_INVALID.message(stage=plan.name, problem=files.marker_problem)
    if (plan.validation_step is not None or plan.generation) and not files.marker:
        where = f"validation step {plan.validation_step}" if plan.validation_step is not None else "the generation"
        return C.VALIDATION_INCOMPLETE, C.VALIDATION_INCOMPLETE.message(stage=plan.name, where=where)
    return None
