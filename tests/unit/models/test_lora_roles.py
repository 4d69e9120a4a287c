"""Several LoRA roles on one base (Stage2's shared base): each role computes exactly what a
single-role model with that role's adapter computes, its gradients reach only its own adapter, the
names map both ways, and a fresh adapter starts as a single-role model's would. On CPU in fp32; on a
CUDA device also with the frozen weights stored in bf16 under autocast (tests/gpu runs this file's
``device`` variant)."""

from __future__ import annotations

import pytest
import torch

from solar.config import families
from solar.launch.materialize import _lora_value
from solar.models.lora import active, adapters_of, apply_lora, role_name, shared_name, single_name
from solar.models.registry import build

FAMILY = "minimax_h3"
LORA = dict(rank=4, alpha=4.0, targets=["q", "k", "v", "o", "ffn"])
ROLES = ("student", "teacher", "critic")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _model(roles=None, seed=0):
    torch.manual_seed(seed)
    model = build(FAMILY, families.spec(FAMILY).dims("tiny"), device="cpu", attention_backend="reference")
    apply_lora(model, FAMILY, **LORA, roles=roles)
    return model


def _inputs(device, seed=3):
    """An H3 forward's arguments: 7 latents of 4x6, the anchor, 3 audio latents, 5 prompt tokens."""
    gen = torch.Generator().manual_seed(seed)
    x, anchor = torch.randn(1, 24, 7, 4, 6, generator=gen), torch.randn(1, 24, 1, 4, 6, generator=gen)
    audio, prompt = torch.randn(1, 2, 3, 32, generator=gen), torch.randn(1, 5, 40, generator=gen)
    return ((x.to(device), torch.tensor([0.3], device=device), prompt.to(device)),
            {"anchor": anchor.to(device), "audio": audio.to(device), "audio_timestep": 0.7})


def test_names_map_between_a_shared_model_and_each_roles_own():
    shared, single = _model(ROLES), _model()
    own = set(single.state_dict())
    for role in ROLES:
        mapped = {role_name(k, role) for k in shared.state_dict()} - {None}
        assert mapped == own
        assert {shared_name(k, role) for k in own} <= set(shared.state_dict())
    name = "transformer_blocks.0.attn1.to_q.lora_A.critic.weight"
    assert single_name(name) == "transformer_blocks.0.attn1.to_q.lora_A.weight"
    assert role_name(name, "student") is None
    # a fresh adapter is seeded by the single-role name: every role starts as its own model would
    assert torch.equal(_lora_value(name, (4, 8), seed=5),
                       _lora_value("transformer_blocks.0.attn1.to_q.lora_A.weight", (4, 8), seed=5))


@pytest.mark.parametrize("device", DEVICES)
def test_each_role_computes_as_its_own_model_and_trains_only_its_adapter(device):
    shared = _model(ROLES)
    with torch.no_grad():  # distinct adapters: B is zero at attach time
        for name, p in shared.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(hash(name) % 2**31)) * 0.1)
    singles = {}
    for role in ROLES:
        single = _model()
        state = {role_name(k, role): v for k, v in shared.state_dict().items() if role_name(k, role) is not None}
        single.load_state_dict(state)
        singles[role] = single.to(device)
    shared.to(device)
    bf16 = device == "cuda"
    if bf16:  # what Stage2 does on a GPU: frozen weights (base, teacher adapter) stored in bf16
        for role_model in [shared, *singles.values()]:
            for module in role_model.modules():
                for name, param in module.named_parameters(recurse=False):
                    if ".lora_" not in name and not param.requires_grad:
                        module.register_parameter(name, torch.nn.Parameter(param.to(torch.bfloat16),
                                                                           requires_grad=False))
    assert adapters_of(shared).active == "student"  # what validation and saves see by default
    args, kwargs = _inputs(device)
    outs = []
    for role in ROLES:
        shared.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16), active(shared, role):
            out = shared(*args, **kwargs)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            ref = singles[role](*args, **kwargs)
        assert torch.equal(out, ref), role
        outs.append(out.detach())
        out.float().square().mean().backward()
        grads = {n for n, p in shared.named_parameters() if p.grad is not None}
        assert grads and all(role_name(n, role) is not None and ".lora_" in n for n in grads), role
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])  # the adapters matter
    assert adapters_of(shared).active == "student"
