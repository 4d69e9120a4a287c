"""What a directory holds, byte for byte: the "nothing written" check of a refusal."""

from __future__ import annotations

from pathlib import Path


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path below ``root`` (relative, sorted) with its bytes (None for a directory); {} when
    ``root`` does not exist. Equal snapshots: nothing was created, removed, appended or rewritten."""
    root = Path(root)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}
