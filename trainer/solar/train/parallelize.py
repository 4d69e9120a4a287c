"""Parallelism applied to a plain model from outside, in a fixed order (style.md §3):
SP wrapper (the model's ``set_sequence_parallel``) -> activation checkpointing -> FSDP2 per block,
then the root. Model files contain none of this.

FSDP2 (``fully_shard``) shards over every rank (``full_shard``) or within nodes with replication
across them (``hybrid_shard``); on CUDA parameters compute in bfloat16 and gradients reduce in
float32 while the sharded fp32 parameters are the master weights. FSDP averages gradients over
all ranks; SP peers' partial gradients must add, so the trainer multiplies by the SP degree.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def blocks_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    for name in ("blocks", "transformer_blocks"):
        if hasattr(model, name):
            return getattr(model, name)
    raise ValueError(f"{type(model).__name__} has no block list")


# Attention kernels whose outputs the ``save_attention`` policy keeps (the most expensive part of a
# long-sequence block to recompute; its output is one [B, H, S, D] tensor per block).
_ATTENTION_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu")


def _save_attention_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    ops = {getattr(torch.ops.aten, name).default for name in _ATTENTION_OPS if hasattr(torch.ops.aten, name)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(model: torch.nn.Module, *, policy: str = "full", skip_blocks: int = 0) -> int:
    """Recompute block activations in backward (non-reentrant); parameter names are unchanged.
    ``policy`` ``full`` recomputes the whole block, ``save_attention`` keeps the attention kernels'
    outputs and recomputes the rest; the last ``skip_blocks`` blocks keep every activation (memory
    for speed). Returns the number of checkpointed blocks."""
    import functools

    if policy not in ("full", "save_attention"):
        raise ValueError(f"activation checkpointing policy {policy!r}: use full or save_attention")
    blocks = blocks_of(model)
    wrapped = blocks[: max(len(blocks) - skip_blocks, 0)]
    options = {"use_reentrant": False}
    if policy == "save_attention":
        options["context_fn"] = _save_attention_context
    for block in wrapped:
        inner = block.forward

        def forward(*args, _inner=inner, **kwargs):
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return checkpoint(functools.partial(_inner, **kwargs), *args, **options)

        block.forward = forward
    return len(wrapped)


def apply_compile(model: torch.nn.Module) -> int:
    """``torch.compile`` each block in place (after activation checkpointing, before FSDP2, as
    torchtitan orders them); parameter names and checkpoints are unchanged."""
    blocks = blocks_of(model)
    for block in blocks:
        block.compile()
    return len(blocks)


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether ``apply_compile`` compiled the model's blocks."""
    return any(getattr(block, "_compiled_call_impl", None) is not None for block in blocks_of(model))


def device_mesh(*, world: int, local_world: int, strategy: str, device: torch.device):
    """The sharding mesh: (replicate, shard) with one shard group per node for ``hybrid_shard`` when
    the world spans several nodes, else one shard dimension over every rank."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = "cuda" if device.type == "cuda" else "cpu"
    if strategy == "hybrid_shard" and local_world < world and world % local_world == 0:
        return init_device_mesh(kind, (world // local_world, local_world), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(kind, (world,), mesh_dim_names=("shard",))


def apply_fsdp(model: torch.nn.Module, mesh, *, policy=None, reshard_after_forward: bool = True):
    """``fully_shard`` each block, then the root, over ``mesh`` (``device_mesh``). ``policy``: FSDP2's
    MixedPrecisionPolicy (``solar.launch.precision.fsdp_policy``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    policy = policy or MixedPrecisionPolicy()
    for block in blocks_of(model):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The causal models' other entry points gather the root's weights too (teacher forcing, the KV
    # cache's prefix and chunks), as calling the module does.
    for name in FORWARD_METHODS:
        if hasattr(model, name):
            register_fsdp_forward_method(model, name)


FORWARD_METHODS = ("forward_teacher_forcing", "teacher_context", "new_cache", "forward_chunk", "commit_chunk")
