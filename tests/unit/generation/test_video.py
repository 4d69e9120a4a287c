"""H.264 outputs: reproducible bytes, create-only, decodable with the expected geometry."""

from __future__ import annotations

import pytest
import torch

from solar.generation import video


def _frames(seed: int, frames=17, h=32, w=48, grain=0.0):
    # smooth moving content, optionally with grain like an early checkpoint's samples
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(3, 1, h // 8, w // 8, generator=g)
    x = torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear")[:, 0]
    clip = torch.stack([torch.roll(x, shifts=i, dims=2) for i in range(frames)], dim=1) * 2 - 1
    return video.to_uint8(clip + grain * torch.randn(clip.shape, generator=g))


def test_the_same_frames_always_encode_to_the_same_bytes(tmp_path):
    # grainy moving content: x264's default macroblock-tree rate control gave a different bitstream
    # on most of 8 encodes of exactly this clip; the writer must not
    frames = _frames(0, frames=81, h=64, w=96, grain=0.2)
    for i in range(6):
        video.write_mp4(tmp_path / f"v{i}.mp4", frames, 16.0)
    assert len({(tmp_path / f"v{i}.mp4").read_bytes() for i in range(6)}) == 1


def test_side_by_side_decodes_with_double_width_and_every_frame(tmp_path):
    left, right = _frames(1), _frames(2)
    video.write_mp4(tmp_path / "compare.mp4", video.side_by_side(left, right), 24.0)
    decoded = video.read_frames(tmp_path / "compare.mp4")
    assert decoded.shape == (17, 32, 96, 3)
    assert (decoded[..., :48, :].float() - left.float()).abs().mean() < 6  # H.264 at crf 18: close to the input


def test_videos_are_never_overwritten(tmp_path):
    path = tmp_path / "generated.mp4"
    video.write_mp4(path, _frames(3), 16.0)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="never overwritten"):
        video.write_mp4(path, _frames(4), 16.0)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["generated.mp4"]


def test_to_uint8_maps_the_pixel_range():
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0]).view(1, 4, 1, 1).expand(3, 4, 1, 1)
    assert video.to_uint8(x)[:, 0, 0, 0].tolist() == [0, 128, 255, 255]


def test_a_pyav_without_the_h264_encoder_is_refused_with_the_fix(monkeypatch):
    import av

    from solar.errors import SolarError
    from solar.generation.video import check_writer

    check_writer()   # this machine's PyAV (PyPI's wheels) has libx264

    def no_codec(name, mode):
        raise av.codec.codec.UnknownCodecError(name)

    monkeypatch.setattr(av.codec, "Codec", no_codec)
    with pytest.raises(SolarError, match=r"this PyAV has no H.264 encoder \(libx264: .*install PyAV's wheels"):
        check_writer()
