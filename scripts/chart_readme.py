#!/usr/bin/env python3
"""Generate charts/solar-operator/README.md from README.md.tmpl, values.yaml (the comment above each
key) and values.schema.json (types). ``--check`` exits 1 when the committed README is stale."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "solar-operator"


def documented_values(text: str) -> list[tuple[str, str]]:
    """(dotted key, its comment) for every key with a ``# --`` comment above it, in file order."""
    out, stack, comment = [], [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and comment:
            comment.append(stripped[1:].strip())
            continue
        m = re.match(r"^( *)([A-Za-z_][A-Za-z0-9_]*):", line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(2)))
            if comment:
                out.append((".".join(k for _, k in stack), " ".join(comment)))
        comment = [] if stripped else comment
    return out


def _lookup(tree, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


def _type(schema: dict, path: str) -> str:
    node = schema
    for part in path.split("."):
        node = node.get("properties", {}).get(part, {})
    kind = node.get("type", "")
    return "/".join(kind) if isinstance(kind, list) else kind


def render() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for path, comment in documented_values((CHART / "values.yaml").read_text()):
        default = json.dumps(_lookup(values, path), separators=(", ", ": "))
        rows.append(f"| `{path}` | {_type(schema, path)} | `{default}` | {comment.replace('|', '&#124;')} |")
    text = (CHART / "README.md.tmpl").read_text()
    return (text.replace("{{ version }}", chart["version"]).replace("{{ appVersion }}", chart["appVersion"])
            .replace("{{ values }}", "\n".join(rows)))


if __name__ == "__main__":
    target = CHART / "README.md"
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if target.is_file() and target.read_text() == render() else 1)
    target.write_text(render())
    print(target)
