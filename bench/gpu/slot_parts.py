"""The parts of a validation / ``solar infer`` slot outside the DiT, one at a time (issue 40 item 1):
the released Wan 2.2 VAE's decode of a 60-latent clip at 480x864 (237 frames) in fp32 and in bf16
(wall seconds, and the bf16 frames' PSNR against the fp32 frames as a user sees them: uint8), and
the MP4 encode of the decoded frames (``generation.video.write_mp4`` as shipped, then x264 variants,
each twice to see whether its bitstream is the same from one call to the next).

No released VAE weights can be had here, so the decoder is randomly initialised (seed 0) and the
latents are drawn at random: the PSNR says how far bf16 rounding moves this network's output, not
what a trained decoder shows. The encode is timed on those frames (``encode`` alone: on a smooth
synthetic clip of moving gradients); x264's speed depends on the content, and random decoder output
is harder to compress than natural video.

    PYTHONPATH=trainer:. python3 bench/gpu/slot_parts.py [decode] [encode] [variants]

``variants`` adds bf16 decodes with cuDNN's autotuner, with channels-last 3D tensors, and compiled
(the RMS norms alone, then the decoder's whole per-latent forward).

``BENCH_LATENTS`` (default 60), ``BENCH_HW`` (default 480x864).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from solar.generation import video
from solar.models.wan import vae as wan_vae

LATENTS = int(os.environ.get("BENCH_LATENTS", "60"))
H, W = (int(x) for x in os.environ.get("BENCH_HW", "480x864").split("x"))
# (x264 threads, preset) beside the shipped encode (write_mp4: X264_THREADS, veryfast; before
# 2026-12-06: one thread, medium); 0 threads = x264's choice
VARIANTS = [(1, "medium"), (0, "medium"), (1, "veryfast"), (0, "veryfast")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def emit(record: dict) -> None:
    import json

    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": name,
                      "torch": torch.__version__, "cores": os.cpu_count(), **record}), flush=True)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.float() - b.float()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def decode_case() -> torch.Tensor:
    vae = wan_vae.build_vae("wan2.2", profile=os.environ.get("BENCH_PROFILE", "released")).to(DEVICE)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, 48, LATENTS, H // 16, W // 16, generator=g).to(DEVICE)
    frames = {}
    for dtype in (torch.float32, torch.bfloat16):
        vae.to(dtype)
        wan_vae.decode(vae, z[:, :, :2])   # warm: cuDNN's algorithm choice, the allocator
        _sync()
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        out = wan_vae.decode(vae, z)
        _sync()
        seconds = time.perf_counter() - started
        frames[dtype] = video.to_uint8(out[0])
        emit({"bench": "slot_parts", "case": "decode", "dtype": str(dtype).split(".")[1], "latents": LATENTS,
              "frames": int(frames[dtype].shape[0]), "hw": f"{H}x{W}", "seconds": round(seconds, 3),
              "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if DEVICE == "cuda" else None})
        del out
    if "variants" in sys.argv[1:]:
        # bf16 with cuDNN's autotuner, then also with channels-last 3D weights and input
        vae.to(torch.bfloat16)
        torch.backends.cudnn.benchmark = True
        for name, fmt in (("bf16+cudnn.benchmark", None), ("bf16+benchmark+channels_last_3d", torch.channels_last_3d)):
            if fmt is not None:
                for m in vae.modules():
                    if isinstance(m, torch.nn.Conv3d):
                        m.weight.data = m.weight.data.contiguous(memory_format=fmt)
            x = z if fmt is None else z.contiguous(memory_format=fmt)
            wan_vae.decode(vae, x[:, :, :3])
            wan_vae.decode(vae, x[:, :, :3])
            _sync()
            started = time.perf_counter()
            out = wan_vae.decode(vae, x)
            _sync()
            seconds = time.perf_counter() - started
            got = video.to_uint8(out[0])
            emit({"bench": "slot_parts", "case": "decode", "dtype": name, "latents": LATENTS, "seconds": round(seconds, 3),
                  "psnr_vs_bf16_db": round(psnr(got, frames[torch.bfloat16]), 2)})
            del out
        # compiled (still channels-last, autotuned): the RMS norms alone (memory-bound passes fused), then
        # the decoder's whole per-latent forward
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

        x = z.contiguous(memory_format=torch.channels_last_3d)
        for name in ("bf16+channels_last+compiled_norms", "bf16+channels_last+compiled_decoder"):
            try:
                if name.endswith("norms"):
                    for m in vae.modules():
                        if isinstance(m, WanRMS_norm):
                            m.forward = torch.compile(m.forward)
                else:
                    vae.decoder.forward = torch.compile(vae.decoder.forward)
                warm = time.perf_counter()
                wan_vae.decode(vae, x[:, :, :3])
                wan_vae.decode(vae, x[:, :, :3])
                _sync()
                warm = time.perf_counter() - warm
                started = time.perf_counter()
                out = wan_vae.decode(vae, x)
                _sync()
                seconds = time.perf_counter() - started
                got = video.to_uint8(out[0])
                emit({"bench": "slot_parts", "case": "decode", "dtype": name, "latents": LATENTS,
                      "seconds": round(seconds, 3), "warm_seconds": round(warm, 1),
                      "psnr_vs_bf16_db": round(psnr(got, frames[torch.bfloat16]), 2)})
                del out
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
                emit({"bench": "slot_parts", "case": "decode", "dtype": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
        torch.backends.cudnn.benchmark = False
    a, b = frames[torch.float32], frames[torch.bfloat16]
    diff = (a.int() - b.int()).abs()
    emit({"bench": "slot_parts", "case": "decode_bf16_vs_fp32", "psnr_db": round(psnr(a, b), 2),
          "max_abs_uint8": int(diff.max()), "mean_abs_uint8": round(diff.float().mean().item(), 4)})
    return a


def smooth_clip(frames: int) -> torch.Tensor:
    t = torch.arange(frames).view(-1, 1, 1, 1).float()
    y = torch.arange(H).view(1, -1, 1, 1).float()
    x = torch.arange(W).view(1, 1, -1, 1).float()
    c = torch.tensor([0.0, 2.1, 4.2]).view(1, 1, 1, 3)
    v = 127.5 + 100 * torch.sin(x / 37 + t / 9 + c) * torch.cos(y / 23 - t / 13 + c)
    return v.round().clamp(0, 255).to(torch.uint8)


def _encode(frames: torch.Tensor, path: Path, threads: int, preset: str) -> float:
    started = time.perf_counter()
    video.write_mp4(path, frames, 16.0, threads=threads, preset=preset)
    return time.perf_counter() - started


def encode_case(decoded: torch.Tensor | None) -> None:
    clips = {"decoded": decoded} if decoded is not None else {"smooth": smooth_clip(1 + 4 * (LATENTS - 1))}
    with tempfile.TemporaryDirectory() as tmp:
        for name, frames in clips.items():
            started = time.perf_counter()
            video.write_mp4(Path(tmp) / f"{name}-shipped.mp4", frames, 16.0)   # as a slot writes it
            shipped = time.perf_counter() - started
            emit({"bench": "slot_parts", "case": "encode", "clip": name, "variant": "shipped (write_mp4)",
                  "frames": int(frames.shape[0]), "seconds": round(shipped, 3),
                  "bytes": (Path(tmp) / f"{name}-shipped.mp4").stat().st_size})
            reference = video.read_frames(Path(tmp) / f"{name}-shipped.mp4")
            for threads, preset in VARIANTS:
                path = Path(tmp) / f"{name}-{threads}-{preset}.mp4"
                seconds = _encode(frames, path, threads, preset)
                again = Path(tmp) / f"{name}-{threads}-{preset}-again.mp4"
                _encode(frames, again, threads, preset)   # is the bitstream the same from one call to the next?
                got = video.read_frames(path)
                emit({"bench": "slot_parts", "case": "encode", "clip": name, "threads": threads or "auto",
                      "preset": preset, "seconds": round(seconds, 3), "bytes": path.stat().st_size,
                      "same_bytes_twice": path.read_bytes() == again.read_bytes(),
                      "psnr_vs_source_db": round(psnr(got, frames), 2),
                      "same_frames_as_shipped": bool(torch.equal(got, reference))})


def main(argv: list[str]) -> None:
    cases = [a for a in argv if a != "variants"] or ["decode", "encode"]
    decoded = decode_case() if "decode" in cases else None
    if "encode" in cases:
        encode_case(decoded)


if __name__ == "__main__":
    main(sys.argv[1:])
