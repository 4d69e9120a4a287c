"""``SOLAR_FAKE_GPU_MEMORY`` (issue 53 item 8): a drill that stands in for a GPU's memory on the CPU, so it
is honoured only where the device is the CPU; on a GPU the device's own memory decides and the variable
has no effect (rank 0 says it is ignored)."""

from __future__ import annotations

import pytest

from solar.train import faults

DRILL = {"SOLAR_ALLOW_FAULTS": "1", "SOLAR_FAKE_GPU_MEMORY": "1000,2000"}


def test_on_the_cpu_each_rank_reports_its_faked_size():
    assert [faults.device_memory(rank, "cpu", DRILL) for rank in range(3)] == [1000, 2000, 1000]


@pytest.mark.parametrize("rank", [0, 1])
def test_on_a_gpu_it_is_ignored(rank, capsys):
    assert faults.device_memory(rank, "cuda", DRILL) is None
    said = capsys.readouterr().err
    if rank == 0:
        assert said == ("solar: warning: ignoring SOLAR_FAKE_GPU_MEMORY='1000,2000' on a cuda device (it stands in "
                        "for a GPU's memory on the CPU only)\n")
    else:
        assert said == ""


def test_without_the_drill_switch_it_is_ignored_everywhere(capsys):
    env = {"SOLAR_FAKE_GPU_MEMORY": "1000"}
    assert faults.device_memory(0, "cpu", env) is None and faults.device_memory(0, "cuda", env) is None
    assert "drills need SOLAR_ALLOW_FAULTS=1" in capsys.readouterr().err
