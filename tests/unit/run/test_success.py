"""success.py: when a succeeded job makes a succeeded stage (table-driven, pure)."""

from __future__ import annotations

import pytest

from solar.run.observe import StageFiles
from solar.run.plan import StagePlan
from solar.run.success import completion_problem

TRAIN = StagePlan("fm", 0, "train", "r", "c.yaml", (), "/runs/x/fm", final_step=4, validation_step=4, generation=False)
TRAIN_NO_VAL = StagePlan("fm", 0, "train", "r", "c.yaml", (), "/runs/x/fm", final_step=4, validation_step=None,
                         generation=False)
INFER = StagePlan("gen", 1, "infer", "r", "c.yaml", (), "/runs/x/gen", final_step=None, validation_step=None,
                  generation=True)
GOOD = dict(exists=True, launched=True, result="complete", latest=4, final="verified", marker=True,
            marker_status="complete")


@pytest.mark.parametrize("plan, files, reason, fragment", [
    (TRAIN, GOOD, None, None),
    (TRAIN, {**GOOD, "marker_status": "partial"}, None, None),           # a partial step still has its marker
    (TRAIN_NO_VAL, {**GOOD, "marker": False}, None, None),
    (INFER, {**GOOD, "final": None, "latest": None}, None, None),
    (TRAIN, {**GOOD, "result": None}, "ResultIncomplete", "run-result.json says nothing"),
    (TRAIN, {**GOOD, "result": "stopped"}, "ResultIncomplete", "says stopped"),
    (TRAIN, {**GOOD, "final": "missing"}, "CheckpointMissing", "/runs/x/fm/checkpoints/step_00000004 does not exist"),
    (TRAIN, {**GOOD, "final": "incomplete", "final_problems": ("no COMPLETE.json",)}, "CheckpointIncomplete",
     "is incomplete: no COMPLETE.json"),
    (TRAIN, {**GOOD, "final": "unverifiable", "final_problems": ("member a has 3 bytes", "b")},
     "CheckpointUnverifiable", "does not verify: member a has 3 bytes; b"),
    (TRAIN, {**GOOD, "marker": False}, "ValidationIncomplete", "validation step 4 has no COMPLETE.json"),
    (INFER, {**GOOD, "marker": False}, "ValidationIncomplete", "the generation has no COMPLETE.json"),
    (TRAIN, {**GOOD, "result": "failed", "final": "missing"}, "ResultIncomplete", None),  # the first rule broken
    (TRAIN, {"exists": False}, "StageDirectoryMissing", "/runs/x/fm is not visible"),
    (TRAIN, {**GOOD, "result": None, "result_problem": "run-result.json /runs/x/fm/run-result.json is empty"},
     "EvidenceInvalid", "run-result.json /runs/x/fm/run-result.json is empty; nothing was deleted"),
    (TRAIN, {**GOOD, "marker": False, "marker_problem": "COMPLETE.json /v/COMPLETE.json is not valid JSON"},
     "EvidenceInvalid", "/v/COMPLETE.json is not valid JSON"),
    (TRAIN_NO_VAL, {**GOOD, "marker": False, "marker_problem": "COMPLETE.json x is empty"}, None, None),
])
def test_completion_rules(plan, files, reason, fragment):
    problem = completion_problem(plan, StageFiles(**files))
    if reason is None:
        assert problem is None
    else:
        assert problem[0].name == reason and problem[1].startswith(f"stage {plan.name}: ")
        assert fragment is None or fragment in problem[1]
