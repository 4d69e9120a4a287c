"""One index row: the contract's checks, done by hand for speed (millions of rows)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from solar.config.families import canonical_family
from solar.errors import DataError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_INT_FIELDS = ("shard_size", "num_frames", "height", "width", "start_frame", "validation_noise_seed",
               "member_offset", "member_size")
_MIN = {"num_frames": 1, "height": 1, "width": 1}
_STR_FIELDS = ("caption", "dataset", "member", "family")


@dataclass(frozen=True, slots=True)
class Row:
    """The fields of a row that planning and reading use."""

    sample_id: str
    key: str
    shard: str
    epoch_repeats: int
    num_frames: int | None
    start_frame: int | None
    family: str | None
    validation_noise_seed: int | None
    member: str | None
    member_offset: int | None
    member_size: int | None
    shard_size: int | None


def check_relative_path(path: str) -> str | None:
    """Why ``path`` is not a safe relative POSIX path, or None when it is."""
    if not path:
        return "is empty"
    if "\\" in path:
        return "contains a backslash"
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "is absolute"
    if _SCHEME.match(path):
        return "has a URL scheme"
    for segment in path.split("/"):
        if segment == "":
            return "has an empty segment"
        if segment in (".", ".."):
            return f"has a '{segment}' segment"
    return None


def _bad(where: str, what: str) -> DataError:
    return DataError(f"{where}: {what}")


_INT0 = frozenset(n for n in _INT_FIELDS if n not in _MIN)
_INT1 = frozenset(n for n in _INT_FIELDS if n in _MIN) | {"epoch_repeats"}
_STRS = frozenset(_STR_FIELDS)
_REQUIRED = ("sample_id", "key", "shard")


def _field_problem(name: str, value: Any) -> str | None:
    if name in _INT0 or name in _INT1:
        minimum = 0 if name in _INT0 else 1
        if type(value) is not int or value < minimum:
            return f"{name} must be an integer >= {minimum}, got {value!r}"
    elif name in _STRS:
        if type(value) is not str:
            return f"{name} must be a string, got {type(value).__name__}"
    elif name == "fps":
        if type(value) not in (int, float) or not 0 < value < float("inf"):
            return f"fps must be a positive number, got {value!r}"
    return None


@dataclass(frozen=True)
class _Shape:
    """What to check for rows with one particular ordered set of keys."""

    ints: tuple[tuple[str, int], ...]
    strs: tuple[str, ...]
    fps: bool
    family: bool
    member: bool
    offsets: int  # how many of member_offset/member_size are present
    start_and_frames: bool


_SHAPES: dict[tuple[str, ...], _Shape] = {}


def _shape(keys: tuple[str, ...]) -> _Shape:
    shape = _SHAPES.get(keys)
    if shape is None:
        present = set(keys)
        shape = _SHAPES[keys] = _Shape(
            ints=tuple((k, 0) for k in keys if k in _INT0) + tuple((k, 1) for k in keys if k in _INT1),
            strs=tuple(k for k in keys if k in _STRS), fps="fps" in present,
            family="family" in present, member="member" in present,
            offsets=len(present & {"member_offset", "member_size"}),
            start_and_frames={"start_frame", "num_frames"} <= present)
    return shape


def validate_row(obj: Any, name: str, line: int, known_shards: Any = ()) -> tuple[str, ...]:
    """Check one decoded JSON row of index ``name`` at ``line`` (used only in messages); returns
    its keys. ``known_shards``: shard paths already checked (rows of one shard repeat the path)."""
    if type(obj) is not dict:
        raise _bad(f"{name}:{line}", f"row is a {type(obj).__name__}, expected a JSON object")
    get = obj.get
    sample_id, key, shard = get("sample_id"), get("key"), get("shard")
    if type(sample_id) is not str or type(key) is not str or type(shard) is not str \
            or not sample_id or not key:
        _raise_required(obj, f"{name}:{line}")
    if shard not in known_shards:
        problem = check_relative_path(shard)
        if problem:
            raise _bad(f"{name}:{line} (sample_id {sample_id!r})",
                       f"shard {shard!r} {problem}; shards are relative POSIX paths under the data root")
    keys = tuple(obj)
    if len(keys) == 3:
        return keys
    shape = _shape(keys)
    for field_name, minimum in shape.ints:
        value = obj[field_name]
        if (type(value) is not int or value < minimum) and value is not None:
            raise _bad(f"{name}:{line} (sample_id {sample_id!r})", _field_problem(field_name, value))
    for field_name in shape.strs:
        value = obj[field_name]
        if type(value) is not str and value is not None:
            raise _bad(f"{name}:{line} (sample_id {sample_id!r})", _field_problem(field_name, value))
    if shape.fps:
        value = obj["fps"]
        if value is not None and not (type(value) in (int, float) and 0 < value < float("inf")):
            raise _bad(f"{name}:{line} (sample_id {sample_id!r})", _field_problem("fps", value))
    if shape.family and obj["family"] is not None and canonical_family(obj["family"]) is None:
        raise _bad(f"{name}:{line} (sample_id {sample_id!r})",
                   f"family {obj['family']!r} is not a known family")
    if shape.member and obj["member"] is not None:
        problem = check_relative_path(obj["member"])
        if problem:
            raise _bad(f"{name}:{line} (sample_id {sample_id!r})", f"member {obj['member']!r} {problem}")
    if shape.offsets and (get("member_offset") is None) != (get("member_size") is None):
        raise _bad(f"{name}:{line} (sample_id {sample_id!r})",
                   "member_offset and member_size come together")
    if shape.start_and_frames:
        start, frames = obj["start_frame"], obj["num_frames"]
        if start is not None and frames is not None and start >= frames:
            raise _bad(f"{name}:{line} (sample_id {sample_id!r})",
                       f"start_frame {start} is not below num_frames {frames}")
    return keys


def parse_row(obj: Any, name: str, line: int, known_shards: Any = ()) -> Row:
    """Validate a row and return its fields."""
    validate_row(obj, name, line, known_shards)
    get = obj.get
    family = get("family")
    return Row(obj["sample_id"], obj["key"], obj["shard"], get("epoch_repeats") or 1,
               get("num_frames"), get("start_frame"),
               None if family is None else canonical_family(family), get("validation_noise_seed"),
               get("member"), get("member_offset"), get("member_size"), get("shard_size"))


def _raise_required(obj: dict, where: str) -> None:
    sample_id = obj.get("sample_id")
    if isinstance(sample_id, str) and sample_id:
        where = f"{where} (sample_id {sample_id!r})"
    for name in _REQUIRED:
        value = obj.get(name)
        if value is None or value == "":
            raise _bad(where, f"missing or empty required field {name}")
        if type(value) is not str:
            raise _bad(where, f"{name} must be a string, got {type(value).__name__}")
    raise _bad(where, "invalid required fields")
