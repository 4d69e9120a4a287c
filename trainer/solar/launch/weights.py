"""The weights a launch starts from: a released base (a Solar directory from ``solar model
convert`` or a diffusers folder), a verified checkpoint's live or EMA member, and the refusal of an
adapter-only checkpoint without its base."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from solar.models.weights import iter_solar_tensors, load_into, read_solar_manifest
from solar.storage.checkpoints import CheckpointError


def load_base(model: torch.nn.Module, family: str, path: str) -> None:
    """Released base weights into a (possibly LoRA-wrapped) model: adapter factors stay as built."""
    root = Path(path)
    if (root / "solar-model.json").is_file():
        read_solar_manifest(root)
        tensors = dict(iter_solar_tensors(root))
    else:
        from solar.models.convert import plan

        _, source, mapping, _ = plan(family, "diffusers", root)
        tensors = {target: source.get(origin) for target, origin in mapping.items()}
    lora = {k: v for k, v in model.state_dict().items() if ".lora_" in k}
    load_into(model, {**tensors, **lora}, init_delta_from_time=True, where=f"model.pretrained_path {path}")


def require_base(cfg, path, manifest: dict, where: str = "checkpoint.path") -> None:
    """An adapter-only (LoRA) checkpoint is only half a model: refuse it without the base it was
    trained on, instead of silently putting the adapters on a random initialisation."""
    state = manifest.get("trainer_state", {})
    if state.get("adapter_only") and not cfg.model.pretrained_path:
        raise CheckpointError(f"{where} {path} holds LoRA adapters only (trained on the base "
                              f"{state.get('base')}); set model.pretrained_path to that base")


def load_weights(path: Path, role: str, which: str) -> dict[str, torch.Tensor]:
    """A checkpoint's ``role`` member, ``which`` live or ema: live weights, with the EMA shadow laid
    over them for ema."""
    live_path = path / role / "live.safetensors"
    if not live_path.is_file():
        raise CheckpointError(f"{path} has no {role} weights ({role}/live.safetensors)")
    tensors = load_file(live_path)
    if which == "ema":
        ema_path = path / role / "ema.safetensors"
        if not ema_path.is_file():
            raise CheckpointError(f"{path} has no {role} EMA weights; use weights: live")
        for name, value in load_file(ema_path).items():
            tensors[name] = value.to(tensors[name].dtype) if name in tensors else value
    return tensors


def with_base(model: torch.nn.Module, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An adapter-only member completed with the model's own (base) weights, for a strict load."""
    return {**{k: v for k, v in model.state_dict().items() if ".lora_" not in k}, **adapters}
