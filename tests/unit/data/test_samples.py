"""Pre-encoded samples: bit-exact round trips, validation, shards, the synthetic world, streams."""

from __future__ import annotations

import json
import math

import pytest
import torch

from solar.config import families
from solar.data.cameras import check_guards, rebase, transform_translation
from solar.data.index import load_table
from solar.data.layout import layout_for
from solar.data.plan import PlanParams, plan_readers
from solar.data.rows import Row
from solar.data.sample_io import (
    Sample,
    ShardReader,
    ShardWriter,
    decode_sample,
    encode_sample,
    validate_sample,
)
from solar.data.stream import ClipSource, GuardSettings, RankStream, ReaderStream
from solar.data.synth import RESOLUTION, render_latents, synthesize
from solar.errors import DataError

FAMILIES = list(families.FAMILIES)


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("synth")
    for family in FAMILIES:
        synthesize(family, base / family, samples=6, seed=3)
    return base


def _layout(family):
    h, w = RESOLUTION["tiny"][family]
    return layout_for(family, height=h, width=w, text_dim=families.spec(family).dims("tiny").text_dim)


def _rows(root, split="train"):
    from solar.data.index import iter_rows
    return [row for _, row in iter_rows(root / f"{split}-index.jsonl.gz")]


@pytest.mark.parametrize("family", FAMILIES)
def test_synth_samples_validate_and_round_trip(synth_root, family):
    root = synth_root / family
    reader = ShardReader(root)
    manifest = json.loads((root / "dataset.json").read_text())
    assert manifest["family"] == family and manifest["samples"] == {"train": 6, "test": 2}
    for row in _rows(root) + _rows(root, "test"):
        blob = reader.read(row)
        sample = decode_sample(blob, row.sample_id)
        validate_sample(sample, _layout(family), row.sample_id)
        again = decode_sample(encode_sample(sample), row.sample_id)
        assert encode_sample(again) == blob  # bytes stable
        for name, tensor in sample.tensors().items():
            assert torch.equal(tensor, again.tensors()[name]) and tensor.dtype == again.tensors()[name].dtype
        assert again.metadata == sample.metadata and sample.metadata["sample_id"] == row.sample_id
    assert (root / "conditioning" / "negative-prompt.safetensors").is_file()
    assert (root / "support" / "audio-silence.safetensors").is_file() == (family == "minimax_h3")


def test_member_lookup_without_offsets_matches(synth_root):
    root = synth_root / "wan22_ti2v_5b"
    reader = ShardReader(root)
    for row in _rows(root):
        bare = Row(row.sample_id, row.key, row.shard, 1, None, None, None, None, None, None, None, None)
        assert reader.read(bare) == reader.read(row)


def test_shard_reader_errors(synth_root, tmp_path):
    root = synth_root / "wan22_ti2v_5b"
    row = _rows(root)[0]
    reader = ShardReader(root)
    with pytest.raises(DataError, match="index declares 1"):
        reader.read(Row(row.sample_id, row.key, row.shard, 1, None, None, None, None, None, None, None, 1))
    with pytest.raises(DataError, match="no member 'nope.safetensors'"):
        reader.read(Row(row.sample_id, "nope", row.shard, 1, None, None, None, None, None, None, None, None))
    with pytest.raises(DataError, match="missing under"):
        reader.read(Row("x", "x", "shards/none.tar", 1, None, None, None, None, None, None, None, None))


def _sample(family="wan22_ti2v_5b", frames=81, **changes):
    layout = _layout(family)
    t = layout.latent_frames(frames)
    sample = Sample(torch.zeros(layout.latent_channels, t, layout.latent_height, layout.latent_width),
                    torch.zeros(8, layout.text_dim), torch.eye(4).repeat(frames, 1, 1),
                    {"schema": "solar.latent-sample.v1", "family": family, "sample_id": "x", "key": "x",
                     "num_frames": str(frames), "fps": "16.0", "height": "64", "width": "96", "caption": ""})
    for name, value in changes.items():
        setattr(sample, name, value)
    return sample, layout


