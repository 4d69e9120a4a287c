"""A run directory is never stuck (issue 52): a refused launch writes nothing, a run that committed no
checkpoint starts over in place, a full resume from an older checkpoint rewinds in place and keeps
what it supersedes. `solar train` as users run it, on the tiny Wan TI2V-5B Stage0.5 config."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import TINY, result, steps, train
from tests.support.files import snapshot

pytestmark = pytest.mark.slow
CONFIG = TINY["wan22_ti2v_5b"]


def _sets(data: Path, out: Path, *extra: str) -> list[str]:
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.validate_every=0", "runtime.log_every=1",
            *extra]


def _launch_records(out: Path) -> list[dict]:
    found = [out / "launch-manifest.json", *sorted((out / "launches").glob("*-launch-manifest.json"))]
    return [json.loads(p.read_text()) for p in found if p.is_file()]


def _rank0(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events" / "rank-00000.jsonl").read_text().splitlines()]


def _last_launch_steps(out: Path) -> dict[int, float]:
    """Step -> loss of rank 0's latest launch."""
    events = _rank0(out)
    last = max(i for i, e in enumerate(events) if e["event"] == "start")
    return {e["step"]: e["loss"] for e in events[last:] if e["event"] == "step"}


@pytest.fixture(scope="module")
def shard_missing(wan_data, tmp_path_factory) -> Path:
    """The dataset with its training shard gone (the index still names it)."""
    import shutil

    root = tmp_path_factory.mktemp("shard-missing") / "data"
    shutil.copytree(wan_data, root)
    for shard in (root / "shards").glob("train-*.tar"):
        shard.unlink()
    return root


def test_a_refused_launch_leaves_the_directory_as_it_found_it_and_the_fixed_one_trains_there(
        wan_data, shard_missing, tmp_path):
    """A typo'd data root, a missing shard, a typo'd pretrained path: each is refused in one line (exit
    2) before anything is written: an absent directory stays absent; a run directory (a finished run,
    resumed with the wrong input) stays byte-identical. The fixed command trains in that directory."""
    wrong = {"solar: error: data.train_index": [f"data.root={tmp_path / 'no-such-data'}"],
             "solar: error: data.root: shard": [f"data.root={shard_missing}"],
             "solar: error: model.pretrained_path ": [f"model.pretrained_path={tmp_path / 'no-such-weights'}"]}
    out = tmp_path / "run"
    for case, sets in wrong.items():
        refused = train(CONFIG, [*_sets(wan_data, out, "train.max_steps=2"), *sets])
        assert refused.returncode == 2, (case, refused.stderr[-2000:])
        assert not out.exists(), (case, sorted(p.name for p in out.iterdir()))
        assert refused.stderr.startswith(case), refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
    fixed = train(CONFIG, _sets(wan_data, out, "train.max_steps=2", "runtime.save_every=2"))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert result(out)["status"] == "complete" and len(_launch_records(out)) == 1

    before = snapshot(out)
    resume = ["checkpoint.mode=full_resume", f"checkpoint.path={out / 'checkpoints' / 'step_00000002'}",
              "train.max_steps=3"]
    for case, sets in wrong.items():
        again = train(CONFIG, [*_sets(wan_data, out, *resume), *sets])
        assert again.returncode == 2 and again.stderr.count("\n") == 1, (case, again.stderr)
        assert snapshot(out) == before, case


