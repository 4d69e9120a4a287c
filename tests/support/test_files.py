"""The "nothing written" helper counts what a list of files misses: a new empty directory, a link, a
hidden file, a rewrite of the same size."""

from __future__ import annotations

import os

from tests.support.files import snapshot


def test_a_snapshot_changes_with_every_kind_of_write(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "a.json").write_text("{}")
    before = snapshot(tmp_path)
    assert before == {"run": None, "run/a.json": b"{}", "run/checkpoints": None}
    run = tmp_path / "run"
    partial = run / "checkpoints" / "step_00000002.partial"
    for write, undo in [
        (partial.mkdir, partial.rmdir),                                       # an empty directory
        (lambda: (run / ".fence.json").write_text("1"), (run / ".fence.json").unlink),   # a hidden file
        (lambda: os.symlink("a.json", run / "latest"), (run / "latest").unlink),         # a link
        (lambda: (run / "a.json").write_text("[]"), lambda: (run / "a.json").write_text("{}")),   # same size
    ]:
        write()
        assert snapshot(tmp_path) != before
        undo()
        assert snapshot(tmp_path) == before


def test_a_missing_root_is_empty(tmp_path):
    assert snapshot(tmp_path / "nowhere") == {}
