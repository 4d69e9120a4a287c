"""Create-only and atomic-replace writes."""

from __future__ import annotations

import os

import pytest

from solar.config.canonical import blake2s_hex, canonical_bytes, digest
from solar.storage.atomic import OutputExistsError, write_create_only, write_replace


def test_create_only_writes_once(tmp_path):
    target = tmp_path / "a.json"
    write_create_only(target, b"one")
    assert target.read_bytes() == b"one"
    with pytest.raises(OutputExistsError, match="already exists"):
        write_create_only(target, b"two")
    assert target.read_bytes() == b"one"
    assert os.listdir(tmp_path) == ["a.json"]


def test_create_only_refuses_dangling_symlink(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputExistsError):
        write_create_only(tmp_path / "link", b"x")
    assert not (tmp_path / "nowhere").exists()


def test_replace(tmp_path):
    target = tmp_path / "status.json"
    write_replace(target, b"1")
    write_replace(target, b"2")
    assert target.read_bytes() == b"2" and os.listdir(tmp_path) == ["status.json"]


def test_replace_fsyncs_unless_told_not_to_and_heartbeats_do_not(tmp_path, monkeypatch):
    import json

    from solar.storage.run_dir import Heartbeat

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    target = tmp_path / "status.json"
    write_replace(target, b"1")
    assert len(synced) == 2  # the file, then its directory
    write_replace(target, b"2", durable=False)
    assert len(synced) == 2 and target.read_bytes() == b"2" and os.listdir(tmp_path) == ["status.json"]
    beat = Heartbeat(tmp_path, 3)
    beat.update(phase="forward", step=7)  # several times per training step: no fsync (issue 18)
    assert len(synced) == 2
    assert json.loads((tmp_path / "heartbeat" / "rank-00003.json").read_text())["phase"] == "forward"
    assert os.listdir(tmp_path / "heartbeat") == ["rank-00003.json"]


def test_canonical_json_and_digest():
    a = {"b": [1, 2.5, "é"], "a": {"z": None, "y": True}}
    assert canonical_bytes(a) == '{"a":{"y":true,"z":null},"b":[1,2.5,"é"]}'.encode()
    assert digest(a) == digest({"a": {"z": None, "y": True}, "b": [1, 2.5, "é"]})
    assert len(digest(a)) == 64 and digest(a) == blake2s_hex(canonical_bytes(a))
    with pytest.raises(ValueError):
        canonical_bytes({"x": float("nan")})
