"""The SolarRun CustomResourceDefinition, generated from the pydantic models in ``spec.py``.

``crds/solarwm.io_solarruns.yaml`` is this document, and so is the Helm chart's copy
``charts/solar-operator/files/`` (a chart cannot read files outside itself); ``python -m
solar.run.crd`` rewrites both and a test fails when a committed copy and the models drift apart. The conversion makes a structural
schema: references inlined, every node typed, optional fields ``nullable``, free-form Kubernetes
objects (volume sources, resources, affinity, tolerations) ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from solar.run.spec import GROUP, KIND, PLURAL, SHORT, VERSION, SolarRunSpec, SolarRunStatus

REPO = Path(__file__).resolve().parents[3]
CRD_PATH = REPO / "crds" / f"{GROUP}_{PLURAL}.yaml"
CHART_CRD_PATH = REPO / "charts" / "solar-operator" / "files" / f"{GROUP}_{PLURAL}.yaml"
_KEEP = ("description", "pattern", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
         "enum", "default", "format")


def _structural(node: dict, defs: dict) -> dict:
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    variants = node.get("anyOf")
    if variants:
        real = [v for v in variants if v.get("type") != "null"]
        if len(real) != 1:
            raise ValueError(f"cannot express anyOf {variants} structurally")
        inner = _structural(real[0], defs)
        out = {**inner, **{k: node[k] for k in _KEEP if k in node}}
        if len(real) < len(variants):
            out["nullable"] = True
        if out.get("default", 0) is None:
            del out["default"]
        return out
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
        node.setdefault("type", "string")
    out = {k: node[k] for k in _KEEP if k in node}
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties")
        if props:
            out["properties"] = {name: _structural(value, defs) for name, value in props.items()}
            required = node.get("required")
            if required:
                out["required"] = list(required)
        else:
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("type") not in (None, "object") and not extra.get("anyOf"):
                out["additionalProperties"] = _structural(extra, defs)
            else:
                out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["type"] = "array"
        out["items"] = _structural(node.get("items", {"type": "object"}), defs)
    elif kind in ("string", "integer", "number", "boolean"):
        out["type"] = kind
    elif kind is None:
        out["x-kubernetes-preserve-unknown-fields"] = True
        out["type"] = "object"
    else:
        raise ValueError(f"unsupported JSON schema type {kind!r}")
    if out.get("type") == "object" and "items" in out:
        del out["items"]
    return out


def openapi_schema(model) -> dict:
    schema = model.model_json_schema(mode="validation")
    return _structural({k: v for k, v in schema.items() if k != "$defs"}, schema.get("$defs", {}))


def _strip_titles(node):
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def crd_document() -> dict[str, Any]:
    spec = _strip_titles(openapi_schema(SolarRunSpec))
    status = _strip_titles(openapi_schema(SolarRunStatus))
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": [SHORT]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Stage", "type": "string", "jsonPath": ".status.currentStage"},
                    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
                    {"name": "GPU-Hours", "type": "number", "jsonPath": ".status.gpuHours"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A Solar training and inference run: ordered stages, each a PyTorchJob.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                        "spec": spec, "status": status,
                    },
                }},
            }],
        },
    }


def render() -> str:
    import yaml

    header = ("# Generated from trainer/solar/run/spec.py by `python -m solar.run.crd`; do not edit by hand.\n"
              "# A test fails when this file and the models disagree.\n")
    return header + yaml.safe_dump(crd_document(), sort_keys=False, width=100)


if __name__ == "__main__":
    text = render()
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if all(p.is_file() and p.read_text() == text for p in (CRD_PATH, CHART_CRD_PATH)) else 1)
    for path in (CRD_PATH, CHART_CRD_PATH):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
