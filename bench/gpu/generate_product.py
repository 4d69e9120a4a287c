"""The product's causal generation against the bench's, in one process (issue 25): the released
TI2V-5B Stage2 infer config at 480x864 (30x54 latents, 405 tokens per frame), self-forcing 4 steps
over 21 latents, batch 1, the DiT alone (no VAE, no files).

- ``product``: ``generation.passes.Generation._sample``'s call as validation and ``solar infer`` make
  it: the model built as ``solar infer`` builds it (fp32 parameters), ``sample_autoregressive``
  inside ``launch.precision.autocast`` (bf16 on the GPU);
- ``bench``: ``bench/gpu/generate.py``'s ``rollout`` on a bf16 copy of the same weights, at the
  same shape and rollout length (its own 4 evenly spaced levels).

    PYTHONPATH=trainer:. python3 bench/gpu/generate_product.py
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.gpu import generate as bench
from bench.gpu.common import emit, peak_memory, timed
from solar.config.resolve import resolve_file
from solar.launch import precision
from solar.launch.batch import Batch

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs/solar_wm/wan22_ti2v_5b/infer_stage2_sgf_81f.yaml"
LAT_H, LAT_W, FRAMES = 30, 54, 21


def main() -> None:
    from solar.generation.autoregressive import sample_autoregressive
    from solar.models.registry import model_from_config

    cfg = resolve_file(CONFIG, ["model.attention_backend=sdpa"], expected_action="infer", placeholders=False).config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cuda").eval()  # fp32 parameters, as solar infer holds them
    dims = model.cfg.dims
    g = torch.Generator(device="cuda").manual_seed(0)
    batch = Batch(torch.randn(1, 48, FRAMES, LAT_H, LAT_W, device="cuda", generator=g),
                  torch.randn(1, 512, dims.text_dim, device="cuda", generator=g), torch.ones(1, 512, device="cuda"),
                  torch.eye(4, device="cuda").expand(1, FRAMES, 4, 4).clone(), None,
                  [{"sample_id": "bench", "start_frame": 0}])
    device = torch.device("cuda")

    def product():
        with torch.no_grad(), precision.autocast(cfg, device, sharded=False):
            sample_autoregressive(model, cfg, batch, noise_seed=1, solver="self_forcing", steps=4,
                                  rollout_latents=FRAMES)

    torch.cuda.reset_peak_memory_stats()
    t = timed(product, warmup=1, iters=3)
    emit({"bench": "generate_product", "variant": "product (sample_autoregressive, precision policy)", **t,
          "latent_frames_per_s": FRAMES / t["median_s"], "peak_gib": peak_memory()})
    model.to(torch.bfloat16)
    prompt = batch.prompt.to(torch.bfloat16)
    torch.cuda.reset_peak_memory_stats()
    for name, cams in (("bench rollout (bf16 weights, PRoPE on as in the product)", batch.cameras),
                       ("bench rollout (bf16 weights, PRoPE off as in bench/gpu/generate.py)", None)):
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            b = timed(lambda: bench.rollout(model, 48, LAT_H, LAT_W, prompt, cams), warmup=1, iters=3)
        emit({"bench": "generate_product", "variant": name, **b, "latent_frames_per_s": FRAMES / b["median_s"],
              "peak_gib": peak_memory(), "product_over_bench": t["median_s"] / b["median_s"]})


if __name__ == "__main__":
    main()
