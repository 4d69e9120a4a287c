"""The stage's fencing token (solar.storage.fence, issue 51 item 3): recorded before a launch writes,
a newer attempt refuses a stale one that starts late and stops one that wakes up (one line, exit 3,
nothing written); tokens compare within one SolarRun stage; the writer lock lets a newer attempt
past an older holder. tests/e2e/test_fence.py does it with real torchrun processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from solar.errors import SolarError
from solar.storage import fence, run_dir
from solar.storage.atomic import write_replace

OWNER = {"run_uid": "u-1", "stage": "fm"}


@pytest.fixture(autouse=True)
def _disarmed():
    yield
    fence.disarm()


def _recorded(out: Path) -> dict:
    return json.loads((out / fence.FENCE_FILE).read_text())


@pytest.mark.parametrize("raw, token", [(None, None), ("", None), ("1", 1), (" 12 ", 12)])
def test_the_token_is_the_attempt_number_and_a_launch_by_hand_has_none(raw, token):
    assert fence.token_from({} if raw is None else {fence.ENV: raw}) == token


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5"])
def test_a_token_that_is_not_an_attempt_number_is_refused(raw):
    with pytest.raises(SolarError, match=rf"SOLAR_ATTEMPT='{raw}' is not an attempt number"):
        fence.token_from({fence.ENV: raw})


def test_a_launch_records_its_token_and_a_later_one_replaces_it(tmp_path):
    out = tmp_path / "stage"
    fence.record(fence.Fence(out, 1, OWNER))
    first = _recorded(out)
    assert first["token"] == 1 and first["owner"] == OWNER and first["pid"] == os.getpid() and first["since"]
    fence.record(fence.Fence(out, 1, OWNER))   # the same attempt again (an operator restarted before its status)
    fence.record(fence.Fence(out, 3, OWNER))   # attempts may skip numbers (one whose pods never started)
    assert _recorded(out)["token"] == 3
    assert sorted(p.name for p in out.iterdir()) == [fence.FENCE_FILE]   # no temporary file left


def test_a_stale_attempt_starting_late_is_refused_writing_nothing(tmp_path):
    out = tmp_path / "stage"
    fence.record(fence.Fence(out, 2, OWNER))
    before = (out / fence.FENCE_FILE).read_bytes()
    stale = fence.Fence(out, 1, OWNER)
    with pytest.raises(fence.Stale) as caught:
        fence.record(stale)
    doc = _recorded(out)
    assert str(caught.value) == (f"attempt 1 of stage fm is stale: attempt 2 took over at {doc['since']} (host "
                                 f"{doc['host']}, pid {os.getpid()}); not starting (exit status 3)")
    assert caught.value.exit_code == fence.STALE_EXIT == 3
    assert (out / fence.FENCE_FILE).read_bytes() == before and sorted(os.listdir(out)) == [fence.FENCE_FILE]


def test_tokens_compare_within_one_run_stage(tmp_path):
    """A recreated SolarRun of the same name starts again at attempt 1 and takes the directory over; a
    process of the other run is then stale, whatever its token."""
    out = tmp_path / "stage"
    fence.record(fence.Fence(out, 5, OWNER))
    fence.record(fence.Fence(out, 1, {"run_uid": "u-2", "stage": "fm"}))
    assert _recorded(out)["token"] == 1
    old = fence.Fence(out, 5, OWNER)
    assert old.stale(old.current()) and not old.newer(old.current())


def test_an_unarmed_process_checks_nothing(tmp_path):
    out = tmp_path / "stage"
    fence.record(fence.Fence(out, 2, OWNER))
    fence.check()                                     # a launch without a token: `solar train` by hand
    write_replace(out / "run-result.json", b"{}")
    assert (out / "run-result.json").read_bytes() == b"{}"


def test_the_current_attempt_passes_its_checks_and_a_smaller_token_is_written_over(tmp_path):
    """Two launches that recorded at once may leave the smaller token; the larger writes its own again
    at its first check."""
    out = tmp_path / "stage"
    mine = fence.Fence(out, 2, OWNER)
    fence.record(mine)
    fence.arm(mine)
    write_replace(out / "run-result.json", b"{}")
    fence.Fence(out, 1, OWNER)._write()
    fence.check()
    assert _recorded(out)["token"] == 2


STALE_WRITER = """
import sys
from pathlib import Path
from solar.storage import fence, run_dir
from solar.storage.atomic import write_replace

out = Path(sys.argv[1])
mine = fence.Fence(out, 1, None)
fence.record(mine)
fence.arm(mine)
events = run_dir.EventLog(out, 0)
events.write("step", step=1)
fence.record(fence.Fence(out, 2, None))    # attempt 2 takes over while this one sleeps
try:
    {write}
finally:
    write_replace(out / "finally.json", b"{{}}")   # never runs: the process leaves at once
print("not reached")
"""


@pytest.mark.parametrize("write", [
    "write_replace(out / 'run-result.json', b'{}')",
    "events.write('step', step=2)",
    "run_dir.Heartbeat(out, 0).update(phase='step')",
    "__import__('solar.storage.checkpoints').storage.checkpoints.begin(out, 2)",
    "run_dir.RankLog(out, 0)",
])
def test_a_process_of_a_replaced_attempt_leaves_at_its_next_write_with_one_line(write, tmp_path):
    out = tmp_path / "stage"
    proc = subprocess.run([sys.executable, "-c", STALE_WRITER.format(write=write), str(out)], capture_output=True,
                          text=True, timeout=60)
    doc = _recorded(out)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [
        f"solar: attempt 1 of {out} is stale: attempt 2 took over at {doc['since']} (host {doc['host']}, pid "
        f"{doc['pid']}); exiting without writing (exit status 3)"]
    assert proc.stdout == ""
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert left == [fence.FENCE_FILE, "events", "events/rank-00000.jsonl"]
    assert len((out / "events" / "rank-00000.jsonl").read_text().splitlines()) == 1   # its step 1, before


MID_WRITE = """
import sys
from pathlib import Path
from solar.storage import atomic, fence

