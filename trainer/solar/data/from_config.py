"""Data objects from a resolved run config (what the trainer and validation build)."""

from __future__ import annotations

import os
from pathlib import Path

from solar.config.contracts import effective_dims
from solar.config.schema import RunConfig
from solar.data.index import load_table
from solar.data.layout import Layout, layout_for
from solar.data.plan import PlanParams
from solar.data.stream import ClipSource, GuardSettings, RankStream


def index_path(cfg: RunConfig, which: str) -> Path:
    value = getattr(cfg.data, which)
    path = Path(value)
    return path if path.is_absolute() else Path(cfg.data.root) / path


def layout_of(cfg: RunConfig) -> Layout:
    return layout_for(cfg.model.family, height=cfg.data.height, width=cfg.data.width,
                      text_dim=effective_dims(cfg).text_dim)


def plan_params(cfg: RunConfig) -> PlanParams:
    d = cfg.data
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return PlanParams(seed=d.seed, pixel_frames=d.pixel_frames, world_size=cfg.distributed.world_size,
                      sequence_parallel_size=cfg.distributed.sequence_parallel_size,
                      local_world_size=int(local) if local and local.isdigit() else None,
                      num_workers=d.num_workers, mode=d.sampling, shuffle_buffer=d.shuffle_buffer,
                      random_start=d.random_start)


def guard_settings(cfg: RunConfig) -> GuardSettings:
    d = cfg.data
    return GuardSettings(fps=d.fps or 16.0, seconds=d.camera_guard_seconds,
                         max_translation=d.max_relative_translation, max_abs=d.max_camera_abs)


def train_stream(cfg: RunConfig, rank: int, state: dict | None = None) -> RankStream:
    index = index_path(cfg, "train_index")
    source = ClipSource(str(index), load_table(index), cfg.data.root, layout_of(cfg),
                        cfg.data.pixel_frames, guard_settings(cfg))
    return RankStream(source, plan_params(cfg), rank, state)
