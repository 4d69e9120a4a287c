"""Weight files: reading released checkpoints safely, writing and reading Solar's layout.

Solar's layout (``solar.model.v1``) is a directory with ``solar-model.json`` (family, dims, source,
files with sizes, parameter count) and safetensors shards ``model-NNNNN-of-NNNNN.safetensors``
(at most ``SHARD_BYTES`` each) whose tensor names are the Solar module's state-dict keys. Sources
are read tensor by tensor (safetensors, or ``torch.load(weights_only=True)`` for ``.pth``/``.pt``:
never arbitrary unpickling), and the output is built in a hidden sibling and renamed into place.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from solar.config.canonical import pretty_bytes
from solar.errors import SolarError
from solar.safetensors_io import write_streaming
from solar.storage.atomic import fsync_dir

MODEL_SCHEMA = "solar.model.v1"
MANIFEST = "solar-model.json"
SHARD_BYTES = 4 << 30


class WeightsError(SolarError):
    """A weight source is missing, unreadable or does not match the model."""


@dataclass
class TensorSource:
    """Lazy access to the tensors of one checkpoint (one or many files)."""

    files: dict[str, Path]                 # tensor name -> file
    shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    _loaded: dict[Path, dict[str, torch.Tensor]]

    def names(self) -> list[str]:
        return sorted(self.files)

    def get(self, name: str) -> torch.Tensor:
        path = self.files[name]
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as handle:
                return handle.get_tensor(name)
        return self._loaded[path][name]


_DTYPE_NAMES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                "U8": torch.uint8, "BOOL": torch.bool}


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return json.loads(handle.read(length))


def open_source(path: str | os.PathLike[str]) -> TensorSource:
    """Every ``*.safetensors`` (or ``*.pth``/``*.pt``) file of a directory, or one such file."""
    root = Path(path)
    if not root.exists():
        raise WeightsError(f"weights {root}: no such file or directory")
    candidates = [root] if root.is_file() else sorted(
        p for p in root.iterdir() if p.suffix in (".safetensors", ".pth", ".pt") and p.is_file())
    if not candidates:
        raise WeightsError(f"weights {root}: no .safetensors, .pth or .pt files")
    files: dict[str, Path] = {}
    shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    loaded: dict[Path, dict[str, torch.Tensor]] = {}
    for file in candidates:
        if file.suffix == ".safetensors":
            try:
                header = safetensors_header(file)
            except (OSError, ValueError) as exc:
                raise WeightsError(f"weights {file}: not a readable safetensors file ({exc})") from None
            entries = {k: (_DTYPE_NAMES[v["dtype"]], tuple(v["shape"])) for k, v in header.items()
                       if k != "__metadata__"}
        else:
            try:
                state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # noqa: BLE001 - report any unpickling refusal as one line
                raise WeightsError(f"weights {file}: not loadable with weights_only=True ({exc})") from None
            if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
                state = state["state_dict"]
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise WeightsError(f"weights {file}: expected a mapping of tensor names to tensors")
            loaded[file] = state
            entries = {k: (v.dtype, tuple(v.shape)) for k, v in state.items()}
        for name, spec in entries.items():
            if name in files:
                raise WeightsError(f"weights {root}: tensor {name!r} appears in {files[name].name} and {file.name}")
            files[name], shapes[name] = file, spec
    return TensorSource(files, shapes, loaded)


@dataclass(frozen=True)
class KeyReport:
    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]  # "name: source [shape] vs model [shape]"

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self, limit: int = 5) -> str:
        parts = []
        for label, keys in (("missing", self.missing), ("unexpected", self.unexpected),
                            ("shape mismatch", self.mismatched)):
            if keys:
                shown = ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")
                parts.append(f"{len(keys)} {label}: {shown}")
        return "; ".join(parts)


def compare_keys(expected: dict[str, tuple[int, ...]], got: dict[str, tuple[int, ...]]) -> KeyReport:
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    mismatched = sorted(f"{k}: source {list(got[k])} vs model {list(expected[k])}"
                        for k in set(expected) & set(got) if tuple(got[k]) != tuple(expected[k]))
    return KeyReport(missing, unexpected, mismatched)


def _shards(specs: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(specs):
        dtype, shape = specs[name]
        nbytes = torch.empty((), dtype=dtype).element_size() * int(torch.tensor(shape).prod().item() if shape else 1)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_solar(out: str | os.PathLike[str], specs: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                load: Callable[[str], torch.Tensor], manifest: dict,
                progress: Callable[[str], None] = lambda _: None) -> dict:
    """Write Solar's layout to a new directory ``out`` (atomic rename from a hidden sibling)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WeightsError(f"--out {out} exists and is not empty; choose a new directory (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.{secrets.token_hex(4)}.partial"
    work.mkdir()
    try:
        groups = _shards(specs)
        files = []
        for i, names in enumerate(groups, 1):
            name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
            with open(work / name, "xb") as handle:
                size = write_streaming(handle, {n: specs[n] for n in names}, load,
                                       {"format": "pt", "schema": MODEL_SCHEMA})
                handle.flush()
                os.fsync(handle.fileno())
            files.append({"path": name, "size": size, "tensors": len(names)})
            progress(f"solar: wrote {name} ({size / 2**20:.1f} MiB, {len(names)} tensors)")
        document = {**manifest, "schema": MODEL_SCHEMA, "files": files,
                    "parameters": sum(int(torch.tensor(s).prod().item() if s else 1) for _, s in specs.values())}
        with open(work / MANIFEST, "xb") as handle:
            handle.write(pretty_bytes(document))
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(work)
        if out.exists():
            out.rmdir()
        os.rename(work, out)
        fsync_dir(out.parent)
        return document
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def read_solar_manifest(path: str | os.PathLike[str]) -> dict:
    manifest = Path(path) / MANIFEST
    try:
        document = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise WeightsError(f"{path}: no {MANIFEST}; not a Solar weights directory") from None
    except ValueError as exc:
        raise WeightsError(f"{manifest}: not valid JSON ({exc})") from None
    if document.get("schema") != MODEL_SCHEMA:
        raise WeightsError(f"{manifest}: schema {document.get('schema')!r}, expected {MODEL_SCHEMA}")
    for entry in document.get("files", []):
        file = Path(path) / entry["path"]
        if not file.is_file() or file.stat().st_size != entry["size"]:
            raise WeightsError(f"{path}: member {entry['path']} is missing or not {entry['size']} bytes")
    return document


