"""LoRA adapters: rank/alpha/targets from the config, adapter-only state dicts, merging.

``LoRALinear`` is an ``nn.Linear`` (same ``weight``/``bias`` keys, so base checkpoints load
before or after adapters are attached) with two extra factors ``lora_A`` [r, in] (Kaiming
uniform) and ``lora_B`` [out, r] (zeros): y = W x + b + (alpha / r) * B A dropout(x). Attaching
freezes every base parameter; only the factors train. ``merge_lora`` folds the factors into the
weights for inference/export. Targets map config names to each family's linear layers:
q, k, v, o of every attention (self and, where present, prompt cross-attention) and the FFN's
two projections, in every transformer block (H3: also its token-refiner blocks).

Several roles may share one base (Stage2's LoRA roles): attached with ``Adapters``, each layer holds
one pair of factors per role (``lora_A.<role>.weight``) and applies the pair the shared ``Adapters``
object names as active (``active(model, role)``). ``role_name`` maps such a model's names to the
names a single-adapter model has, so each role still saves and loads as one model.
"""

from __future__ import annotations

import contextlib
import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

# Per family: the block containers and, per target, the linear names inside a block.
_BLOCKS = {
    "wan22_ti2v_5b": r"blocks\.\d+",
    "wan22_i2v_a14b": r"blocks\.\d+",
    "ltx25_video": r"transformer_blocks\.\d+",
    "minimax_h3": r"(transformer_blocks|token_refiner\.refiner_blocks)\.\d+",
}
_TARGETS = {
    "q": r"attn\d?\.to_q", "k": r"attn\d?\.to_k", "v": r"attn\d?\.to_v", "o": r"attn\d?\.to_out\.0",
    "ffn": r"(ffn|ff)\.net\.(0\.proj|2)",
}


class Adapters:
    """The roles of a model whose LoRA layers hold one adapter per role, and the one they apply now;
    one object shared by every layer of the model."""

    def __init__(self, roles: tuple[str, ...]) -> None:
        self.roles, self.active = tuple(roles), roles[0]


class LoRALinear(nn.Linear):
    adapters: Adapters | None = None

    def attach(self, rank: int, alpha: float, dropout: float, adapters: Adapters | None = None) -> None:
        self.rank, self.scaling, self.dropout_p = rank, alpha / rank, dropout
        device, dtype = self.weight.device, self.weight.dtype

        def pair() -> tuple[nn.Linear, nn.Linear]:
            a = nn.Linear(self.in_features, rank, bias=False, device=device, dtype=dtype)
            b = nn.Linear(rank, self.out_features, bias=False, device=device, dtype=dtype)
            if device.type != "meta":
                nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))
                nn.init.zeros_(b.weight)
            return a, b

        if adapters is None:
            self.lora_A, self.lora_B = pair()
        else:
            pairs = {role: pair() for role in adapters.roles}
            self.lora_A = nn.ModuleDict({role: a for role, (a, _) in pairs.items()})
            self.lora_B = nn.ModuleDict({role: b for role, (_, b) in pairs.items()})
            self.adapters = adapters
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def _factors(self) -> tuple[nn.Module, nn.Module]:
        if self.adapters is None:
            return self.lora_A, self.lora_B
        return self.lora_A[self.adapters.active], self.lora_B[self.adapters.active]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)
        h = F.dropout(x, self.dropout_p, self.training) if self.dropout_p else x
        lora_A, lora_B = self._factors()
        return base + lora_B(lora_A(h)) * self.scaling

    def merged(self) -> nn.Linear:
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            lora_A, lora_B = self._factors()
            delta = (lora_B.weight.float() @ lora_A.weight.float()) * self.scaling
            out.weight.copy_((self.weight.float() + delta).to(self.weight.dtype))
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out


def target_pattern(family: str, targets: list[str]) -> re.Pattern:
    names = "|".join(_TARGETS[t] for t in targets)
    return re.compile(rf"^{_BLOCKS[family]}\.({names})$")


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def apply_lora(model: nn.Module, family: str, *, rank: int, alpha: float, targets: list[str],
               dropout: float = 0.0, roles: tuple[str, ...] | None = None) -> list[str]:
    """Attach adapters to the family's target linears (one per role of ``roles`` on a shared base);
    freeze everything else. Returns their names."""
    pattern = target_pattern(family, targets)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and pattern.match(n)]
    if not names:
        raise ValueError(f"no LoRA targets {targets} found in the {family} model")
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = Adapters(roles) if roles else None
    for name in names:
        linear = model.get_submodule(name)
        linear.__class__ = LoRALinear  # same parameters, LoRA forward
        linear.attach(rank, alpha, dropout, adapters)
    if adapters is not None:
        model.lora_adapters = adapters
    return names


def adapters_of(model: nn.Module) -> Adapters | None:
    """The shared ``Adapters`` of a multi-role model, None for any other model."""
    return getattr(model, "lora_adapters", None)


@contextlib.contextmanager
def active(model: nn.Module, role: str):
    """Calls of ``model`` inside apply ``role``'s adapters (nothing changes for a single-role model)."""
    adapters = adapters_of(model)
    if adapters is None:
        yield
        return
    saved, adapters.active = adapters.active, role
    try:
        yield
    finally:
        adapters.active = saved


_ROLE_FACTOR = re.compile(r"\.(lora_[AB])\.([A-Za-z_]+)\.")


def role_name(name: str, role: str) -> str | None:
    """A multi-role model's parameter name as the single-role model of ``role`` names it; None for
    another role's adapter. Base names are the same in both."""
    match = _ROLE_FACTOR.search(name)
    if match is None:
        return name
    return single_name(name) if match.group(2) == role else None


def single_name(name: str) -> str:
    """Any role's adapter factor named as in a single-role model (other names unchanged)."""
    return _ROLE_FACTOR.sub(r".\1.", name, count=1)


def shared_name(name: str, role: str) -> str:
    """The inverse of ``role_name``: ``role``'s adapter factor in a multi-role model."""
    return re.sub(r"\.(lora_[AB])\.", rf".\1.{role}.", name, count=1)


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if ".lora_A." in k or ".lora_B." in k}


def load_adapter(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = set(adapter_state_dict(model))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"adapter does not fit: {len(missing)} missing (e.g. {missing[:2]}), "
                         f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})")
    model.load_state_dict(state, strict=False)


def merge_lora(model: nn.Module) -> nn.Module:
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            _set(model, name, module.merged())
    return model


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
