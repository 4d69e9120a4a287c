"""Every example config resolves once its placeholders are supplied, and not before."""

from __future__ import annotations

import json
import re

import pytest

from solar.config import families
from solar.config.guards import walk
from solar.config.loader import read_document
from solar.config.resolve import resolve_file
from solar.errors import ConfigError
from tests.conftest import CONFIGS

ALL = sorted(CONFIGS.rglob("*.yaml"))
RELEASED = [p for p in ALL if "tiny" not in p.parts]


def _pending(path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        resolve_file(path)
    match = re.search(r"fields this (?:train|infer) run reads: (.*); supply them", str(info.value))
    assert match, str(info.value)
    return match.group(1).split(", ")


def _values_for(keys: list[str]) -> list[str]:
    # Teacher and critic share one Stage0.5 source, so give them the same value.
    def value(key: str) -> str:
        if key.startswith("checkpoint.roles.") and key.split(".")[2] in ("teacher", "critic"):
            return "/ckpt/stage0p5/checkpoints/step_00000010"
        return "/deploy/" + key.replace(".", "-")
    return [f"{key}={value(key)}" for key in keys]


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_rejected_until_placeholders_supplied(path):
    keys = _pending(path)
    _, tree = read_document(path)
    placeholders = {k for k, _, v in walk(tree) if isinstance(v, str) and v.startswith("/path/to/")}
    assert set(keys) <= placeholders
    assert keys == sorted(keys)
    # Supplying all but one still fails and names the one left.
    if len(keys) > 1:
        with pytest.raises(ConfigError, match=re.escape(keys[-1])):
            resolve_file(path, _values_for(keys[:-1]))
    resolved = resolve_file(path, _values_for(keys))
    assert resolved.route.key
    assert resolved.config.action == tree["action"]


@pytest.mark.parametrize("path, expected", [
    ("wan22_ti2v_5b/train_stage0p5_fm_81f.yaml",
     ["data.root", "model.pretrained_path", "model.vae_path", "runtime.output_dir"]),
    ("wan22_ti2v_5b/train_stage1_tf_anyflow_81f.yaml",
     ["checkpoint.path", "data.root", "model.vae_path", "runtime.output_dir"]),
    ("wan22_ti2v_5b/train_stage2_sgf_81f.yaml",
     ["checkpoint.roles.critic.path", "checkpoint.roles.student.path", "checkpoint.roles.teacher.path",
      "data.root", "model.vae_path", "runtime.output_dir"]),
    ("wan22_ti2v_5b/infer_stage2_sgf_camera_length.yaml",
     ["checkpoint.path", "data.root", "model.vae_path", "runtime.output_dir"]),
    # LoRA routes read the base model even when loading a checkpoint.
    ("ltx25/infer_stage0p5_fm_153f.yaml",
     ["checkpoint.path", "data.root", "model.pretrained_path", "model.vae_path", "runtime.output_dir"]),
    ("tiny/minimax_h3/train_stage2_sgf_158f.yaml", ["data.root", "runtime.output_dir"]),
])
def test_placeholder_lists(path, expected):
    assert _pending(CONFIGS / path) == expected


@pytest.mark.parametrize("path", [p for p in ALL if "tiny" in p.parts and p.name.startswith("train_")],
                         ids=lambda p: p.name)
def test_tiny_training_configs_need_only_data_root_and_output_dir(path, tmp_path):
    resolved = resolve_file(path, [f"data.root={tmp_path}/data", f"runtime.output_dir={tmp_path}/out"])
    assert resolved.config.model.profile == "tiny"


@pytest.mark.parametrize("path", RELEASED, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_tiny_twin_has_same_route_and_frames(path):
    twin = CONFIGS / "tiny" / path.relative_to(CONFIGS)
    assert twin.is_file()
    released = resolve_file(path, _values_for(_pending(path)))
    tiny = resolve_file(twin, _values_for(_pending(twin)))
    assert tiny.route == released.route
    assert tiny.config.action == released.config.action
    assert tiny.config.data.pixel_frames == released.config.data.pixel_frames
    assert released.config.model.profile == "released" and tiny.config.model.profile == "tiny"
    assert ([p.solver for p in tiny.config.validation.passes]
            == [p.solver for p in released.config.validation.passes][: len(tiny.config.validation.passes)])


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_resolved_config_feeds_back_to_itself(path, tmp_path):
    first = resolve_file(path, _values_for(_pending(path)))
    again_path = tmp_path / "resolved-config.json"
    again_path.write_text(json.dumps(first.document()["config"]))
    again = resolve_file(again_path)
    assert again.resolved_digest == first.resolved_digest
    assert again.document()["config"] == first.document()["config"]
    assert again.topology == first.topology


def test_released_values_match_the_recipe():
    """Spot checks of semantics.md §10 in the released-scale configs."""
    def cfg(rel):
        path = CONFIGS / rel
        return resolve_file(path, _values_for(_pending(path)))

    wan = cfg("wan22_ti2v_5b/train_stage0p5_fm_81f.yaml")
    assert wan.topology.as_dict() == {"world_size": 256, "sequence_parallel_size": 1,
                                      "logical_dp_world_size": 256, "micro_batch_size": 1,
                                      "gradient_accumulation": 1, "global_batch_size": 256}
    assert wan.config.model.timestep_shift == 5.0 and wan.config.train.optimizer.lr == 5e-5
    assert wan.config.train.optimizer.betas == [0.9, 0.95] and wan.config.train.max_steps == 30000
    a14b = cfg("wan22_i2v_a14b/train_stage0p5_fm_81f.yaml")
    assert a14b.topology.sequence_parallel_size == 2 and a14b.topology.global_batch_size == 128
    assert a14b.config.model.timestep_shift == 3.0
    ltx = cfg("ltx25/train_stage0p5_fm_153f.yaml")
    assert (ltx.topology.sequence_parallel_size, ltx.topology.gradient_accumulation,
            ltx.topology.global_batch_size) == (2, 2, 256)
    assert ltx.config.model.lora.rank == 384 and ltx.config.train.fm.timestep_sampling == "shifted_logit_normal"
    h3s2 = cfg("minimax_h3/train_stage2_sgf_158f.yaml")
    assert (h3s2.topology.sequence_parallel_size, h3s2.topology.global_batch_size) == (4, 64)
    assert h3s2.config.train.ema.start_step == 39 and h3s2.config.train.ema.decay == 0.99
    assert h3s2.config.runtime.validation_steps == [20, 200] and h3s2.config.runtime.save_every == 100
    assert h3s2.config.train.sgf.rollout_latents == 50 and h3s2.config.train.sgf.supervised_latents == 47
    assert h3s2.config.model.camera_translation_transform == "logd4"
    wan_s2 = cfg("wan22_ti2v_5b/train_stage2_sgf_81f.yaml")
    assert wan_s2.config.train.optimizer.lr == 2e-6 and wan_s2.config.train.sgf.critic_optimizer.lr == 4e-7
    assert wan_s2.config.train.sgf.denoising_steps == [1000, 750, 500, 250]
    h3s1 = cfg("minimax_h3/train_stage1_tf_anyflow_158f.yaml")
    assert h3s1.config.train.anyflow.trained_latents == 45 and h3s1.config.train.anyflow.guidance_scale is None
    for rel in ("ltx25/infer_stage0p5_fm_153f.yaml", "wan22_ti2v_5b/infer_stage0p5_fm_81f.yaml"):
        resolved = cfg(rel)
        field = families.spec(resolved.route.family).infer_sample_count_field
        block, key = field.split(".")
        assert getattr(getattr(resolved.config, block), key) is not None, rel
