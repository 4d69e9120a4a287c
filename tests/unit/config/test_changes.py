"""What a full resume may change (solar.config.changes): kinds, path spellings, refusals."""

from __future__ import annotations

import copy

import pytest

from solar.config import changes
from solar.config.resolve import resolve_file
from tests.conftest import CONFIGS

BASE = resolve_file(CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml",
                    ["data.root=/data", "runtime.output_dir=/runs/a"], expected_action="train").config_dict


def _with(**edits):
    doc = copy.deepcopy(BASE)
    for key, value in edits.items():
        *path, last = key.split("__")
        node = doc
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return doc


@pytest.mark.parametrize("key, kind", [
    ("distributed.world_size", "execution"), ("runtime.save_every", "execution"), ("runtime.compile", "execution"),
    ("runtime.save_every_seconds", "execution"),
    ("checkpoint.path", "execution"), ("train.micro_batch_size", "execution"), ("data.root", "execution"),
    ("train.max_steps", "schedule"), ("train.optimizer.warmup_steps", "schedule"),
    ("train.sgf.critic_optimizer.min_lr_ratio", "schedule"),
    ("train.optimizer.lr", "recipe"), ("train.global_batch_size", "recipe"), ("data.seed", "recipe"),
    ("train.ema.decay", "recipe"), ("model.pretrained_path", "recipe"), ("model.dims", "recipe"),
    ("data.train_index", "recipe"), ("validation.sample_count", "recipe"),
])
def test_every_key_has_its_kind_and_unlisted_keys_are_recipe(key, kind):
    assert changes.kind_of(key) == kind


def test_execution_changes_and_path_spellings_pass_freely():
    new = _with(distributed__world_size=4, runtime__save_every=9, data__root="/data/",
                data__train_index="./train-index.jsonl.gz", runtime__output_dir="/elsewhere/a")
    review = changes.review(BASE, new, completed_step=4, where="/runs/a")
    assert not review.recorded and not review.lines()
    assert {c.key for c in review.execution} == {"distributed.world_size", "runtime.save_every", "runtime.output_dir"}


def test_a_longer_schedule_is_recorded_from_the_next_step():
    review = changes.review(BASE, _with(train__max_steps=20), completed_step=10, where="/runs/a")
    assert review.recorded == [{"key": "train.max_steps", "kind": "schedule", "old": 10, "new": 20, "from_step": 11}]
    assert review.lines() == ["schedule change: train.max_steps 10 -> 20 (from step 11)"]


def test_a_schedule_shorter_than_the_completed_step_is_refused():
    with pytest.raises(ValueError, match=r"train.max_steps=3 is below step 4, which /runs/a has already completed"):
        changes.review(BASE, _with(train__max_steps=3), completed_step=4, where="/runs/a")
    assert changes.review(BASE, _with(train__max_steps=4), completed_step=4, where="/runs/a").schedule


def test_a_recipe_change_is_refused_naming_each_key_with_both_values_until_listed():
    new = _with(train__optimizer={**BASE["train"]["optimizer"], "lr": 0.002}, data__seed=7)
    with pytest.raises(ValueError) as refused:
        changes.review(BASE, new, completed_step=4, where="/runs/a")
    text = str(refused.value)
    assert "data.seed 42 -> 7, train.optimizer.lr 0.001 -> 0.002;" in text and "\n" not in text
    assert "--set 'checkpoint.accept_changes=[data.seed,train.optimizer.lr]'" in text
    new["checkpoint"]["accept_changes"] = ["train.optimizer.lr", "data.seed"]
    review = changes.review(BASE, new, completed_step=4, where="/runs/a")
    assert [(c["key"], c["old"], c["new"], c["from_step"]) for c in review.recorded] == [
        ("data.seed", 42, 7, 5), ("train.optimizer.lr", 0.001, 0.002, 5)]


def test_a_long_refusal_names_three_keys_then_how_many_more():
    new = _with(data__seed=7, train__seed=8, train__ema={**BASE["train"]["ema"], "decay": 0.9},
                data__fps=8.0, data__shuffle_buffer=3)
    with pytest.raises(ValueError, match=r"data.fps 16.0 -> 8.0, data.seed 42 -> 7, data.shuffle_buffer 64 -> 3 and 2 "
                                         r"more;"):
        changes.review(BASE, new, completed_step=1, where="/runs/a")


def test_accept_changes_names_config_keys_only():
    new = _with(checkpoint__accept_changes=["train.optimizer.learning_rate"])
    with pytest.raises(ValueError, match="checkpoint.accept_changes lists train.optimizer.learning_rate, which is not a "
                                         "key of the config"):
        changes.review(BASE, new, completed_step=1, where="/runs/a")
    listed = _with(checkpoint__accept_changes=["train.optimizer.lr"])   # listed, not changed (an earlier resume's)
    assert not changes.review(BASE, listed, completed_step=1, where="/runs/a").recorded
