"""The operator's reconcile pool: a finished job's pass goes before queued polls, a stopped poll
does not wait for its pass, errors reach the handler (kopf retries on them)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import kopf
import pytest

from solar_operator import handlers
from solar_operator.dispatch import CHANGE, JOB, POLL, Dispatcher


def _blocked(pool: Dispatcher) -> threading.Event:
    """Occupy the pool's only worker until the returned event is set."""
    inside, release = threading.Event(), threading.Event()
    pool.submit(POLL, lambda: (inside.set(), release.wait(10)))
    assert inside.wait(10)
    return release


def test_a_job_event_pass_does_not_wait_behind_queued_polls():
    pool = Dispatcher(1)
    ran: list[str] = []
    release = _blocked(pool)
    futures = [pool.submit(POLL, ran.append, f"poll-{i}") for i in range(20)]
    futures.append(pool.submit(CHANGE, ran.append, "create"))
    futures.append(pool.submit(JOB, ran.append, "job"))
    release.set()
    for f in futures:
        f.result(10)
    assert ran[:2] == ["job", "create"]
    assert ran[2:] == [f"poll-{i}" for i in range(20)]   # first come, first served within a priority
    pool.stop()


def test_the_pool_never_runs_more_passes_at_once_than_its_workers():
    pool = Dispatcher(3)
    lock, now, peak = threading.Lock(), [0], [0]
    gate = threading.Event()

    def work():
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        gate.wait(0.05)
        with lock:
            now[0] -= 1

    for f in [pool.submit(POLL, work) for _ in range(12)]:
        f.result(10)
    assert peak[0] == 3 and len(pool._threads) == 3
    pool.stop()


def test_a_pass_error_reaches_the_awaiting_handler_and_stop_cancels_what_is_queued():
    pool = Dispatcher(1)

    def fails():
        raise kopf.TemporaryError("the API server said 503", delay=1)

    with pytest.raises(kopf.TemporaryError):
        asyncio.run(pool.run(JOB, fails))
    release = _blocked(pool)
    queued = pool.submit(POLL, lambda: None)
    pool.stop()
    release.set()
    assert queued.cancelled() and pool.submit(JOB, lambda: None).cancelled()


def test_every_reconciling_handler_is_a_coroutine():
    """No pass runs in kopf's FIFO pool, where a job event would wait behind every queued poll."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    fns = {h.id.split("/")[0]: h.fn for kind in (registry._changing, registry._watching, registry._spawning)
           for h in kind.get_all_handlers()}
    for id_ in ("run-created", "run-resumed", "run-updated", "run-deleted", "run-metrics",
                "job-changed", "trainjob-changed"):
        assert inspect.iscoroutinefunction(fns[id_]), id_


def test_a_steady_stream_of_job_passes_never_starves_a_poll(monkeypatch):
    from solar_operator import dispatch

    monkeypatch.setattr(dispatch, "MAX_WAIT", 0.2)   # (10 s in the operator)
    pool = Dispatcher(1)
    ran: list[str] = []
    release = _blocked(pool)
    pool.submit(POLL, ran.append, "poll")
    for i in range(20):
        pool.submit(JOB, lambda i=i: (ran.append(f"job{i}"), time.sleep(0.05)))
    release.set()
    pool.submit(JOB, lambda: None).result(10)
    assert ran.index("poll") < 15   # not after all twenty: once it has waited MAX_WAIT, it goes first
    pool.stop()
