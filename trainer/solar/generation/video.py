"""H.264 MP4s through PyAV, written atomically and create-only; side-by-side comparisons."""

from __future__ import annotations

import os
import secrets
from fractions import Fraction
from pathlib import Path

import torch

from solar.errors import SolarError


X264_THREADS = 8


def to_uint8(pixels_3FHW: torch.Tensor) -> torch.Tensor:
    """[-1, 1] float [3, F, H, W] on any device -> uint8 [F, H, W, 3] on the CPU."""
    x = ((pixels_3FHW.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 3, 0).contiguous().cpu()


def side_by_side(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    frames = min(left.shape[0], right.shape[0])
    return torch.cat([left[:frames], right[:frames]], dim=2)


def check_writer() -> None:
    """Refuse, before any work, a launch whose validation or generation could not write its MP4s
    (PyAV missing, or built without the H.264 encoder): otherwise every slot fails after its
    generation, hours into a training run."""
    try:
        import av
    except ImportError as exc:
        raise SolarError(f"validation and solar infer write MP4 files through PyAV, which cannot be imported "
                         f"({exc}); install it: pip install 'av>=12' (part of solar's trainer extra)") from None
    try:
        av.codec.Codec("libx264", "w")
    except Exception as exc:  # noqa: BLE001 - PyAV's UnknownCodecError and the like
        raise SolarError(f"this PyAV has no H.264 encoder (libx264: {exc}); install PyAV's wheels from PyPI, "
                         f"which include it") from None


def write_mp4(path: Path, frames_FHW3: torch.Tensor, fps: float, *, threads: int | None = None,
              preset: str = "veryfast") -> None:
    """H.264 at CRF 18 (``threads``: x264's thread count, X264_THREADS when None; 0 lets x264 choose)."""
    import av

    if path.exists():
        raise FileExistsError(f"{path} exists; videos are never overwritten")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    F, H, W, _ = frames_FHW3.shape
    container = av.open(str(tmp), mode="w", format="mp4")
    try:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        # A fixed thread count and no macroblock-tree rate control: with mb-tree on, x264 gave
        # different bitstreams for the same frames from one call to the next (measured), and x264's
        # output depends on its thread count, so a count taken from the machine's cores would differ
        # between machines; validation and `solar infer` must decode to the same frames. One 237-frame
        # 480x864 clip: 28 s single-threaded at medium, 2.0 s at veryfast with x264's own thread choice
        # (16 cores, H200 machine); a slot's two MP4s at veryfast with X264_THREADS: 2.6 s (H100
        # machine; bench/RESULTS.md).
        stream.codec_context.thread_count = X264_THREADS if threads is None else threads
        stream.options = {"crf": "18", "preset": preset, "x264-params": "mbtree=0"}
        array = frames_FHW3.numpy()
        for i in range(F):
            frame = av.VideoFrame.from_ndarray(array[i], format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    finally:
        container.close()
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.link(tmp, path)
    tmp.unlink()


def read_frames(path: Path) -> torch.Tensor:
    import av

    with av.open(str(path)) as container:
        frames = [torch.from_numpy(f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    return torch.stack(frames)
