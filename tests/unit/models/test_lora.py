"""LoRA: only adapters train, merged weights equal the adapter forward, adapter-only state dicts."""

from __future__ import annotations

import pytest
import torch

from solar.models.lora import (
    LoRALinear, adapter_state_dict, apply_lora, load_adapter, merge_lora, trainable_parameters,
)
from tests.unit.models.family_helpers import H3_DIMS, h3_ours, ltx_dims, ltx_ours, randomize


def _h3():
    return randomize(h3_ours(camera_transform="logd4"))


def _randomize_adapters(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def test_only_adapters_require_grad_and_targets_are_the_recipe():
    model = _h3()
    names = apply_lora(model, "minimax_h3", rank=4, alpha=8.0, targets=["q", "k", "v", "o", "ffn"])
    assert len(names) == 6 * (H3_DIMS.num_layers + 2)  # blocks and token-refiner blocks
    grads = {n for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(".lora_A." in n or ".lora_B." in n for n in grads)
    assert trainable_parameters(model) == sum(p.numel() for n, p in model.named_parameters() if n in grads)
    # Fresh adapters change nothing (B = 0).
    x, ctx = torch.randn(1, 24, 2, 4, 6), torch.randn(1, 3, H3_DIMS.text_dim)
    plain = _h3()
    with torch.no_grad():
        assert torch.equal(model(x, 0.5, ctx), plain(x, 0.5, ctx))


@pytest.mark.parametrize("family", ["minimax_h3", "ltx25_video"])
def test_merged_forward_equals_adapter_forward_and_gradients_reach_only_adapters(family):
    if family == "minimax_h3":
        model = _h3()
        x, ctx = torch.randn(1, 24, 3, 4, 6), torch.randn(1, 3, H3_DIMS.text_dim)
        t = torch.tensor([0.4])
    else:
        d = ltx_dims()
        model = randomize(ltx_ours(d, camera_transform="linear"))
        x, ctx = torch.randn(1, 128, 3, 2, 3), torch.randn(1, 4, d.text_dim)
        t = torch.tensor([300.0])
    apply_lora(model, family, rank=4, alpha=4.0, targets=["q", "k", "v", "o", "ffn"])
    _randomize_adapters(model)
    out = model(x, t, ctx)
    out.square().mean().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == ("lora_" in name), name
    with torch.no_grad():
        adapted = model(x, t, ctx)
        merged = merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in merged.modules())
        assert (merged(x, t, ctx) - adapted).abs().max().item() <= 1e-5


def test_adapter_only_state_dict_round_trip():
    a = _h3()
    apply_lora(a, "minimax_h3", rank=2, alpha=2.0, targets=["q", "v"])
    _randomize_adapters(a, seed=3)
    state = adapter_state_dict(a)
    assert state and all("lora_" in k for k in state)
    b = _h3()
    apply_lora(b, "minimax_h3", rank=2, alpha=2.0, targets=["q", "v"])
    load_adapter(b, state)
    x, ctx = torch.randn(1, 24, 2, 4, 6), torch.randn(1, 3, H3_DIMS.text_dim)
    with torch.no_grad():
        assert torch.equal(a(x, 0.5, ctx), b(x, 0.5, ctx))
    c = _h3()
    apply_lora(c, "minimax_h3", rank=2, alpha=2.0, targets=["q"])
    with pytest.raises(ValueError, match="unexpected"):
        load_adapter(c, state)
