"""On a CUDA device: chunk-by-chunk generation through compiled blocks (inductor) under bf16
autocast at the 5B block dims and the released 480x864 chunk (3 latents of 405 tokens): two graphs
(the first chunk's, then the key length as a dynamic dimension) over seven chunks, and the eager
path's outputs to bf16 tolerance. Skipped without CUDA."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from solar.config import families
from solar.models.wan.model import WanConfig, WanDiT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _rollout(model, prompt, cams, chunks: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = model.new_cache(prompt)
    out = []
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for c in range(chunks):
            s = slice(3 * c, 3 * c + 3)
            x = torch.randn(1, 48, 3, 30, 54, device="cuda", generator=gen)
            for level in (1000.0, 750.0, 500.0, 250.0):
                v = model.forward_chunk(x, torch.full((1, 3), level, device="cuda"), cache, cameras=cams[:, s])
                x = x - level / 4000 * v.float()
            model.commit_chunk(x, cache, cameras=cams[:, s])
            out.append(x)
    return torch.cat(out, dim=2)


def test_compiled_chunk_generation_one_graph_and_eager_outputs():
    import torch._dynamo

    torch._dynamo.reset()
    dims = dataclasses.replace(families.spec("wan22_ti2v_5b").dims("released"), num_layers=2)
    torch.manual_seed(0)
    with torch.device("cuda"):
        eager = WanDiT(WanConfig(dims, camera_transform="linear", chunk_latents=3, max_prior_clean_chunks=5)).eval()
    compiled = copy.deepcopy(eager)
    for block in compiled.blocks:
        block.compile()
    prompt = torch.randn(1, 512, dims.text_dim, device="cuda")
    cams = torch.eye(4, device="cuda").repeat(1, 21, 1, 1)
    cams[..., :3, 3] = torch.linspace(0, 1, 21, device="cuda")[None, :, None]
    a = _rollout(eager, prompt, cams, 7)
    torch._dynamo.utils.counters.clear()
    b = _rollout(compiled, prompt, cams, 7)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert torch.isfinite(b).all()
    rel = ((a - b).norm() / a.norm()).item()
    assert rel < 2e-2, rel
