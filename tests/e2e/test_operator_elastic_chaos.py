"""The elastic chaos bench, short (issue 45 item 9, issue 51 item 7; the full run is
bench/operator/elastic_chaos.py, recorded in bench/RESULTS.md): 12 elastic SolarRuns on 24 nodes of the
faithful emulated cluster (kubelets that heartbeat, the node lifecycle controller, the taint manager,
PodGC, one-pod-at-a-time scheduling, each pod its own played-rank process that honours the fence) against
the real ``solar-operator --read-nodes`` process while 5 nodes are lost, one of each kind (NotReady with
the taint manager's eviction, NotReady alone, deleted, silent: SIGSTOPped, dead kubelet: its ranks run
on), and come back. Every failure count of the bench must be 0: every run Succeeded with no failure
counted, none stuck, every lost attempt continued in time at the largest shape the cluster held, every
stage grew back when it could and no grow was decided without room or collided, the committed steps are
1..max_steps with none lost or repeated, nothing a replaced attempt wrote after its successor recorded
its token (stale commits), and the status's attempts, shape changes and disruption seconds agree with
what ran."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.crd_schema import anchor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]   # about 2 minutes on a 2-core machine


def test_twelve_elastic_runs_and_five_node_losses_of_every_kind_lose_no_step(tmp_path):
    anchor("kubeflow.org_pytorchjobs.yaml")  # the emulated cluster serves the upstream CRD: skipped without it
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "bench/operator/elastic_chaos.py", "--runs", "12", "--node-kills", "5",
                           "--nodes", "24", "--active", "8", "--steps", "500", "--kill-every", "4", "--seed", "3",
                           "--timeout", "240", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=330)
    assert out.is_file(), proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failures"] == {k: 0 for k in result["failures"]}, (result.get("details"), proc.stderr[-3000:])
    assert proc.returncode == 0
    assert "collisions" in result["failures"] and "decided_without_room_then" in result["failures"]
    assert "stale_commits" in result["failures"] and "stale_writes" in result["failures"]
    kills = result["node_kills"]
    assert kills["done"] == kills["hit_an_attempt"] == 5
    assert kills["by_kind"] == {kind: 1 for kind in ("not-ready", "not-ready-alone", "deleted", "silent",
                                                     "dead-kubelet")}
    continued = result["continued"]["by_kind"]
    assert continued["silent"]["n"] == 1 and continued["dead-kubelet"]["n"] == 1, continued
    assert result["steps"]["lost"] == result["steps"]["repeated_in_history"] == 0
    reasons = result["event_reasons"]
    assert reasons["TopologyShrunk"] >= 1 and reasons["JobFailed"] == 0
