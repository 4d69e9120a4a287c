"""Sharded checkpoint saves: under FSDP2 every rank writes its own shards, through
``torch.distributed.checkpoint`` (DCP) in its safetensors format.

Layout inside ``step_NNNNNNNN/`` beside today's whole files (``checkpoint_io``)::

    shards/shard-RRRRR-model-KKKKK-of-NNNNN.safetensors    rank R's file K of N (DCP's names; FILE_BYTES)
    shards.json                                            every tensor's dtype and full shape
    <role>/optimizer.json                                  hyperparameters, step counts, names
    trainer.json, rng/, data/                              as in a whole-file checkpoint

Tensors are named ``<role>/live/<param>``, ``<role>/ema/<param>`` and
``<role>/optimizer/<param>::<moment>``; each shard file's ``DCP_SHARDING_INFO`` metadata gives every
piece's offsets, so any number of ranks at any sharding reads back just its rows
(``launch.materialize.role_tensors``). DCP's planner writes a tensor replicated over ranks (a
``hybrid_shard`` replica, a buffer) once. The capture copies this rank's shards only into host
buffers (``stage``: ``Staging.copy`` of each DTensor's local shard) and wraps them as DTensors again, so DCP plans the save from their
placements and the write never touches the GPU or gathers a whole tensor. The save's collectives
run on a gloo group of their own (``Dist.checkpoint_group``), so a background write
(``runtime.async_checkpoint``) never races the training thread's collectives.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from solar.config.canonical import pretty_bytes
from solar.storage.checkpoints import SHARDS_DIR

# About what one rank's shard file holds at most: DCP's safetensors writer builds a whole file in
# memory (and copies it once more) before it writes it, so a rank's save holds its largest file twice
# beside its staged shards (bench/RESULTS.md: 2.1-2.8x the bytes a rank wrote when each rank wrote
# one file). Tensors are spread over files by their bytes per rank, the same mapping on every rank.
FILE_BYTES = 256 << 20
LAYOUT_SCHEMA = "solar.checkpoint-shards.v1"


def role_state(role: str, snap: dict) -> dict[str, torch.Tensor]:
    """One role's tensors under their checkpoint names (``checkpoint_io.snapshot``'s sharded result)."""
    from solar.train.checkpoint_io import moments

    out = {f"{role}/live/{k}": v for k, v in snap["weights"].items()}
    if snap["ema"]:
        out.update({f"{role}/ema/{k}": v for k, v in snap["ema"].items()})
    out.update({f"{role}/optimizer/{k}": v for k, v in moments(snap).items()})
    return out


def stage(state: dict[str, torch.Tensor], staging) -> dict[str, torch.Tensor]:
    """Host copies of this rank's shards (``staging``: a ``checkpoint_save.Staging``), each a DTensor
    again with its tensor's placements, so training may change the originals from here on."""
    from torch.distributed.tensor import DTensor

    out = {}
    for key, t in state.items():
        t = t.detach()
        if isinstance(t, DTensor):
            local = staging.copy(key, t.to_local())
            out[key] = DTensor.from_local(local, _host_mesh(t.device_mesh), t.placements, run_check=False,
                                          shape=t.shape, stride=t.stride())
        else:
            out[key] = staging.copy(key, t)
    return out


def _host_mesh(mesh):
    """``mesh``'s ranks and dims as a CPU mesh, without new process groups: ``DTensor.from_local``
    moves a local tensor to its mesh's device, so a GPU mesh would copy the host buffers back to the
    GPU (seen on an H100 by ``tests/gpu/test_sharded_staging.py``). One per GPU mesh and process."""
    if mesh.device_type == "cpu":
        return mesh
    host = _HOST_MESHES.get(id(mesh))
    if host is None or host[0] is not mesh:
        from torch.distributed.device_mesh import DeviceMesh

        host = _HOST_MESHES[id(mesh)] = (mesh, DeviceMesh("cpu", mesh.mesh, mesh_dim_names=mesh.mesh_dim_names,
                                                          _init_backend=False))
    return host[1]


_HOST_MESHES: dict[int, tuple] = {}


def layout_document(state: dict[str, torch.Tensor], world: int) -> bytes:
    """``shards.json``: what the shard files must add up to (``storage.checkpoints.verify`` checks it)."""
    from solar.safetensors_io import dtype_name

    tensors = {k: {"dtype": dtype_name(v.dtype), "shape": list(v.shape)} for k, v in sorted(state.items())}
    return pretty_bytes({"schema": LAYOUT_SCHEMA, "format": "dcp-safetensors", "world": world,
                         "tensors": tensors})


def save(state: dict[str, torch.Tensor], partial: Path, group, fail: OSError | None = None) -> None:
    """Every rank writes its shards of ``state`` into ``partial/shards`` (a collective over ``group``).
    ``fail``: a drill's storage fault (``train/faults.py``), raised inside DCP's write on this rank the
    way a full volume's error is, after this rank's shard file is begun."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.api import CheckpointException

    directory = partial / SHARDS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    writer = HuggingFaceStorageWriter(str(directory), fqn_to_index_mapping=file_mapping(state, group),
                                      save_distributed=True)
    if fail is not None:
        def write_data(plan, planner):
            (directory / f"shard-drill-{os.getpid()}.safetensors").write_bytes(b"\0" * 64)  # a file begun
            raise fail
        writer.write_data = write_data
    try:
        dcp.save(state, storage_writer=writer, process_group=group)
    except CheckpointException as exc:
        # DCP gathers every rank's failure; raise this rank's own (else the first) as itself, so a full
        # or failing volume keeps its classified one-line error naming the path
        rank = dist.get_rank(group) if dist.is_initialized() else 0
        failures = exc.failures
        cause = (failures.get(rank) or next(iter(failures.values())))[0] if failures else None
        if isinstance(cause, Exception):
            raise cause from None
        raise RuntimeError(f"sharded checkpoint save failed: {exc}") from None


def file_mapping(state: dict[str, torch.Tensor], group, limit: int = FILE_BYTES) -> dict[str, int] | None:
    """Each tensor's file (1, 2, ...) so that a rank's file holds about ``limit`` bytes at most, from
    every tensor's whole bytes over the ranks (a rank writes about that much of it, its shard or its
    share of the replicated pieces DCP spreads over them); None when one file per rank will do."""
    import torch.distributed as dist

    ranks = dist.get_world_size(group) if dist.is_initialized() else 1
    mapping, index, held = {}, 1, 0
    for key in sorted(state):
        t = state[key]
        share = t.numel() * t.element_size() // ranks
        if held and held + share > limit:
            index, held = index + 1, 0
        mapping[key] = index
        held += share
    return mapping if index > 1 else None


def local_bytes(t: torch.Tensor) -> int:
    """The bytes of this rank's part of ``t`` (its shard of a DTensor)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()
