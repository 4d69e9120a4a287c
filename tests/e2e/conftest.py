"""Fixtures of the end-to-end tests: the session's shared tiny Wan dataset and Stage0.5 run, the
emulated cluster and the real ``solar-operator`` process."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from filelock import FileLock

from tests.e2e.helpers import TINY, train
from tests.integration.world import CRD, TRAINJOB_CRDS
from tests.support.crd_schema import ANCHORS, anchor
from tests.support.kube import emulated_cluster, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``name`` under the session's base directory, built by ``build(path)`` once per test session:
    under pytest-xdist the first worker to ask builds it (the others wait on a file lock) and every
    worker reads the same directory. A marker written after ``build`` returns tells a finished
    build from a failed one, which the next caller removes and builds again. Shared results are
    read-only by contract: a test that changes one copies it first."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, shared by the workers' own base directories
    target = root / "shared" / name
    done = target.with_name(f"{name}.done")
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            done.touch()
    return target


@pytest.fixture(scope="session")
def wan_data(tmp_path_factory) -> Path:
    """The session's tiny Wan TI2V-5B dataset (4 train and test samples, seed 3); read-only."""
    from solar.data.synth import synthesize

    return built_once(tmp_path_factory, "wan-data", lambda path: synthesize("wan22_ti2v_5b", path, samples=4, seed=3))


@pytest.fixture(scope="session")
def wan_stage0p5(wan_data, tmp_path_factory) -> Path:
    """The session's tiny Wan Stage0.5 run on ``wan_data``: 4 steps, checkpoints and validation
    (live-unipc, ema-unipc) at steps 2 and 4; read-only (the pipeline tests start Stage1 from it)."""
    def build(path: Path) -> None:
        run = path / "stage0p5"
        proc = train(TINY["wan22_ti2v_5b"], [f"data.root={wan_data}", f"runtime.output_dir={run}",
                                             "runtime.log_every=100", "train.max_steps=4", "runtime.save_every=2",
                                             "runtime.validate_every=2"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert run.joinpath("checkpoints", "step_00000004", "COMPLETE.json").is_file()

    return built_once(tmp_path_factory, "wan-run", build) / "stage0p5"  # the name the pipeline tests expect


@pytest.fixture
def cluster(tmp_path):
    """Serves SolarRuns, PyTorchJobs and, where their upstream CRDs are at hand, Trainer v2's TrainJobs
    and ClusterTrainingRuntimes."""
    trainer = [ANCHORS / name for name in TRAINJOB_CRDS if (ANCHORS / name).is_file()]
    with emulated_cluster([CRD, anchor("kubeflow.org_pytorchjobs.yaml"), *trainer], tmp_path) as running:
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
           "storage": storage, "log": tmp_path / "operator.log", "proc": proc}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
