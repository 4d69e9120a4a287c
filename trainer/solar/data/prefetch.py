"""A rank's clip stream read one clip ahead on a background thread (issue 18).

``Prefetched`` wraps a ``RankStream``: handing out a clip schedules the read of the next one, so the
shard read, decode, validation and cut of step n+1's clip run while step n computes instead of
between the steps with the GPU idle. The clips and their order are the stream's own (one worker,
reads in sequence). ``state_dict`` is the stream's state after the clips handed out, never after
one only read ahead, so a checkpoint resumes exactly where the training was. A read's failure is
raised by the ``next_clip`` call that asks for that clip, as the plain stream would raise it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


class Prefetched:
    def __init__(self, stream) -> None:
        self.stream = stream
        self._state = stream.state_dict()   # after the clips handed out (none yet)
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: Future | None = None

    def _read(self):
        clip = self.stream.next_clip()
        return clip, self.stream.state_dict()

    def _schedule(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="solar-data")
        self._ahead = self._pool.submit(self._read)

    def next_clip(self):
        if self._ahead is None:
            self._schedule()
        ahead, self._ahead = self._ahead, None
        clip, state = ahead.result()  # a failed read raises here, for the clip it was reading
        self._state = state
        self._schedule()
        return clip

    def state_dict(self) -> dict:
        return self._state

    def close(self) -> None:
        """Stop reading ahead (the read in flight finishes; its clip is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._ahead = None, None


__all__ = ["Prefetched"]
