"""Models built without a whole copy on any rank.

A role is built on the meta device, parallelism is applied to it there (SP, activation
checkpointing, compile, FSDP2), and only then ``materialize`` allocates each rank's own shards on
its device and fills them from lazy weight sources, each rank reading only its rows of each tensor
(safetensors' sliced reads). Host memory at start-up is therefore about one tensor beyond the rank's
shard. Sources:

- ``released(family, path)``: a base model: a Solar directory (``solar model convert``), a Solar
  checkpoint or export (``solar.launch.base_weights``) or a diffusers folder;
- ``checkpoint(path, role, which)``: a checkpoint member's live weights, the EMA laid over them,
  from whole files or from every rank's shards of a sharded save (``shards``);
- ``module_tensors(model)``: a model already in memory (the seeded random init, built whole on the
  host as before so its parameters are the same; the only path that holds a full copy).

Tensors a source lacks may be made on the spot: AnyFlow's endpoint embedding copied from the time
embedding (Stage0.5 -> Stage1), and LoRA adapters on a released base (``lora_A`` Kaiming-uniform
from a generator seeded by the run's seed and the tensor's name, ``lora_B`` zeros), the same on every
rank. Everything else missing, extra or of another shape is an error naming the keys.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from solar.launch import base_weights
from solar.models.weights import DELTA_PREFIX, WeightsError, compare_keys, read_solar_manifest, safetensors_header
from solar.storage.checkpoints import CheckpointError

# AnyFlow's endpoint embedding and the time embedding it starts from, per family's naming.
DELTA_FROM = {"condition_embedder.delta_embedding.": "condition_embedder.time_embedder.",
              "delta_embedding.": "time_embedder."}


@dataclass(frozen=True)
class Lazy:
    """One tensor of a source, read whole or by rows: a safetensors member, a tensor in memory, or
    the row pieces of a sharded checkpoint's tensor (``chunks``: (file, key, first row, end row))."""

    shape: tuple[int, ...]
    file: Path | None = None
    key: str | None = None
    tensor: torch.Tensor | None = None
    chunks: tuple[tuple[Path, str, int, int], ...] | None = None
    dtype: str | None = None   # the stored dtype's safetensors name (F32, BF16, ...) where a header gives it

    def read_like(self, like: torch.Tensor) -> torch.Tensor:
        """A new tensor laid out like ``like`` (this rank's rows of a sharded one) holding this one."""
        out = torch.empty_like(like)
        local = local_part(out)
        local.copy_(self.read(local_rows(like)).to(device=local.device, dtype=local.dtype))
        return out

    def read(self, rows: tuple[int, int] | None = None) -> torch.Tensor:
        if self.tensor is not None:
            return self.tensor if rows is None else self.tensor[rows[0]:rows[1]]
        if self.chunks is not None:
            return self._assemble(rows)
        with safe_open(str(self.file), framework="pt") as handle:
            if rows is None:
                return handle.get_tensor(self.key)
            return handle.get_slice(self.key)[rows[0]:rows[1]]

    def _assemble(self, rows: tuple[int, int] | None) -> torch.Tensor:
        """Rows ``rows`` (all when None) from the pieces that hold them, each read by its own rows."""
        if not self.shape:
            file, key, _, _ = self.chunks[0]
            with safe_open(str(file), framework="pt") as handle:
                return handle.get_tensor(key)
        lo, hi = rows if rows is not None else (0, self.shape[0])
        pieces = []
        for file, key, start, end in self.chunks:
            a, b = max(lo, start), min(hi, end)
            if a < b:
                with safe_open(str(file), framework="pt") as handle:
                    pieces.append(handle.get_slice(key)[a - start:b - start])
        if not pieces:
            return torch.empty((0, *self.shape[1:]))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def members(file: Path) -> dict[str, Lazy]:
    """Every tensor of one safetensors file, lazily."""
    header = safetensors_header(file)
    return {k: Lazy(tuple(v["shape"]), file, k, dtype=v["dtype"]) for k, v in header.items() if k != "__metadata__"}


