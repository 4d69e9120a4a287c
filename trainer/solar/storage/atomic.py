"""Durable file writes: create-only and atomic replace, both fsynced (file and directory).

A reader never sees a half-written file: bytes go to a hidden temporary sibling, are fsynced, and
only then appear under the final name (``link`` for create-only, ``rename`` for replace), after
which the directory is fsynced so the name itself survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from solar.errors import SolarError


class OutputExistsError(SolarError):
    """A create-only write found its target already there."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(target: Path, data: bytes) -> Path:
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return tmp


def write_create_only(path: str | os.PathLike[str], data: bytes, *, what: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically; refuse if ``path`` exists (never overwrite)."""
    target = Path(path)
    if target.exists() or target.is_symlink():
        raise OutputExistsError(f"{what} {target} already exists; choose a new path (nothing was written)")
    if not target.parent.is_dir():
        raise SolarError(f"{what} {target}: directory {target.parent} does not exist")
    tmp = _write_temp(target, data)
    try:
        os.link(tmp, target)  # fails with FileExistsError if someone else created it meanwhile
    except FileExistsError:
        raise OutputExistsError(
            f"{what} {target} already exists; choose a new path (nothing was written)") from None
    finally:
        tmp.unlink()
    fsync_dir(target.parent)
    return target


def write_replace(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, replacing a previous version (status-like files)."""
    target = Path(path)
    tmp = _write_temp(target, data)
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)
    return target
