"""Issue 44 item 1 through `solar train`: a finished run trains longer by full resume, a recipe change is
refused naming each key with both values (nothing written) and accepted when listed, and recorded."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import TINY, infer, steps, train
from tests.conftest import CONFIGS
from tests.support.files import snapshot

pytestmark = pytest.mark.slow


def _sets(data, run, *extra):
    return [f"data.root={data}", f"runtime.output_dir={run}", "runtime.validate_every=0", "runtime.save_every=2",
            *extra]


def test_a_finished_run_trains_longer_and_a_recipe_change_needs_listing(wan_data, tmp_path):
    run = tmp_path / "run"
    first = train(TINY["wan22_ti2v_5b"], _sets(wan_data, run, "train.max_steps=4"))
    assert first.returncode == 0, first.stderr[-2000:]
    resume = ("checkpoint.mode=full_resume", f"checkpoint.path={run}/checkpoints/step_00000004")
    before = snapshot(run)

    refused = train(TINY["wan22_ti2v_5b"], _sets(wan_data, run, "train.max_steps=6", "train.optimizer.lr=0.002",
                                                  *resume))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "train.optimizer.lr 0.001 -> 0.002" in refused.stderr and "Traceback" not in refused.stderr
    assert "checkpoint.accept_changes=[train.optimizer.lr]" in refused.stderr
    assert snapshot(run) == before   # nothing written, byte for byte

    shorter = train(TINY["wan22_ti2v_5b"], _sets(wan_data, run, "train.max_steps=3", *resume))
    assert shorter.returncode == 2 and "below step 4" in shorter.stderr and snapshot(run) == before

    longer = train(TINY["wan22_ti2v_5b"], _sets(wan_data, run, "train.max_steps=6", "train.optimizer.lr=0.002",
                                                 "checkpoint.accept_changes=[train.optimizer.lr]", *resume))
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert "solar: schedule change: train.max_steps 4 -> 6 (from step 5)" in longer.stderr
    assert "solar: accepted recipe change: train.optimizer.lr 0.001 -> 0.002 (from step 5)" in longer.stderr
    assert [e["step"] for e in steps(run)] == [1, 2, 3, 4, 5, 6]
    assert [e["lr"] for e in steps(run)][4:] == [0.002, 0.002]   # the new recipe from the next step
    assert (run / "checkpoints" / "step_00000006" / "COMPLETE.json").is_file()
    record = json.loads(next((run / "launches").glob("*-launch-manifest.json")).read_text())
    assert record["changes"] == [
        {"key": "train.max_steps", "kind": "schedule", "old": 4, "new": 6, "from_step": 5},
        {"key": "train.optimizer.lr", "kind": "recipe", "old": 0.001, "new": 0.002, "from_step": 5}]
    events = [json.loads(line) for line in (run / "events" / "rank-00000.jsonl").read_text().splitlines()]
    assert [e["changes"] for e in events if e["event"] == "config_changes"] == [record["changes"]]


def test_infer_into_a_training_directory_says_so(wan_data, tmp_path):
    run = tmp_path / "run"
    assert train(TINY["wan22_ti2v_5b"], _sets(wan_data, run, "train.max_steps=2")).returncode == 0
    proc = infer(CONFIGS / "tiny" / "wan22_ti2v_5b" / "infer_stage0p5_fm_81f.yaml",
                 [f"data.root={wan_data}", f"runtime.output_dir={run}",
                  f"checkpoint.path={run}/checkpoints/step_00000002"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"runtime.output_dir {run} holds a training run" in proc.stderr and "solar infer needs a new directory" \
        in proc.stderr and "full resume" not in proc.stderr