def released(family: str, path: str) -> dict[str, Lazy]:
    """A base model (``model.pretrained_path``), read lazily: a Solar directory, a Solar checkpoint or
    export or one of its weight files (``solar.launch.base_weights``), or a diffusers release. A
    WeightsError names what the path is when it is none of them."""
    solar = base_weights.solar_source(path)
    if solar is not None:
        problem = base_weights.family_problem(solar, family)
        if problem:
            raise base_weights.refusal(path, problem)
        return checkpoint(solar.checkpoint, solar.role, solar.weights)
    problem = base_weights.plain_problem(path)
    if problem:
        raise base_weights.refusal(path, problem)
    root = Path(path)
    if (root / "solar-model.json").is_file():
        out: dict[str, Lazy] = {}
        for entry in read_solar_manifest(root)["files"]:
            out.update(members(root / entry["path"]))
        return out
    from solar.models.convert import plan

    try:
        _, source, mapping, _ = plan(family, "diffusers", root)
    except WeightsError as exc:
        raise base_weights.refusal(path, f"not Solar's layout (no solar-model.json, not a Solar checkpoint's "
                                         f"files) and not a {family} diffusers release: {exc}") from None
    out = {}
    for target, origin in mapping.items():
        file = source.files[origin]
        shape = tuple(source.shapes[origin][1])
        out[target] = Lazy(shape, file, origin) if file.suffix == ".safetensors" else Lazy(shape, tensor=source.get(origin))
    return out


def shards(path: Path) -> dict[str, Lazy]:
    return _shards(str(Path(path).resolve()))


@functools.lru_cache(maxsize=4)   # a committed checkpoint never changes; one load asks for each role's kinds
def _shards(path: str) -> dict[str, Lazy]:
    """Every tensor of a sharded checkpoint (``solar.train.checkpoint_shards``) by its checkpoint name,
    each assembled from the row pieces its ranks wrote (``storage.checkpoints.shard_pieces``): any
    number of ranks at any sharding reads back just its own rows."""
    from solar.storage.checkpoints import SHARDS_DIR, shard_pieces

    root = Path(path)
    files = sorted(f"{SHARDS_DIR}/{f.name}" for f in (root / SHARDS_DIR).glob("*.safetensors"))
    layout, pieces, problems = shard_pieces(root, files)
    missing = sorted(set(layout) - set(pieces))
    if problems or missing:
        raise CheckpointError(f"{root}: its shards do not make the checkpoint: "
                              f"{'; '.join(problems[:2]) or f'{len(missing)} tensors missing, e.g. {missing[:2]}'}")
    return {k: Lazy(tuple(v["shape"]), chunks=tuple((root / rel, k, lo, hi) for rel, lo, hi in pieces[k]),
                    dtype=v["dtype"]) for k, v in layout.items()}


def role_tensors(path: Path, role: str, kind: str) -> dict[str, Lazy]:
    """One role's ``kind`` (live, ema or optimizer) from a checkpoint of either layout: whole files
    (``<role>/<kind>.safetensors``) or every rank's shards; {} when the checkpoint has none."""
    path = Path(path)
    from solar.storage.checkpoints import SHARDS_LAYOUT

    if (path / SHARDS_LAYOUT).is_file():
        prefix = f"{role}/{kind}/"
        return {k[len(prefix):]: v for k, v in shards(path).items() if k.startswith(prefix)}
    file = path / role / f"{kind}.safetensors"
    return members(file) if file.is_file() else {}


def checkpoint(path: Path, role: str, which: str) -> dict[str, Lazy]:
    """A checkpoint's ``role`` member, ``which`` live or ema (the EMA shadow over the live weights)."""
    out = role_tensors(path, role, "live")
    if not out:
        raise CheckpointError(f"{path} has no {role} weights ({role}/live.safetensors or shards)")
    if which == "ema":
        ema = role_tensors(path, role, "ema")
        if not ema:
            raise CheckpointError(f"{path} has no {role} EMA weights; use weights: live")
        out.update(ema)
    return out


