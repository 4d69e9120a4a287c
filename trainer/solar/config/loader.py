"""Strict loading of run configuration documents, ``--set`` edits and ``${VAR}`` expansion.

YAML is read with a loader that rejects what silently corrupts configs elsewhere: duplicate keys,
non-string keys, NaN/inf, and YAML 1.1 timestamps (kept as strings). Floats follow YAML 1.2, so
``1e-4`` is a float, not the string PyYAML 1.1 makes of it. JSON is read with the same rules, so a
``resolved-config.json`` can be fed back as a config.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from solar.errors import ConfigError

_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without timestamps, with YAML 1.2 floats and checked mappings."""

    source = "<config>"


# Drop the implicit timestamp and float resolvers, then add a YAML 1.2 float resolver.
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def _where(loader: _StrictLoader, node: yaml.Node) -> str:
    return f"{loader.source}:{node.start_mark.line + 1}"


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    result: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise ConfigError(
                f"{_where(loader, key_node)}: mapping key {key!r} is not a string "
                f"({_kind(key)}); quote the key"
            )
        if key in result:
            raise ConfigError(
                f"{_where(loader, key_node)}: duplicate key {key!r}; each key may appear once"
            )
        result[key] = loader.construct_object(value_node, deep=True)
    return result


def _construct_float(loader: _StrictLoader, node: yaml.ScalarNode) -> float:
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    if not math.isfinite(value):
        raise ConfigError(
            f"{_where(loader, node)}: non-finite number {node.value!r} is not allowed; use a finite value"
        )
    return value


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def parse_yaml(text: str, source: str = "<config>") -> Any:
    """Parse one YAML document with the strict rules above."""
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # the reader rejects control characters already here
        loader.source = source
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}{line}: invalid YAML: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _json_pairs(source: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ConfigError(f"{source}: duplicate key {key!r}; each key may appear once")
            result[key] = value
        return result

    return hook


def _json_constant(source: str):
    def reject(name: str) -> float:
        raise ConfigError(f"{source}: non-finite number {name} is not allowed; use a finite value")

    return reject


def parse_json(text: str, source: str = "<config>") -> Any:
    """Parse JSON, rejecting duplicate keys and NaN/Infinity."""
    try:
        return json.loads(text, object_pairs_hook=_json_pairs(source),
                          parse_constant=_json_constant(source))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{exc.lineno}: invalid JSON: {exc.msg}") from None


def read_document(path: str | os.PathLike[str], what: str = "--config") -> tuple[bytes, dict[str, Any]]:
    """Read a config file; returns its exact bytes (for the source digest) and the parsed mapping.
    ``what`` names the argument in errors (``MANIFEST`` for a SolarRun)."""
    source = str(path)
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {source}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {source}: is a directory, expected a YAML or JSON file") from None
    except OSError as exc:
        raise ConfigError(f"{what} {source}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    tree = parse_json(text, source) if p.suffix.lower() == ".json" else parse_yaml(text, source)
    if not isinstance(tree, dict):
        kind = "empty" if tree is None else f"a {type(tree).__name__}"
        raise ConfigError(f"{source}: the document is {kind}; a run config is a mapping of blocks")
    return raw, tree


def parse_set(item: str) -> tuple[list[str], Any]:
    """Split one ``--set KEY=VALUE``; the value is YAML (``8`` int, ``true`` bool, ``[1,2]`` list)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. train.max_steps=10")
    parts = key.split(".")
    if any(not part for part in parts):
        raise ConfigError(f"--set {item!r}: empty segment in dotted key {key!r}")
    value = parse_yaml(text, f"--set {key}") if text.strip() else None
    return parts, value


def apply_sets(tree: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """Apply ``--set`` edits in order to a copy of ``tree``; missing mappings are created."""
    result = _deep_copy(tree)
    for item in items:
        parts, value = parse_set(item)
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(
                    f"--set {'.'.join(parts)}: {where} is a {_kind(child)}, not a mapping; "
                    f"set {where} itself instead"
                )
            node = child
        node[parts[-1]] = value
    return result


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(tree: Any, environ: Mapping[str, str], path: str = "") -> Any:
    """Expand ``${VAR}`` in every string (``$$`` is a literal ``$``); an unset variable is an error."""
    if isinstance(tree, dict):
        return {k: expand_env(v, environ, f"{path}.{k}" if path else k) for k, v in tree.items()}
    if isinstance(tree, list):
        return [expand_env(v, environ, f"{path}.{i}") for i, v in enumerate(tree)]
    if isinstance(tree, str) and "$" in tree:
        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name = match.group(1)
            if name not in environ:
                raise ConfigError(
                    f"{path}: environment variable ${{{name}}} is not set; export it or use --set {path}=..."
                )
            return environ[name]

        return _VAR.sub(substitute, tree)
    return tree


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _deep_copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_deep_copy(v) for v in tree]
    return tree


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "list", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )
