"""The shipped ``solar-operator`` process against the emulated API server, driven with ``kubectl``.

Every manifest in ``examples/`` is applied with ``kubectl apply`` and reaches its first job;
``kubectl get``/``wait``/``patch``/``delete`` behave as users expect; the liveness and metrics
endpoints answer; a deleted run's series leave ``/metrics``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.conftest import get as _get
from tests.integration.world import write_checkpoint
from tests.support.crd_schema import ANCHORS
from tests.support.kube import KUBECTL, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not Path(KUBECTL).is_file(), reason=f"{KUBECTL} is not installed")]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_kubectl_apply_get_wait_on_every_example(cluster, operator):
    k = cluster.kubectl
    runtime = ANCHORS / "torch_distributed.yaml"
    trainjobs = "trainjobs" in k("api-resources", "-o", "name").stdout and runtime.is_file()
    if trainjobs:  # Kubeflow Trainer v2's torch-distributed runtime, as a cluster administrator installs it
        k("apply", "-f", str(runtime))
    examples = [p for p in EXAMPLES if trainjobs or yaml.safe_load(p.read_text())["spec"].get("backend") != "TrainJob"]
    for path in examples:
        k("apply", "-f", str(path))
    docs = [yaml.safe_load(p.read_text()) for p in examples]
    names = [d["metadata"]["name"] for d in docs]
    for name in names:
        k("wait", "--for=jsonpath={.status.phase}=Running", f"solarrun/{name}", "--timeout=60s")
        k("wait", "--for=condition=Validated", f"srun/{name}", "--timeout=10s")
    table = k("get", "srun").stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "STAGE", "STEP", "GPU-HOURS", "AGE"]
    assert sorted(line.split()[:3] for line in table[1:]) == sorted([n, "Running", "fm"] for n in names)
    jobs = k("get", "pytorchjobs", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    kinds = {d["metadata"]["name"]: d["spec"].get("backend", "PyTorchJob") for d in docs}
    assert sorted(jobs) == sorted(f"{n}-fm-1" for n in names if kinds[n] == "PyTorchJob")
    if trainjobs:  # the same under Trainer v2: kubectl sees the run and its TrainJob alike
        assert "TrainJob" in kinds.values()
        found = k("get", "trainjobs", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        assert sorted(found) == sorted(f"{n}-fm-1" for n in names if kinds[n] == "TrainJob")
    events = k("get", "events", "--field-selector", f"involvedObject.name={names[0]}", "-o",
               "jsonpath={.items[*].reason}").stdout.split()
    assert events[:3] == ["Resolved", "MemoryForecast", "StageStarted"]
    health = _get(operator["live"])
    assert '"runs"' in health
    text = _get(operator["metrics"])
    assert f'solar_runs{{phase="Running"}} {len(names)}.0' in text
    assert 'solar_operator_reconcile_total{handler="create",result="success"}' in text

    # suspend and resume through kubectl patch
    k("patch", "srun", names[0], "--type", "merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    k("wait", "--for=condition=Suspended", f"srun/{names[0]}", "--timeout=30s")
    wait_for(lambda: f"{names[0]}-fm-1" not in k("get", "pytorchjobs", "-o", "name").stdout, timeout=30)
    k("patch", "srun", names[0], "--type", "merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    k("wait", "--for=jsonpath={.status.phase}=Running", f"srun/{names[0]}", "--timeout=30s")
    if trainjobs:  # a suspended TrainJob run keeps its job, suspended through the job's own spec.suspend
        name = next(n for n in names if kinds[n] == "TrainJob")
        k("patch", "srun", name, "--type", "merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
        k("wait", "--for=condition=Suspended", f"srun/{name}", "--timeout=30s")
        k("wait", "--for=jsonpath={.spec.suspend}=true", f"trainjob/{name}-fm-1", "--timeout=30s")
        k("patch", "srun", name, "--type", "merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
        # the resume replaces the job (delete, then create attempt 2, a job of its own): kubectl wait
        # before it exists finds no object and fails at once, so poll until it does
        wait_for(lambda: k("get", f"trainjob/{name}-fm-2", "-o", "jsonpath={.metadata.labels.solarwm\\.io/attempt}",
                           check=False).stdout == "2", timeout=30, message="attempt 2's TrainJob")
        assert f"{name}-fm-1" not in k("get", "trainjobs", "-o", "name").stdout   # the suspended one is gone

    # a bad run fails with a reason users can wait on, and gets no job
    bad = yaml.safe_load(EXAMPLES[0].read_text())
    bad["metadata"]["name"] = "typo"
    bad["spec"]["stages"][1]["init"] = {"model": {"stage": "fn", "weights": "ema"}}
    (operator["storage"].parent / "typo.yaml").write_text(yaml.safe_dump(bad))
    k("apply", "-f", str(operator["storage"].parent / "typo.yaml"))
    k("wait", "--for=condition=Failed", "srun/typo", "--timeout=30s")
    reason = k("get", "srun", "typo", "-o", "jsonpath={.status.conditions[?(@.type=='Validated')].reason}").stdout
    assert reason == "InvalidInit"
    assert "typo-" not in k("get", "pytorchjobs", "-o", "name").stdout

    # a checkpoint in the stage directory shows as the run's step, in kubectl and in /metrics
    first = yaml.safe_load(EXAMPLES[0].read_text())
    write_checkpoint(operator["storage"] / first["spec"]["storage"]["path"] / "fm", 2)
    k("wait", "--for=jsonpath={.status.step}=2", f"srun/{names[0]}", "--timeout=30s")
    series = f'solar_run_checkpoint_step{{namespace="default",run="{names[0]}",stage="fm"}} 2.0'
    wait_for(lambda: series in _get(operator["metrics"]), timeout=30, message="the checkpoint series")

    # deleting a run removes its per-run series
    k("delete", "srun", names[0])
    wait_for(lambda: f'run="{names[0]}"' not in _get(operator["metrics"]) or None, timeout=30)
    text = _get(operator["metrics"])
    assert 'solar_runs{phase="Failed"} 1.0' in text and f'solar_runs{{phase="Running"}} {len(names) - 1}.0' in text


def test_liveness_answers_at_once_and_sigterm_ends_the_process_within_5_seconds(cluster, operator):
    """While every example run is being reconciled, /healthz answers within a second; a SIGTERM with
    that work in flight ends the process within 5 s (kopf's ultimate exiting timeout, 4.5 s)."""
    import signal
    import time

    for path in EXAMPLES:
        cluster.kubectl("apply", "-f", str(path))
    answers = []
    for _ in range(10):
        started = time.monotonic()
        assert '"runs"' in _get(operator["live"])
        answers.append(time.monotonic() - started)
        time.sleep(0.1)
    assert max(answers) < 1.0, answers
    proc = operator["proc"]
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - started < 5.0
