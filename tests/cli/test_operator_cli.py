"""The solar-operator console script: the contract's flags, clear refusals, no torch."""

from __future__ import annotations

import os
import subprocess
import sys


def _exe() -> str:
    return os.path.join(os.path.dirname(sys.executable), "solar-operator")


def test_help_lists_contract_flags():
    proc = subprocess.run([_exe(), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--storage-root", "--metrics-port", "--standalone", "-A", "-n", "--liveness", "--default-backend",
                 "--backends", "render MANIFEST"):
        assert flag in proc.stdout


def test_refuses_a_missing_storage_root_in_one_line(tmp_path):
    proc = subprocess.run([_exe(), "--standalone", "-A", "--storage-root", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is not a directory" in proc.stderr


def test_requires_a_watch_scope(tmp_path):
    proc = subprocess.run([_exe(), "--standalone", "--storage-root", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "-A/--all-namespaces or -n/--namespace" in proc.stderr


def test_operator_package_imports_without_torch():
    code = ("import sys, solar_operator.main, solar_operator.handlers, solar_operator.runs, solar_operator.jobs, "
            "solar_operator.kube, solar_operator.metrics, solar_operator.trainjobs, solar_operator.backends, "
            "solar_operator.render, solar_operator.pod, solar.run.plan, solar.run.machine, solar.local.executor; "
            "assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_refuses_an_unknown_or_disabled_default_backend_in_one_line(tmp_path):
    proc = subprocess.run([_exe(), "--standalone", "-A", "--storage-root", str(tmp_path), "--default-backend",
                           "mpijob"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "'mpijob' is not a backend" in proc.stderr
    env = {**os.environ, "SOLAR_OPERATOR_DEFAULT_BACKEND": "trainjob", "SOLAR_OPERATOR_BACKENDS": "pytorchjob"}
    proc = subprocess.run([_exe(), "--standalone", "-A", "--storage-root", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "--default-backend TrainJob is not among --backends PyTorchJob" in proc.stderr