def module_tensors(model: torch.nn.Module) -> dict[str, Lazy]:
    return {k: Lazy(tuple(v.shape), tensor=v.detach()) for k, v in model.state_dict().items()}


def local_rows(t: torch.Tensor) -> tuple[int, int] | None:
    """The rows of the full tensor this rank holds: None for a whole (unsharded or replicated)
    tensor; FSDP2 shards dim 0 like ``torch.chunk`` over each sharded mesh dimension."""
    placements = getattr(t, "placements", None)
    if placements is None:
        return None
    start, rows = 0, t.shape[0]
    coordinate = t.device_mesh.get_coordinate()
    for dim, placement in enumerate(placements):
        if placement.is_replicate():
            continue
        if not placement.is_shard(0):
            raise ValueError(f"cannot place {placement} (FSDP2 shards dim 0)")
        size = t.device_mesh.size(dim)
        chunk = -(-rows // size)
        lo = min(coordinate[dim] * chunk, rows)
        start, rows = start + lo, min(chunk, rows - lo)
    return start, start + rows


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) tensor; any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _lora_value(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A fresh adapter factor, seeded by the run's seed and its name as a single-role model has it (so
    every role of a shared base starts as its own model would)."""
    from solar.models.lora import single_name

    value = torch.zeros(shape)
    if ".lora_A." in name:
        digest = hashlib.blake2s(f"{seed}:{single_name(name)}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
        torch.nn.init.kaiming_uniform_(value, a=math.sqrt(5), generator=generator)
    return value


def completed(state: Mapping[str, torch.Tensor], tensors: Mapping[str, Lazy], *, where: str,
              init_delta_from_time: bool = False, drop_delta: bool = False,
              lora_seed: int | None = None, values: bool = True) -> dict[str, Lazy]:
    """``tensors`` as ``fill`` loads them into a model of ``state`` (its state dict: shapes only, a meta
    model will do): AnyFlow's endpoint embedding from the time embedding, fresh LoRA factors (their
    shapes alone without ``values``: a launch's checks); a WeightsError naming what is missing, extra or
    of another shape."""
    tensors = dict(tensors)
    if drop_delta:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(DELTA_PREFIX)}
    expected = {k: tuple(v.shape) for k, v in state.items()}
    made: dict[str, Lazy] = {}
    for name in expected.keys() - tensors.keys():
        if init_delta_from_time:
            delta = next((d for d in DELTA_FROM if name.startswith(d)), None)
            origin = delta and DELTA_FROM[delta] + name[len(delta):]
            if origin in tensors:
                made[name] = tensors[origin]
                continue
        if lora_seed is not None and (".lora_A." in name or ".lora_B." in name):
            made[name] = Lazy(expected[name], tensor=_lora_value(name, expected[name], lora_seed) if values else None)
    tensors.update(made)
    report = compare_keys(expected, {k: v.shape for k, v in tensors.items()})
    if not report.ok:
        raise WeightsError(f"{where} do not fit the model: {report.summary()}")
    return tensors


def fill(model: torch.nn.Module, tensors: Mapping[str, Lazy], *, where: str, init_delta_from_time: bool = False,
         drop_delta: bool = False, lora_seed: int | None = None) -> None:
    """Every parameter and buffer of a materialised ``model`` from ``tensors``, each rank its rows."""
    state = model.state_dict(keep_vars=True)
    tensors = completed(state, tensors, where=where, init_delta_from_time=init_delta_from_time,
                        drop_delta=drop_delta, lora_seed=lora_seed)
    with torch.no_grad():
        for name, target in state.items():
            local = local_part(target)
            rows = local_rows(target)
            value = tensors[name].read(rows)
            local.copy_(value.to(device=local.device, dtype=local.dtype))


def materialize(model: torch.nn.Module, device: torch.device, tensors: Mapping[str, Lazy], **options) -> None:
    """Allocate ``model``'s (local) tensors on ``device`` and fill them (``fill``'s options)."""
    model.to_empty(device=device)
    fill(model, tensors, **options)
