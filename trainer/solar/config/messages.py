"""One-line messages for schema errors: the dotted key, what is wrong, and a hint."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

_MAX_SHOWN = 3


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at ``loc`` (list indices are stepped through)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        info = next((i for n, i in model.model_fields.items() if (i.alias or n) == part), None)
        if info is None:
            return None
        candidates = _models_in(info.annotation)
        model = candidates[0] if candidates else None
    return model


def choices_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The values a ``Literal`` field at ``loc`` allows (empty when it is not one)."""
    owner = model_at(root, loc[:-1])
    info = next((i for n, i in owner.model_fields.items() if (i.alias or n) == loc[-1]), None) if owner else None
    found, stack = [], [info.annotation] if info is not None else []
    while stack:
        annotation = stack.pop(0)
        if typing.get_origin(annotation) is typing.Literal:
            found += [str(a) for a in typing.get_args(annotation)]
        else:
            stack += list(typing.get_args(annotation))
    return found


def did_you_mean(value: str, choices: list[str]) -> str:
    """`` (did you mean X?)`` for the choice ``value`` is closest to, else ''."""
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _value_at(tree: Any, loc: tuple[Any, ...]) -> Any:
    node = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one(error: dict[str, Any], root: type[BaseModel], tree: Any) -> str:
    loc = tuple(error["loc"])
    where = ".".join(str(part) for part in loc) or "<config>"
    kind = error["type"]
    if kind == "extra_forbidden":
        owner = model_at(root, loc[:-1])
        allowed = field_names(owner) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f" (did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?)" if close else (
            f" (allowed: {', '.join(allowed)})" if allowed else "")
        return f"{where}: unknown key{hint}"
    if kind == "missing":
        return f"{where}: required key is missing"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        value = _value_at(tree, loc)
        hint = did_you_mean(value, choices_at(root, loc)) if isinstance(value, str) else ""
        return f"{where}: must be one of {expected}; got {_shown(value)}{hint}"
    if kind in ("model_type", "dict_type"):
        return f"{where}: must be a mapping; got {_shown(_value_at(tree, loc))}"
    message = error["msg"]
    message = message[0].lower() + message[1:] if message else "invalid value"
    value = _value_at(tree, loc)
    if isinstance(value, str) and kind in _SCALAR_TYPES:
        return f"{where}: {message}; got the string {_shown(value)}{_unquoted(where, value, kind)}"
    return f"{where}: {message}; got {_shown(value)}"


# Scalar type errors whose input may be a quoted number or boolean (strict schema: "4" is not 4)
_SCALAR_TYPES = {"int_type", "int_parsing", "float_type", "float_parsing", "bool_type", "bool_parsing"}


def _unquoted(where: str, value: str, kind: str) -> str:
    """How to give a quoted number or boolean as one: the same text without quotes (parsed as the
    loader parses values: YAML 1.2, so ``1e-4`` is a number)."""
    from solar.config.loader import parse_yaml

    try:
        parsed = parse_yaml(value, where)
    except Exception:  # noqa: BLE001 - not YAML: nothing to suggest
        return ""
    fits = {"int": isinstance(parsed, int) and not isinstance(parsed, bool),
            "float": isinstance(parsed, (int, float)) and not isinstance(parsed, bool),
            "bool": isinstance(parsed, bool)}[kind.split("_")[0]]
    if not fits:
        return ""
    what = "the boolean" if kind.startswith("bool") else "the number"
    return f" (it was quoted); write {what} without quotes, e.g. --set {where}={value.strip()}"


def format_validation_error(exc: ValidationError, root: type[BaseModel], tree: Any) -> str:
    """Join the first few schema errors into one line."""
    errors = exc.errors(include_url=False, include_input=False)
    # Pydantic reports each member of a union separately; keep the first per location.
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for error in errors:
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and _is_union_tag(p)))
        seen.setdefault(loc, {**error, "loc": loc})
    # Unknown keys first (the likeliest typo), then bad values, then one summary of missing keys.
    ordered = sorted(seen.values(), key=lambda e: (e["type"] != "extra_forbidden", e["type"] == "missing"))
    parts = [_one(error, root, tree) for error in ordered if error["type"] != "missing"]
    missing = [".".join(map(str, e["loc"])) for e in ordered if e["type"] == "missing"]
    if len(missing) == 1:
        parts.append(f"{missing[0]}: required key is missing")
    elif missing:
        parts.append(f"required keys are missing: {', '.join(missing)}")
    line = "; ".join(parts[:_MAX_SHOWN])
    if len(parts) > _MAX_SHOWN:
        line += f"; and {len(parts) - _MAX_SHOWN} more"
    return line


def _is_union_tag(part: str) -> bool:
    # Union members appear in locs as e.g. 'int', 'constrained-int', 'list[int]', 'function-after[...]'
    return part in {"int", "float", "str", "bool", "none"} or "[" in part or part.startswith(
        ("constrained-", "function-", "lax-", "json-", "tagged-union"))


