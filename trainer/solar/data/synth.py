"""``solar data synth``: a small synthetic pre-encoded world whose content follows the camera.

Each sample is a moving camera (constant velocity with a slow yaw) looking at a per-sample field
of sinusoids on the latent grid. Latent frame j shows the field shifted by the camera's
translation relative to frame 0 (and rotated by its yaw), so the motion of the content is a
deterministic function of the camera track: a tiny model conditioned on the camera can learn it,
and validation videos show it. The prompt embedding encodes the field's parameters. Everything is
drawn from ``--seed``; the output is written to a hidden sibling and renamed into place when
complete.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from solar.config import families
from solar.config.canonical import pretty_bytes
from solar.data.layout import (
    A14B_CONDITION_CHANNELS,
    AUDIO_SILENCE,
    H3_AUDIO_CHANNELS,
    H3_AUDIO_FEATURES,
    NEGATIVE_PROMPT,
    SAMPLE_SCHEMA,
)
from solar.data.sample_io import Sample, ShardWriter, encode_sample
from solar.errors import DataError
from solar.storage.atomic import fsync_dir

SYNTH_SCHEMA = "solar.synth.v1"
# (height, width) per family and profile; tiny matches configs/solar_wm/tiny.
RESOLUTION = {
    "tiny": {"wan22_ti2v_5b": (64, 96), "wan22_i2v_a14b": (32, 48), "ltx25_video": (128, 192),
             "minimax_h3": (64, 96)},
    "released": {"wan22_ti2v_5b": (480, 864), "wan22_i2v_a14b": (480, 832), "ltx25_video": (512, 768),
                 "minimax_h3": (768, 1344)},
}
FPS = {"wan22_ti2v_5b": 16.0, "wan22_i2v_a14b": 16.0, "ltx25_video": 24.0, "minimax_h3": 24.0}
PROMPT_TOKENS = {"tiny": 8, "released": 512}
ROWS_PER_SHARD = 4
WAVES = 4


def _yaw(theta: float) -> torch.Tensor:
    c, s = math.cos(theta), math.sin(theta)
    return torch.tensor([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]], dtype=torch.float64)


def camera_track(gen: torch.Generator, frames: int, fps: float) -> torch.Tensor:
    """[F, 4, 4] camera-to-world: constant velocity (0.3-1.0 units/s) and yaw rate (<= 10 deg/s),
    from a random start pose."""
    direction = torch.randn(3, generator=gen, dtype=torch.float64)
    direction /= direction.norm()
    speed = 0.3 + 0.7 * float(torch.rand(1, generator=gen, dtype=torch.float64))
    yaw_rate = math.radians(10.0) * (2 * float(torch.rand(1, generator=gen, dtype=torch.float64)) - 1)
    origin = torch.randn(3, generator=gen, dtype=torch.float64) * 2.0
    yaw0 = math.pi * (2 * float(torch.rand(1, generator=gen, dtype=torch.float64)) - 1)
    track = torch.zeros(frames, 4, 4, dtype=torch.float64)
    for f in range(frames):
        seconds = f / fps
        track[f, :3, :3] = _yaw(yaw0 + yaw_rate * seconds)
        track[f, :3, 3] = origin + direction * speed * seconds
        track[f, 3, 3] = 1.0
    return track


def render_latents(params: dict[str, torch.Tensor], rel: torch.Tensor, *, channels: int, latents: int,
                   height: int, width: int) -> torch.Tensor:
    """[C, T, h, w]: the sample's sinusoid field seen from the camera at each latent frame."""
    frames = rel.shape[0]
    ys = torch.arange(height, dtype=torch.float64) / max(height, 1)
    xs = torch.arange(width, dtype=torch.float64) / max(width, 1)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    out = torch.zeros(channels, latents, height, width, dtype=torch.float64)
    for j in range(latents):
        f = round(j * (frames - 1) / max(latents - 1, 1))
        t = rel[f, :3, 3]
        yaw = math.atan2(float(rel[f, 0, 2]), float(rel[f, 0, 0]))
        # Lateral motion pans the field, forward motion zooms it, yaw pans it further.
        zoom = math.exp(0.15 * float(t[2]))
        u = 0.25 * float(t[0]) + 0.5 * yaw
        v = 0.25 * float(t[1])
        x = (grid_x - 0.5) * zoom + 0.5 + u
        y = (grid_y - 0.5) * zoom + 0.5 + v
        phase = (2 * math.pi) * (params["fx"][:, None, None] * x + params["fy"][:, None, None] * y)
        waves = torch.sin(phase[None] + params["phi"][:, :, None, None])  # [C, K, h, w]
        out[:, j] = (params["amp"][:, :, None, None] * waves).sum(dim=1)
    return out


