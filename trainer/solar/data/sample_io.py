"""Reading and writing pre-encoded samples (format: ``layout.py``) in tar shards or plain files."""

from __future__ import annotations

import io
import os
import tarfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from solar.data.layout import (
    CAMERA_DTYPES,
    FLOAT_DTYPES,
    METADATA_KEYS,
    SAMPLE_SCHEMA,
    Layout,
    latent_start,
)
from solar.data.rows import Row
from solar.safetensors_io import encode as encode_safetensors
from solar.errors import DataError


@dataclass
class Sample:
    """One pre-encoded sample as stored (full length, absolute cameras)."""

    latents: torch.Tensor
    prompt_embeds: torch.Tensor
    c2w: torch.Tensor
    metadata: dict[str, str]
    image_condition: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"latents": self.latents, "prompt_embeds": self.prompt_embeds, "c2w": self.c2w}
        if self.image_condition is not None:
            out["image_condition"] = self.image_condition
        return out


def encode_sample(sample: Sample) -> bytes:
    missing = [k for k in METADATA_KEYS if k not in sample.metadata]
    if missing:
        raise ValueError(f"sample metadata lacks {', '.join(missing)}")
    return encode_safetensors(sample.tensors(), dict(sample.metadata))


def _metadata_of(blob: bytes) -> dict[str, str]:
    import json
    import struct

    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    return header.get("__metadata__") or {}


def decode_sample(blob: bytes, where: str) -> Sample:
    try:
        tensors = st_load(blob)
        metadata = _metadata_of(blob)
    except (SafetensorError, ValueError, KeyError) as exc:
        raise DataError(f"{where}: not a readable safetensors sample ({exc})") from None
    for name in ("latents", "prompt_embeds", "c2w"):
        if name not in tensors:
            raise DataError(f"{where}: sample lacks tensor {name!r}")
    return Sample(tensors["latents"], tensors["prompt_embeds"], tensors["c2w"], metadata,
                  tensors.get("image_condition"))


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def validate_sample(sample: Sample, layout: Layout, where: str) -> None:
    """Shapes, dtypes and finiteness against the family layout; metadata consistency."""
    meta = sample.metadata
    if meta.get("schema") != SAMPLE_SCHEMA:
        raise DataError(f"{where}: metadata schema {meta.get('schema')!r}, expected {SAMPLE_SCHEMA}")
    if meta.get("family") != layout.family:
        raise DataError(f"{where}: sample family {meta.get('family')!r} does not match {layout.family}")
    try:
        frames = int(meta["num_frames"])
    except (KeyError, ValueError):
        raise DataError(f"{where}: metadata num_frames missing or not an integer") from None
    lat = sample.latents
    expected_t = layout.latent_frames(frames)
    checks = [
        (lat.dim() == 4, f"latents must be [C, T, h, w], got {list(lat.shape)}"),
        (_dtype_name(lat) in FLOAT_DTYPES, f"latents dtype {_dtype_name(lat)} not in {FLOAT_DTYPES}"),
    ]
    for ok, message in checks:
        if not ok:
            raise DataError(f"{where}: {message}")
    want = [layout.latent_channels, expected_t, layout.latent_height, layout.latent_width]
    if expected_t is None or list(lat.shape) != want:
        raise DataError(f"{where}: latents shape {list(lat.shape)}, expected {want} for {layout.family} "
                        f"at {layout.latent_height}x{layout.latent_width} latents and {frames} frames")
    emb = sample.prompt_embeds
    if emb.dim() != 2 or emb.shape[1] != layout.text_dim or emb.shape[0] < 1:
        raise DataError(f"{where}: prompt_embeds shape {list(emb.shape)}, expected [L, {layout.text_dim}]")
    if _dtype_name(emb) not in FLOAT_DTYPES:
        raise DataError(f"{where}: prompt_embeds dtype {_dtype_name(emb)} not in {FLOAT_DTYPES}")
    cam = sample.c2w
    if list(cam.shape) != [frames, 4, 4]:
        raise DataError(f"{where}: c2w shape {list(cam.shape)}, expected [{frames}, 4, 4]")
    if _dtype_name(cam) not in CAMERA_DTYPES:
        raise DataError(f"{where}: c2w dtype {_dtype_name(cam)} not in {CAMERA_DTYPES}")
    if layout.image_condition_channels is not None:
        cond = sample.image_condition
        want_c = [layout.image_condition_channels, *want[1:]]
        if cond is None or list(cond.shape) != want_c:
            got = None if cond is None else list(cond.shape)
            raise DataError(f"{where}: image_condition shape {got}, expected {want_c}")
    elif sample.image_condition is not None:
        raise DataError(f"{where}: {layout.family} samples carry no image_condition")
    for name, tensor in sample.tensors().items():
        if not bool(torch.isfinite(tensor).all()):
            raise DataError(f"{where}: tensor {name} has non-finite values")
    bottom = cam[:, 3, :].to(torch.float64)
    if not torch.allclose(bottom, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64).expand_as(bottom),
                          atol=1e-5):
        raise DataError(f"{where}: c2w bottom rows must be [0, 0, 0, 1]")


