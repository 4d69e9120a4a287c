"""CRD openAPIV3Schema -> strict JSON Schema (kubernetes.md: plain jsonschema is too lax).

int-or-string becomes anyOf integer/string, nullable allows null, and every object without
``x-kubernetes-preserve-unknown-fields`` rejects unknown fields (what API-server pruning would
silently drop is an error here). Upstream CRDs are read from ../shared/anchors; tests skip cleanly
when they are absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.yaml_docs import file_docs

ANCHORS = Path(__file__).resolve().parents[2].parent / "shared" / "anchors"


def strict(node: dict) -> dict:
    node = dict(node)
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.pop("x-kubernetes-preserve-unknown-fields", False):
        return {k: v for k, v in node.items() if k in ("type", "description")}
    nullable = node.pop("nullable", False)
    for drop in ("x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
                 "x-kubernetes-validations", "x-kubernetes-embedded-resource"):
        node.pop(drop, None)
    if "properties" in node:
        node["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        node.setdefault("additionalProperties", False)
    elif isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = strict(node["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            node[key] = [strict(v) for v in node[key]]
    if nullable and "type" in node:
        node["type"] = [node["type"], "null"]
    return node


def crd_validator_schema(path: Path, version: str | None = None) -> dict:
    crd = next(d for d in file_docs(path) if d.get("kind") == "CustomResourceDefinition")
    versions = crd["spec"]["versions"]
    chosen = next(v for v in versions if version is None or v["name"] == version)
    schema = strict(chosen["schema"]["openAPIV3Schema"])
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return schema


def anchor(name: str) -> Path:
    path = ANCHORS / name
    if not path.is_file():
        pytest.skip(f"upstream CRD {path} is not available here")
    return path
