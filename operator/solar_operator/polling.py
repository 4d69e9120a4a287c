"""The operator's poll of each SolarRun: its own timer, not kopf's.

A kopf timer puts kopf's finalizer on every object it serves and removes it, once the timer has
stopped, with a patch of its own. When the API server refuses that patch (a 409 after a 500, as the
chaos bench plays them), kopf gives the event up, and the run, which nothing writes to any more,
gets no later event: it keeps the finalizer and ``kubectl delete`` waits for good. So no kopf
handler needs a finalizer (kopf drops the one older versions added at the run's next event); the
finalizer a run does carry is the operator's own (``runs.FINALIZER``), removed by a pass, which this
poll retries until it is gone.

``Poller`` keeps every SolarRun the watch reported (``seen``) and, on the event loop, asks each
one that ``due`` says needs it for a pass every ``interval`` seconds after its last poll ended. The
first one comes at a random moment of the first fifth of an interval after the run was first seen:
after a restart the poll is the second chance of a run whose start-up pass failed and whose kopf
retry waits out a long backoff (kopf's timers polled every run at once at a start; the chaos bench's
kill-to-converged p50 was 16.6 s with the first poll anywhere in the first interval, 13.5 s within
its first fifth), and the spread keeps a restart's polls from coming all at once. A run
that a pass is to release (its finalizer; ``seen``) is polled at once, then until the watch shows
the finalizer gone. One poll of a run at a time; a poll the API server failed is tried again after
the delay ``delay`` gives (Retry-After or a backoff), any other error is logged and the run is
polled again at the next interval. ``soon`` brings a run's poll forward: a job event's pass, which
kopf does not retry, that the server refused is retried by the run's next poll after the server's
delay, with the job event's priority (``urgent``); asked while the run's poll is in flight (that poll
may have read the run before the news, or be covered by an earlier pass: ``Reconciler.reconcile``),
it comes when that poll ends. The pass is asked for as a ``job`` pass (that
retry), a ``retry`` (after a refused poll: its kopf retry may be lost too) or a plain ``poll``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable

import kopf

log = logging.getLogger("solar_operator.polling")

Key = tuple[str, str]   # namespace, name


class Poller:
    def __init__(self, interval: float, *, due: Callable[[str, str, dict], bool],
                 poll: Callable[[str, str, str], Awaitable[object]], delay: Callable[[Exception, int], float],
                 clock: Callable[[], float] = time.monotonic, jitter: Callable[[], float] = random.random) -> None:
        self.interval = interval
        self._due, self._poll, self._delay = due, poll, delay
        self._clock, self._jitter = clock, jitter
        self._status: dict[Key, dict] = {}
        self._retries: dict[Key, int] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._next: dict[Key, float] = {}      # the one entry of the heap that counts for each run
        self._seq = itertools.count()
        self._running: set[Key] = set()
        self._release: set[Key] = set()        # runs whose finalizer a pass is to remove
        self._urgent: set[Key] = set()         # runs whose next poll retries a job event's pass
        self._asked: dict[Key, float] = {}     # runs whose poll is in flight: the earliest ``soon`` since
        self._wake = asyncio.Event()

    # -- fed by the watch (event loop) -----------------------------------------------------------
    def seen(self, namespace: str, name: str, status: dict | None, *, deleted: bool = False,
             release: bool = False) -> None:
        """The watch's latest of a run. ``release``: a pass must remove the operator's finalizer (the
        run is being deleted or finished): polled at once and until the finalizer is gone."""
        key = (namespace, name)
        if deleted:
            self._status.pop(key, None)
            self._next.pop(key, None)
            self._retries.pop(key, None)
            self._release.discard(key)
            self._urgent.discard(key)
            self._asked.pop(key, None)
            return
        known = key in self._status
        self._status[key] = dict(status or {})
        if release:
            if key not in self._release:
                self._release.add(key)
                self.soon(namespace, name, 0.0)
        else:
            self._release.discard(key)
        if not known and key not in self._next:
            self._schedule(key, 0.2 * self.interval * self._jitter())

    def soon(self, namespace: str, name: str, after: float, *, urgent: bool = False) -> None:
        """Poll the run within ``after`` seconds; ``urgent``: that poll retries a job event's pass
        (kopf does not retry those), so it is asked for with the job event's priority."""
        key = (namespace, name)
        if key not in self._status:
            return
        if urgent:
            self._urgent.add(key)
        if key in self._running:   # kept for when that poll ends: it may have read the run before the news
            self._asked[key] = min(self._asked.get(key, float("inf")), self._clock() + after)
        elif self._next.get(key, float("inf")) > self._clock() + after:
            self._schedule(key, after)

    def _schedule(self, key: Key, after: float) -> None:
        at = self._clock() + after
        self._next[key] = at
        heapq.heappush(self._heap, (at, next(self._seq), key))
        self._wake.set()

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Until cancelled: start each due run's poll as its own task."""
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                now = self._clock()
                while self._heap and self._heap[0][0] <= now:
                    at, _, key = heapq.heappop(self._heap)
                    if self._next.get(key) != at:
                        continue   # rescheduled since, or deleted
                    del self._next[key]
                    if key in self._running:
                        continue   # its poll reschedules it when it ends
                    if key not in self._release and not self._due(*key, self._status.get(key, {})):
                        self._schedule(key, self.interval)
                        continue
                    self._running.add(key)
                    task = asyncio.ensure_future(self._one(key))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                self._wake.clear()
                wait = self._heap[0][0] - self._clock() if self._heap else self.interval
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.0))
                except TimeoutError:
                    pass
        finally:
            for task in tasks:
                task.cancel()

    async def _one(self, key: Key) -> None:
        after = self.interval
        kind = "job" if key in self._urgent else "retry" if self._retries.get(key) else "poll"
        self._urgent.discard(key)
        try:
            await self._poll(*key, kind)
            self._retries.pop(key, None)
        except asyncio.CancelledError:
            raise
        except kopf.TemporaryError as exc:
            retry = self._retries.get(key, 0)
            self._retries[key] = retry + 1
            after = self._delay(exc, retry)
            log.info("poll of SolarRun %s/%s failed (%s); next try in %.1f s", *key, exc, after)
        except Exception:  # noqa: BLE001 (a bug in one pass must not stop every run's poll)
            log.exception("poll of SolarRun %s/%s failed", *key)
        finally:
            self._running.discard(key)
        asked = self._asked.pop(key, None)
        if asked is not None:   # a ``soon`` while it ran (a refused job event's pass, a release)
            after = min(after, max(asked - self._clock(), 0.0))
        if key in self._status:   # not deleted meanwhile
            self._schedule(key, after)
