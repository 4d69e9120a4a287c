"""Deterministic test-index selection and the frozen validation plan (semantics.md §3).

    rows        = Random(selection_seed).sample(range(rows), sample_count)
    start frame = the row's start_frame, else a stable hash of (key, slot) over the valid starts
    noise seed  = the row's validation_noise_seed, else hash("validation-noise", slot, noise_seed)
    owner       = logical DP rank  slot % dp_world

A slot whose camera fails the guards is replaced from a reserve (the unselected rows in a stable
hash order). The selection is frozen into ``validation/frozen-plan.json`` on first use; later
validations and inference with the same settings must reproduce it exactly.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from solar.config.canonical import digest, pretty_bytes
from solar.data.index import IndexTable, fetch_rows
from solar.errors import DataError
from solar.storage.atomic import OutputExistsError, write_create_only

PLAN_SCHEMA = "solar.validation-plan.v1"


def stable_int(*parts: object) -> int:
    text = "|".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2s(text.encode(), digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True)
class Slot:
    slot: int
    row: int
    sample_id: str
    key: str
    shard: str
    start_frame: int
    noise_seed: int
    replaced: list[str] | None = None  # sample ids replaced because of the camera guards


def owner(slot: int, dp_world: int) -> int:
    return slot % dp_world


def _start(table: IndexTable, row: int, key: str, slot: int, pixel_frames: int) -> int:
    declared = table.start_frame[row]
    if declared != -1:
        return declared
    frames = table.num_frames[row]
    if frames == -1:
        return 0
    stride = table.stride[row]
    choices = (frames - pixel_frames) // stride + 1
    if choices < 1:
        raise DataError(f"{table.path}:{table.lines[row]}: num_frames {frames} < {pixel_frames} pixel "
                        "frames")
    return stride * (stable_int("validation-start", key, slot) % choices)


def select(table: IndexTable, *, sample_count: int, selection_seed: int, noise_seed: int,
           pixel_frames: int, camera_ok: Callable[[int, int], str | None] | None = None) -> list[Slot]:
    """The validation slots; ``camera_ok(row, start)`` returns a rejection reason or None."""
    if sample_count > table.rows:
        raise DataError(f"validation.sample_count={sample_count} exceeds the {table.rows} rows of "
                        f"{table.path}")
    chosen = random.Random(selection_seed).sample(range(table.rows), sample_count)
    taken = set(chosen)
    reserve = iter(sorted((r for r in range(table.rows) if r not in taken),
                          key=lambda r: stable_int("reserve", selection_seed, r)))
    rows = fetch_rows(table.path, set(range(table.rows)) if camera_ok else taken)
    slots = []
    for slot, row_index in enumerate(chosen):
        replaced: list[str] = []
        while True:
            row = rows[row_index]
            start = _start(table, row_index, row.key, slot, pixel_frames)
            reason = camera_ok(row_index, start) if camera_ok else None
            if reason is None:
                break
            replaced.append(row.sample_id)
            row_index = next(reserve, None)
            if row_index is None:
                raise DataError(f"validation slot {slot}: no reserve row left with a valid camera "
                                f"(last: {reason})")
        seed = (row.validation_noise_seed if row.validation_noise_seed is not None
                else stable_int("validation-noise", slot, noise_seed))
        slots.append(Slot(slot, row_index, row.sample_id, row.key, row.shard, start, seed,
                          replaced or None))
    return slots


def plan_document(table: IndexTable, slots: list[Slot], *, test_index: str, sample_count: int,
                  selection_seed: int, noise_seed: int, pixel_frames: int) -> dict:
    return {
        "schema": PLAN_SCHEMA,
        "test_index": test_index,
        "test_index_sample_id_digest": table.sample_id_digest,
        "sample_count": sample_count,
        "selection_seed": selection_seed,
        "noise_seed": noise_seed,
        "pixel_frames": pixel_frames,
        "slots": [{k: v for k, v in asdict(s).items() if v is not None} for s in slots],
    }


def freeze(path: str | Path, document: dict) -> dict:
    """Create ``frozen-plan.json`` once; later calls must reproduce it exactly."""
    path = Path(path)
    data = pretty_bytes(document)
    try:
        write_create_only(path, data, what="validation plan")
        return document
    except OutputExistsError:
        pass
    frozen = json.loads(path.read_text())
    if digest(frozen) != digest(document):
        raise DataError(f"{path}: this validation selection differs from the frozen plan "
                        f"({_first_difference(frozen, document)}); keep the test index, seeds, sample "
                        "count and frame profile fixed, or validate into a new run directory")
    return frozen


def load_frozen(path: str | Path, header: dict) -> list[Slot] | None:
    """The slots of an existing frozen plan whose settings equal ``header`` (a plan document
    without ``slots``); None when there is no plan yet. A plan frozen under other settings (or over
    a rewritten test index) is refused, naming the first difference."""
    path = Path(path)
    if not path.is_file():
        return None
    frozen = json.loads(path.read_text())
    if frozen.get("schema") != PLAN_SCHEMA:
        raise DataError(f"{path}: schema {frozen.get('schema')!r}, expected {PLAN_SCHEMA}")
    settings = {k: v for k, v in frozen.items() if k != "slots"}
    if settings != header:
        raise DataError(f"{path}: the config no longer matches the frozen validation plan "
                        f"({_first_difference(settings, header)}); keep the test index, seeds, sample count "
                        "and frame profile fixed, or validate into a new run directory")
    return [Slot(**{"replaced": None, **entry}) for entry in frozen["slots"]]


def _first_difference(a: dict, b: dict) -> str:
    for key in sorted(set(a) | set(b)):
        if key == "slots":
            continue
        if a.get(key) != b.get(key):
            return f"{key}: frozen {a.get(key)!r}, now {b.get(key)!r}"
    for i, (x, y) in enumerate(zip(a.get("slots", []), b.get("slots", []))):
        if x != y:
            field = next(k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k))
            return f"slot {i} {field}: frozen {x.get(field)!r}, now {y.get(field)!r}"
    return f"{len(a.get('slots', []))} frozen slots, now {len(b.get('slots', []))}"
