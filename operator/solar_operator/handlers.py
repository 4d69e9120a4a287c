"""The kopf handlers: each one line into ``runs.Reconciler`` (in ``memo.runs``) or ``metrics.RUNS``.

``register(registry)`` declares them into a registry instead of kopf's global one, so an operator
can be started, stopped and started again in one process with fresh handlers (tests, the bench);
``solar-operator`` calls it once. Every handler has an explicit id.

- SolarRun created / resumed at operator start / spec changed -> reconcile (at start: not a settled
                                                                  run, finished with nothing left)
- every ``poll_seconds`` while the run is not finished        -> reconcile (stage files have no watch)
  (or its final verdict's ``jobsToDelete`` are not gone)        by ``polling.Poller``, not a kopf timer:
                                                                  no kopf finalizer
- any change of a PyTorchJob or TrainJob labelled with a run  -> reconcile that run (a finished job
                                                                  starts the next stage at once), unless
                                                                  its last pass saw that very version;
                                                                  only the kinds in ``backends`` are watched
- every SolarRun watch event                                   -> the metrics' view of current runs
- SolarRun being deleted or finished, with the operator's      -> reconcile at once (the pass removes it)
  finalizer
- SolarRun deleted                                             -> forget its plan and unposted Events
                                                                  (its jobs go with it: owner references)

Every handler is a coroutine: the passes run in the operator's own pool (``dispatch.Dispatcher``,
``workers`` threads), a job event's pass before queued creates, resumes and spec updates, and those
before polls, so the pass that starts a finished stage's next job never waits behind the polls of
all active runs; whether a job event brings anything new is decided on the event loop, before any
thread is taken. A pass the API server fails (5xx, 429, 409, no answer in time) is retried by kopf
after the server's Retry-After, else after 1, 2, 4 ... s (capped at a minute): never by sleeping in
a worker. A job event's pass the server refused is retried by the run's poll, brought forward to
the server's delay; while a run waits out a Retry-After its retries and polls wait, a job event is
tried at once (``Reconciler.reconcile``).

The liveness probe answers from the event loop at once, never queued behind reconciles, and says
only that the process and its loop work. On SIGTERM kopf stops; whatever is still running after
``EXIT_SECONDS`` is killed (every write is one API call, so nothing is half-written; the next start
resumes from the status).
"""

from __future__ import annotations

import asyncio
import logging
import time

import kopf

from solar.run.spec import GROUP, PLURAL, VERSION
from solar_operator import errors, metrics, trainjobs
from solar_operator.dispatch import CHANGE, JOB, POLL, Dispatcher
from solar_operator.jobs import RUN_LABEL
from solar_operator.kube import JOB_GROUP, JOB_PLURAL, JOB_VERSION
from solar_operator.polling import Poller
from solar_operator.runs import FINALIZER

FINISHED = ("Succeeded", "Failed")
EXIT_SECONDS = 4.5   # SIGTERM to exit, at most (kopf's ultimate exiting timeout)
WORKERS = 8          # reconcile threads (--workers, SOLAR_OPERATOR_WORKERS; kopf's own pool too)


def _finished(status: dict) -> bool:
    """A final verdict with no job left to delete: no pass will create or delete a job for the run."""
    return status.get("phase") in FINISHED and not status.get("jobsToDelete")


def _active(memo: kopf.Memo, namespace: str, name: str, status: dict) -> bool:
    """Polled while the run is not finished, or while its final verdict's job deletes or Events of
    it wait for another try."""
    if not _finished(status):
        return True
    runs = getattr(memo, "runs", None)
    return runs is not None and runs.pending_events(namespace, name) > 0


def _to_release(meta, status: dict) -> bool:
    """The run carries the operator's finalizer and is being deleted or finished: a pass removes it."""
    return FINALIZER in (meta.get("finalizers") or []) and bool(meta.get("deletionTimestamp") or _finished(status))


def _settled(meta, status: dict) -> bool:
    """Finished, nothing left to delete, no finalizer of the operator's: no pass has anything to do."""
    return _finished(status) and FINALIZER not in (meta.get("finalizers") or [])


def _retry_delay(exc: Exception, retry: int) -> float:
    if isinstance(exc, errors.ApiUnavailable):
        return errors.backoff(exc, retry).delay
    return getattr(exc, "delay", None) or errors.RETRY_DELAY


def _pass(pool: Dispatcher, priority: int, memo: kopf.Memo, namespace: str, name: str, handler: str):
    """The run's pass in the pool, stamped with the moment its trigger was raised (a successful pass
    that starts after it covers it: ``Reconciler.reconcile``)."""
    return pool.run(priority, memo.runs.reconcile, namespace, name, handler, time.monotonic())


async def _reconcile(pool: Dispatcher, priority: int, memo: kopf.Memo, namespace: str, name: str, handler: str,
                     retry: int) -> None:
    """A pass the API server failed is retried by kopf after the server's Retry-After, else after a
    backoff that doubles with each failed try of this handler (errors.backoff)."""
    try:
        await _pass(pool, priority, memo, namespace, name, handler)
    except errors.ApiUnavailable as exc:
        raise errors.backoff(exc, retry) from None


