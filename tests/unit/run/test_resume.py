"""resume.py: where the next attempt of a stage starts (table-driven, pure)."""

from __future__ import annotations

import dataclasses

import pytest

from solar.run.observe import StageFiles
from solar.run.plan import StagePlan
from solar.run import resume
from solar.run.resume import next_start, planned_start

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


def test_a_used_directory_without_a_checkpoint_starts_over():
    """Issue 52 item 2: never NothingToResume for a stage that has nothing to resume."""
    start = next_start(TRAIN, StageFiles(exists=True, launched=True, result="failed", launches=2), 3)
    assert (start.resume_from, start.step, start.restart, start.rewind) == (None, None, True, False)
    assert start.how.startswith("over from step 0")
    assert planned_start(TRAIN, StageFiles(exists=True, launched=True)).restart    # the dry runs say so too


REWOUND = dataclasses.replace(TRAIN, rewind=2)


@pytest.mark.parametrize("files, rewound, resume_from, rewind, settles", [
    # newer checkpoints than the set's step, no record of the rewind: rewind
    (StageFiles(exists=True, launched=True, latest=6), None, "/runs/x/fm/checkpoints/step_00000002", True, False),
    # a launch record says a launch rewound the directory to step 2: the newest as always
    (StageFiles(exists=True, launched=True, latest=6, rewinds=(2,)), None, "/runs/x/fm/checkpoints/step_00000006",
     False, False),
    # the status records the rewind settled at step 2 (nothing was newer then): the newest
    (StageFiles(exists=True, launched=True, latest=6), 2, "/runs/x/fm/checkpoints/step_00000006", False, False),
    # a rewind to another step recorded: this one is still to do
    (StageFiles(exists=True, launched=True, latest=6, rewinds=(4,)), 4, "/runs/x/fm/checkpoints/step_00000002",
     True, False),
    # step 2 is the newest: resuming it is the rewind (settled, nothing to move aside)
    (StageFiles(exists=True, launched=True, latest=2), None, "/runs/x/fm/checkpoints/step_00000002", False, True),
    # no checkpoint at step 2 (none verified): the trainer's to refuse, naming the path
    (StageFiles(exists=True, launched=True), None, "/runs/x/fm/checkpoints/step_00000002", True, False),
])
def test_a_stage_set_rewinds_once(files, rewound, resume_from, rewind, settles):
    start = next_start(REWOUND, files, 2, rewound)
    assert (start.resume_from, start.rewind, start.restart) == (resume_from, rewind, False)
    assert start.step == int(resume_from[-8:])
    assert resume.rewind_pending(REWOUND, files, rewound) == rewind
    assert resume.settles(REWOUND, files, rewound) == settles
    if rewind:
        assert start.how == f"rewinding to {resume_from}"


def test_the_dry_runs_read_a_settled_rewind_from_the_status():
    from solar.run.spec import SolarRunStatus, StageStatus

    files = StageFiles(exists=True, launched=True, latest=6)
    assert planned_start(REWOUND, files).rewind
    status = SolarRunStatus(stages=[StageStatus(name="fm", rewoundTo=2)])
    assert planned_start(REWOUND, files, status).resume_from == "/runs/x/fm/checkpoints/step_00000006"
