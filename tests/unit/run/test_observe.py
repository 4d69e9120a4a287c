"""What a stage directory tells the state machine (real files, torch-free)."""

from __future__ import annotations

import json

from solar.run.observe import observe_stage
from solar.storage import checkpoints as ckpt


def _checkpoint(run, step, payload=b"weights"):
    partial = ckpt.begin(run, step)
    (partial / "model").mkdir()
    (partial / "model" / "blob.bin").write_bytes(payload)
    return ckpt.commit(partial, step=step, contract={"family": "x"}, roles={"model": {"weights": ["live"],
                       "members": ["model/blob.bin"]}}, trainer_state={"step": step})


def test_missing_directory_and_complete_stage(tmp_path):
    assert not observe_stage(tmp_path / "nope", final_step=4, validation_step=None, generation=False).exists
    run = tmp_path / "fm"
    _checkpoint(run, 2)
    _checkpoint(run, 4)
    (run / "launch-manifest.json").write_text("{}")
    (run / "run-result.json").write_text(json.dumps({"status": "complete"}))
    marker = run / "validation" / "step_00000004" / "COMPLETE.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"status": "partial"}))
    files = observe_stage(run, final_step=4, validation_step=4, generation=False)
    assert files.launched and files.result == "complete" and files.final_problem is None
    assert files.latest == (4, str(run / "checkpoints" / "step_00000004"))
    assert files.validation == (4, "partial") and files.last_activity is not None


def test_final_checkpoint_problems_are_named(tmp_path):
    run = tmp_path / "fm"
    _checkpoint(run, 2)
    files = observe_stage(run, final_step=4, validation_step=4, generation=False)
    assert files.final_problem.startswith("CheckpointMissing") and files.latest[0] == 2 and files.validation is None
    final = _checkpoint(run, 4)
    (final / "model" / "blob.bin").write_bytes(b"tampered!!")
    assert observe_stage(run, final_step=4, validation_step=None, generation=False).final_problem.startswith(
        "CheckpointUnverifiable")
    (final / "COMPLETE.json").unlink()
    files = observe_stage(run, final_step=4, validation_step=None, generation=False)
    assert files.final_problem.startswith("CheckpointIncomplete") and files.latest[0] == 2


def test_generation_marker_for_inference_stages(tmp_path):
    run = tmp_path / "generate"
    (run / "generation").mkdir(parents=True)
    assert observe_stage(run, final_step=None, validation_step=None, generation=True).validation is None
    (run / "generation" / "COMPLETE.json").write_text(json.dumps({"status": "complete"}))
    assert observe_stage(run, final_step=None, validation_step=None, generation=True).validation == (0, "complete")
