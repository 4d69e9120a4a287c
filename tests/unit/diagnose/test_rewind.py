"""`solar diagnose` on run directories that were rewound in place, restarted from step 0, or whose
save collided with an earlier launch's checkpoint (issue 52 items 2, 3 and 5), built by hand
(tests/support/run_dirs.py); and the command that continues a stopped run, checked to resolve to the
run's own config."""

from __future__ import annotations

import json
import shlex

from solar.config.canonical import canonical_bytes
from solar.config.resolve import resolve_file
from solar.diagnose import diagnose_dir, failure_summary
from tests.support.run_dirs import (CONFIG, T0, Run, collided, collision_message, first_launch, restarted, rewound,
                                    start, step)

NOW = T0 + 600


def _diagnose(run: Run):
    return diagnose_dir(run.root, now=NOW)


def _resolves_to(command: str, expected: dict) -> None:
    """``command`` is ``solar train --config C --set ...``: resolving C with its edits gives ``expected``."""
    argv = shlex.split(command)
    assert argv[:2] == ["solar", "train"] and argv[2] == "--config"
    assert argv[4::2] == ["--set"] * len(argv[5::2])
    sets = argv[5::2]
    resolved = resolve_file(argv[3], sets, placeholders=False)
    assert json.loads(canonical_bytes(resolved.config_dict)) == expected


def _expected(run: Run, record: str, step: int) -> dict:
    config = json.loads((run.root / record).read_text())
    config["checkpoint"].update(mode="full_resume", path=str(run.root / "checkpoints" / f"step_{step:08d}"))
    config["runtime"]["output_dir"] = str(run.root)
    return config


def test_a_rewind_is_in_the_evidence_and_the_stopped_run_says_how_to_continue(tmp_path):
    run = rewound(tmp_path / "run")
    d = _diagnose(run)
    assert (d.status, d.kind) == ("stopped", "stopped")
    assert ("launch 2 (launches/0001-launch-manifest.json) rewound the run to step 4: step_00000006, "
            "step_00000008 superseded, kept under checkpoints/superseded/0001/") in d.details
    assert "2 superseded checkpoints kept under checkpoints/superseded/ (never resumed from)" in d.details
    lines = {line.where: line.text for line in d.evidence}
    assert lines["launches/0001-launch-manifest.json"] == (
        'rewind: {"checkpoint": "' + str(run.root / "checkpoints" / "step_00000004") + '", "step": 4, '
        '"superseded": ["step_00000006", "step_00000008"], "superseded_dir": "checkpoints/superseded/0001"}')
    assert lines["events/rank-00000.jsonl:16"].startswith('{"event": "rewound", "step": 4')
    # the exact command: the latest launch's resolved config, resumed from the newest checkpoint
    command = d.next["command"]
    assert command == (f"solar train --config {run.root / 'launches' / '0001-resolved-config.json'} --set "
                       f"runtime.output_dir={run.root} --set checkpoint.mode=full_resume --set "
                       f"checkpoint.path={run.root / 'checkpoints' / 'step_00000006'}")
    _resolves_to(command, _expected(run, "launches/0001-resolved-config.json", 6))
    # ... and the same from its source config, with the edits it was launched with
    assert d.next["from_source"].startswith(f"solar train --config {CONFIG} --set ")
    _resolves_to(d.next["from_source"], _expected(run, "launches/0001-resolved-config.json", 6))
    text = d.text()
    assert f"continue it from checkpoint step 6:\n  {command}\n" in text
    assert f"  or from its source config:\n  {d.next['from_source']}" in text
    assert d.as_dict()["next"] == d.next


def test_a_changed_source_config_is_named_and_the_resolved_one_still_continues(tmp_path):
    source = tmp_path / "config.yaml"
    source.write_bytes(CONFIG.read_bytes())
    run = rewound(tmp_path / "run")
    for record in (run.root / "launch-manifest.json", run.root / "launches" / "0001-launch-manifest.json"):
        doc = json.loads(record.read_text())
        doc["source_config"]["path"] = str(source)
        record.write_text(json.dumps(doc))
    source.write_text(source.read_text() + "\n# edited since\n")
    d = _diagnose(run)
    assert d.next["from_source"] is None
    assert d.next["note"] == (f"its source config {source} has changed since the launch (another digest); the "
                              "resolved config is the launch's exact config")
    _resolves_to(d.next["command"], _expected(run, "launches/0001-resolved-config.json", 6))


