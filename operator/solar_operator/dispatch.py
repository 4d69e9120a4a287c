"""The operator's reconcile threads: a bounded pool that takes a finished job's pass before polls.

kopf runs sync handlers in one FIFO thread pool, so at load a job event (the one that starts the next
stage) waited behind every poll queued before it, and kopf holds the job's next event until its handler
returns. The handlers are coroutines instead: each hands its pass to this pool with a priority and
awaits it (the event loop stays free; kopf still sees the handler's result or error and retries as
before). Lower runs first: ``JOB`` (a job of the run changed), then ``CHANGE`` (created, resumed, spec
changed), then ``POLL``; FIFO within one priority; a pass that has waited more than ``MAX_WAIT``
goes first (a steady stream of job events never starves the polls, which retry what kopf lost). ``workers``
threads at most, started on the first pass; daemon threads, so a pass still running never holds
the process at exit; ``stop`` (kopf's cleanup) cancels what has not started, which the next start
redoes from the stored status.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections import deque

JOB, CHANGE, POLL = 0, 1, 2
MAX_WAIT = 10.0   # seconds: a pass waiting longer is taken first, whatever its priority (a guard against
#                   starvation only: at 2 s the chaos bench's backlog made the pool FIFO, next job p50 0.49 s)


class Dispatcher:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._cv = threading.Condition()
        self._queues: dict[int, deque] = {JOB: deque(), CHANGE: deque(), POLL: deque()}
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self._idle = 0   # threads waiting for work

    def submit(self, priority: int, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._stopped:
                future.cancel()
                return future
            self._queues[priority].append((time.monotonic(), next(self._seq), future, fn, args))
            if len(self._threads) < self.workers and self._count() > self._idle:
                thread = threading.Thread(target=self._work, name=f"solar-reconcile-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cv.notify()
        return future

    async def run(self, priority: int, fn, *args):
        """``fn(*args)`` in the pool: its result or its exception."""
        return await asyncio.wrap_future(self.submit(priority, fn, *args))

    def queued(self) -> int:
        with self._cv:
            return self._count()

    def stop(self) -> None:
        """No new passes; queued ones are cancelled, running ones finish in their threads."""
        with self._cv:
            self._stopped = True
            pending = [item for q in self._queues.values() for item in q]
            for q in self._queues.values():
                q.clear()
            self._cv.notify_all()
        for _, _, future, _, _ in pending:
            future.cancel()

    def _count(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _take(self):
        """The next pass (under the lock, some queued): the oldest, when it has waited more than
        ``MAX_WAIT``, else the first of the most urgent queue (a steady stream of job events never
        starves the polls)."""
        waiting = [q for _, q in sorted(self._queues.items()) if q]
        oldest = min(waiting, key=lambda q: q[0][1])
        if time.monotonic() - oldest[0][0] > MAX_WAIT:
            return oldest.popleft()
        return waiting[0].popleft()

    def _work(self) -> None:
        while True:
            with self._cv:
                self._idle += 1
                while not self._count() and not self._stopped:
                    self._cv.wait()
                self._idle -= 1
                if self._stopped:
                    return
                _, _, future, fn, args = self._take()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 (handed to the awaiting handler, as kopf's pool does)
                future.set_exception(exc)
            else:
                future.set_result(result)