@dataclass
class Clip:
    """A training/validation clip cut from a sample at a start frame."""

    latents: torch.Tensor          # [C, T_clip, h, w]
    prompt_embeds: torch.Tensor    # [L, D]
    c2w: torch.Tensor              # [F_clip, 4, 4] absolute (stored convention)
    image_condition: torch.Tensor | None
    sample_id: str
    key: str
    start_frame: int
    fps: float


def cut_clip(sample: Sample, layout: Layout, *, start_frame: int, pixel_frames: int, where: str) -> Clip:
    frames = int(sample.metadata["num_frames"])
    if start_frame + pixel_frames > frames:
        raise DataError(f"{where}: clip [{start_frame}, {start_frame + pixel_frames}) exceeds the "
                        f"sample's {frames} frames")
    t0 = latent_start(layout.family, start_frame)
    t_len = layout.latent_frames(pixel_frames)
    if t_len is None or t0 + t_len > sample.latents.shape[1]:
        raise DataError(f"{where}: {pixel_frames} pixel frames from {start_frame} do not map onto the "
                        f"sample's {sample.latents.shape[1]} latents")
    cond = None if sample.image_condition is None else sample.image_condition[:, t0:t0 + t_len]
    return Clip(sample.latents[:, t0:t0 + t_len], sample.prompt_embeds,
                sample.c2w[start_frame:start_frame + pixel_frames], cond,
                sample.metadata.get("sample_id", ""), sample.metadata.get("key", ""), start_frame,
                float(sample.metadata.get("fps") or 0.0))


# --- shards ------------------------------------------------------------------------------------

def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    return info


@dataclass
class ShardWriter:
    """Writes an uncompressed, deterministic tar shard; reports each member's data offset."""

    path: Path
    members: list[tuple[str, int, int]] = field(default_factory=list)  # name, offset, size

    def __post_init__(self) -> None:
        self._handle = open(self.path, "xb")  # noqa: SIM115 (closed in close())
        self._tar = tarfile.open(fileobj=self._handle, mode="w", format=tarfile.USTAR_FORMAT)

    def add(self, name: str, data: bytes) -> tuple[int, int]:
        info = _tarinfo(name, len(data))
        header = len(info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape"))
        offset = self._tar.offset + header
        self._tar.addfile(info, io.BytesIO(data))
        self.members.append((name, offset, len(data)))
        return offset, len(data)

    def close(self) -> int:
        self._tar.close()
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        return self.path.stat().st_size


class ShardReader:
    """Reads sample blobs by index row: offsets when the row has them, else the tar's headers
    (cached per shard). Checks containment under the root and the declared shard size."""

    def __init__(self, root: str | os.PathLike[str], cache_shards: int = 64) -> None:
        self.root = Path(root)
        self._real_root = self.root.resolve()
        self._members: OrderedDict[str, dict[str, tuple[int, int]]] = OrderedDict()
        self._cache = cache_shards

    def path_of(self, row: Row) -> Path:
        path = (self.root / row.shard).resolve()
        if path != self._real_root and self._real_root not in path.parents:
            raise DataError(f"shard {row.shard} (sample_id {row.sample_id!r}) resolves outside the data "
                            f"root {self.root}")
        return path

    def read(self, row: Row) -> bytes:
        path = self.path_of(row)
        where = f"shard {row.shard} (sample_id {row.sample_id!r})"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DataError(f"{where}: missing under {self.root}") from None
        if row.shard_size is not None and size != row.shard_size:
            raise DataError(f"{where}: size {size} bytes, index declares {row.shard_size}")
        if row.shard.endswith(".safetensors"):
            return path.read_bytes()
        member = row.member or f"{row.key}.safetensors"
        if row.member_offset is not None:
            offset, length = row.member_offset, row.member_size
        else:
            located = self._locate(path, row.shard).get(member)
            if located is None:
                raise DataError(f"{where}: no member {member!r} in the shard")
            offset, length = located
        with open(path, "rb") as handle:
            handle.seek(offset)
            blob = handle.read(length)
        if len(blob) != length:
            raise DataError(f"{where}: member {member!r} is truncated ({len(blob)} of {length} bytes)")
        return blob

    def _locate(self, path: Path, shard: str) -> dict[str, tuple[int, int]]:
        members = self._members.get(shard)
        if members is None:
            try:
                with tarfile.open(path, mode="r:") as tar:
                    members = {m.name: (m.offset_data, m.size) for m in tar.getmembers() if m.isfile()}
            except tarfile.TarError as exc:
                raise DataError(f"shard {shard}: not a readable tar ({exc})") from None
            self._members[shard] = members
            if len(self._members) > self._cache:
                self._members.popitem(last=False)
        else:
            self._members.move_to_end(shard)
        return members
