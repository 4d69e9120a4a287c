"""Activation-checkpointing policies change what backward recomputes, never what it computes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from solar.train.parallelize import apply_activation_checkpointing
from tests.unit.models.wan_helpers import TI2V, dims, ours, randomize


class _CountAttention(TorchDispatchMode):
    """Counts the attention kernels dispatched while active (forward recomputation included)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in func.__name__ and "backward" not in func.__name__:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _grads(model, inputs):
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss = out.square().mean()
    counter = _CountAttention()
    with counter:
        loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, counter.calls


@pytest.mark.parametrize("policy, skip, checkpointed, recomputed_attention", [
    ("full", 0, 3, 6),            # every block's two attentions (self + cross) run again in backward
    ("save_attention", 0, 3, 0),  # the kernels' outputs are kept: no attention runs again
    ("full", 2, 1, 2),            # only the first block is recomputed
    ("full", 5, 0, 0),            # more blocks skipped than exist: nothing is recomputed
])
def test_policies_match_the_plain_model(policy, skip, checkpointed, recomputed_attention):
    base = randomize(ours(dims(TI2V, layers=3), attention_backend="sdpa", camera_transform=None)).train()
    gen = torch.Generator().manual_seed(1)
    inputs = (torch.randn(1, 48, 3, 4, 6, generator=gen), torch.tensor([300.0]),
              torch.randn(1, 5, base.cfg.dims.text_dim, generator=gen))
    out, grads, plain_calls = _grads(base, inputs)
    assert plain_calls == 0
    wrapped = copy.deepcopy(base)
    assert apply_activation_checkpointing(wrapped, policy=policy, skip_blocks=skip) == checkpointed
    out_w, grads_w, calls = _grads(wrapped, inputs)
    assert calls == recomputed_attention
    assert torch.equal(out, out_w)
    assert grads.keys() == grads_w.keys()
    for name in grads:
        torch.testing.assert_close(grads_w[name], grads[name], rtol=0, atol=1e-6, msg=name)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="use full or save_attention"):
        apply_activation_checkpointing(ours(dims(TI2V)), policy="selective")