def iter_solar_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, torch.Tensor]]:
    document = read_solar_manifest(path)
    for entry in document["files"]:
        with safe_open(str(Path(path) / entry["path"]), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


DELTA_PREFIX = ("condition_embedder.delta_embedding.", "delta_embedding.")  # Wan, H3


def load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor], *,
              init_delta_from_time: bool = False, drop_delta: bool = False, where: str = "weights") -> None:
    """Strictly load ``tensors`` into ``model``. AnyFlow's endpoint embedding may be initialised from
    the time embedding when the source lacks it (Stage0.5 -> Stage1) or dropped when the model
    lacks it (Stage1 EMA -> Stage2 student); anything else missing or extra is an error."""
    if drop_delta:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(DELTA_PREFIX)}
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    report = compare_keys(expected, {k: tuple(v.shape) for k, v in tensors.items()})
    missing = report.missing
    if init_delta_from_time:
        missing = [k for k in missing if not k.startswith(DELTA_PREFIX)]
    if missing or report.unexpected or report.mismatched:
        raise WeightsError(f"{where} do not fit the model: "
                           f"{KeyReport(missing, report.unexpected, report.mismatched).summary()}")
    model.load_state_dict(tensors, strict=False, assign=False)
    if init_delta_from_time and report.missing:
        model.init_delta_from_time()


def load_solar(model: torch.nn.Module, path: str | os.PathLike[str], **options) -> dict:
    """Load a Solar weights directory (``solar model convert`` output) into ``model``."""
    document = read_solar_manifest(path)
    load_into(model, dict(iter_solar_tensors(path)), where=str(path), **options)
    return document