def _sample(index: int, split: str, family: str, *, seed: int, profile: str, frames: int,
            height: int, width: int, fps: float, text_dim: int, tokens: int,
            prompt_basis: torch.Tensor, dtype: torch.dtype) -> Sample:
    spec = families.spec(family)
    gen = torch.Generator().manual_seed(_seed_of(seed, split, index))
    channels = spec.vae.channels
    lh, lw = height // spec.vae.spatial, width // spec.vae.spatial
    t_lat = spec.vae.latent_frames(frames)
    params = {
        "fx": torch.randint(1, 3, (WAVES,), generator=gen).to(torch.float64),
        "fy": torch.randint(0, 3, (WAVES,), generator=gen).to(torch.float64),
        "phi": torch.rand(channels, WAVES, generator=gen, dtype=torch.float64) * 2 * math.pi,
        "amp": torch.randn(channels, WAVES, generator=gen, dtype=torch.float64) / math.sqrt(WAVES / 2),
    }
    c2w = camera_track(gen, frames, fps)
    rel = torch.linalg.inv(c2w) @ c2w[0]
    latents = render_latents(params, rel, channels=channels, latents=t_lat, height=lh, width=lw)
    code = torch.cat([params["fx"], params["fy"], params["phi"][:4].flatten().cos(),
                      params["amp"][:4].flatten()]).to(torch.float32)
    code = torch.nn.functional.pad(code, (0, max(0, prompt_basis.shape[0] - code.numel())))
    code = code[: prompt_basis.shape[0]]
    positions = torch.arange(tokens, dtype=torch.float32)[:, None] / tokens
    prompt = (code @ prompt_basis)[None, :] * (1.0 + positions)  # [L, D]
    image_condition = None
    if family == "wan22_i2v_a14b":
        image_condition = torch.zeros(A14B_CONDITION_CHANNELS, t_lat, lh, lw, dtype=torch.float64)
        image_condition[:4, 0] = 1.0
        image_condition[4:, 0] = latents[:, 0]
    key = f"{split}-{index:06d}"
    caption = (f"synthetic field fx={params['fx'].tolist()} fy={params['fy'].tolist()} seen from a "
               "moving camera")
    metadata = {"schema": SAMPLE_SCHEMA, "family": family, "sample_id": f"synth-{key}", "key": key,
                "num_frames": str(frames), "fps": str(fps), "height": str(height), "width": str(width),
                "caption": caption}
    return Sample(latents.to(dtype), prompt.to(dtype), c2w.to(torch.float32), metadata,
                  None if image_condition is None else image_condition.to(dtype))


def _seed_of(seed: int, split: str, index: int) -> int:
    import hashlib

    digest = hashlib.blake2s(f"synth|{seed}|{split}|{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"--out {out} exists and is not an empty directory; choose a new directory "
                        "(nothing was written)")
    if out.parent.exists() and not out.parent.is_dir():
        raise DataError(f"--out {out}: {out.parent} is not a directory")


