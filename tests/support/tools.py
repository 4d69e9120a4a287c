"""The external tools the chart and monitoring tests run (helm, promtool, prometheus), fetched by
``scripts/fetch_tools.py`` into ``.cache/tools/bin`` (``make test`` does that first). A test that
needs one skips, naming the fetch command, when it is absent."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.yaml_docs import parse_all

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".cache" / "tools" / "bin"
CHART = REPO / "charts" / "solar-operator"
MONITORING_API = "monitoring.coreos.com/v1"


def tool(name: str) -> Path:
    path = BIN / name
    if not path.is_file():
        pytest.skip(f"{name} is not in {BIN} (run `python scripts/fetch_tools.py`; `make test` does)")
    return path


def helm(*args: str, tmp: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run helm with its cache/config/data homes under ``tmp`` (nothing written to $HOME)."""
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp / "helm-cache"), "HELM_CONFIG_HOME": str(tmp / "helm-config"),
           "HELM_DATA_HOME": str(tmp / "helm-data")}
    result = subprocess.run([str(tool("helm")), *args], env=env, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result


def values_args(values: dict | None, tmp: Path, name: str = "values") -> list[str]:
    if not values:
        return []
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["--values", str(path)]


def render(tmp: Path, values: dict | None = None, *, monitoring_api: bool = False, namespace: str = "solar-system",
           release: str = "solar") -> list[dict]:
    """``helm template`` of the chart: the rendered documents (hooks and tests included)."""
    args = ["template", release, str(CHART), "--namespace", namespace, *values_args(values, tmp)]
    if monitoring_api:
        args += ["--api-versions", MONITORING_API]
    out = helm(*args, tmp=tmp).stdout
    return parse_all(out)
