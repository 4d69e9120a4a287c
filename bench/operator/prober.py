"""``/healthz`` asked from a process of its own: ``prober.py URL PERIOD``.

Prints one line per ask, ``<time.monotonic() when asked> <seconds it took> <1: a 200, 0: none>``,
until its output is closed. The benches used to ask from a thread of their own process, which also runs the
API server emulator and the players: that thread's waits (the GIL, the garbage collector of a large
heap) were counted as the operator's (the chaos bench's late answers were seen there and not by a
prober of its own; bench/RESULTS.md). ``time.monotonic`` is the system's monotonic clock, the same
in every process of the machine, so the bench can place each answer between its kills and starts.
"""

from __future__ import annotations

import http.client
import sys
import time
import urllib.request


def main() -> None:
    url, period = sys.argv[1], float(sys.argv[2])
    while True:
        asked = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                ok = resp.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
        took = time.monotonic() - asked
        try:
            print(f"{asked:.6f} {took:.6f} {int(ok)}", flush=True)
        except (BrokenPipeError, ValueError):   # the bench is done with us
            return
        time.sleep(max(0.0, period - took))


if __name__ == "__main__":
    main()
