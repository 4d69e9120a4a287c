"""Every Wan example config builds its model (on meta) with the route's options."""

from __future__ import annotations

import pytest

from solar.config.resolve import resolve_file
from solar.models.registry import count_parameters, model_from_config
from tests.conftest import CONFIGS
from tests.unit.config.test_examples import _pending, _values_for

WAN = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name.startswith("wan22"))


@pytest.mark.parametrize("path", WAN, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_wan_configs_build(path):
    cfg = resolve_file(path, _values_for(_pending(path))).config
    model = model_from_config(cfg)
    anyflow = cfg.train.objective == "anyflow_forward_map"
    assert (model.condition_embedder.delta_embedding is not None) == anyflow
    if anyflow:
        assert model.cfg.anyflow_gate == 0.25
    assert model.cfg.camera_transform == cfg.model.camera_translation_transform
    assert (count_parameters(model) > 4e9) == (cfg.model.profile == "released")
    if cfg.model.causal is not None:
        assert model.cfg.chunk_latents == 3 and model.cfg.max_prior_clean_chunks == 5
