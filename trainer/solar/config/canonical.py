"""Canonical JSON and BLAKE2s-256 digests (the identity of configs, manifests and plans)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_bytes(obj: Any) -> bytes:
    """Sorted keys, no whitespace, no NaN/inf, UTF-8: equal objects give equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def blake2s_hex(data: bytes) -> str:
    return hashlib.blake2s(data, digest_size=32).hexdigest()


def digest(obj: Any) -> str:
    """BLAKE2s-256 of the canonical JSON of ``obj``."""
    return blake2s_hex(canonical_bytes(obj))


def readable(obj: Any, indent: str = "") -> str:
    """Indented JSON with sorted keys; lists of scalars stay on one line."""
    step = indent + "  "
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{step}{json.dumps(str(k), ensure_ascii=False)}: {readable(v, step)}"
                 for k, v in sorted(obj.items())]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, (list, tuple)):
        if not obj:
            return "[]"
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ", ".join(readable(v) for v in obj) + "]"
        return "[\n" + ",\n".join(step + readable(v, step) for v in obj) + "\n" + indent + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def pretty_bytes(obj: Any) -> bytes:
    """Human-readable JSON with the canonical key order (for stdout and documents people read)."""
    return (readable(obj) + "\n").encode("utf-8")
