"""The solar-operator console script exists, parses the contract's flags and says what it lacks."""

from __future__ import annotations

import os
import subprocess
import sys


def _exe() -> str:
    return os.path.join(os.path.dirname(sys.executable), "solar-operator")


def test_help_lists_contract_flags():
    proc = subprocess.run([_exe(), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--storage-root", "--metrics-port", "--standalone", "-A", "-n", "--liveness"):
        assert flag in proc.stdout


def test_reports_missing_handlers_in_one_line():
    proc = subprocess.run([_exe(), "--standalone", "-A"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not part of this build" in proc.stderr


def test_operator_package_imports_without_torch():
    code = "import sys, solar_operator.main; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
