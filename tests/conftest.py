"""Shared helpers: the repository root, in-process CLI calls and small config builders."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "solar_wm"
SHARED = REPO.parent / "shared"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``solar`` in-process: ``cli("config", "routes")`` -> CliResult."""
    from solar.cli import main

    def run(*argv: str, env: dict[str, str] | None = None) -> CliResult:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def pytest_configure(config):
    """Under pytest-xdist (``make test``) each worker shares the machine's cores with the others: one
    compute thread per process, in the worker and in what it starts (the end-to-end helpers already
    start trainers with one), instead of every process spinning a thread per core."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def python() -> str:
    return sys.executable


# Hypothesis: 300 examples per property by default; HYPOTHESIS_PROFILE=deep for a longer hunt.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("default", max_examples=300)
_hypothesis_settings.register_profile("deep", max_examples=5000)
_hypothesis_settings.load_profile(__import__("os").environ.get("HYPOTHESIS_PROFILE", "default"))