@pytest.mark.parametrize("change, fragment", [
    ({"latents": torch.zeros(48, 20, 4, 6)}, "latents shape [48, 20, 4, 6], expected [48, 21, 4, 6]"),
    ({"latents": torch.zeros(48, 21, 4, 6, dtype=torch.int32)}, "latents dtype int32"),
    ({"prompt_embeds": torch.zeros(8, 31)}, "prompt_embeds shape [8, 31], expected [L, 32]"),
    ({"c2w": torch.eye(4).repeat(80, 1, 1)}, "c2w shape [80, 4, 4], expected [81, 4, 4]"),
    ({"image_condition": torch.zeros(20, 21, 4, 6)}, "carry no image_condition"),
])
def test_validation_rejects(change, fragment):
    sample, layout = _sample(**change)
    with pytest.raises(DataError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        validate_sample(sample, layout, "s")


def test_validation_rejects_nan_and_bad_camera_rows():
    sample, layout = _sample()
    sample.latents[0, 0, 0, 0] = float("nan")
    with pytest.raises(DataError, match="tensor latents has non-finite values"):
        validate_sample(sample, layout, "s")
    sample, layout = _sample()
    sample.c2w[3, 3, 0] = 1.0
    with pytest.raises(DataError, match="bottom rows"):
        validate_sample(sample, layout, "s")
    sample, layout = _sample()
    sample.metadata["family"] = "ltx25_video"
    with pytest.raises(DataError, match="does not match wan22_ti2v_5b"):
        validate_sample(sample, layout, "s")


def test_synthetic_content_follows_the_camera():
    params = {"fx": torch.tensor([1.0, 2.0]), "fy": torch.tensor([1.0, 0.0]),
              "phi": torch.zeros(3, 2, dtype=torch.float64), "amp": torch.ones(3, 2, dtype=torch.float64)}
    still = torch.eye(4, dtype=torch.float64).repeat(9, 1, 1)
    frames = render_latents(params, still, channels=3, latents=3, height=4, width=6)
    assert torch.equal(frames[:, 0], frames[:, 1]) and torch.equal(frames[:, 0], frames[:, 2])
    moving = still.clone()
    moving[:, 0, 3] = torch.linspace(0, 2, 9, dtype=torch.float64)  # pan along x
    panned = render_latents(params, moving, channels=3, latents=3, height=4, width=6)
    assert torch.equal(panned[:, 0], frames[:, 0]) and not torch.allclose(panned[:, 2], frames[:, 2])
    # A pan of one full period of the slowest wave in x returns the same picture for that wave.
    period = still.clone()
    period[:, 0, 3] = 4.0  # u = 0.25 * 4 = one unit of x
    params_x = {**params, "fx": torch.tensor([1.0, 2.0]), "fy": torch.tensor([0.0, 0.0])}
    assert torch.allclose(render_latents(params_x, period, channels=3, latents=1, height=4, width=6),
                          render_latents(params_x, still, channels=3, latents=1, height=4, width=6), atol=1e-9)


def test_synth_refuses_a_used_directory_and_writes_nothing(tmp_path, cli):
    out = tmp_path / "d"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli("data", "synth", "--family", "ltx-2.5", "--out", str(out))
    assert result.code == 2 and "is not an empty directory" in result.err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    result = cli("data", "synth", "--family", "sora", "--out", str(tmp_path / "e"))
    assert result.code == 2 and "is not a family" in result.err


def test_synth_is_deterministic(tmp_path):
    a = synthesize("minimax_h3", tmp_path / "a", samples=2, seed=9)
    b = synthesize("minimax_h3", tmp_path / "b", samples=2, seed=9)
    assert {k: v for k, v in a.items() if k != "out"} == {k: v for k, v in b.items() if k != "out"}
    for rel in ("train-index.jsonl.gz", "shards/train-000000.tar", "support/audio-silence.safetensors"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_cameras():
    track = torch.eye(4).repeat(5, 1, 1)
    track[:, 0, 3] = torch.arange(5.0)
    rel = rebase(track)
    assert torch.allclose(rel[0], torch.eye(4))
    assert torch.allclose(rel[:, 0, 3], -torch.arange(5.0))
    assert check_guards(rel, fps=1.0, seconds=10, max_translation=20, max_abs=20).ok
    verdict = check_guards(rel, fps=1.0, seconds=10, max_translation=3.5, max_abs=20)
    assert not verdict.ok and "at frame 4" in verdict.reason
    assert check_guards(rel, fps=1.0, seconds=3, max_translation=3.5, max_abs=20).ok  # beyond 3 s ignored
    t = torch.tensor([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]])
    out = transform_translation(t, "logd4")
    assert torch.equal(out[0], torch.zeros(3))
    assert torch.allclose(out[1].norm(), torch.tensor(math.log1p(5.0) / 4))
    assert torch.equal(transform_translation(t, "linear"), t)


@pytest.fixture(scope="module")
def wan_source(synth_root):
    root = synth_root / "wan22_ti2v_5b"
    index = str(root / "train-index.jsonl.gz")
    table = load_table(index)
    return ClipSource(index, table, root, _layout("wan22_ti2v_5b"), 81, GuardSettings(fps=16.0))


def test_reader_stream_crosses_epochs_like_the_plan(wan_source):
    params = PlanParams(seed=4, pixel_frames=81, world_size=2, shuffle_buffer=4, random_start=True)
    stream = ReaderStream(wan_source.table, params, 1)
    got = [next(stream) for _ in range(3 * 3 + 1)]  # 3 occurrences per epoch for reader 1
    for epoch in range(3):
        plan = plan_readers(wan_source.table, PlanParams(**{**params.__dict__, "epoch": epoch}))[1]
        part = [o for o in got if o.epoch == epoch]
        assert [(o.row, o.start_frame) for o in part] == list(zip(plan.rows, plan.starts))[: len(part)]


def test_rank_stream_resumes_exactly(wan_source):
    params = PlanParams(seed=2, pixel_frames=81, world_size=1, num_workers=2, shuffle_buffer=2,
                        random_start=True)
    straight = RankStream(wan_source, params, 0)
    head = [straight.next_clip() for _ in range(5)]
    state = json.loads(json.dumps(straight.state_dict()))  # what a checkpoint stores
    tail = [straight.next_clip() for _ in range(9)]
    resumed = RankStream(wan_source, params, 0, state)
    again = [resumed.next_clip() for _ in range(9)]
    assert [c.occurrence for c in again] == [c.occurrence for c in tail]
    for a, b in zip(again, tail):
        assert torch.equal(a.clip.latents, b.clip.latents) and torch.equal(a.rel_c2w, b.rel_c2w)
        assert a.clip.latents.shape == (48, 21, 4, 6) and a.clip.c2w.shape == (81, 4, 4)
    assert len({c.row.sample_id for c in head + tail}) == 6  # every training sample was read
    with pytest.raises(DataError, match="reader"):
        RankStream(wan_source, PlanParams(seed=2, pixel_frames=81, world_size=2, num_workers=2), 1, state)


def test_guard_failures_are_skipped(tmp_path):
    layout = _layout("wan22_ti2v_5b")
    root = tmp_path / "data"
    (root / "shards").mkdir(parents=True)
    writer = ShardWriter(root / "shards" / "s.tar")
    rows = []
    for i, speed in enumerate([0.0, 100.0, 0.0]):
        sample, _ = _sample()
        sample.metadata.update(sample_id=f"s{i}", key=f"k{i}")
        sample.c2w = torch.eye(4).repeat(81, 1, 1)
        sample.c2w[:, 0, 3] = torch.arange(81.0) * speed / 16
        offset, size = writer.add(f"k{i}.safetensors", encode_sample(sample))
        rows.append({"sample_id": f"s{i}", "key": f"k{i}", "shard": "shards/s.tar",
                     "member_offset": offset, "member_size": size})
    writer.close()
    (root / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = load_table(root / "index.jsonl")
    source = ClipSource(str(root / "index.jsonl"), table, root, layout, 81, GuardSettings(fps=16.0))
    stream = RankStream(source, PlanParams(seed=0, pixel_frames=81, world_size=1, shuffle_buffer=0), 0)
    ids = [stream.next_clip().row.sample_id for _ in range(4)]
    assert ids == ["s0", "s2", "s0", "s2"]
    assert len(stream.skipped) == 2 and "camera guard: relative translation" in stream.skipped[0]
