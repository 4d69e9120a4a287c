"""Every example config builds its model (on meta) with the route's options and LoRA recipe."""

from __future__ import annotations

import pytest

from solar.config.resolve import resolve_file
from solar.models.lora import LoRALinear, trainable_parameters
from solar.models.registry import count_parameters, model_from_config
from tests.conftest import CONFIGS
from tests.unit.config.test_examples import _pending, _values_for

ALL = sorted(CONFIGS.rglob("*.yaml"))


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_configs_build(path):
    cfg = resolve_file(path, _values_for(_pending(path))).config
    model = model_from_config(cfg)
    anyflow = cfg.train.objective == "anyflow_forward_map"
    delta = getattr(model, "delta_embedding", None) or getattr(getattr(model, "condition_embedder", None),
                                                                "delta_embedding", None)
    assert (delta is not None) == anyflow
    assert model.cfg.camera_transform == cfg.model.camera_translation_transform
    lora = cfg.model.training_mode == "lora"
    assert any(isinstance(m, LoRALinear) for m in model.modules()) == lora
    if lora and cfg.model.profile == "released" and cfg.model.family == "minimax_h3":
        assert trainable_parameters(model) == 2_075_394_048
    if cfg.model.profile == "released":
        assert count_parameters(model) > 4e9