out = Path(sys.argv[1])
mine = fence.Fence(out, 1, None)
fence.record(mine)
fence.arm(mine)
written = atomic._write_temp

def stopped_while_writing(*args, **kwargs):   # the check before the write passed; attempt 2 takes over meanwhile
    tmp = written(*args, **kwargs)
    fence.record(fence.Fence(out, 2, None))
    return tmp

atomic._write_temp = stopped_while_writing
atomic.{write}(out / "run-result.json", b"{{}}")
print("not reached")
"""


@pytest.mark.parametrize("write", ["write_replace", "write_create_only"])
def test_a_write_whose_attempt_was_replaced_while_it_wrote_publishes_nothing_and_leaves_no_temporary(write, tmp_path):
    out = tmp_path / "stage"
    proc = subprocess.run([sys.executable, "-c", MID_WRITE.format(write=write), str(out)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3 and " is stale: attempt 2 took over " in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == [fence.FENCE_FILE]


def test_a_checkpoint_commit_of_a_replaced_attempt_leaves_before_its_rename(tmp_path):
    code = ("import sys; from pathlib import Path; from solar.storage import checkpoints as ck, fence\n"
            "out = Path(sys.argv[1]); mine = fence.Fence(out, 1, None); fence.record(mine); fence.arm(mine)\n"
            "partial = ck.begin(out, 2); (partial / 'x.bin').write_bytes(b'x')\n"
            "fence.record(fence.Fence(out, 2, None))\n"
            "ck.commit(partial, step=2, contract={}, roles={}, trainer_state={})\n")
    out = tmp_path / "stage"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and " is stale: attempt 2 took over " in proc.stderr
    assert not (out / "checkpoints" / "step_00000002").exists()


def test_the_writer_lock_lets_a_newer_attempt_past_an_older_holder_and_takes_the_lock_when_it_goes(tmp_path):
    out = tmp_path / "stage"
    old = run_dir.hold(out, 1, OWNER)
    old.record()
    new = run_dir.hold(out, 2, OWNER)
    assert new.fenced and new.fenced.startswith(f"attempt 1 (host ") and f"pid {os.getpid()}" in new.fenced
    new.record()
    for token, owner in [(None, None), (2, OWNER), (3, {"run_uid": "u-2", "stage": "fm"})]:
        with pytest.raises(SolarError, match="is being written by a live launch"):   # as today
            run_dir.hold(out, token, owner).release()
    old.release()                          # the fenced holder goes: the newer attempt's thread takes the lock
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            run_dir.hold(out).release()
        except SolarError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the newer attempt did not take the lock its fenced holder released")
    new.release()


def test_the_writer_lock_refuses_an_older_attempt_as_stale(tmp_path):
    out = tmp_path / "stage"
    live = run_dir.hold(out, 2, OWNER)
    live.record()
    with pytest.raises(fence.Stale, match="attempt 1 of stage fm is stale: attempt 2 took over at "):
        run_dir.hold(out, 1, OWNER)
    live.release()


def test_a_directory_holding_only_the_lock_and_the_fence_is_unused(tmp_path):
    out = tmp_path / "stage"
    run_dir.hold(out, 1).release()
    fence.record(fence.Fence(out, 1))
    assert run_dir.prepare(out, types.SimpleNamespace(config_dict={"action": "train"}), resuming=False) is None


class _Dist:
    """One rank's process group, as ``Session.check`` uses it."""
    rank, world = 0, 1

    def all_gather_object(self, obj, name):
        return [obj]

    def close(self):
        pass


def _session(out: Path):
    from solar.launch.session import Session

    return Session(types.SimpleNamespace(), _Dist(), out, verb="training")


def test_a_session_records_its_attempt_before_it_writes_and_arms_the_check(tmp_path, monkeypatch):
    monkeypatch.setenv(fence.ENV, "2")
    monkeypatch.setenv("SOLAR_RUN_UID", "u-1")
    monkeypatch.setenv("SOLAR_RUN_STAGE", "fm")
    out = tmp_path / "stage"
    session = _session(out)
    session.check(lambda: None)
    assert _recorded(out)["token"] == 2 and _recorded(out)["owner"] == OWNER
    assert fence.armed() == fence.Fence(out, 2, OWNER)
    session.lock.release()


def test_a_session_of_a_stale_attempt_is_refused_with_exit_3_writing_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(fence.ENV, "1")
    monkeypatch.delenv("SOLAR_RUN_UID", raising=False)
    monkeypatch.setenv("SOLAR_TERMINATION_LOG", str(tmp_path / "termination-log"))
    (tmp_path / "termination-log").write_text("")
    out = tmp_path / "stage"
    fence.record(fence.Fence(out, 2))
    with pytest.raises(fence.Stale, match=rf"attempt 1 of {out} is stale: attempt 2 took over"):
        _session(out).check(lambda: None)
    assert sorted(os.listdir(out)) == [fence.FENCE_FILE] and _recorded(out)["token"] == 2
    assert fence.armed() is None
    assert (tmp_path / "termination-log").read_text() == ""   # not a refusal of the input: the operator retries nothing


def test_a_session_without_a_token_records_and_checks_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(fence.ENV, raising=False)
    out = tmp_path / "stage"
    session = _session(out)
    session.check(lambda: None)
    assert not (out / fence.FENCE_FILE).exists() and fence.armed() is None
    session.lock.release()
