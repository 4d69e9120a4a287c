"""The torch-free parameter counts of ``solar.config.parameters`` equal the real modules', built on
the meta device: every family at its released and tiny dims and at odd dims, with AnyFlow's
delta embedding and with LoRA adapters."""

from __future__ import annotations

import dataclasses

import pytest

from solar.config import families, parameters
from solar.models.lora import apply_lora, trainable_parameters
from solar.models.registry import build, count_parameters

FAMILIES = list(families.FAMILIES)


def _odd(family: str) -> families.Dims:
    d = families.spec(family).dims("tiny")
    heads, head_dim = 6, 24
    hidden = 100 if family == "minimax_h3" else heads * head_dim  # H3's hidden size is not heads x head dim
    return dataclasses.replace(d, num_layers=3, num_heads=heads, head_dim=head_dim, hidden_size=hidden,
                               ffn_dim=200, text_dim=heads * head_dim if family == "ltx25_video" else 52,
                               freq_dim=40, prope_start=12 if family == "minimax_h3" else 0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("which", ["released", "tiny", "odd"])
def test_counts_equal_the_modules(family, which):
    dims = _odd(family) if which == "odd" else families.spec(family).dims(which)
    anyflow_options = [False] + ([True] if family in ("wan22_ti2v_5b", "minimax_h3") else [])
    for anyflow in anyflow_options:
        model = build(family, dims, device="meta", **({"anyflow": True} if anyflow else {}))
        lay = parameters.layout(family, dims, anyflow=anyflow)
        assert lay.total == count_parameters(model), (family, which, anyflow)
    blocks = model.blocks if hasattr(model, "blocks") else model.transformer_blocks
    assert lay.per_block == count_parameters(blocks[0])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("targets", [["q", "k", "v", "o", "ffn"], ["q", "v"], ["ffn"]])
def test_lora_counts_equal_the_adapters(family, targets):
    dims = _odd(family)
    model = build(family, dims, device="meta")
    apply_lora(model, family, rank=8, alpha=8.0, targets=targets)
    lay = parameters.layout(family, dims)
    assert lay.lora(parameters.lora_pattern(targets), 8) == trainable_parameters(model)
