"""YAML as the tests read it: libyaml's C loader where PyYAML was built with it (the upstream CRDs
are 0.5-0.9 MB each, about a second apiece for the pure-Python loader), and each file parsed once
per test process; callers get their own copy, free to change."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_all(text: str) -> list[Any]:
    """The non-empty documents of ``text``."""
    return [doc for doc in yaml.load_all(text, Loader=LOADER) if doc]


@functools.lru_cache(maxsize=None)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[Any, ...]:
    return tuple(parse_all(Path(path).read_text()))


def file_docs(path: Path) -> list[Any]:
    """The non-empty documents of the file at ``path`` (re-read when it changes)."""
    stat = Path(path).stat()
    return copy.deepcopy(list(_parsed(str(path), stat.st_mtime_ns, stat.st_size)))
