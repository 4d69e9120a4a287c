"""What goes into a checkpoint and how it comes back (tensors as safetensors, the rest as JSON).

Layout inside ``step_NNNNNNNN/`` (roles: ``model`` for single-model routes; Stage2 uses
``student`` and ``critic``)::

    <role>/live.safetensors       weights (LoRA on a released base: the adapter factors only)
    <role>/ema.safetensors        fp32 EMA of the trainable weights (when it exists)
    <role>/optimizer.safetensors  AdamW moments per parameter name; <role>/optimizer.json the rest
    rng/rank-NNNNN.json           every rank's Python and torch RNG states
    data/rank-NNNNN.json          every rank's data-stream state (its readers, keyed by reader id)
    data/position.json            the stream's position without ranks (step, global batch, shape)
    trainer.json                  step counters, EMA bookkeeping

Loading uses ``safetensors`` and ``json`` only: no pickle anywhere.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from solar.config.canonical import pretty_bytes
from solar.safetensors_io import write_streaming
from solar.storage.checkpoints import CheckpointError


def write_bytes(path: Path, data: bytes) -> None:
    """A new member (create-only); the transaction's commit fsyncs it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as handle:
        handle.write(data)


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors member written tensor by tensor straight from the CPU copies (create-only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as handle:
        write_streaming(handle, {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}, tensors.__getitem__)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def full(tensors: dict[str, torch.Tensor], staging=None, key: str = "") -> dict[str, torch.Tensor]:
    """CPU copies of an unsharded role's tensors (into ``staging``'s reused buffers when given, a
    ``checkpoint_save.Staging``); sharded roles go through ``checkpoint_shards`` instead."""
    if staging is not None:
        return {k: staging.copy(f"{key}/{k}", v) for k, v in tensors.items()}
    return {k: _cpu(v) for k, v in tensors.items()}


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer, names: list[str], *, sharded: bool,
             adapter_only: bool, ema: dict[str, torch.Tensor] | None, staging=None, key: str = "model",
             role: str | None = None) -> dict:
    """Everything a role saves. Unsharded: full CPU tensors that training may no longer change (copies;
    with ``staging``, its buffers: wait for ``staging.ready()`` before reading them). Sharded (FSDP2):
    the role's own tensors as they are, DTensors included, for ``checkpoint_shards.stage`` to copy this
    rank's shards of. ``role``: the role's adapter in a model whose LoRA base several roles share; it
    saves the base and its own adapter under a single-role model's names.

    The optimizer's state is read as it stands (``state_dict()``, per parameter index): a parameter
    that has had no update yet has no moments and saves none. (torch's ``get_optimizer_state_dict``
    would first step an optimizer without state once with zero gradients, which moves AdamW's step
    count and so changes that role's training.)"""
    from solar.models.lora import role_name

    weights = model.state_dict()
    state = optimizer.state_dict()
    per_param = {names[i]: entry for i, entry in state["state"].items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    if role:
        weights = {own: v for k, v in weights.items() if (own := role_name(k, role)) is not None}
    if adapter_only:
        weights = {k: v for k, v in weights.items() if ".lora_" in k}
    if sharded:
        return {"weights": weights, "ema": ema or None, "optimizer": (per_param, groups)}

    def copy(name: str, k: str, v):
        if not isinstance(v, torch.Tensor) or k == "step":
            return v
        return staging.copy(f"{key}/optimizer/{name}/{k}", v) if staging is not None else _cpu(v)

    return {"weights": full(weights, staging, f"{key}/live"), "ema": full(ema, staging, f"{key}/ema") if ema else None,
            "optimizer": ({name: {k: copy(name, k, v) for k, v in entry.items()} for name, entry in per_param.items()},
                          groups)}


def optimizer_document(snap: dict, names: list[str]) -> bytes:
    """``<role>/optimizer.json``: the hyperparameters, each parameter's step count and the names."""
    per_param, groups = snap["optimizer"]
    steps = {name: float(entry["step"]) for name, entry in per_param.items() if "step" in entry}
    return pretty_bytes({"param_groups": groups, "steps": steps, "names": names})


def save_role(partial: Path, role: str, snap: dict, names: list[str]) -> list[str]:
    """Write one role's members (rank 0); returns their paths relative to the checkpoint."""
    members = [f"{role}/live.safetensors"]
    write_tensors(partial / members[0], snap["weights"])
    if snap["ema"]:
        members.append(f"{role}/ema.safetensors")
        write_tensors(partial / members[-1], snap["ema"])
    members += [f"{role}/optimizer.safetensors", f"{role}/optimizer.json"]
    write_tensors(partial / members[-2], moments(snap))
    write_bytes(partial / members[-1], optimizer_document(snap, names))
    return members


def moments(snap: dict) -> dict[str, torch.Tensor]:
    """The optimizer's tensors by ``<parameter>::<moment>`` (the step counts go to optimizer.json)."""
    return {f"{name}::{k}": v for name, entry in snap["optimizer"][0].items() for k, v in entry.items()
            if k != "step" and isinstance(v, torch.Tensor)}


def local_tensors(tensors: dict, params: dict[str, torch.nn.Parameter], where: str) -> dict[str, torch.Tensor]:
    """The lazy ``tensors`` (``materialize.role_tensors``) named like ``params``, each laid out like its
    parameter (this rank's rows of an FSDP2-sharded one): a rank reads only its own rows."""
    missing = [n for n in params if n not in tensors]
    if missing:
        raise CheckpointError(f"{where} lacks {len(missing)} parameters, e.g. {missing[:2]}")
    return {n: tensors[n].read_like(p.detach().float()) for n, p in params.items()}


def load_optimizer(path: Path, role: str, optimizer: torch.optim.Optimizer, names: list[str],
                   params: dict[str, torch.nn.Parameter]) -> None:
    """Restore AdamW's state and hyperparameters; each moment laid out like its parameter (this rank's
    rows when sharded), read by rows from the checkpoint, whole-file or sharded at any topology."""
    from solar.launch.materialize import role_tensors

    meta = json.loads((path / role / "optimizer.json").read_text())
    if meta["names"] != names:
        raise CheckpointError(f"{path}: the optimizer was saved for different parameters")
    by_param: dict[str, dict] = {}
    for key, lazy in role_tensors(path, role, "optimizer").items():
        name, moment = key.split("::", 1)
        by_param.setdefault(name, {})[moment] = lazy
    for name in names:
        p = params[name]
        entry = {moment: lazy.read_like(p) for moment, lazy in by_param.get(name, {}).items()}
        if name in meta["steps"]:
            entry["step"] = torch.tensor(meta["steps"][name])
        if entry:
            optimizer.state[p] = entry
    for group, saved in zip(optimizer.param_groups, meta["param_groups"]):
        group.update({k: v for k, v in saved.items() if k in group and k != "params"})
        if "betas" in group:
            group["betas"] = tuple(group["betas"])


def trainer_file(state: dict) -> dict[str, bytes]:
    """``trainer.json``: step counters and EMA bookkeeping."""
    return {"trainer.json": json.dumps(state, sort_keys=True).encode()}



def rng_state() -> dict:
    py = random.getstate()
    state = {"python": [py[0], list(py[1]), py[2]], "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def rank_state_files(rank: int, *, data_state: dict) -> dict[str, bytes]:
    """This rank's RNG and data-stream state as checkpoint members, taken now."""
    return {f"rng/rank-{rank:05d}.json": json.dumps(rng_state()).encode(),
            f"data/rank-{rank:05d}.json": json.dumps(data_state).encode()}


def load_rank_state(path: Path, rank: int) -> dict:
    """A full resume's data-stream state (every rank's saved state merged: readers are keyed by id, so
    any topology with the same global batch takes the readers of its own positions) and, when the
    checkpoint was saved at this world size, this rank's RNG states (at another world size the RNGs are
    not restored: no training draw uses them, every one is keyed by its clip; issue 39)."""
    import torch.distributed as dist

    from solar.data.stream import merge_states
    from solar.errors import DataError

    files = sorted((path / "data").glob("rank-*.json"))
    if not files:
        raise CheckpointError(f"{path} holds no data stream state (data/rank-NNNNN.json)")
    try:
        data = merge_states([json.loads(f.read_text()) for f in files])
    except DataError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rng_files = sorted((path / "rng").glob("rank-*.json"))
    if len(rng_files) == world and (path / "rng" / f"rank-{rank:05d}.json").is_file():
        set_rng_state(json.loads((path / "rng" / f"rank-{rank:05d}.json").read_text()))
    elif "global_batch_size" not in data and len(files) != world:
        raise CheckpointError(f"{path} was saved at world size {len(files)} before data positions were kept "
                              f"apart from ranks; resume it at world size {len(files)}")
    return data


def position_file(step: int, data_state: dict, saved_with: dict, epochs: tuple[int, int]) -> dict[str, bytes]:
    """``data/position.json`` (rank 0): where the stream stands without ranks — the step, the global
    batch, the topology it was saved with and the readers' epochs; what ``solar run --dry-run`` and the
    operator show for a resume at another shape (``storage.checkpoints.data_position`` reads it)."""
    doc = {"schema": "solar.data-position.v1", "step": step,
           "global_batch_size": data_state.get("global_batch_size"), "plan_nodes": data_state.get("plan_nodes"),
           "saved_with": saved_with, "epochs": list(epochs)}
    return {"data/position.json": json.dumps(doc, sort_keys=True).encode()}
