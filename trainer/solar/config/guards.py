"""Checks over the raw config tree: inline credentials and unresolved ``/path/to/`` placeholders."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from solar.errors import ConfigError

PLACEHOLDER_PREFIX = "/path/to/"
CREDENTIAL_KEYS = ("token", "password", "secret", "api_key", "access_token")
_URL_USERINFO = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s]*:[^/@\s]+@")


def walk(tree: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """Yield ``(dotted_key, last_key, value)`` for every leaf and mapping entry of ``tree``."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            dotted = f"{path}.{key}" if path else str(key)
            yield dotted, str(key), value
            yield from walk(value, dotted)
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            dotted = f"{path}.{index}"
            yield dotted, str(index), value
            yield from walk(value, dotted)


def is_credential_key(key: str) -> bool:
    lowered = key.lower()
    return any(lowered == name or lowered.endswith("_" + name) for name in CREDENTIAL_KEYS)


def reject_inline_credentials(tree: dict[str, Any]) -> None:
    """Credentials never live in run configs; the message names the key and never the value."""
    found: list[str] = []
    for dotted, key, value in walk(tree):
        if is_credential_key(key) and value not in (None, "", {}, []):
            found.append(dotted)
        elif isinstance(value, str) and _URL_USERINFO.match(value):
            found.append(dotted + " (credentials in a URL)")
    if found:
        raise ConfigError(
            f"inline credential at {', '.join(found)}: remove it and supply credentials through the "
            "environment or a mounted secret (the value is not shown)"
        )


def placeholder_keys(tree: dict[str, Any], is_read: Callable[[str], bool]) -> list[str]:
    """Dotted keys whose value is a ``/path/to/...`` placeholder in a field the action reads."""
    return sorted(
        dotted for dotted, _, value in walk(tree)
        if isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX) and is_read(dotted)
    )
