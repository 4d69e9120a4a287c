"""Checkpoint transactions and verification (no torch).

Roles are saved as whole files (``<role>/live.safetensors`` ...: unsharded runs) or, under FSDP2, as
every rank's own shards (``shards/`` with ``shards.json``: ``solar.train.checkpoint_shards``); a
sharded checkpoint verifies only when its shard files hold every row of every tensor once.

A checkpoint is built in a hidden sibling ``checkpoints/.step_NNNNNNNN.<random>.partial/``; when
every member is written, ``commit`` writes ``manifest.json`` (every member with its byte size),
then ``COMPLETE.json`` (``manifest_digest`` = BLAKE2s-256 of the manifest's exact bytes), fsyncs
every file and directory, renames the directory to ``checkpoints/step_NNNNNNNN`` and fsyncs the
parent. A crash leaves only a partial directory, which nothing here ever treats as a checkpoint.
``begin`` and ``commit`` check the stage's fence (``solar.storage.fence``), the commit again right
before its rename: a process of a replaced attempt starts or commits no checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
from pathlib import Path

from solar.config.canonical import blake2s_hex, pretty_bytes
from solar.errors import SolarError
from solar.storage import fence
from solar.storage.atomic import fsync_dir

MANIFEST_SCHEMA = "solar.checkpoint.v1"
COMPLETE_SCHEMA = "solar.checkpoint-complete.v1"
STEP_DIR = re.compile(r"^step_(\d{8})$")
PARTIAL_DIR = re.compile(r"^\.step_(\d{8})\.[0-9a-f]+\.partial$")
# A sharded save (FSDP2: every rank writes its own shards through torch.distributed.checkpoint):
# its shard files, the layout they add up to, and DCP's header key for each piece's offsets.
SHARDS_DIR = "shards"
SHARDS_LAYOUT = "shards.json"
SHARDING_INFO = "DCP_SHARDING_INFO"
CONTRACT_KEYS = ("family", "stage", "causal_mode", "objective", "objective_variant",
                 "camera_translation_transform", "parameterization", "sequence_parallel_size", "data_generation")


class CheckpointError(SolarError):
    """A checkpoint is missing, incomplete, corrupt or incompatible."""


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def begin(run_dir: str | os.PathLike[str], step: int) -> Path:
    fence.check()
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    if final.exists():
        raise CheckpointError(f"{final} already exists; checkpoints are never overwritten")
    partial = root / f".{step_name(step)}.{secrets.token_hex(4)}.partial"
    partial.mkdir()
    return partial


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def remove_partial(partial: Path) -> bool:
    """Remove a partial checkpoint directory of this run (only a name ``begin`` makes, never a
    checkpoint); True when something was removed."""
    partial = Path(partial)
    if not PARTIAL_DIR.match(partial.name) or not partial.is_dir():
        return False
    import shutil

    shutil.rmtree(partial, ignore_errors=True)
    return not partial.exists()


def commit(partial: Path, *, step: int, contract: dict, roles: dict, trainer_state: dict,
           final: Path | None = None) -> Path:
    """Write manifest + COMPLETE, fsync everything, rename into place (``checkpoints/step_NNNNNNNN``
    beside the partial, or ``final``: an export). Returns the final path."""
    fence.check()
    files = []
    for dirpath, _dirs, names in os.walk(partial):
        for name in sorted(names):
            full = Path(dirpath) / name
            rel = full.relative_to(partial).as_posix()
            files.append({"path": rel, "size": full.stat().st_size})
    files.sort(key=lambda f: f["path"])
    shard_files = [f["path"] for f in files if f["path"].startswith(SHARDS_DIR + "/")]
    roles = {role: ({**spec, "members": [*spec["members"], SHARDS_LAYOUT, *shard_files]}
                    if spec.get("layout") == "sharded" else spec) for role, spec in roles.items()}
    manifest = {"schema": MANIFEST_SCHEMA, "step": step, "contract": contract, "roles": roles,
                "files": files, "trainer_state": trainer_state}
    data = pretty_bytes(manifest)
    with open(partial / "manifest.json", "xb") as handle:
        handle.write(data)
    complete = {"schema": COMPLETE_SCHEMA, "step": step, "manifest_digest": blake2s_hex(data)}
    with open(partial / "COMPLETE.json", "xb") as handle:
        handle.write(pretty_bytes(complete))
    _fsync_tree(partial)
    final = Path(final) if final is not None else partial.parent / step_name(step)
    if final.exists():
        raise CheckpointError(f"{final} already exists; checkpoints are never overwritten")
    fence.check()   # the fsyncs above may have taken long enough for a stop and a newer attempt
    os.rename(partial, final)
    fsync_dir(partial.parent)
    return final


class _ShortFile(ValueError):
    pass


def _header(path: Path) -> tuple[int, dict]:
    """A safetensors file's header length and header (JSON, ``__metadata__`` included)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise _ShortFile("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        return length, json.loads(handle.read(length))


