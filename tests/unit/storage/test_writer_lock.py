"""The run directory's writer lock (solar.storage.run_dir.hold): one holder, named to the next; gone
with its holder; a directory holding only the lock file is an unused one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from solar.errors import SolarError
from solar.storage import run_dir


def test_a_second_holder_is_refused_naming_the_first_and_a_released_lock_is_free(tmp_path):
    lock = run_dir.hold(tmp_path / "run")
    lock.record()
    (tmp_path / "run" / run_dir.LOCK_FILE).read_text()    # another descriptor of the file keeps the lock
    with pytest.raises(SolarError, match=rf"is being written by a live launch \(host \S+, pid {os.getpid()}, since "):
        run_dir.hold(tmp_path / "run")
    lock.release()
    run_dir.hold(tmp_path / "run").release()


def test_a_dead_holder_leaves_no_lock(tmp_path):
    code = ("import sys, os; from pathlib import Path; from solar.storage import run_dir; "
            "run_dir.hold(Path(sys.argv[1])).record(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], check=True)
    assert "pid" in (tmp_path / "run" / run_dir.LOCK_FILE).read_text()   # the file stays, its lock does not
    run_dir.hold(tmp_path / "run").release()


def test_a_directory_holding_only_the_lock_file_is_unused():
    import types
    from pathlib import Path
    from tempfile import TemporaryDirectory

    with TemporaryDirectory() as tmp:
        run_dir.hold(Path(tmp)).release()
        resolved = types.SimpleNamespace(config_dict={"action": "train"})
        assert run_dir.prepare(Path(tmp), resolved, resuming=False) is None
