"""The precision policy of every GPU path, in one place.

Master weights, gradients, AdamW moments, the EMA and solver state stay float32. On CUDA, unless
``model.dtype`` is float32, the model computes in bfloat16 by one of two mechanisms, never both:
FSDP2's ``MixedPrecisionPolicy`` (parameters all-gathered in bf16, gradients reduced in fp32) when
the model is sharded, ``torch.autocast`` around each forward and its loss when it is not. On the
CPU everything is float32.
"""

from __future__ import annotations

import contextlib

import torch


def computes_in_bf16(cfg, device: torch.device) -> bool:
    """Whether this run's model computes in bfloat16 (CUDA and ``model.dtype`` auto or bfloat16)."""
    return device.type == "cuda" and cfg.model.dtype != "float32"


def autocast(cfg, device: torch.device, *, sharded: bool):
    """The forward's context: bf16 autocast for an unsharded model on CUDA, nothing otherwise
    (a sharded model already computes in bf16 through its FSDP2 policy)."""
    if computes_in_bf16(cfg, device) and not sharded:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def fsdp_policy(cfg, device: torch.device):
    """FSDP2's mixed-precision policy for a sharded model of this run."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if computes_in_bf16(cfg, device):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()
