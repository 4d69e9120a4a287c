"""The kopf handlers: thin adapters around ``solar.run`` (validation, planner, state machine).

Every handler ends in ``reconcile_run``: observe (the run's PyTorchJobs, its stage directories under
``--storage-root``), decide (``solar.run.machine.reconcile``), act (create/delete jobs with
deterministic names, 409/404 meaning "already done"), report (status patch, events, metrics).
A per-run lock keeps the create/update handlers and the poll timer from overlapping. Restarting
the operator loses nothing: the decision is a function of the stored status and the observations.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import kopf
from pydantic import ValidationError

from solar.run.machine import Observation, reconcile
from solar.run.observe import observe_stage
from solar.run.plan import RunInvalid, plan_run
from solar.run.spec import GROUP, PLURAL, VERSION, SolarRunSpec, SolarRunStatus
from solar_operator import metrics, pytorchjob
from solar_operator.backend import JobBackend, PyTorchJobs

INTERVAL = float(os.environ.get("SOLAR_OPERATOR_INTERVAL", "10"))
REPO = Path(os.environ.get("SOLAR_REPO", Path(__file__).resolve().parents[2]))
_locks: dict[str, threading.Lock] = {}
_plans: dict[tuple[str, int], object] = {}
log = logging.getLogger("solar_operator")


class Context:
    """Process-wide settings and the job backend (replaceable in tests)."""

    storage_root: Path = Path(os.environ.get("SOLAR_OPERATOR_STORAGE_ROOT", "/runs"))
    backend: JobBackend | None = None


def backend() -> JobBackend:
    if Context.backend is None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        Context.backend = PyTorchJobs(client.ApiClient())
    return Context.backend


def _plan(uid: str, generation: int, spec: SolarRunSpec):
    key = (uid, generation)
    if key not in _plans:
        try:
            _plans[key] = plan_run(spec, f"{spec.storage.mountPath}/{spec.storage.path}", repo=REPO, environ={})
        except RunInvalid as exc:
            _plans[key] = exc
        for old in [k for k in _plans if k[0] == uid and k[1] != generation]:
            del _plans[old]
    return _plans[key]


def reconcile_run(handler: str, body, patch, logger) -> None:
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    with _locks.setdefault(uid, threading.Lock()), metrics.timed(handler):
        raw_status = dict(body.get("status") or {})
        previous = SolarRunStatus.model_validate(raw_status) if raw_status.get("phase") else None
        if previous is not None and previous.phase in ("Succeeded", "Failed"):
            return
        generation = int(meta.get("generation") or 1)
        try:
            spec = SolarRunSpec.model_validate(dict(body["spec"]))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "spec." + ".".join(str(p) for p in first["loc"])
            invalid, spec, plan = RunInvalid("InvalidSpec", f"{where}: {first['msg']}"), None, None
        else:
            plan = _plan(uid, generation, spec)
            invalid = plan if isinstance(plan, RunInvalid) else None
            plan = None if invalid else plan
        jobs, files = {}, {}
        if plan is not None:
            jobs = backend().jobs(namespace, name)
            done = {s.name for s in (previous.stages if previous else []) if s.phase == "Succeeded"}
            for stage in plan.stages:
                if stage.name not in done:
                    files[stage.name] = observe_stage(Context.storage_root / spec.storage.path / stage.name,
                                                      final_step=stage.final_step,
                                                      validation_step=stage.validation_step,
                                                      generation=stage.generation)
                    break  # only the current stage's files matter
        obs = Observation(name, generation, time.time(), plan=plan, invalid=invalid, jobs=jobs, files=files)
        decision = reconcile(spec, previous, obs)
        for action in decision.actions:
            if action.kind == "create_job":
                manifest = pytorchjob.build(dict(body), spec, plan.stage(action.stage), action.job,
                                            attempt=action.attempt, resume_from=action.resume_from)
                problems = pytorchjob.webhook_problems(manifest)
                if problems:  # a bug of ours, never the user's: do not send it
                    raise kopf.PermanentError(f"refusing to create {action.job}: {'; '.join(problems)}")
                created = backend().create(manifest)
                logger.info(f"job {action.job} {'created' if created else 'already exists'}")
            elif action.kind == "delete_job":
                backend().delete(namespace, action.job)
                logger.info(f"job {action.job} deleted")
        for kind, reason, message in decision.events:
            kopf.event(body, type=kind, reason=reason, message=message)
        for _stage, phase in decision.transitions:
            metrics.STAGE_TRANSITIONS.labels(to_phase=phase).inc()
        patch.status.update(decision.status.model_dump(mode="json", exclude_none=True))


@kopf.on.startup(id="solar-startup")
def startup(settings: kopf.OperatorSettings, **_) -> None:
    settings.posting.level = logging.INFO
    settings.persistence.finalizer = "solarwm.io/operator"
    settings.watching.server_timeout = 60


@kopf.index(GROUP, VERSION, PLURAL, id="solarrun_index")
def solarrun_index(namespace, name, status, **_):
    return {(namespace, name): dict(status or {})}


@kopf.on.create(GROUP, VERSION, PLURAL, id="solarrun-create")
def on_create(body, patch, logger, solarrun_index, **_) -> None:
    metrics.RUN_INDEX.set(solarrun_index)
    reconcile_run("create", body, patch, logger)


@kopf.on.resume(GROUP, VERSION, PLURAL, id="solarrun-resume")
def on_resume(body, patch, logger, solarrun_index, **_) -> None:
    metrics.RUN_INDEX.set(solarrun_index)
    reconcile_run("resume", body, patch, logger)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", id="solarrun-update")
def on_update(body, patch, logger, solarrun_index, **_) -> None:
    metrics.RUN_INDEX.set(solarrun_index)
    reconcile_run("update", body, patch, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, id="solarrun-poll",
            when=lambda status, **_: (status or {}).get("phase") not in ("Succeeded", "Failed"))
def poll(body, patch, logger, solarrun_index, **_) -> None:
    metrics.RUN_INDEX.set(solarrun_index)
    reconcile_run("poll", body, patch, logger)


@kopf.on.delete(GROUP, VERSION, PLURAL, id="solarrun-delete", optional=True)
def on_delete(body, **_) -> None:
    _locks.pop(body["metadata"]["uid"], None)
    for key in [k for k in _plans if k[0] == body["metadata"]["uid"]]:
        del _plans[key]
