"""FP8 linear layers (``model.fp8_linear``), in one place: torchao's float8 training recipes on the
transformer blocks' ``nn.Linear`` layers of every DiT a training run builds.

``convert`` swaps each plain ``nn.Linear`` inside the model's block list that projects tokens
(attention q, k, v and output, the FFN's two; not a modulation projection) and whose in and out
features are multiples of 16 (what the FP8 matmul needs) for torchao's ``Float8Linear`` (the same
``weight`` and ``bias`` parameters, so names, checkpoints and the fp32 master weights are
unchanged); the patch embedding, the condition embedders and the output projection sit outside the
blocks and keep bf16. It runs on the meta-device model before activation checkpointing, compile and FSDP2, the
order torchao documents. FSDP2 gathers the bf16 parameters and each layer casts its weight after the
gather (torchao's FP8 all-gather is left off: it would put a tensor subclass in the parameters our
materialisation fills, and it would keep validation generation from computing in bf16).

``high_precision`` makes converted layers compute in their input's precision for its duration
(every cast disabled, the plain matmul): validation generation during training keeps bf16, as
``solar infer`` does (it builds its own model, never converted).

Stated bound, held by tests/unit/train/test_fp8.py (CPU, against fp32, tiny Wan: Stage0.5 FM and
Stage1 TF-AnyFlow) and tests/gpu/test_fp8_linear.py (against bf16, Wan TI2V-5B blocks at the
released dims, eager and compiled): the model's output and its gradients within 5% relative (L2)
of the unconverted model's, the loss within 1% relative. Measured on the CPU: about 0.7% (output),
1.2% (gradients), 0.02% (loss). ``pad_inner_dim`` is on: the weight-gradient matmul's inner
dimension is a token count, which FP8 matmuls need in multiples of 16.

``launch_problem`` is the launch's check: torchao importable, CUDA with compute capability >= 8.9.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import re

import torch

MIN_CAPABILITY = (8, 9)


def launch_problem(recipe: str, device: torch.device) -> str | None:
    """Why ``model.fp8_linear=<recipe>`` cannot run on ``device`` (one line naming the fix), or None."""
    if recipe == "off":
        return None
    key = f"model.fp8_linear={recipe}"
    if importlib.util.find_spec("torchao") is None:
        return f"{key} needs torchao (pip install 'solar[fp8]', torchao>=0.18); install it or set model.fp8_linear=off"
    if device.type != "cuda":
        return (f"{key} needs a CUDA device (this run is on {device.type}); run on a GPU with compute capability "
                ">= 8.9 (Ada, Hopper or newer) or set model.fp8_linear=off")
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        return (f"{key} needs compute capability >= 8.9 for FP8 matmuls, {torch.cuda.get_device_name(device)} has "
                f"{capability[0]}.{capability[1]}; use an Ada/Hopper or newer GPU or set model.fp8_linear=off")
    return None


def _float8():
    """torchao's float8 package, imported without its load-time chatter on stderr (its optional
    compiled kernels that do not load here, torch's note on its enum registration)."""
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8
        import torchao.float8.config
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    return torchao.float8


def _block_prefix(model: torch.nn.Module) -> str:
    from solar.train.parallelize import blocks_of

    blocks = blocks_of(model)
    return next(name for name, module in model.named_modules() if module is blocks) + "."


def eligible(model: torch.nn.Module) -> list[str]:
    """The names of the linear layers ``convert`` swaps: plain ``nn.Linear`` (not LoRA layers or their
    factors) inside the block list that project tokens (attention q/k/v/out, the FFN), both
    dimensions multiples of 16."""
    prefix = _block_prefix(model)
    return [name for name, module in model.named_modules() if _wanted(module, name, prefix)]


# The token-wise projections of a block: attention q, k, v and output (self and cross), the FFN's two.
# Not a block's modulation projection (MiniMax-H3's adaln_proj: one row per sample, nothing to gain and
# the gates and shifts of every token to lose precision in).
_TOKEN_WISE = re.compile(r"\.(attn\d?\.(to_q|to_k|to_v|to_out\.0)|(ffn|ff)\.net\.(0\.proj|2))$")


def _wanted(module: torch.nn.Module, fqn: str, prefix: str) -> bool:
    return (type(module) is torch.nn.Linear and fqn.startswith(prefix) and ".lora_" not in fqn
            and _TOKEN_WISE.search(fqn) is not None
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert(model: torch.nn.Module, recipe: str) -> int:
    """Swap the eligible linears for torchao's ``Float8Linear`` of ``recipe`` (tensorwise or rowwise);
    returns how many were converted (0 for ``off``)."""
    if recipe == "off":
        return 0
    f8 = _float8()
    prefix = _block_prefix(model)
    names = set(eligible(model))
    # pad_inner_dim: the weight-gradient matmul's inner dimension is the token count (batch x sequence,
    # or x prompt length for cross-attention's keys and values), which FP8 matmuls need in multiples of 16.
    config = dataclasses.replace(f8.Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True)
    f8.convert_to_float8_training(model, config=config,
                                  module_filter_fn=lambda module, fqn: fqn in names and _wanted(module, fqn, prefix))
    return len(converted(model))


def converted(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [module for module in model.modules() if type(module).__name__ == "Float8Linear"]


@contextlib.contextmanager
def high_precision(model: torch.nn.Module):
    """Converted layers compute without FP8 casts (plain matmuls in the input's precision) inside."""
    layers = converted(model)
    if not layers:
        yield
        return
    c = _float8().config
    off = c.CastConfig(scaling_type=c.ScalingType.DISABLED)
    plain = c.Float8LinearConfig(cast_config_input=off, cast_config_weight=off, cast_config_grad_output=off)
    saved = [layer.config for layer in layers]
    for layer in layers:
        layer.config = plain
    try:
        yield
    finally:
        for layer, config in zip(layers, saved):
            layer.config = config
