"""A run's own writes meeting a full or failing volume: the class, the path and what to do.

``storage_full`` (ENOSPC, EDQUOT) and ``storage_error`` (EIO, EROFS) are the ``error_type`` a launch
records when a checkpoint or validation write fails that way; the message names the path, the free
space of its volume and the fix. ``shortfall`` answers, before a save starts, whether the volume
can hold it at all.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

FULL, ERROR = "storage_full", "storage_error"
_FULL = {errno.ENOSPC, errno.EDQUOT}
_ERROR = {errno.EIO, errno.EROFS}


def storage_class(exc: BaseException) -> str | None:
    """``storage_full`` / ``storage_error`` for an OSError of that kind, else None."""
    if isinstance(exc, OSError):
        if exc.errno in _FULL:
            return FULL
        if exc.errno in _ERROR:
            return ERROR
    return None


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes for an unprivileged writer on the volume holding ``path`` (its nearest existing
    parent), or None when that cannot be read."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def human(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def message(kind: str, what: str, exc: OSError, where: str | os.PathLike[str]) -> str:
    """One line: what failed, where (the directory written into), the volume's free space and the fix."""
    if kind == FULL:
        return (f"{what}: no space left on the volume of {where} ({human(free_bytes(where))} free); free space "
                f"there or point runtime.output_dir at a larger volume, then resume from the last checkpoint")
    return (f"{what}: the volume of {where} failed ({os.strerror(exc.errno or 0)}); check the volume, then resume "
            f"from the last checkpoint")


def shortfall(where: str | os.PathLike[str], needed: int, what: str) -> str | None:
    """The storage_full message when the volume of ``where`` has less free space than ``needed``
    bytes (plus 1% headroom for metadata), else None."""
    free = free_bytes(where)
    if free is None or free >= needed * 1.01:
        return None
    return (f"{what}: needs {human(needed)} at {where}, its volume has {human(free)} free; free "
            f"{human(int(needed * 1.01) - free)} or more there or point runtime.output_dir at a larger volume, "
            f"then resume from the last checkpoint")