def synthesize(family: str, out: str | os.PathLike[str], *, samples: int = 8, seed: int = 0,
               profile: str = "tiny", progress: Callable[[str], None] = lambda _: None) -> dict:
    canonical = families.canonical_family(family)
    if canonical is None:
        raise DataError(families.not_a_family(family))
    if profile not in RESOLUTION:
        raise DataError(f"--profile {profile!r}: use tiny or released")
    if samples < 1:
        raise DataError(f"--samples must be >= 1, got {samples}")
    if seed < 0:
        raise DataError(f"--seed must be >= 0, got {seed}")
    out = Path(out)
    _check_out(out)
    spec = families.spec(canonical)
    frames = max(f for fs in spec.frame_profiles.values() for f in fs)
    height, width = RESOLUTION[profile][canonical]
    fps = FPS[canonical]
    text_dim = spec.dims(profile).text_dim
    tokens = PROMPT_TOKENS[profile]
    dtype = torch.float32 if profile == "tiny" else torch.bfloat16
    basis_gen = torch.Generator().manual_seed(_seed_of(seed, "prompt-basis", 0))
    prompt_basis = torch.randn(32, text_dim, generator=basis_gen) / math.sqrt(32)
    counts = {"train": samples, "test": max(2, samples // 4)}

    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.{secrets.token_hex(4)}.partial"
    work.mkdir()
    try:
        (work / "shards").mkdir()
        for split, count in counts.items():
            rows = []
            writer: ShardWriter | None = None
            shard_rel = ""
            for i in range(count):
                if i % ROWS_PER_SHARD == 0:
                    if writer is not None:
                        _finish_shard(writer, shard_rel, rows)
                    shard_rel = f"shards/{split}-{i // ROWS_PER_SHARD:06d}.tar"
                    writer = ShardWriter(work / shard_rel)
                sample = _sample(i, split, canonical, seed=seed, profile=profile, frames=frames,
                                 height=height, width=width, fps=fps, text_dim=text_dim, tokens=tokens,
                                 prompt_basis=prompt_basis, dtype=dtype)
                member = f"{sample.metadata['key']}.safetensors"
                offset, size = writer.add(member, encode_sample(sample))
                rows.append({"sample_id": sample.metadata["sample_id"], "key": sample.metadata["key"],
                             "shard": shard_rel, "member": member, "member_offset": offset,
                             "member_size": size, "family": canonical, "num_frames": frames,
                             "fps": fps, "height": height, "width": width,
                             "caption": sample.metadata["caption"], "dataset": "solar-synth"})
                progress(f"solar: synth {canonical} {split} {i + 1}/{count}")
            _finish_shard(writer, shard_rel, rows)
            _write_index(work / f"{split}-index.jsonl.gz", rows)
        _write_support(work, canonical, seed=seed, tokens=tokens, text_dim=text_dim,
                       latents=spec.vae.latent_frames(frames), prompt_basis=prompt_basis, dtype=dtype)
        summary = {"schema": SYNTH_SCHEMA, "family": canonical, "profile": profile, "seed": seed,
                   "samples": counts, "pixel_frames": frames, "height": height, "width": width,
                   "fps": fps, "latent_channels": spec.vae.channels, "text_dim": text_dim,
                   "prompt_tokens": tokens, "train_index": "train-index.jsonl.gz",
                   "test_index": "test-index.jsonl.gz", "out": str(out)}
        _write_file(work / "dataset.json", pretty_bytes(summary))
        fsync_dir(work / "shards")
        fsync_dir(work)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(work, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return summary


def _finish_shard(writer: ShardWriter, shard_rel: str, rows: list[dict]) -> None:
    size = writer.close()
    for row in rows:
        if row["shard"] == shard_rel:
            row["shard_size"] = size


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _write_index(path: Path, rows: list[dict]) -> None:
    lines = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode()
    _write_file(path, gzip.compress(lines, mtime=0))


def _write_support(work: Path, family: str, *, seed: int, tokens: int, text_dim: int, latents: int,
                   prompt_basis: torch.Tensor, dtype: torch.dtype) -> None:
    from solar.safetensors_io import encode as save

    (work / "conditioning").mkdir()
    gen = torch.Generator().manual_seed(_seed_of(seed, "negative-prompt", 0))
    negative = (torch.randn(tokens, text_dim, generator=gen) * 0.5).to(dtype)
    _write_file(work / NEGATIVE_PROMPT, save({"prompt_embeds": negative},
                                             metadata={"schema": "solar.conditioning.v1"}))
    if family == "minimax_h3":
        (work / "support").mkdir()
        gen = torch.Generator().manual_seed(_seed_of(seed, "audio-silence", 0))
        silence = (torch.randn(H3_AUDIO_CHANNELS, latents, H3_AUDIO_FEATURES, generator=gen) * 0.05).to(dtype)
        _write_file(work / AUDIO_SILENCE, save({"audio_latents": silence},
                                               metadata={"schema": "solar.support.v1"}))
