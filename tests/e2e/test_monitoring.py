"""Monitoring with the real tools: promtool checks and unit-tests the alert rules the chart renders
and lints the operator's and a training run's /metrics; a real Prometheus scrapes the operator
(against the emulated API server, with SolarRuns applied) and a tiny trainer, evaluates the rules,
and answers every dashboard query."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.conftest import free_port, get
from tests.e2e.helpers import TINY, train
from tests.support.kube import KUBECTL, wait_for
from tests.support.tools import CHART, render, tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
RULE_TESTS = REPO / "tests" / "data" / "prometheus" / "alerts_test.yaml"
DASHBOARD = CHART / "dashboards" / "solar-runs.json"
ALERTS = {"SolarOperatorDown", "SolarOperatorReconcileErrors", "SolarRunFailed", "SolarTrainingStalled",
          "SolarRunCheckpointStale", "SolarNonFiniteLoss"}


def _rendered_rules(tmp_path: Path) -> Path:
    """The rule file exactly as the chart's PrometheusRule carries it."""
    docs = render(tmp_path, {"monitoring": {"prometheusRule": {"enabled": True}}}, monitoring_api=True)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def _promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool("promtool")), *args], input=stdin, capture_output=True, text=True, timeout=120)


def test_promtool_checks_and_unit_tests_the_rendered_rules(tmp_path):
    rules = _rendered_rules(tmp_path)
    checked = _promtool("check", "rules", str(rules))
    assert checked.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout, checked.stdout
    assert {r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]} == ALERTS
    shutil.copy(RULE_TESTS, tmp_path / "alerts_test.yaml")
    tested = _promtool("test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    tested_alerts = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
                     for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested_alerts == ALERTS  # every alert is shown to fire


def test_the_rule_tests_fail_when_a_rule_is_broken(tmp_path):
    rules = _rendered_rules(tmp_path)
    text = rules.read_text().replace('solar_run_phase{phase="Failed"} == 1', 'solar_run_phase{phase="Failed"} == 2')
    rules.write_text(text)
    shutil.copy(RULE_TESTS, tmp_path / "alerts_test.yaml")
    tested = _promtool("test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert tested.returncode != 0 and "alertname: SolarRunFailed" in tested.stdout + tested.stderr


class _Trainer:
    """A tiny Stage0.5 run serving rank 0's metrics until stopped with SIGTERM (as a pod is)."""

    def __init__(self, data: Path, out: Path, port: int) -> None:
        self.out, self.url = out, f"http://127.0.0.1:{port}/metrics"
        self.proc = train(TINY["wan22_ti2v_5b"], [f"data.root={data}", f"runtime.output_dir={out}",
                                                  "runtime.log_every=100", "train.max_steps=100000",
                                                  "runtime.save_every=2", "train.optimizer.warmup_steps=1"],
                          extra_env={"SOLAR_METRICS_PORT": str(port), "SOLAR_PEAK_FLOPS": "1e9"}, wait=False)

    def scrape_when(self, ready) -> str:
        def attempt():
            assert self.proc.poll() is None, self.proc.stderr.read()[-3000:]
            try:
                text = get(self.url)
            except OSError:
                return None
            return text if ready(text) else None
        return wait_for(attempt, timeout=180, message="the trainer's metrics")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _value(text: str, name: str) -> float | None:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture
def trainer(wan_data, tmp_path):
    running = _Trainer(wan_data, tmp_path / "train", free_port())
    yield running
    running.stop()


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(config: dict) -> str:
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen([str(tool("prometheus")), f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--web.enable-lifecycle"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        started.append((proc, log))
        base = f"http://127.0.0.1:{port}"

        def ready():
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                return get(f"{base}/-/ready")
            except OSError:
                return None
        wait_for(ready, timeout=60, message="prometheus to be ready")
        return base
    yield start
    for proc, log in started:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _query(base: str, expr: str) -> list[dict]:
    doc = json.loads(get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def _dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def _instantiate(expr: str) -> str:
    """A dashboard query as Grafana sends it with every variable on All."""
    for var, value in (("$__rate_interval", "30s"), ("$__interval", "15s"), ("$__range", "5m"),
                       ("${namespace}", ".*"), ("${run}", ".*"), ("$namespace", ".*"), ("$run", ".*")):
        expr = expr.replace(var, value)
    return expr


@pytest.mark.skipif(not Path(KUBECTL).is_file(), reason=f"{KUBECTL} is not installed")
def test_prometheus_scrapes_the_operator_and_a_trainer(cluster, operator, trainer, prometheus, tmp_path):
    cluster.kubectl("apply", "-f", str(REPO / "examples" / "solarrun-tiny.yaml"))
    cluster.kubectl("wait", "--for=jsonpath={.status.phase}=Running", "solarrun/tiny-wan", "--timeout=60s")
    operator_text = wait_for(lambda: (lambda t: t if 'solar_run_phase{namespace="default"' in t else None)(
        get(operator["metrics"])), timeout=30, message="the run's series on the operator")
    trainer_text = trainer.scrape_when(lambda t: (_value(t, "solar_checkpoint_last_step") or 0) >= 2)
    for name, text in (("operator", operator_text), ("trainer", trainer_text)):
        linted = _promtool("check", "metrics", stdin=text)
        assert linted.returncode == 0, f"{name}: {linted.stdout}{linted.stderr}"

    rules = _rendered_rules(tmp_path)
    base = prometheus({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "solar-operator", "honor_labels": True,
             "static_configs": [{"targets": [operator["metrics"].split("/")[2]]}]},
            {"job_name": "solar-trainer",
             "static_configs": [{"targets": [trainer.url.split("/")[2]],
                                 "labels": {"namespace": "default", "run": "tiny-wan", "stage": "fm",
                                            "pod": "tiny-wan-fm-1-master-0"}}]},
        ],
    })
    # rates need two scrapes of each target: the dashboard's operator panels read rates too
    wait_for(lambda: len(_query(base, 'solar_train_step{job="solar-trainer"} > 2')) == 1
             and _query(base, 'rate(solar_train_samples_total[5s]) > 0')
             and _query(base, 'rate(solar_operator_reconcile_total[30s])') or None,
             timeout=120, message="prometheus to have scraped several steps and the operator twice")
    up = {r["metric"]["job"]: r["value"][1] for r in _query(base, "up")}
    assert up == {"solar-operator": "1", "solar-trainer": "1"}
    phase = _query(base, 'solar_run_phase{job="solar-operator"}')
    assert [(r["metric"]["namespace"], r["metric"]["run"], r["metric"]["phase"], r["metric"]["stage"])
            for r in phase] == [("default", "tiny-wan", "Running", "fm")]  # the run's namespace, not a target's
    loss = _query(base, 'solar_train_loss{job="solar-trainer", run="tiny-wan", stage="fm"}')
    assert loss and loss[0]["metric"]["term"] and float(loss[0]["value"][1]) > 0
    assert _query(base, "histogram_quantile(0.5, rate(solar_train_step_seconds_bucket[10s]))")
    assert _query(base, "solar_operator_reconcile_total") and _query(base, "solar_checkpoint_last_step >= 2")
    assert _query(base, "solar_train_mfu_ratio > 0")  # against the SOLAR_PEAK_FLOPS given to this CPU run

    answered = {}
    for title, expr in _dashboard_queries():  # every dashboard query parses and runs on real data
        answered[title] = answered.get(title, False) or bool(_query(base, _instantiate(expr)))
    must_answer = {"Runs by phase", "Current phase and stage", "Loss", "Gradient norm", "Step time", "Samples/s",
                   "MFU", "Tokens/s", "Training step", "Checkpoint save time", "Operator up",
                   "Reconcile rate by result", "Reconcile latency p99"}
    assert {t: answered.get(t) for t in must_answer} == dict.fromkeys(must_answer, True)

    rules_state = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
    health = {r["name"]: (r["health"], r.get("lastError", "")) for g in rules_state for r in g["rules"]}
    assert set(health) == ALERTS and all(h == "ok" for h, _ in health.values()), health
    firing = {a["labels"]["alertname"] for a in json.loads(get(f"{base}/api/v1/alerts"))["data"]["alerts"]}
    assert not firing & {"SolarOperatorDown", "SolarRunFailed", "SolarNonFiniteLoss"}, firing
    trainer.stop()
    assert os.path.exists(trainer.out / "run-result.json")