def shard_pieces(root: Path, shard_files: list[str]) -> tuple[dict, dict[str, list[tuple[str, int, int]]], list[str]]:
    """A sharded checkpoint's index, read from ``shards.json`` and the shard files' headers (DCP's
    offsets): (every tensor's {dtype, shape}, each tensor's row pieces as (file, first row, end row) —
    a scalar is one piece of row 0 —, problems: files that cannot be read, pieces that are not whole
    rows of their tensor)."""
    try:
        layout = json.loads((root / SHARDS_LAYOUT).read_text())["tensors"]
    except (OSError, ValueError, KeyError) as exc:
        return {}, {}, [f"{SHARDS_LAYOUT} is missing or unreadable ({exc})"]
    pieces: dict[str, list[tuple[str, int, int]]] = {}
    problems = []
    for rel in shard_files:
        try:
            _, header = _header(root / rel)
            info = json.loads((header.get("__metadata__") or {}).get(SHARDING_INFO, "{}"))
        except (OSError, ValueError, struct.error) as exc:
            problems.append(f"member {rel}: unreadable shard header ({exc})")
            continue
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            full = layout.get(key)
            offsets = info.get(key, {}).get("saved_offsets")
            shape = entry["shape"]
            if full is None or offsets is None:
                problems.append(f"member {rel}: tensor {key} is not in {SHARDS_LAYOUT}")
                continue
            if entry["dtype"] != full["dtype"] or list(shape[1:]) != list(full["shape"][1:]) or any(offsets[1:]):
                problems.append(f"member {rel}: tensor {key} is not a piece of rows of {full['shape']} {full['dtype']}")
                continue
            pieces.setdefault(key, []).append((rel, offsets[0], offsets[0] + shape[0]) if shape else (rel, 0, 1))
    for chunks in pieces.values():
        chunks.sort(key=lambda c: c[1])
    return layout, pieces, problems


def _shard_problems(root: Path, shard_files: list[str]) -> list[str]:
    """A sharded checkpoint's shard files against ``shards.json``: every tensor's rows are there, once,
    in pieces of its shape (a rank's missing or foreign file shows as rows missing or too many)."""
    layout, pieces, problems = shard_pieces(root, shard_files)
    for key, full in layout.items():
        rows = full["shape"][0] if full["shape"] else 1
        covered, at = pieces.get(key, []), 0
        for _, lo, hi in covered:
            if hi == lo:
                continue
            if lo != at:
                break
            at = hi
        held = sum(hi - lo for _, lo, hi in covered)
        if at != rows or held != rows:
            problems.append(f"tensor {key}: its shards hold {held} of {rows} rows (a rank's part is missing or doubled)")
            if len(problems) > 20:
                break
    return problems


def _safetensors_problem(path: Path) -> str | None:
    try:
        length, header = _header(path)
    except _ShortFile as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"unreadable safetensors header ({exc})"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, stop = entry["data_offsets"]
        end = max(end, stop)
    if 8 + length + end != path.stat().st_size:
        return f"data ends at {8 + length + end} bytes but the file has {path.stat().st_size}"
    return None


def not_a_checkpoint(root: Path) -> str | None:
    """What ``root`` is when it is a run directory or a run's ``checkpoints`` folder rather than a
    checkpoint (the likeliest wrong path), naming its newest checkpoint; None otherwise."""
    run = root if (root / "checkpoints").is_dir() or (root / "launch-manifest.json").is_file() else None
    folder = root / "checkpoints" if run is not None else root
    try:
        steps = sorted(e.name for e in folder.iterdir() if STEP_DIR.match(e.name) and e.is_dir())
    except OSError:
        steps = []
    if run is None and not steps:
        return None
    what = "it is a run directory" if run is not None else "it is a run's checkpoints folder"
    if not steps:
        return f"{what}, not a checkpoint, and it holds no checkpoint yet"
    listed = f"`solar checkpoint list {run if run is not None else root.parent}` lists them"
    return (f"{what}, not a checkpoint; give one of its {len(steps)} checkpoint{'s' if len(steps) > 1 else ''}, "
            f"e.g. the newest {folder / steps[-1]} ({listed})")


