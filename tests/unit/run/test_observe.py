"""What a stage directory tells the state machine (real files, torch-free)."""

from __future__ import annotations

import json

from solar.run.observe import LazyStageFiles, observe_stage
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
    assert files.launched and files.result == "complete" and files.final == "verified"
    assert files.latest == 4
    assert files.marker and files.marker_status == "partial" and files.last_activity is not None


def test_final_checkpoint_problems_are_named(tmp_path):
    run = tmp_path / "fm"
    _checkpoint(run, 2)
    files = observe_stage(run, final_step=4, validation_step=4, generation=False)
    assert files.final == "missing" and files.latest == 2 and not files.marker
    final = _checkpoint(run, 4)
    (final / "model" / "blob.bin").write_bytes(b"tampered!!")
    files = observe_stage(run, final_step=4, validation_step=None, generation=False)
    assert files.final == "unverifiable" and "member model/blob.bin has 10 bytes" in files.final_problems[0]
    assert files.latest == 2  # the newest checkpoint that verifies
    assert len(files.skipped) == 1 and files.skipped[0].startswith(f"{final}: member model/blob.bin has 10 bytes")
    (final / "COMPLETE.json").unlink()
    files = observe_stage(run, final_step=4, validation_step=None, generation=False)
    assert files.final == "incomplete" and files.latest == 2


def test_truncated_or_foreign_documents_are_named_not_taken_as_absent(tmp_path):
    run = tmp_path / "fm"
    _checkpoint(run, 4)
    marker = run / "validation" / "step_00000004" / "COMPLETE.json"
    marker.parent.mkdir(parents=True)
    cases = [(b"", "is empty"), (b'{"status": "comp', "is not valid JSON (truncated?)"),
             (b"[1, 2]", "is not a run-result.json document"), (b'{"schema": "x"}', "no status")]
    for text, fragment in cases:
        (run / "run-result.json").write_bytes(text)
        marker.write_bytes(text)
        files = observe_stage(run, final_step=4, validation_step=4, generation=False)
        assert files.result is None and f"run-result.json {run / 'run-result.json'} " in files.result_problem
        assert fragment in files.result_problem
        assert not files.marker and f"COMPLETE.json {marker} " in files.marker_problem
    (run / "run-result.json").unlink()
    marker.unlink()
    files = observe_stage(run, final_step=4, validation_step=4, generation=False)
    assert files.result_problem is None and files.marker_problem is None  # absent is not corrupt
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "validation"]  # nothing deleted


def test_evidence_of_another_run_is_refused_and_unowned_evidence_accepted(tmp_path):
    run = tmp_path / "fm"
    _checkpoint(run, 4)
    result = run / "run-result.json"
    result.write_text(json.dumps({"status": "complete", "owner": {"run_uid": "u-1", "stage": "fm"}}))
    mine = observe_stage(run, final_step=4, validation_step=None, generation=False, owner=("u-1", "fm"))
    assert mine.result == "complete" and mine.result_problem is None
    for other in (("u-2", "fm"), ("u-1", "anyflow")):
        files = observe_stage(run, final_step=4, validation_step=None, generation=False, owner=other)
        assert files.result is None and "was written for SolarRun uid u-1 stage fm" in files.result_problem
        assert f"not this run's stage {other[1]} (uid {other[0]})" in files.result_problem
    result.write_text(json.dumps({"status": "complete"}))  # written by hand or by an older trainer
    files = observe_stage(run, final_step=4, validation_step=None, generation=False, owner=("u-2", "fm"))
    assert files.result == "complete" and files.result_problem is None


def test_the_trainer_records_the_stage_it_ran_for(tmp_path, monkeypatch):
    from solar.storage import run_dir

    monkeypatch.delenv("SOLAR_RUN_UID", raising=False)
    run_dir.write_result(tmp_path, "complete")
    assert "owner" not in json.loads((tmp_path / "run-result.json").read_text())
    monkeypatch.setenv("SOLAR_RUN_UID", "u-1")
    monkeypatch.setenv("SOLAR_RUN_STAGE", "fm")
    run_dir.write_result(tmp_path, "complete")
    assert json.loads((tmp_path / "run-result.json").read_text())["owner"] == {"run_uid": "u-1", "stage": "fm"}


