"""How a sharded save spreads one rank's tensors over files (``checkpoint_shards.file_mapping``): DCP's
safetensors writer holds a whole file in memory twice before writing it, so no file may grow past
about ``FILE_BYTES`` of a rank's bytes; every tensor has a file, and a small state keeps one."""

from __future__ import annotations

import torch

from solar.train.checkpoint_shards import file_mapping


def test_a_small_state_keeps_one_file_per_rank():
    state = {f"model/live/w{i}": torch.zeros(16, 16) for i in range(4)}
    assert file_mapping(state, None, limit=1 << 20) is None


def test_tensors_fill_files_up_to_the_limit_in_name_order():
    state = {f"model/live/w{i}": torch.zeros(256, 256) for i in range(10)}   # 256 KiB each
    mapping = file_mapping(state, None, limit=600 << 10)
    assert set(mapping) == set(state)
    files: dict[int, int] = {}
    for key, index in mapping.items():
        files[index] = files.get(index, 0) + state[key].numel() * 4
    assert sorted(files) == list(range(1, 6)) and all(size <= 600 << 10 for size in files.values())
    assert [mapping[k] for k in sorted(state)] == sorted(mapping[k] for k in sorted(state))  # in name order


def test_a_tensor_larger_than_the_limit_gets_a_file_of_its_own():
    state = {"a": torch.zeros(8), "b": torch.zeros(1 << 20), "c": torch.zeros(8)}
    mapping = file_mapping(state, None, limit=1 << 10)
    assert mapping["a"] != mapping["b"] != mapping["c"] and mapping["a"] == 1

