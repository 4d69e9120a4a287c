"""The operator's own poll of each SolarRun (``polling.Poller``) and why it replaced kopf's timer:
no handler needs a finalizer, so no run carries one."""

from __future__ import annotations

import asyncio
import time

import kopf

from solar_operator import errors, handlers
from solar_operator.polling import Poller

TICK = 0.05


def _poller(polls: list, *, due=lambda ns, name, status: status.get("phase") != "Succeeded", fail=None,
            hold: asyncio.Event | None = None, delays: list | None = None) -> Poller:
    async def poll(namespace: str, name: str, kind: str) -> None:
        polls.append((name, time.monotonic()) if kind == "poll" else (name, time.monotonic(), kind))
        if hold is not None:
            await hold.wait()
        if fail:
            raise fail.pop(0)

    def delay(exc, retry):
        if delays is not None:
            delays.append(retry)
        return TICK

    return Poller(TICK, due=due, poll=poll, delay=delay, jitter=lambda: 0.5)


async def _running(poller: Poller, seconds: float) -> None:
    task = asyncio.ensure_future(poller.run())
    try:
        await asyncio.sleep(seconds)
    finally:
        task.cancel()


def test_a_run_is_polled_every_interval_until_it_is_not_due_or_deleted():
    polls: list = []

    async def scenario():
        poller = _poller(polls)
        started = time.monotonic()
        poller.seen("ns", "a", {"phase": "Running"})
        poller.seen("ns", "b", {"phase": "Succeeded"})   # finished: known, never polled
        task = asyncio.ensure_future(poller.run())
        await asyncio.sleep(12 * TICK)
        first = polls[0][1] - started
        a_polls = len(polls)
        poller.seen("ns", "a", {"phase": "Running"}, deleted=True)
        await asyncio.sleep(6 * TICK)
        task.cancel()
        return first, a_polls

    first, a_polls = asyncio.run(scenario())
    assert {name for name, _ in polls} == {"a"}
    assert first >= 0.1 * TICK           # at a random moment of the first fifth of an interval (here: its middle)
    assert 3 <= a_polls <= 12            # about one per interval
    assert len(polls) == a_polls         # none after the delete


def test_a_run_that_becomes_due_again_is_polled_again():
    polls: list = []

    async def scenario():
        poller = _poller(polls)
        poller.seen("ns", "a", {"phase": "Succeeded"})
        task = asyncio.ensure_future(poller.run())
        await asyncio.sleep(4 * TICK)
        before = len(polls)
        poller.seen("ns", "a", {"phase": "Running"})   # e.g. a final verdict with jobsToDelete left
        await asyncio.sleep(6 * TICK)
        task.cancel()
        return before

    assert asyncio.run(scenario()) == 0 and polls


def test_one_poll_of_a_run_at_a_time():
    polls: list = []

    async def scenario():
        hold = asyncio.Event()
        poller = _poller(polls, hold=hold)
        poller.seen("ns", "a", {})
        task = asyncio.ensure_future(poller.run())
        await asyncio.sleep(10 * TICK)    # many intervals while the first poll has not returned
        during = len(polls)
        hold.set()
        await asyncio.sleep(4 * TICK)
        task.cancel()
        return during

    assert asyncio.run(scenario()) == 1 and len(polls) > 1


def test_a_refused_poll_is_retried_after_its_delay_with_a_growing_retry_count():
    polls: list = []
    delays: list = []
    refused = [errors.ApiUnavailable("patch: 429", delay=1.0, retry_after=1.0) for _ in range(3)]
    asyncio.run(_running(_poller(polls, fail=refused, delays=delays), 0))   # nothing seen: nothing polled
    poller = _poller(polls, fail=refused, delays=delays)
    poller.seen("ns", "a", {})
    asyncio.run(_running(poller, 12 * TICK))
    assert delays == [0, 1, 2] and len(polls) >= 4   # three refusals, then it goes on
    assert [p[2:] for p in polls[:4]] == [(), ("retry",), ("retry",), ("retry",)]   # retries ask more than polls


