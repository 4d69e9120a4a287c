"""A launch whose WORLD_SIZE differs from ``distributed.world_size`` is refused before any process
group is joined, with one line naming the field and both numbers."""

from __future__ import annotations

import pytest
import torch.distributed

from solar.errors import SolarError
from solar.launch import distributed


@pytest.fixture
def no_process_group(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(distributed.dist, "new_group", lambda *a, **k: calls.append((a, k)))
    return calls


@pytest.mark.parametrize("env_world, expected", [(4, 2), (1, 8), (3, 1)])
def test_world_size_mismatch_is_refused(monkeypatch, no_process_group, env_world, expected):
    monkeypatch.setenv("WORLD_SIZE", str(env_world))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(SolarError) as info:
        distributed.from_environment(expected_world=expected, sp=1, device="cpu")
    message = str(info.value)
    assert "\n" not in message
    assert f"distributed.world_size={expected}" in message
    assert f"WORLD_SIZE={env_world}" in message
    assert no_process_group == [] and not torch.distributed.is_initialized()


def test_no_world_size_means_one_process(monkeypatch, no_process_group):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SolarError, match=r"distributed.world_size=2 but this launch has WORLD_SIZE=1"):
        distributed.from_environment(expected_world=2, sp=1, device="cpu")
    d = distributed.from_environment(expected_world=1, sp=1, device="cpu")
    assert (d.rank, d.world, d.backend) == (0, 1, None) and no_process_group == []


def test_matching_world_joins_the_group(monkeypatch, no_process_group):
    """The same check passes when the numbers agree (the group itself is stubbed: no peers here)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    d = distributed.from_environment(expected_world=2, sp=2, device="cpu")
    assert (d.rank, d.world, d.sp, d.backend) == (1, 2, 2, "gloo")
    assert len(no_process_group) == 1 + 1 + 2  # init, one SP group, two DP groups


def test_solar_train_refuses_the_launch_with_one_line_and_writes_nothing(cli, tmp_path, no_process_group):
    from tests.conftest import CONFIGS

    config = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    out = tmp_path / "out"
    result = cli("train", "--config", str(config), "--set", f"data.root={tmp_path / 'data'}",
                 "--set", f"runtime.output_dir={out}", "--set", "distributed.world_size=2",
                 "--set", "train.global_batch_size=2", env={"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    assert result.code == 2, result.err
    (line,) = result.err.splitlines()
    assert line.startswith("solar: error: distributed.world_size=2 but this launch has WORLD_SIZE=1")
    assert not out.exists() and no_process_group == []
