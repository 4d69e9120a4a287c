"""Durable file writes: create-only and atomic replace, both fsynced (file and directory).

A reader never sees a half-written file: bytes go to a hidden temporary sibling, are fsynced, and
only then appear under the final name (``link`` for create-only, ``rename`` for replace), after
which the directory is fsynced so the name itself survives a crash. ``write_replace(...,
durable=False)`` keeps the atomic rename but skips both fsyncs: for status files rewritten many
times a second whose newest version is only meaningful while the machine is up (heartbeats), where
a process crash still leaves the last whole version in the page cache.

Both check the stage's fence before the temporary file and again before publishing it
(``solar.storage.fence.check``: nothing without a fencing token; a process of an attempt a newer one
replaced removes its temporary file and leaves without writing).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from solar.errors import SolarError
from solar.storage import fence


class OutputExistsError(SolarError):
    """A create-only write found its target already there."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(target: Path, data: bytes, durable: bool = True) -> Path:
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return tmp


def write_create_only(path: str | os.PathLike[str], data: bytes, *, what: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically; refuse if ``path`` exists (never overwrite)."""
    fence.check()
    target = Path(path)
    if target.exists() or target.is_symlink():
        raise OutputExistsError(f"{what} {target} already exists; choose a new path (nothing was written)")
    if not target.parent.is_dir():
        raise SolarError(f"{what} {target}: directory {target.parent} does not exist")
    tmp = _write_temp(target, data)
    fence.check(discard=tmp)
    try:
        os.link(tmp, target)  # fails with FileExistsError if someone else created it meanwhile
    except FileExistsError:
        raise OutputExistsError(
            f"{what} {target} already exists; choose a new path (nothing was written)") from None
    finally:
        tmp.unlink()
    fsync_dir(target.parent)
    return target


def write_replace(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically, replacing a previous version (status-like files);
    ``durable=False``: no fsync (the module's docstring says when)."""
    fence.check()
    target = Path(path)
    tmp = _write_temp(target, data, durable)
    fence.check(discard=tmp)
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(target.parent)
    return target
