"""`solar diagnose` on hand-built run directories: each class from its evidence, and no fault from a
quiet worker alone. (tests/e2e/test_diagnose.py produces the same classes with real runs.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from solar.diagnose import diagnose_dir, failure_summary
from solar.errors import SolarError
from tests.integration.world import write_checkpoint

NOW = 1_800_000_000.0


class RunDir:
    def __init__(self, root: Path, world: int = 2) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "launch-manifest.json").write_text(json.dumps({
            "schema": "solar.launch.v1", "action": "train", "name": "t", "route": "r",
            "topology": {"world_size": world, "logical_dp_world_size": world}}))

    def heartbeat(self, rank: int, *, phase: str, step: int, seq: int | None, age: float, name: str = "loss-mean",
                  **extra) -> None:
        (self.root / "heartbeat").mkdir(exist_ok=True)
        doc = {"rank": rank, "pid": 1, "host": "elsewhere", "phase": phase, "step": step, "time": NOW - age,
               "collective": {"name": name, "seq": seq} if seq is not None else None, **extra}
        (self.root / "heartbeat" / f"rank-{rank:05d}.json").write_text(json.dumps(doc))

    def events(self, rank: int, *records: dict) -> None:
        (self.root / "events").mkdir(exist_ok=True)
        with open(self.root / "events" / f"rank-{rank:05d}.jsonl", "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)

    def result(self, status: str, **fields) -> None:
        (self.root / "run-result.json").write_text(json.dumps({"schema": "solar.run-result.v1", "status": status,
                                                               **fields}))


def _diagnose(run: RunDir):
    return diagnose_dir(run.root, now=NOW)


def test_a_completed_run_is_healthy(tmp_path):
    run = RunDir(tmp_path / "run")
    for r in (0, 1):
        run.heartbeat(r, phase="complete", step=4, seq=30, age=5)
        run.events(r, {"event": "step", "step": 4, "loss": 0.5})
    run.result("complete", final={"step": 4})
    d = _diagnose(run)
    assert (d.status, d.kind) == ("healthy", "healthy") and "step 4" in d.summary
    assert failure_summary(run.root) is None


def test_a_quiet_run_whose_ranks_agree_is_running_not_hung(tmp_path):
    run = RunDir(tmp_path / "run")
    for r in (0, 1):  # both in the same collective for an hour (a long validation, a slow step)
        run.heartbeat(r, phase="validation", step=7, seq=50, age=3600)
    d = _diagnose(run)
    assert (d.status, d.kind) == ("running", "running") and "no fault is inferred from silence" in d.summary


def test_ranks_at_different_collectives_that_still_move_are_not_a_hang(tmp_path):
    run = RunDir(tmp_path / "run")
    run.heartbeat(0, phase="backward", step=7, seq=51, age=1)
    run.heartbeat(1, phase="forward", step=7, seq=50, age=2)
    assert _diagnose(run).kind == "running"


def test_a_live_hang_names_the_rank_that_never_entered_the_collective(tmp_path):
    run = RunDir(tmp_path / "run", world=4)
    for r in (0, 1, 3):
        run.heartbeat(r, phase="grad-sync", step=12, seq=88, age=900, name="grad-allreduce")
    run.heartbeat(2, phase="data", step=12, seq=87, age=950)
    d = _diagnose(run)
    assert (d.status, d.kind) == ("failed", "hang")
    assert d.first_bad["rank"] == 2 and d.first_bad["step"] == 12 and d.first_bad["phase"] == "data"
    assert "grad-allreduce #88" in d.summary and "[0, 1, 3]" in d.summary
    assert any(line.where == "heartbeat/rank-00002.json" for line in d.evidence)


def test_non_finite_names_the_first_bad_rank_step_and_sample(tmp_path):
    run = RunDir(tmp_path / "run")
    run.events(0, {"event": "step", "step": 2, "loss": 0.4},
               {"event": "non_finite", "step": 3, "rank": 0, "loss": float("inf"), "sample_id": "b", "start_frame": 8,
                "timestep": 10.0})
    run.events(1, {"event": "step", "step": 2, "loss": 0.4},
               {"event": "non_finite", "step": 3, "rank": 1, "loss": float("nan"), "sample_id": "a", "start_frame": 0,
                "timestep": 999.0},
               {"event": "error", "error_type": "non_finite", "message": "rank 0: ...; rank 1: ...", "ranks": [0, 1]})
    run.heartbeat(0, phase="failed", step=3, seq=20, age=10)
    run.heartbeat(1, phase="failed", step=3, seq=20, age=10)
    run.result("failed", error_type="non_finite", message="rank 0: non-finite loss inf at step 3")
    d = _diagnose(run)
    assert d.kind == "non_finite" and d.first_bad["rank"] == 0 and d.first_bad["step"] == 3
    assert d.first_bad["sample_id"] == "b" and "ranks [1] were also non-finite at step 3" in d.details
    assert d.evidence[0].where == "events/rank-00000.jsonl:2"
    assert failure_summary(run.root).startswith("non_finite: non-finite loss at step 3 on rank 0")


@pytest.mark.parametrize("error_type, kind", [("oom", "oom"), ("shape", "shape"), ("data", "data"),
                                              ("sp_mismatch", "sp_mismatch"), ("checkpoint", "checkpoint_load"),
                                              ("error", "error")])
def test_a_failure_is_classified_by_the_recorded_error_and_names_the_failing_rank(tmp_path, error_type, kind):
    run = RunDir(tmp_path / "run")
    message = f"rank 1: Something: sample 'clip-9' went wrong ({error_type})"
    for r in (0, 1):
        run.heartbeat(r, phase="failed", step=5, seq=40, age=3, failed_in="forward")
        run.events(r, {"event": "error", "error_type": error_type, "message": message, "ranks": [1]})
    run.result("failed", error_type=error_type, message=message)
    d = _diagnose(run)
    assert (d.status, d.kind) == ("failed", kind)
    assert d.first_bad == {"rank": 1, "step": 5, "phase": "forward", "sample_id": "clip-9"}
    assert d.evidence[0].text.startswith('{"event": "error"')


def test_validation_without_its_marker_names_the_missing_slots_and_their_owner(tmp_path):
    run = RunDir(tmp_path / "run")
    run.result("complete", final={"step": 4})
    (run.root / "resolved-config.json").write_text(json.dumps(
        {"validation": {"passes": [{"name": "live", "weights": "live"}, {"name": "ema", "weights": "ema"}]}}))
    (run.root / "validation").mkdir()
    (run.root / "validation" / "frozen-plan.json").write_text(json.dumps({"slots": [{}, {}, {}, {}]}))
    live = run.root / "validation" / "step_00000004" / "live"
    for slot, status in ((0, "ok"), (2, "error")):
        (live / f"slot_{slot:06d}").mkdir(parents=True)
        (live / f"slot_{slot:06d}" / "manifest.json").write_text(json.dumps({"status": status, "error": "decode"}))
    (live / ".slot_000001.x1y2.partial").mkdir()
    d = _diagnose(run)
    assert (d.status, d.kind) == ("failed", "validation_missing")
    assert d.first_bad == {"step": 4, "pass": "live", "slot": 1, "logical_dp_rank": 1}
    assert "missing slots [1, 3] (owned by logical DP rank [1])" in d.details[0] and "pass ema: not started" in d.details
    assert any(".slot_000001.x1y2.partial" in line.where for line in d.evidence)


def test_a_committed_checkpoint_that_no_longer_verifies_is_a_load_failure(tmp_path):
    run = RunDir(tmp_path / "run")
    run.result("stopped", final={"step": 4})
    good, bad = write_checkpoint(run.root, 2), write_checkpoint(run.root, 4)
    (Path(bad) / "model" / "live.safetensors").write_bytes(b"oops")
    d = _diagnose(run)
    assert (d.kind, d.first_bad["step"]) == ("checkpoint_load", 4) and "verified checkpoints: [2]" in d.details[-1]
    assert Path(good).is_dir()


def test_a_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(SolarError, match="holds no run"):
        diagnose_dir(tmp_path)
    with pytest.raises(SolarError, match="is not a directory"):
        diagnose_dir(tmp_path / "nope")


def test_a_killed_process_on_this_host_is_a_crash(tmp_path):
    import socket

    run = RunDir(tmp_path / "run", world=1)
    run.heartbeat(0, phase="forward", step=3, seq=None, age=30)
    doc = json.loads((run.root / "heartbeat" / "rank-00000.json").read_text())
    doc.update(host=socket.gethostname(), pid=2**22 + 12345)  # no such process
    (run.root / "heartbeat" / "rank-00000.json").write_text(json.dumps(doc))
    assert not os.path.exists(f"/proc/{doc['pid']}")
    d = _diagnose(run)
    assert (d.kind, d.first_bad["rank"], d.first_bad["step"]) == ("crashed", 0, 3)


def _resumed_at_world_1(tmp_path) -> RunDir:
    """Launch 1 at world 2 lost rank 0 (rank 1 recorded a peer error and failed); launch 2 resumed at
    world 1. Every launch appends to the same per-rank files."""
    run = RunDir(tmp_path / "run", world=2)
    (run.root / "launches").mkdir()
    (run.root / "launches" / "0001-launch-manifest.json").write_text(json.dumps({
        "schema": "solar.launch.v1", "action": "train", "name": "t", "route": "r",
        "topology": {"world_size": 1, "logical_dp_world_size": 1}}))
    run.heartbeat(1, phase="failed", step=6, seq=30, age=60, failed_in="backward")
    run.events(1, {"event": "start", "world": 2}, {"event": "step", "step": 5},
               {"event": "error", "error_type": "error", "message": "Connection reset by peer"})
    run.events(0, {"event": "start", "world": 2}, {"event": "step", "step": 5},
               {"event": "error", "error_type": "error", "message": "an earlier launch's own error"},
               {"event": "start", "world": 1}, {"event": "step", "step": 6})
    return run


def test_what_an_earlier_launch_left_is_not_evidence_of_the_latest(tmp_path):
    """A run resumed at a smaller world size (an elastic shrink, a resume on fewer GPUs) and completed
    is healthy: the larger launch's extra ranks and every rank's events before its last start are not
    its evidence."""
    run = _resumed_at_world_1(tmp_path)
    run.heartbeat(0, phase="complete", step=8, seq=50, age=5)
    run.events(0, {"event": "step", "step": 8})
    run.result("complete", final={"step": 8})
    d = _diagnose(run)
    assert (d.status, d.kind) == ("healthy", "healthy") and "step 8" in d.summary
    assert failure_summary(run.root) is None


def test_the_latest_launchs_own_failure_is_still_found(tmp_path):
    run = _resumed_at_world_1(tmp_path)
    run.heartbeat(0, phase="failed", step=7, seq=50, age=5, failed_in="forward")
    run.events(0, {"event": "error", "error_type": "oom", "message": "CUDA out of memory at step 7"})
    run.result("failed", error_type="oom", message="CUDA out of memory at step 7")
    d = _diagnose(run)
    assert (d.status, d.kind) == ("failed", "oom") and d.first_bad["rank"] == 0
    assert "earlier launch" not in " ".join(line.text for line in d.evidence)
