"""Streaming index reading (JSONL / JSONL.GZ) into a compact columnar table, and ``inspect``.

One pass over the file decodes each row once, checks it (``rows.parse_row``), and keeps only what
planning needs per row in typed arrays (repeats, frame counts, start frames, start stride, shard
id). Full rows are kept only for the row numbers a caller asks for (``keep``). Duplicate ids are
found with a set of string hashes, confirmed by string comparison on a second pass only when a
hash repeats. The index is authoritative: nothing here lists shard contents.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from solar.config import families
from solar.config.families import canonical_family
from solar.data.rows import Row, parse_row, validate_row
from solar.errors import DataError

# Pixel-frame stride of a clip start for pre-encoded samples of each family (latent-aligned).
START_STRIDE = {"x4": 4, "x8": 8, "h3": 17}
_GZIP_CHUNK = 1 << 20  # most decompressed bytes taken per read (a read returns what one input block gave)


def start_stride(family: str | None) -> int:
    if family is None:
        return 1
    return START_STRIDE[families.spec(family).vae.temporal]


def data_root_for(index: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> Path:
    """The data root shards resolve under: explicit, ``$SOLAR_DATA_ROOT``, or the index's folder."""
    if root is not None:
        return Path(root)
    env = os.environ.get("SOLAR_DATA_ROOT")
    return Path(env) if env else Path(index).resolve().parent


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every non-blank line; gzip detected by magic bytes."""
    name = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        raise DataError(f"{name}: no such index file") from None
    except IsADirectoryError:
        raise DataError(f"{name}: is a directory, expected a .jsonl or .jsonl.gz index") from None
    except OSError as exc:
        raise DataError(f"{name}: cannot read ({exc.strerror})") from None
    with raw:
        compressed = raw.peek(2)[:2] == b"\x1f\x8b" if hasattr(raw, "peek") else False
        if not compressed:
            for number, line in enumerate(raw, 1):
                if line.strip():
                    yield number, line
            return
        yield from _gzip_lines(gzip.GzipFile(fileobj=raw), name)


def _gzip_lines(stream: gzip.GzipFile, name: str) -> Iterator[tuple[int, bytes]]:
    """Lines of a gzip stream, split here rather than by a read-ahead buffer, so that every line
    decompressed before a truncation or corruption is yielded and the error names the last complete
    line read (a read-ahead buffer would drop the data it had decoded when the stream fails)."""
    number = 0  # the last complete (newline-terminated) line yielded
    pending: list[bytes] = []  # pieces of a line begun but not yet ended
    try:
        while chunk := stream.read1(_GZIP_CHUNK):
            cut = chunk.rfind(b"\n") + 1
            if not cut:
                pending.append(chunk)
                continue
            block = chunk[:cut]
            if pending:
                block = b"".join((*pending, block))
                pending.clear()
            if cut < len(chunk):
                pending.append(chunk[cut:])
            # BytesIO splits on b"\n" only, as file iteration does (bytes.splitlines would not).
            for number, line in enumerate(io.BytesIO(block), number + 1):  # noqa: B007 (used below)
                if line.strip():
                    yield number, line
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{name}: corrupt or truncated gzip stream after line {number} ({exc}); "
                        "the index is incomplete") from None
    tail = b"".join(pending)
    if tail.strip():  # a last line without a final newline
        yield number + 1, tail


_scan_once = json.scanner.make_scanner(json.JSONDecoder())


def decode_line(line: bytes, name: str, number: int):
    """One JSON value from one line; the C scanner directly, json.loads only to explain errors."""
    try:
        text = line.decode("utf-8")
        obj, end = _scan_once(text, 0)
        if text[end:].strip():
            raise ValueError
        return obj
    except (ValueError, StopIteration, UnicodeDecodeError):
        try:
            return json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DataError(f"{name}:{number}: invalid JSON ({exc})") from None


def iter_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, Row]]:
    name = str(path)
    for number, line in iter_lines(path):
        yield number, parse_row(decode_line(line, name, number), name, number)


@dataclass
class IndexTable:
    """What planning needs of an index, one entry per row (row order = index order)."""

    path: str
    repeats: array = field(default_factory=lambda: array("I"))
    num_frames: array = field(default_factory=lambda: array("i"))   # -1: not declared
    start_frame: array = field(default_factory=lambda: array("i"))  # -1: not declared
    stride: array = field(default_factory=lambda: array("B"))
    shard_of: array = field(default_factory=lambda: array("I"))
    shards: list[str] = field(default_factory=list)
    content_digest: str = ""  # BLAKE2s of the non-blank lines (each normalised to end in \\n)
    sample_id_digest: str = ""
    fields: dict[str, int] = field(default_factory=dict)
    families: dict[str, int] = field(default_factory=dict)
    shard_sizes: dict[int, set[int]] = field(default_factory=dict)
    kept: dict[int, Row] = field(default_factory=dict)
    lines: array = field(default_factory=lambda: array("I"))  # line number of each row

    @property
    def rows(self) -> int:
        return len(self.repeats)

    @property
    def virtual_occurrences(self) -> int:
        return sum(self.repeats)


def load_table(path: str | os.PathLike[str],
               keep: Callable[[int, int, int, str], bool] | None = None) -> IndexTable:
    """One streaming pass. ``keep(row, first_occurrence, repeats, shard)`` selects rows kept whole."""
    name = str(path)
    table = IndexTable(path=name)
    content = hashlib.blake2s(digest_size=32)
    ids = hashlib.blake2s(digest_size=32)
    seen: set[int] = set()
    suspects: set[int] = set()
    shard_ids: dict[str, int] = {}
    field_counts: dict[str, int] = {}
    family_counts: dict[str, int] = {}
    signatures: dict[tuple[str, ...], int] = {}
    strides = {None: 1, **{f: start_stride(f) for f in families.FAMILIES}}
    occurrence = index = 0
    repeats_, frames_, starts_, stride_, shard_of_, lines_ = (
        table.repeats.append, table.num_frames.append, table.start_frame.append,
        table.stride.append, table.shard_of.append, table.lines.append)
    ids_update, content_update = ids.update, content.update
    for number, line in iter_lines(path):
        obj = decode_line(line, name, number)
        signature = validate_row(obj, name, number, shard_ids)
        signatures[signature] = signatures.get(signature, 0) + 1
        get = obj.get
        sample_id, shard = obj["sample_id"], obj["shard"]
        h = hash(sample_id)
        if h in seen:
            suspects.add(h)
        else:
            seen.add(h)
        sid = shard_ids.get(shard)
        if sid is None:
            sid = shard_ids[shard] = len(table.shards)
            table.shards.append(shard)
        repeats = get("epoch_repeats") or 1
        repeats_(repeats)
        frames = get("num_frames")
        frames_(-1 if frames is None else frames)
        start = get("start_frame")
        starts_(-1 if start is None else start)
        family = get("family")
        if family is not None:
            family = canonical_family(family)
            family_counts[family] = family_counts.get(family, 0) + 1
        stride_(strides[family])
        shard_of_(sid)
        lines_(number)
        size = get("shard_size")
        if size is not None:
            table.shard_sizes.setdefault(sid, set()).add(size)
        ids_update(sample_id.encode() + b"\n")
        content_update(line.rstrip(b"\r\n") + b"\n")
        if keep is not None and keep(index, occurrence, repeats, shard):
            table.kept[index] = parse_row(obj, name, number, shard_ids)
        occurrence += repeats
        index += 1
    for signature, count in signatures.items():
        for key in signature:
            field_counts[key] = field_counts.get(key, 0) + count
    if not table.repeats:
        raise DataError(f"{name}: the index has no rows")
    if suspects:
        _name_duplicate(path, suspects)
    table.content_digest = content.hexdigest()
    table.sample_id_digest = ids.hexdigest()
    table.fields = dict(sorted(field_counts.items()))
    table.families = dict(sorted(family_counts.items()))
    return table


def _name_duplicate(path: str | os.PathLike[str], suspects: set[int]) -> None:
    first_line: dict[str, int] = {}
    for number, row in iter_rows(path):
        if hash(row.sample_id) not in suspects:
            continue
        if row.sample_id in first_line:
            raise DataError(f"{path}:{number}: duplicate sample_id {row.sample_id!r} "
                            f"(first at line {first_line[row.sample_id]}); sample ids must be unique")
        first_line[row.sample_id] = number


def fetch_rows(path: str | os.PathLike[str], wanted: set[int]) -> dict[int, Row]:
    """Full rows for the given row numbers (0-based), reading only as far as needed."""
    found: dict[int, Row] = {}
    if not wanted:
        return found
    last = max(wanted)
    for index, (_, row) in enumerate(iter_rows(path)):
        if index in wanted:
            found[index] = row
        if index >= last:
            break
    return found


def shard_problems(table: IndexTable, root: Path) -> list[str]:
    """Containment, existence and declared sizes of every shard (one stat per unique shard)."""
    problems: list[str] = []
    try:
        real_root = root.resolve(strict=True)
    except FileNotFoundError:
        return [f"data root {root} does not exist (set SOLAR_DATA_ROOT or keep shards beside the index)"]
    for sid, shard in enumerate(table.shards):
        target = root / shard
        real = target.resolve()
        if real != real_root and real_root not in real.parents:
            problems.append(f"shard {shard}: resolves outside the data root {root} (via a symlink)")
            continue
        try:
            size = os.stat(real).st_size
        except FileNotFoundError:
            problems.append(f"shard {shard}: missing under {root}")
            continue
        declared = table.shard_sizes.get(sid)
        if declared and (len(declared) > 1 or size not in declared):
            problems.append(f"shard {shard}: size {size} bytes, index declares "
                            f"{', '.join(str(d) for d in sorted(declared))}")
    return problems


PROBLEMS_SHOWN = 100


def inspect(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> dict:
    """``solar data inspect``: counts, fields, families, shard problems and the id digest."""
    table = load_table(path)
    problems = shard_problems(table, data_root_for(path, root))
    shown = problems[:PROBLEMS_SHOWN]
    if len(problems) > PROBLEMS_SHOWN:
        shown.append(f"... and {len(problems) - PROBLEMS_SHOWN} more")
    result = {
        "index": str(path),
        "rows": table.rows,
        "virtual_occurrences": table.virtual_occurrences,
        "fields": table.fields,
        "shards": len(table.shards),
        "data_root": str(data_root_for(path, root)),
        "problems": shown,
        "problem_count": len(problems),
        "ordered_sample_id_digest": table.sample_id_digest,
        "content_digest": table.content_digest,
    }
    if table.families:
        result["families"] = table.families
    return result
