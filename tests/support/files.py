"""What a directory holds, byte for byte: the "nothing written" check of a refusal."""

from __future__ import annotations

import os
from pathlib import Path


def snapshot(root: Path) -> dict[str, bytes | str | None]:
    """Every path below ``root`` (relative, sorted, hidden ones included) with its bytes, None for a
    directory (an empty one too) and ``-> target`` for a symbolic link (not followed); {} when ``root``
    does not exist. Equal snapshots: nothing was created (no file, no directory, no link), removed,
    appended or rewritten. Compare a whole tree with it, never a list of names or of files only."""
    root = Path(root)
    if not root.exists():
        return {}
    found: dict[str, bytes | str | None] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = None
            else:
                found[rel] = path.read_bytes()
    return dict(sorted(found.items()))
