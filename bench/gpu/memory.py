"""Activation memory per token per block, per family and checkpointing policy, on one GPU: the table
``solar.config.memory.ACTIVATIONS`` is read from this.

For each family at its released width, the product's Stage0.5 loss (``train.fm_step.fm_loss``, the
released config resolved with ``model.dims.num_layers`` L and the policy set) runs forward and
backward under the bf16 autocast the trainer uses, on a random batch in the family's layout, at
two sequence lengths T1 < T2 and with L = 1 and 2 blocks. With P(L, T) the peak memory above the
model's own (``max_memory_allocated`` minus what is allocated before the step):

    per block per token   = [(P(2,T2) - P(2,T1)) - (P(1,T2) - P(1,T1))] / (T2 - T1)
    outside per token     = (P(1,T2) - P(1,T1)) / (T2 - T1) - per block

Terms that do not grow with the sequence (gradients, autocast's weight casts) cancel in the
differences. T counts the rows ``solar.config.memory`` counts (H3: text, anchor and audio rows too).

    PYTHONPATH=trainer:. python3 bench/gpu/memory.py [FAMILY ...]
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch

from bench.gpu.common import emit
from solar.config import families, memory
from solar.config.resolve import resolve_file
from solar.launch.batch import Batch

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {
    "wan22_ti2v_5b": "configs/solar_wm/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml",
    "wan22_i2v_a14b": "configs/solar_wm/wan22_i2v_a14b/train_stage0p5_fm_81f.yaml",
    "ltx25_video": "configs/solar_wm/ltx25/train_stage0p5_fm_153f.yaml",
    "minimax_h3": "configs/solar_wm/minimax_h3/train_stage0p5_fm_158f.yaml",
}
# (height, width) pairs: the released resolution and another with a different token count
SIZES = {"wan22_ti2v_5b": ((480, 864), (704, 1280)), "wan22_i2v_a14b": ((320, 576), (480, 832)),
         "ltx25_video": ((512, 768), (768, 1152)), "minimax_h3": ((384, 672), (768, 1344))}
POLICIES = ("full", "save_attention", "none")


def _resolve(family: str, layers: int, policy: str, size: tuple[int, int]):
    ac = ["distributed.activation_checkpointing=false"] if policy == "none" else [
        "distributed.activation_checkpointing=true", f"distributed.activation_checkpointing_policy={policy}",
        "distributed.activation_checkpointing_skip_blocks=0"]
    sets = [f"model.dims.num_layers={layers}", f"data.height={size[0]}", f"data.width={size[1]}",
            "model.attention_backend=sdpa", *ac]
    return resolve_file(REPO / CONFIGS[family], sets, expected_action="train", placeholders=False)


def _batch(cfg) -> tuple[Batch, torch.Tensor | None]:
    spec = families.spec(cfg.model.family)
    T = spec.vae.latent_frames(cfg.data.pixel_frames)
    h, w = cfg.data.height // spec.vae.spatial, cfg.data.width // spec.vae.spatial
    dims = families.spec(cfg.model.family).dims("released")
    g = torch.Generator(device="cuda").manual_seed(0)
    cond = torch.randn(1, 20, T, h, w, device="cuda", generator=g) if cfg.model.family == "wan22_i2v_a14b" else None
    batch = Batch(torch.randn(1, spec.vae.channels, T, h, w, device="cuda", generator=g),
                  torch.randn(1, memory.PROMPT_TOKENS, dims.text_dim, device="cuda", generator=g),
                  torch.ones(1, memory.PROMPT_TOKENS, device="cuda"),
                  torch.eye(4, device="cuda").expand(1, T, 4, 4).clone(), cond,
                  [{"sample_id": "bench", "start_frame": 0}])
    silence = torch.randn(2, T, 32, device="cuda", generator=g) * 0.05 if cfg.model.family == "minimax_h3" else None
    return batch, silence


def peak(family: str, layers: int, policy: str, size: tuple[int, int]) -> tuple[int, int]:
    """(peak bytes of one step above the model's own, rows) for one configuration."""
    from solar.models.registry import model_from_config
    from solar.train.fm_step import fm_loss
    from solar.train.parallelize import apply_activation_checkpointing

    resolved = _resolve(family, layers, policy, size)
    cfg = resolved.config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cuda")
    if policy != "none":
        apply_activation_checkpointing(model, policy=policy, skip_blocks=0)
    batch, silence = _batch(cfg)
    rows = memory._sequence(cfg, families.spec(family).vae.latent_frames(cfg.data.pixel_frames))
    result = 0
    for _ in range(2):  # the first step allocates the library workspaces
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = fm_loss(model, cfg, batch, step=1, dp_rank=0, micro=0, audio_silence=silence)
        loss.backward()
        torch.cuda.synchronize()
        result = torch.cuda.max_memory_allocated() - base
    del model, batch, loss
    gc.collect()
    torch.cuda.empty_cache()
    return result, rows


def main() -> None:
    for family in sys.argv[1:] or list(CONFIGS):
        small, large = SIZES[family]
        for policy in POLICIES:
            try:
                p = {(L, s): peak(family, L, policy, size) for L in (1, 2) for s, size in (("T1", small), ("T2", large))}
            except Exception as exc:  # noqa: BLE001 - the other rows still run
                emit({"bench": "memory", "family": family, "policy": policy, "error": repr(exc)[:400]})
                continue
            (p11, t1), (p12, t2) = p[(1, "T1")], p[(1, "T2")]
            (p21, _), (p22, _) = p[(2, "T1")], p[(2, "T2")]
            per_block = ((p22 - p21) - (p12 - p11)) / (t2 - t1)
            outside = (p12 - p11) / (t2 - t1) - per_block
            emit({"bench": "memory", "family": family, "policy": policy, "rows": [t1, t2],
                  "peaks": {f"L{L}_{s}": p[(L, s)][0] for L in (1, 2) for s in ("T1", "T2")},
                  "per_block_per_token": round(per_block, 1), "outside_per_token": round(outside, 1)})


if __name__ == "__main__":
    main()
