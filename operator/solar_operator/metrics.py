"""The operator's Prometheus metrics (contract.md §6).

Counters and the reconcile histogram are ordinary ``prometheus_client`` series. The per-run gauges
(``solar_runs{phase}``, ``solar_run_checkpoint_step`` ...) come from a collector that reads the
current SolarRuns (``RUNS``, fed by the watch stream) at scrape time, so a deleted run's series
disappear with it. No counter carries a run name.
"""

from __future__ import annotations

import contextlib
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

REGISTRY = CollectorRegistry()
RECONCILE = Counter("solar_operator_reconcile_total", "Reconciles of SolarRuns by handler and result.",
                    ["handler", "result"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram("solar_operator_reconcile_duration_seconds", "Time one reconcile takes.", ["handler"],
                              registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
STAGE_TRANSITIONS = Counter("solar_run_stage_transitions_total", "Stage phase transitions.", ["to_phase"],
                            registry=REGISTRY)
STAGE_FAILURES = Counter("solar_run_stage_failures_total", "Failed stage jobs by the error type the trainer "
                         "recorded in run-result.json (unknown: none recorded).", ["error_type"], registry=REGISTRY)
STAGE_GPU_SECONDS = Counter("solar_stage_gpu_seconds_total", "GPU time of ended stages (world size x wall time of "
                            "every launch, from run-result.json), by family, route stage and action.",
                            ["family", "stage", "action"], registry=REGISTRY)
EVENTS = Counter("solar_operator_events_total", "Kubernetes Events the operator posted (posted), could not post "
                 "yet and kept for a later reconcile (retried), or gave up on (dropped).", ["result"],
                 registry=REGISTRY)
for _result in ("posted", "retried", "dropped"):
    EVENTS.labels(result=_result)
SHAPE_CHANGES = Counter("solar_stage_shape_changes_total", "Elastic training stages that continued at a smaller "
                        "shape (shrink: pods disrupted or unschedulable) or grew back (grow).", ["direction"],
                        registry=REGISTRY)
for _direction in ("shrink", "grow"):
    SHAPE_CHANGES.labels(direction=_direction)
DISRUPTION_SECONDS = Counter("solar_stage_disruption_seconds_total", "Time elastic stages lost to disruptions: from "
                             "each disruption to the next checkpoint committed after it.", registry=REGISTRY)
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Suspended")
# The trainer's error types (solar.train.launch); anything else is counted as "other" (bounded labels).
ERROR_TYPES = ("non_finite", "oom", "sp_mismatch", "data", "checkpoint", "validation_setup", "storage_full",
               "storage_error", "error", "unknown", "other")
for _type in ERROR_TYPES:  # present from the start, so increase() sees the first failure
    STAGE_FAILURES.labels(error_type=_type)


def count_stage_gpu_seconds(family: str, route: str, action: str, seconds: float) -> None:
    """A stage that ended (succeeded or failed) adds its GPU time once; labels are bounded (the
    route's stage and the action, never a run name)."""
    STAGE_GPU_SECONDS.labels(family=family, stage=route.split(":")[1], action=action).inc(max(seconds, 0.0))


def count_stage_failure(error_type: str) -> None:
    STAGE_FAILURES.labels(error_type=error_type if error_type in ERROR_TYPES else "other").inc()


class RunStates:
    """The current status of every SolarRun the operator watches, fed by the watch stream
    (``record``); a deleted run is dropped, so its series vanish from the next scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], dict] = {}

    def record(self, namespace: str, name: str, status: dict | None, *, deleted: bool = False) -> None:
        with self._lock:
            if deleted:
                self._runs.pop((namespace, name), None)
            else:
                self._runs[(namespace, name)] = dict(status or {})

    def clear(self) -> None:
        """Forget every run (an operator starting: its watch lists the current runs again)."""
        with self._lock:
            self._runs.clear()

    def runs(self) -> list[tuple[str, str, dict]]:
        with self._lock:
            return [(ns, name, status) for (ns, name), status in self._runs.items()]

    def __len__(self) -> int:
        return len(self._runs)


RUNS = RunStates()


class RunCollector:
    def collect(self):
        runs = RUNS.runs()
        phases = GaugeMetricFamily("solar_runs", "SolarRuns by phase.", labels=["phase"])
        counts = dict.fromkeys(PHASES, 0)
        for _ns, _name, status in runs:
            phase = status.get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in counts.items():
            phases.add_metric([phase], n)
        yield phases
        current = GaugeMetricFamily("solar_run_phase", "1 for each SolarRun's current phase and stage.",
                                    labels=["namespace", "run", "phase", "stage"])
        for namespace, name, status in runs:
            current.add_metric([namespace, name, status.get("phase") or "Pending", status.get("currentStage") or ""], 1)
        yield current
        hours = GaugeMetricFamily("solar_run_gpu_hours", "GPU time of each SolarRun's launches so far.",
                                  labels=["namespace", "run"])
        for namespace, name, status in runs:
            if status.get("gpuHours") is not None:
                hours.add_metric([namespace, name], status["gpuHours"])
        yield hours
        step = GaugeMetricFamily("solar_run_checkpoint_step", "Latest verified checkpoint step per stage.",
                                 labels=["namespace", "run", "stage"])
        stamp = GaugeMetricFamily("solar_run_checkpoint_timestamp_seconds",
                                  "When that checkpoint was verified (Unix time).", labels=["namespace", "run", "stage"])
        validation = GaugeMetricFamily("solar_run_validation_step", "Last complete validation step per stage.",
                                       labels=["namespace", "run", "stage"])
        for namespace, name, status in runs:
            for stage in status.get("stages") or []:
                labels = [namespace, name, stage.get("name", "")]
                ck = stage.get("checkpoint")
                if ck:
                    step.add_metric(labels, ck.get("step", 0))
                    verified = _epoch(ck.get("verifiedAt"))
                    if verified is not None:
                        stamp.add_metric(labels, verified)
                v = stage.get("validation")
                if v and v.get("step") is not None:
                    validation.add_metric(labels, v["step"])
        yield step
        yield stamp
        yield validation


def _epoch(text):
    from solar.run.machine import parse_iso

    try:
        return parse_iso(text)
    except (TypeError, ValueError):
        return None


REGISTRY.register(RunCollector())


@contextlib.contextmanager
def timed(handler: str):
    started = time.perf_counter()
    try:
        yield
    except Exception:
        RECONCILE.labels(handler=handler, result="error").inc()
        raise
    else:
        RECONCILE.labels(handler=handler, result="success").inc()
    finally:
        RECONCILE_SECONDS.labels(handler=handler).observe(time.perf_counter() - started)


def serve(port: int, addr: str = "0.0.0.0"):
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=REGISTRY)
