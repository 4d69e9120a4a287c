"""LoRA adapters: rank/alpha/targets from the config, adapter-only state dicts, merging.

``LoRALinear`` is an ``nn.Linear`` (same ``weight``/``bias`` keys, so base checkpoints load
before or after adapters are attached) with two extra factors ``lora_A`` [r, in] (Kaiming
uniform) and ``lora_B`` [out, r] (zeros): y = W x + b + (alpha / r) * B A dropout(x). Attaching
freezes every base parameter; only the factors train. ``merge_lora`` folds the factors into the
weights for inference/export. Targets map config names to each family's linear layers:
q, k, v, o of every attention (self and, where present, prompt cross-attention) and the FFN's
two projections, in every transformer block (H3: also its token-refiner blocks).
"""

from __future__ import annotations

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


class LoRALinear(nn.Linear):
    def attach(self, rank: int, alpha: float, dropout: float) -> None:
        self.rank, self.scaling, self.dropout_p = rank, alpha / rank, dropout
        device, dtype = self.weight.device, self.weight.dtype
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, device=device, dtype=dtype)
        if device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)
        h = F.dropout(x, self.dropout_p, self.training) if self.dropout_p else x
        return base + self.lora_B(self.lora_A(h)) * self.scaling

    def merged(self) -> nn.Linear:
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            delta = (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling
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
               dropout: float = 0.0) -> list[str]:
    """Attach adapters to the family's target linears; freeze everything else. Returns their names."""
    pattern = target_pattern(family, targets)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and pattern.match(n)]
    if not names:
        raise ValueError(f"no LoRA targets {targets} found in the {family} model")
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        linear = model.get_submodule(name)
        linear.__class__ = LoRALinear  # same parameters, LoRA forward
        linear.attach(rank, alpha, dropout)
    return names


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
