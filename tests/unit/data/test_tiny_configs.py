"""Every tiny training config reads clips from `solar data synth` output of its family."""

from __future__ import annotations

import pytest

from solar.config.resolve import resolve_file
from solar.data.from_config import train_stream
from solar.data.synth import synthesize
from tests.conftest import CONFIGS

TINY_TRAIN = sorted((CONFIGS / "tiny").glob("*/train_*.yaml"))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny-data")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = base / family
            synthesize(family, cache[family], samples=4, seed=1)
        return cache[family]
    return get


@pytest.mark.parametrize("path", TINY_TRAIN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_tiny_config_reads_synth_clips(path, datasets, tmp_path):
    family = resolve_file(path, ["data.root=/x", "runtime.output_dir=/y"]).config.model.family
    root = datasets(family)
    cfg = resolve_file(path, [f"data.root={root}", f"runtime.output_dir={tmp_path}/out"]).config
    for rank in range(cfg.distributed.world_size):
        stream = train_stream(cfg, rank)
        clip = stream.next_clip()
        lat = clip.clip.latents
        assert lat.shape[1] == {81: 21, 153: (39 if family.startswith("wan") else 20), 158: 47}[
            cfg.data.pixel_frames]
        assert clip.clip.c2w.shape[0] == cfg.data.pixel_frames
        # SP peers read the same sample.
        sp = cfg.distributed.sequence_parallel_size
        if rank % sp:
            peer = train_stream(cfg, rank - rank % sp).next_clip()
            assert peer.row.sample_id == clip.row.sample_id and peer.occurrence == clip.occurrence
