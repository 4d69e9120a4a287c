"""The elastic chaos bench, short (issue 45 item 9; the full run is bench/operator/elastic_chaos.py,
recorded in bench/RESULTS.md): 12 elastic SolarRuns on 24 emulated nodes against the real
``solar-operator --read-nodes`` process while 5 nodes fail (NotReady with DisruptionTarget, deleted,
or NotReady with nothing on the pods) and come back. Every failure count of the bench must be 0:
every run Succeeded with no failure counted, every killed attempt continued in time at the largest
shape the cluster held, every stage grew back when it could, the committed steps are 1..max_steps
with none lost or repeated, and the status's attempts, shape changes and disruption seconds agree
with what ran."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.crd_schema import anchor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_twelve_elastic_runs_and_five_node_failures_lose_no_step(tmp_path):
    anchor("kubeflow.org_pytorchjobs.yaml")  # the emulated cluster serves the upstream CRD: skipped without it
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "bench/operator/elastic_chaos.py", "--runs", "12", "--node-kills", "5",
                           "--nodes", "24", "--active", "8", "--steps", "200", "--kill-every", "4", "--seed", "3",
                           "--timeout", "300", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=360)
    assert out.is_file(), proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failures"] == {k: 0 for k in result["failures"]}, (result.get("details"), proc.stderr[-3000:])
    assert proc.returncode == 0
    assert result["node_kills"]["done"] == result["node_kills"]["hit_an_attempt"] == 5
    reasons = result["event_reasons"]
    assert reasons["TopologyShrunk"] >= 1 and reasons["TopologyGrown"] >= 1 and reasons["JobFailed"] == 0
