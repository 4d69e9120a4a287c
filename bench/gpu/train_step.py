"""(b) A full Wan TI2V-5B training step on one H200 at 81 frames 704x1280 (18,480 tokens, batch 1):
activation checkpointing per block, bf16 compute over fp32 master weights, fused AdamW, gradient
clipping and the trainer's fp32 EMA; ours (WanDiT as the trainer builds it: per-frame modulation,
``apply_activation_checkpointing``, the engine's bf16 autocast) against diffusers'
``WanTransformer3DModel`` (TI2V per-token timesteps, its own gradient checkpointing) with the same
optimizer, clipping and EMA, one after the other in the same process.

    PYTHONPATH=trainer:. python3 bench/gpu/train_step.py [VARIANT ...]   # default: ours ours_compiled diffusers

Variants with ``save_attention`` / ``skipN`` use ``distributed.activation_checkpointing_policy`` and
``distributed.activation_checkpointing_skip_blocks``; a ``_prope`` suffix turns camera PRoPE on (the
released configs' ``camera_translation_transform: linear``, as the product runs), a ``_foreach``
suffix uses AdamW's default (foreach) kernels instead of the fused one (issue 18's product-vs-bench
terms; ``bench/gpu/product_s05.py``), e.g. ``ours_compiled_save_attention_skip18_prope_foreach``.

MFU counts model FLOPs (performance.md: ≈ 0.92 PFLOP per clip), not the recomputation.
"""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

from bench.gpu.common import PEAK_BF16, block_train_flops, emit, peak_memory, timed
from solar.config import families
from solar.train.ema import EMA

DIMS = families.spec("wan22_ti2v_5b").dims("released")
FRAMES, LAT_H, LAT_W, TEXT = 21, 44, 80, 512
TOKENS = FRAMES * (LAT_H // 2) * (LAT_W // 2)


def _step_fn(model, forward, fused: bool = True):
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=True if fused else None)
    ema = EMA(params, decay=0.999, start_step=0, warmup_steps=0, enabled=True)
    x = torch.randn(1, 48, FRAMES, LAT_H, LAT_W, device="cuda")
    target = torch.randn_like(x)
    prompt = torch.randn(1, TEXT, DIMS.text_dim, device="cuda")
    count = [0]

    def step():
        count[0] += 1
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = forward(x, prompt)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        ema.update(count[0])
    return step


def cameras() -> torch.Tensor:
    """[1, FRAMES, 4, 4] rebased view matrices: identity rotation, the camera moving along x."""
    view = torch.eye(4, device="cuda").repeat(1, FRAMES, 1, 1)
    view[0, :, 0, 3] = torch.linspace(0.0, 2.0, FRAMES, device="cuda")
    return view


def ours(compiled: bool = False, policy: str = "full", skip: int = 0, prope: bool = False,
         fused: bool = True) -> dict:
    from solar.models.wan.model import WanConfig, WanDiT
    from solar.train.parallelize import apply_activation_checkpointing, apply_compile

    with torch.device("cuda"):
        model = WanDiT(WanConfig(DIMS, camera_transform="linear" if prope else None, attention_backend="sdpa"))
    apply_activation_checkpointing(model, policy=policy, skip_blocks=skip)  # distributed.activation_checkpointing_*
    if compiled:  # runtime.compile=true
        apply_compile(model)
    t = torch.full((1, FRAMES), 500.0, device="cuda")
    t[:, 0] = 0.0  # TI2V: the first latent is the clean image condition
    cams = cameras() if prope else None
    step = _step_fn(model, lambda x, p: model(x, t, p, cameras=cams), fused=fused)
    return _measure(model, step)


def peer() -> dict:
    from diffusers import WanTransformer3DModel

    with torch.device("cuda"):
        model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=DIMS.num_heads,
                                      attention_head_dim=DIMS.head_dim, in_channels=48, out_channels=48,
                                      text_dim=DIMS.text_dim, freq_dim=DIMS.freq_dim, ffn_dim=DIMS.ffn_dim,
                                      num_layers=DIMS.num_layers, cross_attn_norm=True,
                                      qk_norm="rms_norm_across_heads", eps=1e-6)
    model.enable_gradient_checkpointing()
    t = torch.full((1, TOKENS), 500.0, device="cuda")
    t[:, : TOKENS // FRAMES] = 0.0  # per-token timesteps, first frame's tokens clean (the TI2V pipeline)
    step = _step_fn(model, lambda x, p: model(x, t, p, return_dict=False)[0])
    return _measure(model, step)


def _measure(model, step) -> dict:
    params = sum(p.numel() for p in model.parameters())
    torch.cuda.reset_peak_memory_stats()
    r = timed(step, warmup=2, iters=5)
    return {**r, "parameters": params, "peak_gib": peak_memory()}


VARIANTS = {
    "ours": ours,
    "ours_compiled": lambda: ours(True),
    "ours_compiled_save_attention": lambda: ours(True, "save_attention"),
    "diffusers": peer,
}


def main() -> None:
    import sys

    names = sys.argv[1:] or ["ours", "ours_compiled", "diffusers"]
    flops = block_train_flops(hidden=DIMS.hidden_size, ffn=DIMS.ffn_dim, tokens=TOKENS, layers=DIMS.num_layers)
    rows = {}
    def variant(name):  # ours_compiled_save_attention_skipN: the last N blocks not checkpointed
        if name in VARIANTS:
            return VARIANTS[name]
        base, foreach = name.removesuffix("_foreach"), name.endswith("_foreach")
        base, prope = base.removesuffix("_prope"), base.endswith("_prope")
        base, _, skip = base.rpartition("_skip") if "_skip" in base else (base, "", "0")
        policy = "save_attention" if base.endswith("save_attention") else "full"
        return lambda: ours(base.startswith("ours_compiled"), policy, int(skip), prope, not foreach)

    for name, fn in ((n, variant(n)) for n in names):
        try:
            r = fn()
        except Exception as exc:  # noqa: BLE001 - the other side still runs
            emit({"bench": "train_step", "variant": name, "error": repr(exc)[:400]})
            continue
        finally:
            gc.collect()
            torch.cuda.empty_cache()
        r.update(flops=flops, seconds_per_clip=r["median_s"], mfu=flops / r["median_s"] / PEAK_BF16)
        rows[name] = r
        emit({"bench": "train_step", "variant": name, "tokens": TOKENS, **r})
    for name in rows:
        if name != "diffusers" and "diffusers" in rows:
            emit({"bench": "train_step_ratio", "variant": name,
                  "speedup_vs_diffusers": rows["diffusers"]["median_s"] / rows[name]["median_s"]})


if __name__ == "__main__":
    main()
