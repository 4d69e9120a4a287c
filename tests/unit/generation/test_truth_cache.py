"""A slot's ground truth is decoded once per launch: every pass and validation step reuses the frames."""

from __future__ import annotations

import torch

from solar.generation import passes
from solar.generation.passes import Generation
from solar.launch.batch import Batch
from solar.models.codecs import build_codec


class Counting:
    """The real tiny Wan codec, counting its decodes."""

    def __init__(self):
        self.codec, self.calls = build_codec("wan22_ti2v_5b", seed=0), 0

    def decode(self, latents):
        self.calls += 1
        return self.codec.decode(latents)


def _batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(torch.randn(1, 48, 3, 2, 2, generator=g), torch.zeros(1, 4, 8), torch.ones(1, 4),
                 torch.eye(4).expand(1, 3, 4, 4).clone(), None, [{"sample_id": f"s{seed}", "start_frame": 0}])


def test_the_same_input_decodes_once_and_a_new_one_decodes_anew(monkeypatch):
    codec = Counting()
    gen = Generation(None, None, None, codec, None, [], None, None)
    first = gen.truth_frames(_batch(1), 3)
    again = gen.truth_frames(_batch(1), 3)
    assert codec.calls == 1 and torch.equal(first, again)
    assert first.dtype == torch.uint8 and first.shape == (9, 32, 32, 3)
    assert torch.equal(first, passes.video.to_uint8(codec.codec.decode(_batch(1).latents)[0]))
    gen.truth_frames(_batch(2), 3)
    gen.truth_frames(_batch(1), 1)  # another decode length is another video
    assert codec.calls == 3

    monkeypatch.setattr(passes, "TRUTH_CACHE_BYTES", first.nbytes * 3)  # full: decoded, not kept
    gen.truth_frames(_batch(3), 3)
    gen.truth_frames(_batch(3), 3)
    assert codec.calls == 5 and len(gen.truths) == 3
