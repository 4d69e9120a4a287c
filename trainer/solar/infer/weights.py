"""The checkpoint ``solar infer`` generates from: verified and of this route, its default weight role
(``checkpoint.weights`` or the package's release-manifest.json), the checks made before anything
is written, and the live or EMA weights loaded for each pass."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from solar.errors import SolarError
from solar.generation.test_set import check_test_set
from solar.launch.materialize import checkpoint, fill, module_tensors
from solar.launch.weights import require_base
from solar.storage.checkpoints import CheckpointError, require_valid

RELEASE_SCHEMA = "solar.release.v1"


def release_default(path: Path) -> str | None:
    manifest = path / "release-manifest.json"
    if not manifest.is_file():
        return None
    doc = json.loads(manifest.read_text())
    if doc.get("schema") != RELEASE_SCHEMA:
        raise CheckpointError(f"{manifest}: schema {doc.get('schema')!r}, expected {RELEASE_SCHEMA}")
    role = doc.get("load", {}).get("default_weights")
    if role not in ("live", "ema"):
        raise CheckpointError(f"{manifest}: load.default_weights must be live or ema, got {role!r}")
    return role


def check_source(cfg, route) -> tuple[dict, str | None]:
    """The verified checkpoint's manifest and default weight role, or a clear refusal."""
    path = Path(cfg.checkpoint.path)
    manifest = require_valid(path, "checkpoint.path")
    saved = manifest.get("contract", {})
    for key, expected in (("family", route.family), ("stage", route.stage), ("objective", route.objective),
                          ("camera_translation_transform", cfg.model.camera_translation_transform)):
        if saved.get(key) != expected:
            raise CheckpointError(f"checkpoint.path {path}: its {key} is {saved.get(key)!r}; this inference "
                                  f"route ({route.key}) needs {expected!r}")
    require_base(cfg, path, manifest)
    return manifest, cfg.checkpoint.weights or release_default(path)


def preflight(cfg, route, plan_path: Path) -> None:
    """Everything `solar infer` can check before it writes: weights, roles, the video writer, test
    index, frozen plan."""
    from solar.generation.video import check_writer

    _, default = check_source(cfg, route)
    for p in cfg.validation.passes:
        if p.weights == "model" and default is None:
            raise SolarError(f"validation.passes {p.name}: weights model needs checkpoint.weights or the "
                             "package's release-manifest.json")
    check_writer()
    check_test_set(cfg, plan_path)


class InferenceWeights:
    """Loads the checkpoint's live or EMA weights into the model for each pass."""

    def __init__(self, cfg, route, model) -> None:
        self.cfg, self.model, self.path = cfg, model, Path(cfg.checkpoint.path)
        self.manifest, self.default = check_source(cfg, route)
        # a Stage2 checkpoint generates with its student; every other route holds one model
        self.member_role = "student" if "student" in (self.manifest.get("roles") or {}) else "model"

    def role(self, p) -> str:
        if p.weights != "model":
            return p.weights
        if self.default is None:
            raise SolarError(f"validation.passes {p.name}: weights model needs checkpoint.weights or the "
                             f"package's release-manifest.json")
        return self.default

    def __call__(self, p):
        role = self.role(p)
        tensors = checkpoint(self.path, self.member_role, role)
        if self.manifest.get("trainer_state", {}).get("adapter_only"):  # the adapters over the base in the model
            base = {k: v for k, v in module_tensors(self.model).items() if ".lora_" not in k}
            tensors = {**base, **tensors}
        fill(self.model, tensors, where=f"checkpoint.path {self.path}")
        return contextlib.nullcontext(), role