def test_generation_marker_for_inference_stages(tmp_path):
    run = tmp_path / "generate"
    (run / "generation").mkdir(parents=True)
    assert not observe_stage(run, final_step=None, validation_step=None, generation=True).marker
    (run / "generation" / "COMPLETE.json").write_text(json.dumps({"status": "complete"}))
    files = observe_stage(run, final_step=None, validation_step=None, generation=True)
    assert files.marker and files.marker_status == "complete"


def test_lazy_files_observe_a_stage_once_and_only_when_asked(tmp_path):
    seen = []
    files = LazyStageFiles(["fm", "anyflow"], lambda name: seen.append(name) or observe_stage(
        tmp_path / name, final_step=None, validation_step=None, generation=False))
    assert list(files) == ["fm", "anyflow"] and not seen
    assert not files["fm"].exists and not files.get("fm").exists and files.get("nope") is None
    assert seen == ["fm"]


def test_the_newest_step_record_of_rank_0_is_read_from_the_end_of_its_event_log(tmp_path):
    """What ends a disruption's cost (the first step past the checkpoint at the new shape), read from the
    tail of a long log, past records of other kinds and a line cut by a live writer."""
    from solar.run import observe

    run = tmp_path / "fm"
    (run / "events").mkdir(parents=True)
    log = run / "events" / "rank-00000.jsonl"
    assert observe_stage(run, final_step=4, validation_step=None, generation=False).last_step is None
    pad = "x" * 900
    lines = [json.dumps({"event": "step", "step": i, "time": 1000.0 + i, "pad": pad}) for i in range(1, 60)]
    lines += [json.dumps({"event": "validation", "step": 59, "time": 2000.0}), '{"event": "step", "st']
    log.write_text("\n".join(lines))
    assert log.stat().st_size > observe.TAIL_BYTES
    assert observe_stage(run, final_step=4, validation_step=None, generation=False).last_step == (59, 1059.0)
    (run / "events" / "rank-00001.jsonl").write_text(json.dumps({"event": "step", "step": 99, "time": 1.0}))
    assert observe_stage(run, final_step=4, validation_step=None, generation=False).last_step == (59, 1059.0)
    log.write_text(json.dumps({"event": "validation", "step": 1, "time": 5.0}) + "\n")
    assert observe_stage(run, final_step=4, validation_step=None, generation=False).last_step is None


def test_launch_records_are_counted_and_their_rewinds_read(tmp_path):
    """Issue 52: how many launches a stage directory records, and the steps those that rewound it rewound
    to (``rewind`` in launches/NNNN-launch-manifest.json); a record that does not read rewound nothing."""
    run = tmp_path / "fm"
    _checkpoint(run, 2)
    (run / "launch-manifest.json").write_text(json.dumps({"schema": "solar.launch.v1"}))
    (run / "launches").mkdir()
    (run / "launches" / "0001-launch-manifest.json").write_text(json.dumps({"restart": {"earlier_launches": 1}}))
    (run / "launches" / "0002-launch-manifest.json").write_text(json.dumps({"rewind": {
        "checkpoint": f"{run}/checkpoints/step_00000002", "step": 2, "superseded": ["step_00000004"],
        "superseded_dir": "checkpoints/superseded/0002"}}))
    (run / "launches" / "0003-launch-manifest.json").write_text('{"rewind": ')
    files = observe_stage(run, final_step=4, validation_step=None, generation=False)
    assert (files.launches, files.rewinds, files.latest) == (4, (2,), 2)
    assert observe_stage(tmp_path / "none", final_step=4, validation_step=None, generation=False).launches == 0