def verify(path: str | os.PathLike[str], contract: dict | None = None) -> dict:
    """The contract's verification report: {path, step, complete, valid, roles, problems}."""
    root = Path(path)
    report = {"path": str(root), "step": None, "complete": False, "valid": False, "roles": {}, "problems": []}
    problems = report["problems"]
    if not root.is_dir():
        problems.append("not a directory")
        return report
    match = STEP_DIR.match(root.name)
    if PARTIAL_DIR.match(root.name):
        problems.append("a partial (unfinished) checkpoint")
    complete_path, manifest_path = root / "COMPLETE.json", root / "manifest.json"
    if not complete_path.is_file():
        problems.append(not_a_checkpoint(root) or "no COMPLETE.json: the save did not finish")
        return report
    try:
        complete = json.loads(complete_path.read_text())
        manifest_bytes = manifest_path.read_bytes()
        manifest = json.loads(manifest_bytes)
    except (OSError, ValueError) as exc:
        problems.append(f"unreadable marker or manifest ({exc})")
        return report
    report["complete"] = True
    report["step"] = manifest.get("step")
    if complete.get("schema") != COMPLETE_SCHEMA or manifest.get("schema") != MANIFEST_SCHEMA:
        problems.append("unknown COMPLETE.json or manifest.json schema")
    if complete.get("manifest_digest") != blake2s_hex(manifest_bytes):
        problems.append("manifest.json does not match the digest in COMPLETE.json")
    if complete.get("step") != manifest.get("step"):
        problems.append("COMPLETE.json and manifest.json disagree on the step")
    if match and int(match.group(1)) != manifest.get("step"):
        problems.append(f"directory name says step {int(match.group(1))}, manifest says {manifest.get('step')}")
    listed = set()
    for entry in manifest.get("files", []):
        rel = entry.get("path", "")
        listed.add(rel)
        member = root / rel
        if ".." in Path(rel).parts or not member.is_file():
            problems.append(f"member {rel} is missing")
            continue
        if member.stat().st_size != entry.get("size"):
            problems.append(f"member {rel} has {member.stat().st_size} bytes, manifest says {entry.get('size')}")
        elif member.suffix == ".safetensors":
            problem = _safetensors_problem(member)
            if problem:
                problems.append(f"member {rel}: {problem}")
    sharded = False
    for role, spec in (manifest.get("roles") or {}).items():
        members = spec.get("members", [])
        report["roles"][role] = {"weights": spec.get("weights", []), "members": members,
                                 "layout": spec.get("layout", "files")}
        sharded = sharded or spec.get("layout") == "sharded"
        for rel in members:
            if rel not in listed:
                problems.append(f"role {role} member {rel} is not in the manifest")
    if sharded and not problems:
        problems += _shard_problems(root, sorted(r for r in listed if r.startswith(SHARDS_DIR + "/")))
    if contract is not None:
        saved = manifest.get("contract", {})
        for key, value in contract.items():
            if key in saved and saved[key] != value:
                problems.append(f"contract {key}: checkpoint has {saved[key]!r}, expected {value!r}")
    report["valid"] = not problems
    return report


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[dict]:
    """Every checkpoint directory (complete or partial) with {step, path, complete, valid}, by step."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    rows = []
    for entry in sorted(root.iterdir()):
        m = STEP_DIR.match(entry.name) or PARTIAL_DIR.match(entry.name)
        if not m or not entry.is_dir():
            continue
        partial = bool(PARTIAL_DIR.match(entry.name))
        result = verify(entry) if not partial else {"complete": False, "valid": False}
        rows.append({"step": int(m.group(1)), "path": str(entry), "complete": result["complete"] and not partial,
                     "valid": result["valid"] and not partial})
    return sorted(rows, key=lambda r: (r["step"], r["path"]))


def latest_valid(run_dir: str | os.PathLike[str]) -> dict | None:
    """The newest checkpoint that verifies, {step, path, complete, valid}; verified newest first and
    only as far back as needed (the operator asks this of every active stage on every poll)."""
    return newest_valid(run_dir)[0]


def newest_valid(run_dir: str | os.PathLike[str]) -> tuple[dict | None, list[str]]:
    """``latest_valid``'s answer and the newer checkpoint directories it passed over because they do
    not verify, as ``"<path>: <first problem>"`` (newest first)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None, []
    steps = sorted(((int(m.group(1)), entry) for entry in root.iterdir()
                    if (m := STEP_DIR.match(entry.name)) and entry.is_dir()), reverse=True)
    skipped = []
    for step, entry in steps:
        report = verify(entry)
        if report["valid"]:
            return {"step": step, "path": str(entry), "complete": True, "valid": True}, skipped
        skipped.append(f"{entry}: {(report['problems'] or ['does not verify'])[0]}")
    return None, skipped


def read_manifest(path: str | os.PathLike[str]) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def require_valid(path: str | os.PathLike[str], what: str, contract: dict | None = None) -> dict:
    """The manifest of a verified checkpoint, or a CheckpointError naming every problem."""
    report = verify(path, contract)
    if not report["valid"]:
        raise CheckpointError(f"{what} {path} is not usable: {'; '.join(report['problems'])}")
    return read_manifest(path)


DATA_POSITION = "data/position.json"


def data_position(checkpoint: str | Path) -> dict | None:
    """A checkpoint's ``data/position.json`` (``solar.data-position.v1``: step, global batch, the
    topology it was saved with, the readers' epochs), or None for a checkpoint from before it."""
    path = Path(checkpoint) / DATA_POSITION
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "solar.data-position.v1":
        raise CheckpointError(f"{path} is not a solar.data-position.v1 document")
    return doc
