"""(d) Causal few-step generation with the KV cache (Stage2's self-forcing path): 4 denoising steps per
3-latent chunk, then one commit pass per chunk, chunk by chunk over 21 latent frames; latent
frames per second of the DiT alone (no VAE decode), bf16, batch 1, for TI2V-5B at 720p
(704x1280: 880 tokens per frame) and a Wan2.1-1.3B-shaped config (1536 wide, 30 layers, 12 heads,
480x832: 1,560 tokens per frame with the 8x VAE).

Variants: ``eager``; ``compiled`` (each block ``torch.compile``d: the fixed-size key/value ring
of ``ChunkCache`` gives every chunk forward and commit one shape, so one graph serves them);
``reduce-overhead`` (the same in ``torch.compile``'s CUDA-graph mode).

    PYTHONPATH=trainer:. python3 bench/gpu/generate.py [VARIANT ...]   # default: eager compiled
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import torch
import torch._dynamo

from bench.gpu.common import emit, peak_memory, timed
from solar.config import families
from solar.models.wan.model import WanConfig, WanDiT

STEPS, CHUNK, FRAMES = 4, 3, 21


def rollout(model: WanDiT, channels: int, lat_h: int, lat_w: int, prompt: torch.Tensor,
            cameras: torch.Tensor | None = None) -> None:
    """``cameras`` [1, FRAMES, 4, 4]: camera PRoPE on, as the product runs it (None: off)."""
    cache = model.new_cache(prompt)
    levels = torch.linspace(1000, 0, STEPS + 1, device="cuda")[:-1]
    for c in range(FRAMES // CHUNK):
        cams = None if cameras is None else cameras[:, c * CHUNK:(c + 1) * CHUNK]
        x = torch.randn(1, channels, CHUNK, lat_h, lat_w, device="cuda", dtype=torch.bfloat16)
        for i, t in enumerate(levels):
            v = model.forward_chunk(x, t.expand(1), cache, cameras=cams)
            nxt = levels[i + 1] if i + 1 < STEPS else torch.zeros((), device="cuda")
            x = x + (nxt - t) / 1000 * v
        model.commit_chunk(x, cache, cameras=cams)


def run(name: str, dims, channels: int, lat_h: int, lat_w: int, variant: str) -> None:
    torch._dynamo.reset()
    with torch.device("cuda"):
        model = WanDiT(WanConfig(dims, camera_transform=None, attention_backend="sdpa")).to(torch.bfloat16).eval()
    if variant != "eager":
        for block in model.blocks:
            block.compile(mode=None if variant == "compiled" else variant)
    prompt = torch.randn(1, 512, dims.text_dim, device="cuda", dtype=torch.bfloat16)
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        t = timed(functools.partial(rollout, model, channels, lat_h, lat_w, prompt), warmup=2, iters=5)
    emit({"bench": "causal_generation", "model": name, "variant": variant, "latent_frames": FRAMES,
          "steps_per_chunk": STEPS, "tokens_per_frame": (lat_h // 2) * (lat_w // 2), **t,
          "latent_frames_per_s": FRAMES / t["median_s"], "peak_gib": peak_memory()})
    del model
    torch.cuda.empty_cache()


def main() -> None:
    five = families.spec("wan22_ti2v_5b").dims("released")
    small = dataclasses.replace(five, num_layers=30, hidden_size=1536, num_heads=12, head_dim=128, ffn_dim=8960,
                                in_channels=16, out_channels=16)
    for variant in sys.argv[1:] or ["eager", "compiled"]:
        for name, args in (("wan22_ti2v_5b_720p", (five, 48, 44, 80)), ("wan_1.3b_shaped_480p", (small, 16, 60, 104))):
            try:
                run(name, *args, variant)
            except Exception as exc:  # noqa: BLE001
                emit({"bench": "causal_generation", "model": name, "variant": variant, "error": repr(exc)[:400]})


if __name__ == "__main__":
    main()
