"""The operator chaos bench, short (issue 26 item 3): 30 SolarRuns of every kind (plain, invalid,
suspended and resumed, failing and retried, failing past their backoffLimit, deleted mid-run) against
the real ``solar-operator`` process, SIGKILLed 5 times (first while all 30 runs are active) and
restarted, while the emulated API server answers a random share of its requests with 500, 429 +
Retry-After, 409 on patches and deletes, slow answers, and cuts its watch streams. Every failure
count of the bench must be 0, and /healthz must answer within 5 s (the emulator, the operator and
the players share two cores here; the 1 s bound is the full bench's: bench/operator/chaos_load.py).
"""

from __future__ import annotations

import pytest

from bench.operator.chaos_load import chaos
from tests.support.crd_schema import anchor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_thirty_runs_five_kills_and_api_faults_lose_nothing(tmp_path):
    anchor("kubeflow.org_pytorchjobs.yaml")  # the emulated cluster serves the upstream CRD: skipped without it
    result = chaos(runs=30, kills=5, seed=7, poll_seconds=3.0, active=30, liveness_bound=5.0, timeout=200,
                   workdir=tmp_path / "chaos")
    assert result["failures"] == {k: 0 for k in result["failures"]}, (result["details"], result["operator_log"])
    assert result["kills"] == 5 and not result["harness_errors"]
    assert result["start_to_first_200"]["max_ms"] < 5000 and result["liveness_answers"]["max_ms"] < 5000
    injected = result["faults_injected"]
    assert all(injected.get(kind) for kind in ("500", "429", "409", "slow", "watch_cut")), injected
    kinds = result["scenarios"]
    assert all(kinds.get(kind) for kind in ("ok", "invalid", "suspend", "retry", "exhaust", "delete")), kinds
