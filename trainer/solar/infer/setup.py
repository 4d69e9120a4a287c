"""What generation needs from a resolved config: the test plan (frozen), the test-set reader,
the codec, the negative prompt, H3's encoded silence, and (for ``solar infer``) the weights."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from solar.config import families
from solar.data.from_config import guard_settings, index_path, layout_of
from solar.data.index import load_table
from solar.data.layout import AUDIO_SILENCE
from solar.data.selection import Slot, freeze, load_frozen, plan_document, select
from solar.data.stream import ClipSource, Occurrence
from solar.errors import DataError, SolarError
from solar.storage.checkpoints import CheckpointError, require_valid

RELEASE_SCHEMA = "solar.release.v1"
CODEC_SEED = 0  # random tiny codecs must be the same in training validation and in inference


def test_source(cfg) -> ClipSource:
    index = index_path(cfg, "test_index")
    return ClipSource(str(index), load_table(index), cfg.data.root, layout_of(cfg), cfg.data.pixel_frames,
                      guard_settings(cfg))


def sample_count(cfg) -> int:
    field = families.spec(cfg.model.family).infer_sample_count_field if cfg.action == "infer" \
        else "validation.sample_count"
    block, key = field.split(".")
    return getattr(getattr(cfg, block), key)


def _settings(cfg) -> dict:
    v = cfg.validation
    return dict(test_index=cfg.data.test_index, sample_count=sample_count(cfg), selection_seed=v.selection_seed,
                noise_seed=v.noise_seed, pixel_frames=cfg.data.pixel_frames)


def _header(table, settings: dict) -> dict:
    return {k: x for k, x in plan_document(table, [], **settings).items() if k != "slots"}


def check_frozen_plan(cfg, plan_path: Path) -> None:
    """Before anything is written: an existing frozen plan must still match the config and index."""
    if plan_path.is_file() and cfg.validation.passes:
        index = index_path(cfg, "test_index")
        load_frozen(plan_path, _header(load_table(index), _settings(cfg)))


def frozen_slots(cfg, source: ClipSource, plan_path: Path, *, writer: bool) -> list[Slot]:
    """The frozen plan's slots when it exists (its settings must still match the config); otherwise
    select (replacing camera-guard failures from the reserve) and, on the writer, freeze."""
    v = cfg.validation
    count = sample_count(cfg)
    settings = _settings(cfg)
    frozen = load_frozen(plan_path, _header(source.table, settings))
    if frozen is not None:
        if len(frozen) != count:
            raise SolarError(f"{plan_path}: {len(frozen)} frozen slots, the config asks for {count}")
        return frozen

    def camera_ok(row: int, start: int) -> str | None:
        try:
            result = source.read(Occurrence(-1, 0, 0, row, 0, start))
        except (DataError, OSError):
            return None  # unreadable input is not a camera rejection: its slot reports the error
        return result if isinstance(result, str) else None

    slots = select(source.table, sample_count=count, selection_seed=v.selection_seed, noise_seed=v.noise_seed,
                   pixel_frames=cfg.data.pixel_frames, camera_ok=camera_ok)
    if writer:
        plan_path.parent.mkdir(parents=True, exist_ok=True)
        freeze(plan_path, plan_document(source.table, slots, **settings))
    return slots


def negative_prompt(cfg) -> torch.Tensor | None:
    if not (cfg.validation.guidance_scale or 1.0) > 1.0:
        return None
    if not cfg.data.negative_prompt:
        raise SolarError("validation.guidance_scale > 1 needs data.negative_prompt (the unconditional prompt)")
    from safetensors.torch import load_file

    path = Path(cfg.data.root) / cfg.data.negative_prompt
    if not path.is_file():
        raise SolarError(f"data.negative_prompt {path} does not exist")
    return load_file(path)["prompt_embeds"].float()


def audio_silence(cfg) -> torch.Tensor | None:
    if cfg.model.family != "minimax_h3":
        return None
    from safetensors.torch import load_file

    path = Path(cfg.data.root) / AUDIO_SILENCE
    if not path.is_file():
        raise SolarError(f"MiniMax-H3 needs the encoded silence {path} (data.root/{AUDIO_SILENCE})")
    return load_file(path)["audio_latents"].float()


def codec_for(cfg):
    from solar.models.codecs import build_codec

    return build_codec(cfg.model.family, path=cfg.model.vae_path, profile=cfg.model.profile, seed=CODEC_SEED)


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
    from solar.train.setup import require_base

    require_base(cfg, path, manifest)
    return manifest, cfg.checkpoint.weights or release_default(path)


def preflight(cfg, route, plan_path: Path) -> None:
    """Everything `solar infer` can check before it writes: weights, roles, test index, frozen plan."""
    _, default = check_source(cfg, route)
    for p in cfg.validation.passes:
        if p.weights == "model" and default is None:
            raise SolarError(f"validation.passes {p.name}: weights model needs checkpoint.weights or the "
                             "package's release-manifest.json")
    check_test_set(cfg, plan_path)


def check_test_set(cfg, plan_path: Path) -> None:
    """The test index exists and any frozen plan still matches it and the config."""
    if not cfg.data.test_index:
        raise SolarError("validation needs data.test_index (the test set the plan selects from)")
    index = index_path(cfg, "test_index")
    if not index.is_file():
        raise DataError(f"data.test_index {index} does not exist; point data.root/data.test_index at the test set")
    check_frozen_plan(cfg, plan_path)


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
        from solar.models.weights import load_into
        from solar.train import checkpoint_io as io

        role = self.role(p)
        tensors = io.load_weights(self.path, self.member_role, role)
        if self.manifest.get("trainer_state", {}).get("adapter_only"):
            tensors = {**{k: v for k, v in self.model.state_dict().items() if ".lora_" not in k}, **tensors}
        load_into(self.model, tensors, where=f"checkpoint.path {self.path}")
        return contextlib.nullcontext(), role
