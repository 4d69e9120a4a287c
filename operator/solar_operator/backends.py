"""Which job kind runs a SolarRun's stages (contract.md §7): ``spec.backend``, else the operator's
``--default-backend``. ``Backends`` is the one ``JobBackend`` the reconciler sees; it hands each call
to the PyTorchJob or TrainJob backend of the run, and ``check`` says, before any job exists, why a
run cannot be served: a backend this operator does not enable or the cluster does not serve, or a
missing ``ClusterTrainingRuntime`` (``BackendUnavailable``), or run fields the kind cannot carry
(``InvalidSpec``). A kind found available is remembered for ``AVAILABLE_SECONDS``; one found
missing is asked about again by the next new run.
"""

from __future__ import annotations

import time

from solar.run.machine import Action, JobState
from solar.run.plan import RunInvalid, StagePlan
from solar.run.spec import BACKENDS, SolarRunSpec
from solar_operator import trainjobs
from solar_operator.jobs import PyTorchJobBackend

NAMES = {b.lower(): b for b in BACKENDS}   # pytorchjob -> PyTorchJob, trainjob -> TrainJob
DEFAULT = "PyTorchJob"
AVAILABLE_SECONDS = 30.0   # a kind (and runtime) found served is not asked about again for this long


def backend_name(text: str) -> str:
    """``pytorchjob``/``PyTorchJob`` -> ``PyTorchJob``; ValueError otherwise."""
    name = NAMES.get(text.strip().lower())
    if name is None:
        raise ValueError(f"{text!r} is not a backend (use {' or '.join(NAMES)})")
    return name


def chosen(spec: SolarRunSpec | dict | None, default: str) -> str:
    backend = spec.get("backend") if isinstance(spec, dict) else getattr(spec, "backend", None)
    return backend if backend in BACKENDS else default


def of_run(run: dict, default: str) -> str:
    """The backend a run's jobs are of: the one its status records (a run keeps the kind it started
    with, whatever later edits or a restarted operator's default say), else its spec's, else ``default``.
    A run whose status predates ``status.backend`` was started as PyTorchJobs (the only kind then)."""
    status = run.get("status") or {}
    recorded = status.get("backend")
    if recorded in BACKENDS:
        return recorded
    if status.get("phase") and status.get("stages"):
        return "PyTorchJob"  # a run an operator without backends started: its jobs are PyTorchJobs
    return chosen(run.get("spec"), default)


def spec_problems(spec: SolarRunSpec, backend: str) -> list[str]:
    return trainjobs.spec_problems(spec) if backend == "TrainJob" else []


class Backends:
    def __init__(self, kube, *, default: str = DEFAULT, enabled: tuple[str, ...] = BACKENDS,
                 clock=time.monotonic) -> None:
        self.default, self.enabled, self.clock = default, tuple(enabled), clock
        self._available: dict[tuple[str, str | None], float] = {}   # (kind, runtime) -> when it was found
        self.kinds = {"PyTorchJob": PyTorchJobBackend(kube), "TrainJob": trainjobs.TrainJobBackend(kube)}

    def name(self, run: dict) -> str:
        return of_run(run, self.default)

    def of(self, run: dict):
        return self.kinds[self.name(run)]

    def check(self, run: dict, spec: SolarRunSpec) -> RunInvalid | None:
        name = self.name(run)
        problems = spec_problems(spec, name)
        if problems:
            return RunInvalid("InvalidSpec", problems[0])
        if name not in self.enabled:
            return RunInvalid("BackendUnavailable", f"spec.backend {name}: this operator does not run {name}s "
                                                    f"(enabled: {', '.join(self.enabled)}; the chart's backends)")
        key = (name, spec.trainingRuntime if name == "TrainJob" else None)
        if self.clock() - self._available.get(key, -AVAILABLE_SECONDS) < AVAILABLE_SECONDS:
            return None  # found a moment ago (many new runs at once ask the same)
        problem = self.kinds[name].unavailable(spec)
        if problem:
            return RunInvalid("BackendUnavailable", problem)
        self._available[key] = self.clock()
        return None

    def observe(self, run: dict) -> dict[str, JobState]:
        return self.of(run).observe(run)

    def create(self, run: dict, spec: SolarRunSpec, plan: StagePlan, action: Action) -> str | bool:
        return self.of(run).create(run, spec, plan, action)

    def delete(self, run: dict, job: str) -> bool:
        return self.of(run).delete(run, job)

    def suspend(self, run: dict, job: str) -> bool:
        return self.of(run).suspend(run, job)
