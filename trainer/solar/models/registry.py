"""Which module implements a family, built from a resolved config or a (family, profile) pair."""

from __future__ import annotations

import dataclasses

import torch

from solar.config import families
from solar.config.families import Dims
from solar.errors import SolarError

# The LTX-2.5 transformer's variant flags (diffusers' LTX-2 options): gated attention, a static
# per-block prompt modulation (KV-cacheable cross-attention), no FFN bias, no caption projection
# (prompt features arrive at the hidden width), the keyframe embedding, split RoPE.
LTX25 = dict(gated_attn=True, cross_attn_mod=True, ff_bias=False, caption_projection=False,
             keyframes_embedding=True, rope_type="split")
WAN = ("wan22_ti2v_5b", "wan22_i2v_a14b")


def canonical(family: str) -> str:
    name = families.canonical_family(family)
    if name is None:
        raise SolarError(families.not_a_family(family))
    return name


def build(family: str, dims: Dims, *, device: str | torch.device = "cpu", **options) -> torch.nn.Module:
    """The backbone of ``family`` (options: camera_transform, attention_backend, sdpa_kernel,
    anyflow, anyflow_gate, chunk_latents, max_prior_clean_chunks as the family supports them)."""
    with torch.device(device):
        if family in WAN:
            from solar.models.wan.model import WanConfig, WanDiT

            return WanDiT(WanConfig(dims=dims, **options))
        if family == "ltx25_video":
            from solar.models.ltx.model import LTXConfig, LTXVideoDiT

            for key in ("anyflow", "anyflow_gate", "chunk_latents", "max_prior_clean_chunks"):
                if options.pop(key, None) not in (None, False):
                    raise SolarError(f"LTX-2.5 has no {key} (Stage0.5 only)")
            return LTXVideoDiT(LTXConfig(dims=dims, **{**LTX25, **options}))
        if family == "minimax_h3":
            from solar.models.h3.model import H3Config, H3DiT

            return H3DiT(H3Config(dims=dims, **options))
    raise SolarError(f"no Solar model for family {family!r}")


def expected_shapes(family: str, dims: Dims, *, anyflow: bool = False) -> dict[str, tuple[int, ...]]:
    model = build(family, dims, device="meta", **({"anyflow": True} if anyflow else {}))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def model_from_config(cfg, *, device: str | torch.device = "meta",
                      roles: tuple[str, ...] | None = None) -> torch.nn.Module:
    """The backbone a resolved run config describes (built on ``device``; meta by default), with LoRA
    adapters attached for ``training_mode: lora`` (one per role of ``roles`` sharing the base)."""
    from solar.config.contracts import effective_dims

    family = cfg.model.family
    options = {"camera_transform": cfg.model.camera_translation_transform,
               "attention_backend": cfg.model.attention_backend, "sdpa_kernel": cfg.model.sdpa_kernel}
    if cfg.train.objective == "anyflow_forward_map":
        options.update(anyflow=True, anyflow_gate=cfg.model.anyflow_gate)
    causal = cfg.model.causal
    if causal is not None:
        options.update(chunk_latents=causal.chunk_latents, max_prior_clean_chunks=causal.max_prior_clean_chunks)
    model = build(family, effective_dims(cfg), device=device, **options)
    if cfg.model.training_mode == "lora":
        from solar.models.lora import apply_lora

        lora = cfg.model.lora
        apply_lora(model, family, rank=lora.rank, alpha=lora.alpha, targets=list(lora.targets), dropout=lora.dropout,
                   roles=roles)
    return model


def dims_json(dims: Dims) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(dims).items()}


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def info(family: str, profile: str) -> dict:
    """Dims and parameter counts, counted on the meta device (nothing is allocated)."""
    name = canonical(family)
    spec = families.spec(name)
    dims = spec.dims(profile)
    model = build(name, dims, device="meta")
    parts = {child: count_parameters(module) for child, module in model.named_children()}
    parts = {k: v for k, v in parts.items() if v}
    direct = sum(p.numel() for p in model.parameters(recurse=False))
    if direct:
        parts["(own parameters)"] = direct
    total = count_parameters(model)
    result = {"family": name, "title": spec.title, "profile": profile, "dims": dims_json(dims),
              "parameters": total, "parameters_by_part": parts, "bytes_bfloat16": 2 * total,
              "vae": {"name": spec.vae.name, "channels": spec.vae.channels, "spatial": spec.vae.spatial,
                      "temporal": spec.vae.temporal},
              "training_mode": spec.training_mode, "allocated": False}
    if spec.training_mode == "lora":
        from solar.models.lora import apply_lora, trainable_parameters

        apply_lora(model, name, rank=384, alpha=384.0, targets=["q", "k", "v", "o", "ffn"])
        result["lora_r384_trainable_parameters"] = trainable_parameters(model)
    return result
