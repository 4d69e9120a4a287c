"""Which module implements a family, built from a resolved config or a (family, profile) pair."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from solar.config import families
from solar.config.families import Dims
from solar.errors import SolarError

IMPLEMENTED = ("wan22_ti2v_5b", "wan22_i2v_a14b")


def require_implemented(family: str) -> None:
    if family not in IMPLEMENTED:
        raise SolarError(f"--family {family}: this build has no Solar model for {family} yet "
                         f"(available: {', '.join(IMPLEMENTED)})")


def build(family: str, dims: Dims, *, device: str | torch.device = "cpu", **options) -> torch.nn.Module:
    require_implemented(family)
    from solar.models.wan.model import WanConfig, WanDiT

    with torch.device(device):
        return WanDiT(WanConfig(dims=dims, **options))


def model_from_config(cfg, *, device: str | torch.device = "meta") -> torch.nn.Module:
    """The backbone a resolved run config describes (built on ``device``; meta by default)."""
    from solar.config.contracts import effective_dims

    causal = cfg.model.causal
    options = {"camera_transform": cfg.model.camera_translation_transform,
               "attention_backend": cfg.model.attention_backend, "sdpa_kernel": cfg.model.sdpa_kernel,
               "anyflow": cfg.train.objective == "anyflow_forward_map"}
    if cfg.model.anyflow_gate is not None:
        options["anyflow_gate"] = cfg.model.anyflow_gate
    if causal is not None:
        options.update(chunk_latents=causal.chunk_latents, max_prior_clean_chunks=causal.max_prior_clean_chunks)
    return build(cfg.model.family, effective_dims(cfg), device=device, **options)


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def info(family: str, profile: str) -> dict:
    """Dims and parameter counts, counted on the meta device (nothing is allocated)."""
    canonical = families.canonical_family(family)
    if canonical is None:
        raise SolarError(f"--family {family!r} is not a family; use one of {', '.join(families.FAMILIES)}")
    require_implemented(canonical)
    spec = families.spec(canonical)
    dims = spec.dims(profile)
    model = build(canonical, dims, device="meta")
    parts = {"blocks": count_parameters(model.blocks),
             "embeddings": count_parameters(model.patch_embedding) + count_parameters(model.condition_embedder),
             "head": count_parameters(model.proj_out) + model.scale_shift_table.numel()}
    total = count_parameters(model)
    return {"family": canonical, "title": spec.title, "profile": profile,
            "dims": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(dims).items()},
            "parameters": total, "parameters_by_part": parts, "bytes_bfloat16": 2 * total,
            "vae": {"name": spec.vae.name, "channels": spec.vae.channels, "spatial": spec.vae.spatial,
                    "temporal": spec.vae.temporal},
            "allocated": False}


def convert(family: str, kind: str, src: str, out: str, progress=lambda _: None) -> dict:
    from solar.models.wan.convert import plan_conversion
    from solar.models.weights import write_solar

    canonical = families.canonical_family(family)
    if canonical is None:
        raise SolarError(f"--family {family!r} is not a family; use one of {', '.join(families.FAMILIES)}")
    require_implemented(canonical)
    if kind not in ("diffusers", "official"):
        raise SolarError(f"--from {kind!r}: use diffusers or official")
    dims, source, mapping = plan_conversion(canonical, kind, src)
    specs = {target: source.shapes[name] for target, name in mapping.items()}
    manifest = {"family": canonical, "dims": {k: list(v) if isinstance(v, tuple) else v
                                              for k, v in dataclasses.asdict(dims).items()},
                "anyflow": any(k.startswith("condition_embedder.delta_embedding.") for k in specs),
                "source": {"format": kind, "path": str(Path(src).resolve())}}
    return write_solar(out, specs, lambda name: source.get(mapping[name]), manifest, progress)
