"""(a) One Wan TI2V-5B block, fwd+bwd in bf16, ours against diffusers' WanTransformerBlock at the same
dims in the same process, at s = 18,480 (81 frames 704x1280) and 27,280 (121 frames) tokens.

    PYTHONPATH=trainer:. python3 bench/gpu/block.py

Ours runs with the attention kernel chosen per run (cuDNN and flash SDPA), camera PRoPE off and on;
diffusers runs with per-video and per-token (TI2V) modulation. MFU counts model FLOPs only
(performance.md): 6·N_tok·s + 14·d·s² per block.
"""

from __future__ import annotations

import torch

from bench.gpu.common import PEAK_BF16, block_train_flops, emit, matmul_ceiling, peak_memory, timed
from solar.config import families
from solar.models.attention import make_sdpa
from solar.models.prope import camera_matrices
from solar.models.rope import rope_tables
from solar.models.wan.model import Block, _Step

DIMS = families.spec("wan22_ti2v_5b").dims("released")
D, FFN, H, HD = DIMS.hidden_size, DIMS.ffn_dim, DIMS.num_heads, DIMS.head_dim
GRID_H, GRID_W = 22, 40            # 704x1280 through the 16x VAE and 2x2 patches
TEXT = 512


def ours(tokens: int, kernel: str, cameras: bool, compiled: bool = False) -> dict:
    n = GRID_H * GRID_W
    frames = tokens // n
    block = Block(DIMS, 1e-6).cuda().to(torch.bfloat16)
    cos, sin = rope_tables(torch.arange(frames, device="cuda"), GRID_H, GRID_W, HD)
    cams = None
    if cameras:
        view = torch.eye(4, device="cuda").repeat(1, frames, 1, 1)
        view[..., :3, 3] = torch.linspace(0, 1, frames, device="cuda")[None, :, None]
        cams = camera_matrices(view, "linear")
    step = _Step(torch.randn(1, frames, 6, D, device="cuda", dtype=torch.bfloat16) * 0.1, cos, sin, cams, None, n,
                 make_sdpa(kernel))
    x = torch.randn(1, tokens, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ctx = torch.randn(1, TEXT, D, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(1, tokens, D, device="cuda", dtype=torch.bfloat16)

    fn = torch.compile(block) if compiled else block

    def run():
        fn(x, ctx, step).backward(grad)
    torch.cuda.reset_peak_memory_stats()
    t = timed(run)
    return {**t, "peak_gib": peak_memory()}


def peer(tokens: int, per_token: bool) -> dict:
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock

    n = GRID_H * GRID_W
    frames = tokens // n
    block = WanTransformerBlock(D, FFN, H, qk_norm="rms_norm_across_heads", cross_attn_norm=True,
                                eps=1e-6).cuda().to(torch.bfloat16)
    rope = WanRotaryPosEmbed(HD, (1, 2, 2), 1024).cuda()
    rotary = rope(torch.empty(1, 48, frames, GRID_H * 2, GRID_W * 2, device="cuda"))
    temb = torch.randn(1, tokens, 6, D, device="cuda", dtype=torch.bfloat16) if per_token else \
        torch.randn(1, 6, D, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, tokens, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ctx = torch.randn(1, TEXT, D, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(1, tokens, D, device="cuda", dtype=torch.bfloat16)

    def run():
        block(x, ctx, temb * 0.1, rotary).backward(grad)
    torch.cuda.reset_peak_memory_stats()
    t = timed(run)
    return {**t, "peak_gib": peak_memory()}


def main() -> None:
    ceiling = matmul_ceiling()
    emit({"bench": "matmul_ceiling", "tflops": ceiling / 1e12})
    for tokens in (18_480, 27_280):
        flops = block_train_flops(hidden=D, ffn=FFN, tokens=tokens)
        rows = {}
        for name, fn in (("diffusers_per_video", lambda: peer(tokens, False)),
                         ("diffusers_per_token", lambda: peer(tokens, True)),
                         ("ours_flash", lambda: ours(tokens, "flash", False)),
                         ("ours_cudnn", lambda: ours(tokens, "cudnn", False)),
                         ("ours_cudnn_prope", lambda: ours(tokens, "cudnn", True)),
                         ("ours_cudnn_compiled", lambda: ours(tokens, "cudnn", False, compiled=True))):
            try:
                r = fn()
            except Exception as exc:  # noqa: BLE001 - one failed variant must not hide the others
                emit({"bench": "block_fwd_bwd", "tokens": tokens, "variant": name, "error": repr(exc)[:300]})
                continue
            finally:
                torch.cuda.empty_cache()
            r.update(tflops=flops / r["median_s"] / 1e12, mfu=flops / r["median_s"] / PEAK_BF16)
            rows[name] = r
            emit({"bench": "block_fwd_bwd", "tokens": tokens, "variant": name, "flops": flops, **r})
        if "diffusers_per_video" in rows:
            for name in ("ours_flash", "ours_cudnn", "ours_cudnn_prope", "ours_cudnn_compiled"):
                if name in rows:
                    emit({"bench": "block_ratio", "tokens": tokens, "variant": name,
                          "speedup_vs_diffusers_per_video": rows["diffusers_per_video"]["median_s"] / rows[name]["median_s"],
                          "speedup_vs_diffusers_per_token": rows.get("diffusers_per_token", {}).get("median_s", float("nan"))
                          / rows[name]["median_s"]})


if __name__ == "__main__":
    main()
