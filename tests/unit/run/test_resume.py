"""resume.py: where the next attempt of a stage starts (table-driven, pure)."""

from __future__ import annotations

import pytest

from solar.run.observe import StageFiles
from solar.run.plan import StagePlan
from solar.run.resume import next_start

TRAIN = StagePlan("fm", 0, "train", "r", "c.yaml", (), "/runs/x/fm", final_step=8, validation_step=None,
                  generation=False)
INFER = StagePlan("gen", 1, "infer", "r", "c.yaml", (), "/runs/x/gen", final_step=None, validation_step=None,
                  generation=True)


@pytest.mark.parametrize("plan, files, attempt, resume_from, how", [
    (TRAIN, StageFiles(exists=False), 1, None, "fresh"),
    (TRAIN, StageFiles(exists=True), 2, None, "fresh"),          # a directory nobody launched into
    (TRAIN, StageFiles(exists=True, launched=True, latest=6), 2, "/runs/x/fm/checkpoints/step_00000006",
     "from /runs/x/fm/checkpoints/step_00000006"),
    (TRAIN, StageFiles(exists=True, launched=True, latest=8), 3, "/runs/x/fm/checkpoints/step_00000008",
     "from /runs/x/fm/checkpoints/step_00000008"),               # the final one: finishes validation + result
    (INFER, StageFiles(exists=False), 1, None, "fresh"),
    (INFER, StageFiles(exists=True, launched=True), 2, None, "continuing"),
])
def test_next_start(plan, files, attempt, resume_from, how):
    start = next_start(plan, files, attempt)
    assert (start.resume_from, start.how) == (resume_from, how)


def test_a_used_directory_without_a_checkpoint_cannot_be_continued():
    assert next_start(TRAIN, StageFiles(exists=True, launched=True, result="failed"), 2) is None
