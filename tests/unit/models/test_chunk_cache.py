"""Chunk-by-chunk generation's fixed-size key/value ring (``ChunkCache``): compiled blocks see one
shape for every chunk and commit (no recompiles), and the ring computes what attending to the
window's chunks in order computes."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.unit.models.wan_helpers import TI2V, dims, moving_cameras, ours, randomize


def _rollout(model, chunks: int, seed: int = 0) -> torch.Tensor:
    """Self-forcing-like: four levels per chunk, then a commit, over ``chunks`` chunks of 3 latents."""
    gen = torch.Generator().manual_seed(seed)
    d = model.cfg.dims
    prompt = torch.randn(1, 5, d.text_dim, generator=gen)
    cams = moving_cameras(3 * chunks)
    cache = model.new_cache(prompt)
    out = []
    for c in range(chunks):
        s = slice(3 * c, 3 * c + 3)
        x = torch.randn(1, d.in_channels, 3, 4, 4, generator=gen)
        for level in (1000.0, 750.0, 500.0, 250.0):
            x = x - level / 4000 * model.forward_chunk(x, torch.full((1, 3), level), cache, cameras=cams[:, s])
        model.commit_chunk(x, cache, cameras=cams[:, s])
        out.append(x)
    return torch.cat(out, dim=2)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_blocks_generate_with_two_graphs_and_equal_eager():
    """Seven chunks with a window of two: the ring fills, wraps and evicts. Every chunk forward and
    commit of every block goes through two compiled graphs (the first chunk's keys, then the key
    length as a dynamic dimension), none added by a second rollout, with eager's outputs."""
    import torch._dynamo

    torch._dynamo.reset()
    model = randomize(ours(dims(TI2V, heads=2, head_dim=16), camera_transform="logd4", chunk_latents=3,
                           max_prior_clean_chunks=2, attention_backend="sdpa"))
    compiled = copy.deepcopy(model)
    graphs = []

    def backend(gm, example_inputs):   # dynamo's guards decide the graphs; this backend runs them as traced
        graphs.append(gm)
        return gm.forward

    for block in compiled.blocks:
        block.compile(backend=backend)
    eager, traced = _rollout(model, 7), _rollout(compiled, 7)
    assert (eager - traced).abs().max().item() <= 1e-5
    assert len(graphs) == 2
    _rollout(compiled, 7, seed=1)
    assert len(graphs) == 2


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_of_another_shape_are_refused():
    model = randomize(ours(dims(TI2V, heads=2, head_dim=16), camera_transform=None, chunk_latents=3,
                           max_prior_clean_chunks=2, attention_backend="sdpa"))
    d = model.cfg.dims
    cache = model.new_cache(torch.randn(1, 5, d.text_dim))
    model.commit_chunk(torch.randn(1, d.in_channels, 3, 4, 4), cache)
    with pytest.raises(ValueError, match="chunks of one generation must have one shape"):
        model.forward_chunk(torch.randn(1, d.in_channels, 2, 4, 4), torch.zeros(1, 2), cache)