def test_a_run_that_committed_nothing_starts_over_in_place(wan_data, tmp_path):
    """A launch that failed at step 2 (before its first save at 3): the same command starts the run over
    from step 0 in the same directory, the earlier launch kept as history and the restart recorded; a
    launch by hand with another recipe is refused naming the key, and changes nothing."""
    out = tmp_path / "run"
    sets = _sets(wan_data, out, "train.max_steps=4", "runtime.save_every=3")
    failed = train(CONFIG, sets, extra_env={"SOLAR_INJECT_FAULT": "raise:step=2"})
    assert failed.returncode != 0 and result(out)["status"] == "failed"
    assert not list(out.glob("checkpoints/step_*"))
    before = snapshot(out)
    other = train(CONFIG, [*sets, "train.optimizer.lr=0.5"])
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    assert "committed no checkpoint" in other.stderr and "train.optimizer.lr 0.001 -> 0.5" in other.stderr
    assert snapshot(out) == before
    restarted = train(CONFIG, sets)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert "holds no committed checkpoint: the run starts over from step 0 (1 earlier launch kept" in restarted.stderr
    assert result(out)["status"] == "complete" and result(out)["final"]["step"] == 4
    records = _launch_records(out)
    assert len(records) == 2 and records[1]["restart"]["earlier_launches"] == 1
    assert [e["event"] for e in _rank0(out) if e["event"] in ("start", "restarted")] == ["start", "start", "restarted"]
    assert [a["status"] for a in result(out)["usage"]["attempts"]] == ["failed", "complete"]
    # the restart trained every step from the initialisation: the same losses as the failed launch's step 1
    assert _last_launch_steps(out)[1] == [e for e in steps(out) if e["step"] == 1][0]["loss"]
    assert sorted(_last_launch_steps(out)) == [1, 2, 3, 4]


def test_a_launch_killed_before_its_first_save_runs_again_to_the_end(wan_data, tmp_path):
    """SIGKILL while the launch trains (before any checkpoint; its partial files, lock and events stay);
    the same command again starts over and trains to the end."""
    out = tmp_path / "run"
    sets = _sets(wan_data, out, "train.max_steps=3", "runtime.save_every=3")
    proc = train(CONFIG, sets, wait=False, extra_env={"SOLAR_INJECT_FAULT": "hang:step=2"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            (out / "events" / "rank-00000.jsonl").is_file() and any(e["event"] == "step" for e in _rank0(out))):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert not (out / "run-result.json").exists()      # killed: no result, no checkpoint
    again = train(CONFIG, sets)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "starts over from step 0" in again.stderr
    assert result(out)["status"] == "complete" and sorted(_last_launch_steps(out)) == [1, 2, 3]


def test_a_rewind_retrains_in_place_with_the_same_losses_and_keeps_what_it_supersedes(wan_data, tmp_path):
    """A run finished at step 8 (checkpoints 4 and 8); a full resume from step 4 into its own directory
    moves step 8 aside (kept, recorded), trains 5..8 again with the first time's losses, commits a new
    step 8 and completes; the newest-verified rule and a later resume see only the new one."""
    out = tmp_path / "run"
    sets = _sets(wan_data, out, "train.max_steps=8", "runtime.save_every=4")
    first = train(CONFIG, sets)
    assert first.returncode == 0, first.stderr[-2000:]
    losses = {e["step"]: e["loss"] for e in steps(out)}
    old8 = (out / "checkpoints" / "step_00000008" / "COMPLETE.json").read_bytes()
    rewind = train(CONFIG, [*sets, "checkpoint.mode=full_resume", f"checkpoint.path={out / 'checkpoints' / 'step_00000004'}"])
    assert rewind.returncode == 0, rewind.stderr[-2000:]
    assert "rewinding" in rewind.stderr and "step_00000008" in rewind.stderr
    again = _last_launch_steps(out)
    assert sorted(again) == [5, 6, 7, 8] and all(again[s] == losses[s] for s in again)
    kept = out / "checkpoints" / "superseded" / "0001" / "step_00000008"
    assert (kept / "COMPLETE.json").read_bytes() == old8
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_00000004", "step_00000008"]
    record = _launch_records(out)[1]["rewind"]
    assert record["step"] == 4 and record["superseded"] == ["step_00000008"]
    assert record["superseded_dir"] == "checkpoints/superseded/0001"
    assert result(out)["status"] == "complete" and result(out)["final"]["step"] == 8
    assert [e["step"] for e in _rank0(out) if e["event"] == "rewound"] == [4]