def test_a_poll_that_raises_a_bug_is_logged_and_the_run_still_polled(caplog):
    polls: list = []
    poller = _poller(polls, fail=[RuntimeError("a bug in one pass")])
    poller.seen("ns", "a", {})
    asyncio.run(_running(poller, 8 * TICK))
    assert len(polls) >= 2 and "a bug in one pass" in caplog.text


def test_the_retry_delay_is_the_servers_retry_after_else_a_backoff():
    refused = errors.ApiUnavailable("create: 429", delay=2.0, retry_after=2.0)
    assert handlers._retry_delay(refused, 5) == 2.0
    failed = errors.ApiUnavailable("create: 500", delay=errors.RETRY_DELAY)
    assert [handlers._retry_delay(failed, r) for r in (0, 1, 2)] == [1.0, 2.0, 4.0]
    assert handlers._retry_delay(errors.Forbidden("create: 403", delay=60.0), 0) == 60.0


def test_no_kopf_handler_needs_a_finalizer():
    """kopf adds its finalizer for timers, daemons and required delete handlers and removes it with a
    patch that, refused, nothing retries; with none, kopf removes the one older versions left (the
    run's finalizer is the operator's own, ``runs.FINALIZER``)."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    assert not registry._spawning.get_all_handlers()   # no kopf timer or daemon
    deleting = [h for h in registry._changing.get_all_handlers() if h.requires_finalizer]
    assert deleting == []


def test_a_job_events_refused_pass_is_retried_soon_and_urgently_then_polls_go_on():
    polls: list = []

    async def scenario():
        poller = _poller(polls)
        poller.seen("ns", "a", {})
        poller.soon("ns", "a", 0.0, urgent=True)
        poller.soon("ns", "unknown", 0.0, urgent=True)     # never seen (or deleted): nothing to poll
        task = asyncio.ensure_future(poller.run())
        await asyncio.sleep(4 * TICK)
        task.cancel()

    asyncio.run(scenario())
    assert polls[0][0] == "a" and polls[0][2:] == ("job",)   # at once, with the job event's priority
    assert len(polls) >= 2 and all(len(p) == 2 for p in polls[1:])   # then plain polls


def test_a_soon_asked_while_the_runs_poll_is_in_flight_comes_when_it_ends():
    """The poll in flight may have read the run before the news (or be covered by an earlier pass), so
    a refused job event's retry asked meanwhile is not folded into it: it follows at once, urgently,
    instead of an interval later."""
    polls: list = []

    async def scenario():
        hold = asyncio.Event()
        poller = _poller(polls, hold=hold)
        poller.interval = 40 * TICK     # a long interval: the retry must not wait for it
        poller.seen("ns", "a", {})
        task = asyncio.ensure_future(poller.run())
        await asyncio.sleep(12 * TICK)  # the first poll (at 8 TICK) is in flight
        assert len(polls) == 1
        poller.soon("ns", "a", 0.0, urgent=True)
        await asyncio.sleep(2 * TICK)
        assert len(polls) == 1          # one poll of a run at a time
        ended = time.monotonic()
        hold.set()
        await asyncio.sleep(4 * TICK)
        task.cancel()
        return ended

    ended = asyncio.run(scenario())
    assert len(polls) == 2 and polls[1][2:] == ("job",) and polls[1][1] - ended < 2 * TICK


def test_a_restart_reconciles_only_the_runs_that_need_it():
    from solar_operator.runs import FINALIZER

    assert handlers._settled({}, {"phase": "Succeeded"}) and handlers._settled({}, {"phase": "Failed"})
    assert not handlers._settled({}, {"phase": "Running"}) and not handlers._settled({}, {})
    assert not handlers._settled({}, {"phase": "Failed", "jobsToDelete": ["a-fm-1"]})
    assert not handlers._settled({"finalizers": [FINALIZER]}, {"phase": "Succeeded"})   # its finalizer to remove
