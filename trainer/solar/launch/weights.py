"""The refusal of an adapter-only checkpoint without its base (the weights themselves are read by
``solar.launch.materialize``)."""

from __future__ import annotations

from solar.storage.checkpoints import CheckpointError


def require_base(cfg, path, manifest: dict, where: str = "checkpoint.path") -> None:
    """An adapter-only (LoRA) checkpoint is only half a model: refuse it without the base it was
    trained on, instead of silently putting the adapters on a random initialisation."""
    state = manifest.get("trainer_state", {})
    if state.get("adapter_only") and not cfg.model.pretrained_path:
        raise CheckpointError(f"{where} {path} holds LoRA adapters only (trained on the base "
                              f"{state.get('base')}); set model.pretrained_path to that base")
