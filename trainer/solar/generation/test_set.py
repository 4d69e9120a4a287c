"""What generation needs from a resolved config besides weights: the test-set reader, the frozen
plan (reused, or selected and frozen), the codec and the negative prompt of guided passes."""

from __future__ import annotations

from pathlib import Path

import torch

from solar.config import families
from solar.data.from_config import guard_settings, index_path, layout_of
from solar.data.index import load_table
from solar.data.selection import Slot, freeze, load_frozen, plan_document, select
from solar.data.stream import ClipSource, Occurrence
from solar.errors import DataError, SolarError
from solar.launch.conditions import negative_prompt as read_negative_prompt

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
    """The unconditional prompt embedding of guided passes (None without guidance)."""
    if not (cfg.validation.guidance_scale or 1.0) > 1.0:
        return None
    return read_negative_prompt(cfg, "validation.guidance_scale > 1")


def decode_dtype(cfg, device: torch.device | None) -> torch.dtype:
    """``validation.decode_precision``: auto is bf16 on a GPU and fp32 elsewhere (the CPU's bf16
    convolutions are slower than its fp32 ones)."""
    chosen = cfg.validation.decode_precision
    if chosen == "auto":
        chosen = "bf16" if device is not None and torch.device(device).type == "cuda" else "fp32"
    return torch.bfloat16 if chosen == "bf16" else torch.float32


def codec_for(cfg, device: torch.device | None = None):
    """The family's codec on ``device`` (the generating model's, so latents decode where they are),
    in ``decode_dtype``'s precision."""
    from solar.models.codecs import build_codec

    codec = build_codec(cfg.model.family, path=cfg.model.vae_path, profile=cfg.model.profile, seed=CODEC_SEED)
    # torch's own `to`, not diffusers' (which warns on any cast of dtype); on a GPU the 3D convolutions'
    # weights channels-last too (with wan_vae.decode_stream's channels-last input and cuDNN's autotuner,
    # the released Wan 2.2 decode of 60 latents at 480x864: 5.74 -> 5.27 s in bf16 on an H100)
    torch.nn.Module.to(codec.vae, device=device, dtype=decode_dtype(cfg, device))
    if device is not None and torch.device(device).type == "cuda":
        for m in codec.vae.modules():
            if isinstance(m, torch.nn.Conv3d):
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
    return codec


def check_test_set(cfg, plan_path: Path | None) -> None:
    """The test index exists and any frozen plan still matches it and the config (``plan_path`` None:
    no plan to keep, as when a restart moves the earlier launches' aside)."""
    if not cfg.data.test_index:
        raise SolarError("validation needs data.test_index (the test set the plan selects from)")
    index = index_path(cfg, "test_index")
    if not index.is_file():
        raise DataError(f"data.test_index {index} does not exist; point data.root/data.test_index at the test set")
    if plan_path is not None:
        check_frozen_plan(cfg, plan_path)
