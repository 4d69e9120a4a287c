"""The clip stream read one clip ahead (``solar.data.prefetch``) on real tiny shards: the same clips
in the same order as the plain stream, a state that counts only the clips handed out, and a failed
read raised by the call that asks for that clip."""

from __future__ import annotations

import shutil

import pytest

from solar.config.resolve import resolve_file
from solar.data.from_config import train_stream
from solar.data.prefetch import Prefetched
from solar.data.synth import synthesize
from solar.errors import DataError
from tests.conftest import CONFIGS

CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefetch") / "wan"
    synthesize("wan22_ti2v_5b", root, samples=4, seed=1)
    return root


def _cfg(root, tmp_path):
    return resolve_file(CONFIG, [f"data.root={root}", f"runtime.output_dir={tmp_path}/out"]).config


def _ident(clip):
    return clip.row.sample_id, clip.occurrence


def test_same_clips_and_a_state_of_the_clips_handed_out(data, tmp_path):
    cfg = _cfg(data, tmp_path)
    plain, ahead = train_stream(cfg, 0), Prefetched(train_stream(cfg, 0))
    assert ahead.state_dict() == plain.state_dict()
    try:
        for _ in range(9):  # past the first epoch's end (4 samples)
            want, got = plain.next_clip(), ahead.next_clip()
            assert _ident(got) == _ident(want)
            assert got.clip.latents.equal(want.clip.latents) and got.rel_c2w.equal(want.rel_c2w)
            ahead._ahead.result()  # the next clip is read already ...
            assert ahead.state_dict() == plain.state_dict()  # ... and not counted
            assert ahead.stream.state_dict() != plain.state_dict()
        # a stream resumed from that state goes on with the clip read ahead
        resumed = train_stream(cfg, 0, ahead.state_dict())
        assert _ident(resumed.next_clip()) == _ident(plain.next_clip())
    finally:
        ahead.close()


def test_a_failed_read_is_raised_for_its_clip(data, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data, root)
    cfg = _cfg(root, tmp_path)
    plain = train_stream(cfg, 0)
    order = [plain.next_clip() for _ in range(4)]
    seen = {c.row.sample_id for c in order[:2]}
    broken = next(i for i, c in enumerate(order) if i >= 2 and c.row.sample_id not in seen)
    row = order[broken].row
    with open(root / row.shard, "r+b") as shard:  # the member's bytes overwritten in place
        shard.seek(row.member_offset)
        shard.write(b"\0" * 64)
    ahead = Prefetched(train_stream(cfg, 0))
    try:
        for c in order[:broken]:
            assert _ident(ahead.next_clip()) == _ident(c)
        with pytest.raises(DataError, match=row.sample_id):
            ahead.next_clip()
    finally:
        ahead.close()
