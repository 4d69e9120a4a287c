"""`solar checkpoint list|verify` on a run directory that was rewound in place (issue 52 item 3): the
checkpoints a rewind moved under `checkpoints/superseded/NNNN/` are not the run's (listed apart in one
line, never the newest), and nothing else in `checkpoints/` is taken for a broken checkpoint."""

from __future__ import annotations

import json

from solar.storage import checkpoints as ckpt
from tests.support.run_dirs import rewound


def test_list_leaves_superseded_checkpoints_out_and_says_where_they_are_kept(tmp_path, cli):
    run = rewound(tmp_path / "run")
    listed = cli("checkpoint", "list", str(run.root))
    assert listed.code == 0
    rows = json.loads(listed.out)
    assert [(r["step"], r["valid"]) for r in rows] == [(2, True), (4, True), (6, True)]
    assert all(r["path"] == str(run.root / "checkpoints" / ckpt.step_name(r["step"])) for r in rows)
    (line,) = listed.err.splitlines()
    assert line == (f"solar: 2 superseded checkpoints are kept under {run.root / 'checkpoints' / 'superseded'}/ "
                    "(0001: step_00000006, step_00000008; moved aside by rewinds, not listed)")


def test_a_run_without_superseded_checkpoints_lists_them_without_a_line(tmp_path, cli):
    run = rewound(tmp_path / "run")
    import shutil

    shutil.rmtree(run.root / "checkpoints" / "superseded")
    listed = cli("checkpoint", "list", str(run.root))
    assert listed.code == 0 and listed.err == ""


def test_other_directories_in_checkpoints_are_neither_checkpoints_nor_broken(tmp_path, cli):
    run = rewound(tmp_path / "run")
    (run.root / "checkpoints" / "notes").mkdir()
    (run.root / "checkpoints" / "step_00000099.bak").mkdir()
    newest, skipped = ckpt.newest_valid(run.root)
    assert newest["step"] == 6 and skipped == []
    assert [r["step"] for r in ckpt.list_checkpoints(run.root)] == [2, 4, 6]
    verify = cli("checkpoint", "verify", str(run.root))
    (problem,) = json.loads(verify.out)["problems"]
    assert verify.code == 2 and f"the newest {run.root / 'checkpoints' / 'step_00000006'} " in problem


def test_verify_of_a_superseded_checkpoint_checks_it_and_says_it_is_superseded(tmp_path, cli):
    run = rewound(tmp_path / "run")
    old = run.root / "checkpoints" / "superseded" / "0001" / "step_00000008"
    verify = cli("checkpoint", "verify", str(old))
    assert verify.code == 0 and json.loads(verify.out)["valid"] is True
    (line,) = verify.err.splitlines()
    assert line == (f"solar: {old} is superseded: launch record 0001 rewound {run.root} to step 4 and kept it "
                    f"aside; `solar checkpoint list {run.root}` lists the run's checkpoints")
    plain = cli("checkpoint", "verify", str(run.root / "checkpoints" / "step_00000006"))
    assert plain.code == 0 and plain.err == ""
