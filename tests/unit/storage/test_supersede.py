"""What a launch decides and moves aside before its first step (solar.storage.supersede, run_dir.prepare):
restarts of runs that committed nothing, rewinds in place, and the refusals that name why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solar.config.canonical import canonical_bytes
from solar.config.resolve import resolve_file
from solar.errors import SolarError
from solar.storage import run_dir, supersede
from tests.conftest import CONFIGS

CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"


def _resolved(out: Path, *extra: str):
    return resolve_file(CONFIG, [f"data.root={out.parent / 'data'}", f"runtime.output_dir={out}", *extra],
                        expected_action="train")


def _launched(out: Path, resolved) -> None:
    """A directory as a first launch leaves it (its record and config)."""
    run_dir.write_launch(out, resolved, {"mode": "none", "sources": []})


def _checkpoint(out: Path, step: int, *, complete: bool = True) -> Path:
    path = out / "checkpoints" / f"step_{step:08d}"
    path.mkdir(parents=True)
    if complete:
        (path / "COMPLETE.json").write_text("{}")
    return path


def test_committed_steps_are_complete_step_directories_only(tmp_path):
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6, complete=False)
    (tmp_path / "checkpoints" / ".step_00000008.ab12cd34.partial").mkdir()
    (tmp_path / "checkpoints" / "superseded" / "0001" / "step_00000010").mkdir(parents=True)
    assert supersede.committed_steps(tmp_path) == [4]
    assert supersede.committed_steps(tmp_path / "absent") == []


def test_a_rewind_moves_every_newer_checkpoint_and_validation_under_the_launch_number(tmp_path):
    out = tmp_path
    for step in (4, 8, 12):
        _checkpoint(out, step)
        (out / "validation" / f"step_{step:08d}" / "fm").mkdir(parents=True)
    (out / "checkpoints" / ".step_00000010.0a0b0c0d.partial").mkdir()
    (out / "validation" / "frozen-plan.json").write_text("{}")
    plan = supersede.rewind(out, str(out / "checkpoints" / "step_00000008"), 8)
    assert plan.moves == ["checkpoints/.step_00000010.0a0b0c0d.partial", "checkpoints/step_00000012",
                          "validation/step_00000012"]
    assert "rewinding" in plan.line(out) and "step_00000012" in plan.line(out) and "1 validation" in plan.line(out)
    record = supersede.apply(plan, out, 3)
    assert record["superseded_dir"] == "checkpoints/superseded/0003" and record["step"] == 8
    assert record["moved"] == ["checkpoints/superseded/0003/.step_00000010.0a0b0c0d.partial",
                               "checkpoints/superseded/0003/step_00000012", "validation/superseded/0003/step_00000012"]
    assert (out / "checkpoints" / "superseded" / "0003" / "step_00000012" / "COMPLETE.json").is_file()
    assert supersede.committed_steps(out) == [4, 8]
    assert (out / "validation" / "frozen-plan.json").is_file() and (out / "validation" / "step_00000008").is_dir()
    # nothing newer: an ordinary resume of the newest
    assert supersede.rewind(out, str(out / "checkpoints" / "step_00000008"), 8) is None


def test_a_move_never_replaces_what_an_earlier_launch_moved(tmp_path):
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 8)
    (tmp_path / "checkpoints" / "superseded" / "0002" / "step_00000008").mkdir(parents=True)
    plan = supersede.rewind(tmp_path, "x", 4)
    with pytest.raises(FileExistsError):
        supersede.apply(plan, tmp_path, 2)
    assert (tmp_path / "checkpoints" / "step_00000008" / "COMPLETE.json").is_file()


def test_a_restart_moves_the_partial_outputs_folders_whole(tmp_path):
    (tmp_path / "checkpoints" / ".step_00000003.0a0b0c0d.partial").mkdir(parents=True)
    (tmp_path / "validation" / "step_00000002").mkdir(parents=True)
    (tmp_path / "validation" / "frozen-plan.json").write_text("{}")
    plan = supersede.restart(tmp_path, earlier_launches=2)
    assert plan.moves == ["checkpoints", "validation"]
    assert "starts over from step 0 (2 earlier launches kept as history" in plan.line(tmp_path)
    record = supersede.apply(plan, tmp_path, 2)
    assert record == {"moved": ["superseded/0002/checkpoints", "superseded/0002/validation"],
                      "earlier_launches": 2, "superseded_dir": "superseded/0002"}
    assert (tmp_path / "superseded" / "0002" / "validation" / "frozen-plan.json").is_file()
    assert not (tmp_path / "checkpoints").exists()
    nothing = supersede.apply(supersede.restart(tmp_path, 3), tmp_path, 3)
    assert nothing == {"moved": [], "earlier_launches": 3, "superseded_dir": None}


def test_prepare_restarts_a_run_that_committed_nothing_and_refuses_one_that_did(tmp_path, monkeypatch):
    monkeypatch.delenv("SOLAR_RUN_UID", raising=False)
    out = tmp_path / "run"
    first = _resolved(out)
    _launched(out, first)
    # same recipe, another schedule and execution: a restart, the schedule change recorded
    prepared = run_dir.prepare(out, _resolved(out, "train.max_steps=9", "data.num_workers=2"), resuming=False)
    assert prepared.supersede.kind == "restart" and prepared.supersede.earlier_launches == 1
    assert [c["key"] for c in prepared.review.recorded] == ["train.max_steps"]
    # another recipe by hand: refused, naming it
    with pytest.raises(SolarError, match=r"committed no checkpoint, with another recipe: train.optimizer.lr "
                                         r"0.001 -> 0.5; with the run's recipe it starts over in place"):
        run_dir.prepare(out, _resolved(out, "train.optimizer.lr=0.5"), resuming=False)
    # ... taken for a SolarRun stage, whose spec changed on purpose
    monkeypatch.setenv("SOLAR_RUN_UID", "uid-1")
    monkeypatch.setenv("SOLAR_RUN_STAGE", "fm")
    prepared = run_dir.prepare(out, _resolved(out, "train.optimizer.lr=0.5"), resuming=False)
    assert [(c["key"], c["new"]) for c in prepared.review.recorded] == [("train.optimizer.lr", 0.5)]
    # a committed checkpoint: refused, naming the newest, how to resume, and what differs
    _checkpoint(out, 6)
    with pytest.raises(SolarError) as refused:
        run_dir.prepare(out, _resolved(out, "train.optimizer.lr=0.5"), resuming=False)
    text = str(refused.value)
    assert "with checkpoints up to step 6 (this launch's config differs: train.optimizer.lr 0.001 -> 0.5)" in text
    assert f"--set checkpoint.path={out}/checkpoints/step_00000006" in text


def test_a_directory_left_by_a_launch_that_never_recorded_itself_is_unused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    resolved = _resolved(out)
    (out / "resolved-config.json").write_bytes(b"{}")      # written, then the launch died before its manifest
    run_dir.hold(out).release()
    assert run_dir.prepare(out, resolved, resuming=False) is None
    run_dir.write_launch(out, resolved, {"mode": "none", "sources": []})
    assert (out / "resolved-config.json").read_bytes() == canonical_bytes(resolved.config_dict) + b"\n"
    assert run_dir.next_launch_number(out) == 1


def test_the_launch_record_carries_the_restart_or_rewind(tmp_path):
    out = tmp_path / "run"
    resolved = _resolved(out)
    _launched(out, resolved)
    run_dir.write_launch(out, resolved, {"mode": "none", "sources": []}, extra={"restart": {"earlier_launches": 1}})
    doc = json.loads((out / "launches" / "0001-launch-manifest.json").read_text())
    assert doc["restart"] == {"earlier_launches": 1} and run_dir.next_launch_number(out) == 2
