"""Deterministic test-index selection, reserve replacement and the frozen validation plan."""

from __future__ import annotations

import json
import random

import pytest

from solar.data.index import load_table
from solar.data.selection import freeze, load_frozen, owner, plan_document, select, stable_int
from solar.errors import DataError
from tests.unit.data.helpers import rows, write_index


@pytest.fixture
def table(tmp_path):
    items = rows(20, num_frames=153, family="wan22_ti2v_5b")
    items[4]["start_frame"] = 8
    items[6]["validation_noise_seed"] = 777
    return load_table(write_index(tmp_path / "test-index.jsonl.gz", items))


def test_selection_follows_the_contract(table):
    slots = select(table, sample_count=6, selection_seed=42, noise_seed=42, pixel_frames=81)
    assert [s.row for s in slots] == random.Random(42).sample(range(20), 6)
    for s in slots:
        assert s.sample_id == f"s{s.row:05d}"
        if s.row == 4:
            assert s.start_frame == 8
        else:
            assert s.start_frame % 4 == 0 and 0 <= s.start_frame <= 72
            assert s.start_frame == 4 * (stable_int("validation-start", s.key, s.slot) % 19)
        expected = 777 if s.row == 6 else stable_int("validation-noise", s.slot, 42)
        assert s.noise_seed == expected
    assert select(table, sample_count=6, selection_seed=42, noise_seed=42, pixel_frames=81) == slots
    assert [owner(s, 4) for s in range(6)] == [0, 1, 2, 3, 0, 1]


def test_camera_failures_are_replaced_from_the_reserve(table):
    chosen = random.Random(42).sample(range(20), 6)
    bad = set(chosen[:2])
    slots = select(table, sample_count=6, selection_seed=42, noise_seed=42, pixel_frames=81,
                   camera_ok=lambda row, start: "translation 99 > 20" if row in bad else None)
    assert all(s.row not in bad for s in slots) and len({s.row for s in slots}) == 6
    assert [s.replaced for s in slots] == [[f"s{chosen[0]:05d}"], [f"s{chosen[1]:05d}"], None, None,
                                           None, None]
    assert [s.row for s in slots[2:]] == chosen[2:]
    with pytest.raises(DataError, match="no reserve row left"):
        select(table, sample_count=6, selection_seed=42, noise_seed=42, pixel_frames=81,
               camera_ok=lambda row, start: "bad")


def test_too_many_samples(table):
    with pytest.raises(DataError, match="validation.sample_count=21 exceeds the 20 rows"):
        select(table, sample_count=21, selection_seed=42, noise_seed=42, pixel_frames=81)


def test_frozen_plan_is_created_once_and_enforced(table, tmp_path):
    def doc(**kw):
        args = {"sample_count": 4, "selection_seed": 42, "noise_seed": 42, "pixel_frames": 81, **kw}
        slots = select(table, **args)
        return plan_document(table, slots, test_index="test-index.jsonl.gz", **args)

    path = tmp_path / "frozen-plan.json"
    first = freeze(path, doc())
    assert json.loads(path.read_text()) == first and first["schema"] == "solar.validation-plan.v1"
    assert freeze(path, doc()) == first
    with pytest.raises(DataError, match="differs from the frozen plan .noise_seed: frozen 42, now 43"):
        freeze(path, doc(noise_seed=43))
    with pytest.raises(DataError, match="sample_count: frozen 4, now 5"):
        freeze(path, doc(sample_count=5))
    assert json.loads(path.read_text()) == first


def test_load_frozen_returns_the_frozen_slots_or_names_the_changed_setting(table, tmp_path):
    args = {"sample_count": 4, "selection_seed": 42, "noise_seed": 42, "pixel_frames": 81}
    slots = select(table, **args)
    document = plan_document(table, slots, test_index="test-index.jsonl.gz", **args)
    header = {k: v for k, v in document.items() if k != "slots"}
    path = tmp_path / "frozen-plan.json"
    assert load_frozen(path, header) is None
    freeze(path, document)
    assert load_frozen(path, header) == slots
    with pytest.raises(DataError, match=r"no longer matches the frozen validation plan \(pixel_frames: frozen 81, "
                                        r"now 121\)"):
        load_frozen(path, {**header, "pixel_frames": 121})
    with pytest.raises(DataError, match="test_index_sample_id_digest: frozen"):
        load_frozen(path, {**header, "test_index_sample_id_digest": "0" * 64})
