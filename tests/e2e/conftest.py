"""Fixtures of the end-to-end tests: the emulated cluster and the real ``solar-operator`` process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.world import CRD
from tests.support.crd_schema import anchor
from tests.support.kube import emulated_cluster, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


@pytest.fixture
def cluster(tmp_path):
    with emulated_cluster([CRD, anchor("kubeflow.org_pytorchjobs.yaml")], tmp_path) as running:
        yield running


@pytest.fixture
def operator(cluster, tmp_path):
    storage = tmp_path / "runs"
    storage.mkdir()
    metrics_port, live_port = free_port(), free_port()
    exe = Path(sys.executable).with_name("solar-operator")
    log = open(tmp_path / "operator.log", "w")  # noqa: SIM115 (closed below)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "SOLAR_OPERATOR_POLL_SECONDS": "0.5"}
    proc = subprocess.Popen([str(exe), "--standalone", "-A", "--storage-root", str(storage), "--metrics-port",
                             str(metrics_port), "--liveness", f"http://127.0.0.1:{live_port}/healthz"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)

    def alive():
        try:
            return get(f"http://127.0.0.1:{live_port}/healthz")
        except OSError:
            assert proc.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
            return None
    wait_for(alive, timeout=60, message="the operator's liveness endpoint")
    yield {"metrics": f"http://127.0.0.1:{metrics_port}/metrics", "live": f"http://127.0.0.1:{live_port}/healthz",
           "storage": storage, "log": tmp_path / "operator.log"}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