def test_a_failed_launch_that_left_a_checkpoint_says_how_to_continue(tmp_path):
    run = Run(tmp_path / "run")
    first_launch(run, last=5)
    run.events({"event": "error", "time": T0 + 7, "error_type": "oom", "message": "CUDA out of memory"})
    run.result("failed", error_type="oom", message="CUDA out of memory")
    d = _diagnose(run)
    assert d.kind == "oom"
    _resolves_to(d.next["command"], _expected(run, "resolved-config.json", 4))
    assert "continue it from checkpoint step 4:" in d.text()
    assert failure_summary(run.root).startswith("oom: ")


def test_a_run_stopped_before_its_first_checkpoint_is_started_over(tmp_path):
    run = Run(tmp_path / "run")
    run.launch()
    run.events(start(0), step(1, 1, 1.0), {"event": "stopped", "time": T0 + 2})
    run.result("stopped", final={"step": 1})
    d = _diagnose(run)
    assert d.next["checkpoint"] is None
    assert d.next["command"] == \
        f"solar train --config {run.root / 'resolved-config.json'} --set runtime.output_dir={run.root}"
    assert "start it over from step 0 (no checkpoint to resume from):" in d.text()
    _resolves_to(d.next["command"], json.loads((run.root / "resolved-config.json").read_text()))


def test_a_completed_or_running_run_gets_no_command(tmp_path):
    run = Run(tmp_path / "run")
    first_launch(run)
    run.result("complete", final={"step": 8})
    assert _diagnose(run).next is None and "continue it" not in _diagnose(run).text()


def test_a_restart_from_step_0_is_in_the_evidence(tmp_path):
    run = restarted(tmp_path / "run")
    d = _diagnose(run)
    assert (d.status, d.kind) == ("healthy", "healthy") and "step 4" in d.summary
    assert ("launch 2 (launches/0001-launch-manifest.json) started the run over from step 0 (no committed "
            "checkpoint); its 1 earlier launch is kept as history") in d.details
    lines = {line.where: line.text for line in d.evidence}
    assert lines["launches/0001-launch-manifest.json"] == \
        'restart: {"earlier_launches": 1, "superseded_dir": null, "moved": []}'
    assert lines["events/rank-00000.jsonl:7"].startswith('{"event": "restarted", "earlier_launches": 1')


def test_a_save_that_collides_with_an_earlier_launchs_checkpoint_is_a_collision_not_a_load_failure(tmp_path):
    run = collided(tmp_path / "run")
    d = _diagnose(run)
    assert (d.status, d.kind) == ("failed", "checkpoint_collision")
    assert d.summary == ("saving step 6 found checkpoints/step_00000006 already there, committed by an earlier "
                         "launch: this launch resumed from step 4 of a directory holding checkpoints after it "
                         "(6, 8) that were not moved aside (a rewind in place moves them under "
                         "checkpoints/superseded/)")
    assert d.first_bad == {"rank": 0, "step": 6, "phase": "checkpoint", "checkpoint": "checkpoints/step_00000006"}
    assert failure_summary(run.root).startswith("checkpoint_collision: saving step 6 found")
    assert "checkpoint_load" not in json.dumps(d.as_dict())
    # continue where the launch was going: a rewind to its own resume point (it committed nothing)
    _resolves_to(d.next["command"], _expected(run, "launches/0001-resolved-config.json", 4))
    assert d.next["note"].startswith("a trainer that rewinds in place moves step_00000006, step_00000008 under "
                                     "checkpoints/superseded/; to go on from the earlier launch's newest instead, "
                                     f"resume from {run.root / 'checkpoints' / 'step_00000008'}")


def test_a_collision_found_at_commit_is_the_same_collision(tmp_path):
    run = collided(tmp_path / "run")
    message = collision_message(run.root, 6, at_commit=True)
    assert message == f"CheckpointError: {run.root}/checkpoints/step_00000006 already exists; checkpoints are never " \
                      "overwritten"
    run.result("failed", error_type="checkpoint", message=message)
    assert _diagnose(run).kind == "checkpoint_collision"


def test_a_collision_after_the_launch_committed_its_own_checkpoint_continues_from_that(tmp_path):
    run = collided(tmp_path / "run")
    events = run.root / "events" / "rank-00000.jsonl"
    lines = events.read_text().splitlines()   # launch 2 committed step 5 before it collided at step 6
    from tests.support.run_dirs import checkpoint, saved
    checkpoint(run.root, 5)
    lines.insert(len(lines) - 2, json.dumps({"rank": 0, **saved(run.root, 5, 105.5)}))
    events.write_text("\n".join(lines) + "\n")
    d = _diagnose(run)
    assert d.kind == "checkpoint_collision"
    _resolves_to(d.next["command"], _expected(run, "launches/0001-resolved-config.json", 5))
