"""Builders of small indexes for data tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def rows(n: int, *, per_shard: int = 3, repeats: dict[int, int] | None = None, **extra) -> list[dict]:
    out = []
    for i in range(n):
        row = {"sample_id": f"s{i:05d}", "key": f"k{i:05d}", "shard": f"shards/{i // per_shard:04d}.tar"}
        if repeats and i in repeats:
            row["epoch_repeats"] = repeats[i]
        row.update(extra)
        out.append(row)
    return out


def write_index(path: Path, items: list[dict | str], *, gz: bool | None = None) -> Path:
    text = "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items)
    if gz if gz is not None else path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path