async def _job_changed(pool: Dispatcher, polls: dict, memo: kopf.Memo, namespace: str, run: str, job: str,
                       meta) -> None:
    """kopf does not retry a watch event's handler: a pass the server refused is retried by the run's
    poll, brought forward to the server's Retry-After (else the first backoff)."""
    if memo.runs.unchanged(namespace, run, job, meta.get("resourceVersion")):
        return
    try:
        await _pass(pool, JOB, memo, namespace, run, "job")
    except errors.ApiUnavailable as exc:
        poller = polls.get("poller")
        if poller is not None:
            poller.soon(namespace, run, _retry_delay(exc, 0), urgent=True)
        logging.getLogger(__name__).info(f"{namespace}/{run}: a pass for job {job} was refused ({exc}); "
                                         f"the run's poll retries it")


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own state lives under our API group; only warnings become Kubernetes events (the
    operator posts its own, one per transition)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="solarwm.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="solarwm.io", key="last-handled-configuration")
    settings.persistence.finalizer = "solarwm.io/operator"
    settings.posting.level = logging.WARNING


def register(registry: kopf.OperatorRegistry, *, poll_seconds: float = 10.0, workers: int = WORKERS,
             exit_seconds: float | None = None, backends: tuple[str, ...] = ("PyTorchJob", "TrainJob")) -> None:
    """``exit_seconds``: the SIGTERM-to-exit bound (``solar-operator`` passes ``EXIT_SECONDS``; an
    operator embedded in another process, as in the tests, leaves kopf's setting alone)."""
    pool = Dispatcher(workers)
    polls: dict[str, object] = {}   # the poller and its task, made on the operator's event loop at startup

    @kopf.on.startup(id="solar-settings", registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
        configure(settings)
        settings.execution.max_workers = workers
        if exit_seconds is not None:
            settings.process.ultimate_exiting_timeout = exit_seconds
        metrics.RUNS.clear()  # a restarted operator in the same process re-learns runs from its watch

        async def poll(namespace: str, name: str, kind: str) -> None:
            priority = {"job": JOB, "retry": CHANGE}.get(kind, POLL)
            await _pass(pool, priority, memo, namespace, name, "poll")

        poller = Poller(poll_seconds, due=lambda ns, name, status: _active(memo, ns, name, status), poll=poll,
                        delay=_retry_delay)
        polls["poller"], polls["task"] = poller, asyncio.ensure_future(poller.run())

    @kopf.on.cleanup(id="solar-pool", registry=registry)
    async def cleanup(**_) -> None:
        task = polls.pop("task", None)
        if task is not None:
            task.cancel()
        pool.stop()

    @kopf.on.create(GROUP, VERSION, PLURAL, id="run-created", registry=registry)
    async def created(namespace: str, name: str, memo: kopf.Memo, retry: int, **_) -> None:
        await _reconcile(pool, CHANGE, memo, namespace, name, "create", retry)

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="run-resumed", registry=registry)
    async def resumed(namespace: str, name: str, memo: kopf.Memo, retry: int, status, meta, **_) -> None:
        if _settled(meta, dict(status or {})):
            return   # a pass would find nothing to do: a restart's passes go to the runs that need them
        await _reconcile(pool, CHANGE, memo, namespace, name, "resume", retry)

    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", id="run-updated", registry=registry)
    async def updated(namespace: str, name: str, memo: kopf.Memo, retry: int, **_) -> None:
        await _reconcile(pool, CHANGE, memo, namespace, name, "update", retry)

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="run-deleted", optional=True, registry=registry)
    async def deleted(namespace: str, name: str, uid: str, memo: kopf.Memo, **_) -> None:  # no I/O
        memo.runs.forget(namespace, name, uid)

    @kopf.on.event(GROUP, VERSION, PLURAL, id="run-metrics", registry=registry)
    async def observed(namespace: str, name: str, status, meta, type: str | None, **_) -> None:  # noqa: A002
        metrics.RUNS.record(namespace, name, dict(status or {}), deleted=type == "DELETED")   # (no I/O)
        poller = polls.get("poller")
        if poller is not None:
            release = type != "DELETED" and _to_release(meta, dict(status or {}))
            poller.seen(namespace, name, status, deleted=type == "DELETED", release=release)

    if "PyTorchJob" in backends:
        @kopf.on.event(JOB_GROUP, JOB_VERSION, JOB_PLURAL, labels={RUN_LABEL: kopf.PRESENT}, id="job-changed",
                       registry=registry)
        async def job_changed(namespace: str, name: str, labels, meta, memo: kopf.Memo, **_) -> None:
            await _job_changed(pool, polls, memo, namespace, labels[RUN_LABEL], name, meta)

    if "TrainJob" in backends:
        @kopf.on.event(trainjobs.GROUP, trainjobs.VERSION, trainjobs.PLURAL, labels={RUN_LABEL: kopf.PRESENT},
                       id="trainjob-changed", registry=registry)
        async def trainjob_changed(namespace: str, name: str, labels, meta, memo: kopf.Memo, **_) -> None:
            await _job_changed(pool, polls, memo, namespace, labels[RUN_LABEL], name, meta)

    @kopf.on.probe(id="runs", registry=registry)
    async def runs_known(**_) -> int:  # async: answered by the event loop, not queued in the thread pool
        return len(metrics.RUNS)
