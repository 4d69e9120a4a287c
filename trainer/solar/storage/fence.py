"""The stage's fencing token (no torch): a process of an older attempt that wakes up writes nothing.

Every attempt of a stage carries a token that only grows, its attempt number in ``SOLAR_ATTEMPT``:
the operator sets it in every stage pod (the job's ``solarwm.io/attempt``), ``solar run`` in every
stage launch. A plain ``solar train`` / ``solar infer`` has none: it neither records nor checks a
fence (the run directory's writer lock still applies).

Before a launch writes anything, rank 0 reads ``<output_dir>/.fence.json`` (``admit``): a file that
holds a larger token of the same stage refuses the launch (a stale attempt starting late), writing
nothing; otherwise, once the writer lock is settled, it records its own token (``record``: atomic
replace, fsynced). From then on every rank of the launch checks the file (``check``) before each write
the stage's readers see: the storage layer's create-only and atomic writes (run-result.json, launch
records, heartbeats, validation slots and markers), a checkpoint's begin and its commit (again just
before the rename), event lines, rank-log lines and the writer lock's record. When the file names a
newer attempt (a larger token, or another SolarRun's stage), the process writes one line on its own
stderr and leaves at once with ``STALE_EXIT``: ``os._exit``, so no ``finally`` block, atexit hook or
buffered stream writes anything after it.

    .fence.json   {"token": 2, "owner": {"run_uid": ..., "stage": ...} | null, "host": ..., "pid": ..., "since": ...}

Tokens compare only within one owner (``run_dir.owner()``: the SolarRun uid and stage the operator
names; ``solar-run:<run dir>`` and the stage under ``solar run``): a recreated SolarRun of the same name starts again at attempt 1 and
takes the directory over, and a process of the other one is stale.

A check is one read of a file of about 150 bytes (open, read, close, JSON), a few microseconds on a
local disk; with the writer lock and the checks on every write it is what makes a stale process
harmless where flock does not fence across hosts (NFSv4, CephFS, Lustre drop a silent client's locks).

An atomic write is checked twice: before its temporary file and again right before the link or
rename that publishes it (a stale process then removes its temporary file and leaves), so a process
stopped while writing (a silent node's ranks freeze anywhere) publishes nothing when it wakes.

Not covered: a process stopped between the last check and the system call it guards (a read of the
fence file apart) completes that one call when it wakes; a stale process's files that no reader takes for the stage's (a checkpoint's hidden
``.partial`` directory it was writing, its console output) stay; the file is read with the
filesystem's own consistency (NFS: close-to-open, which revalidates at each open).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from solar.errors import SolarError

ENV = "SOLAR_ATTEMPT"
FENCE_FILE = ".fence.json"
# The exit status of a process that found a newer attempt in its stage (a launch refused as stale, or
# a running one fenced): not 0 (nothing of it was kept), not 2 (its input was fine).
STALE_EXIT = 3


_PARSED: dict[str, tuple[bytes, dict | None]] = {}   # a fence file's last bytes and what they parse to


class Stale(SolarError):
    """A launch whose stage has a newer attempt: refused before it wrote anything."""

    exit_code = STALE_EXIT


def token_from(environ=os.environ) -> int | None:
    """This launch's token (``SOLAR_ATTEMPT``), None when it has none."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise SolarError(f"{ENV}={raw!r} is not an attempt number (a positive integer); the operator and solar run "
                         "set it, a launch by hand leaves it unset")
    return int(raw)


@dataclass(frozen=True)
class Fence:
    """One launch's token in one stage directory."""
    out: Path
    token: int
    owner: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "file", os.path.join(self.out, FENCE_FILE))   # a str: checked every write

    @property
    def path(self) -> Path:
        return Path(self.file)

    def current(self) -> dict | None:
        """The recorded fence, None when there is none (or it cannot be read: the write it guards then
        meets the same volume). One open and read each time (never a cached answer: the process may have
        been stopped for minutes since the last); the JSON is parsed again only when the bytes changed."""
        try:
            fd = os.open(self.file, os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.read(fd, 65536)
        except OSError:
            return None
        finally:
            os.close(fd)
        seen = _PARSED.get(self.file)
        if seen is not None and seen[0] == raw:
            return seen[1]
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        doc = doc if isinstance(doc, dict) and isinstance(doc.get("token"), int) else None
        _PARSED[self.file] = (raw, doc)
        return doc

    def newer(self, doc: dict | None) -> bool:
        """Whether ``doc`` records a newer attempt of this stage than this launch."""
        return doc is not None and doc.get("owner") == self.owner and doc["token"] > self.token

    def stale(self, doc: dict | None) -> bool:
        """Whether a running launch must stop writing: ``doc`` is a newer attempt, or another run's stage."""
        return doc is not None and (doc.get("owner") != self.owner or doc["token"] > self.token)

    def line(self, doc: dict, *, starting: bool = False) -> str:
        """What a stale launch says: its attempt, the current one, when and where that one started."""
        where = f"stage {self.owner['stage']}" if self.owner else str(self.out)
        theirs = doc.get("owner")
        if theirs != self.owner and theirs:
            who = f"stage {theirs.get('stage')} of SolarRun uid {theirs.get('run_uid')} (attempt {doc['token']})"
        else:
            who = f"attempt {doc['token']}"
        end = "not starting" if starting else "exiting without writing"
        return (f"attempt {self.token} of {where} is stale: {who} took over at {doc.get('since')} (host "
                f"{doc.get('host')}, pid {doc.get('pid')}); {end} (exit status {STALE_EXIT})")

    def _write(self) -> None:
        """Record this launch's token: a temporary sibling, fsynced, renamed over the file, the directory
        fsynced (as ``solar.storage.atomic.write_replace``, which checks the fence itself)."""
        doc = {"token": self.token, "owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
               "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = self.out / f".{FENCE_FILE}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, json.dumps(doc, sort_keys=True).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.file)
        fd = os.open(self.out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def admit(fence: Fence) -> None:
    """Refuse (``Stale``) a launch whose stage already records a newer attempt; reads only."""
    doc = fence.current()
    if fence.newer(doc):
        raise Stale(fence.line(doc, starting=True))


def record(fence: Fence) -> None:
    """Make this launch the stage's current attempt (rank 0, before anything else of the launch is
    written): ``Stale`` when a newer one is recorded, else its own token, read back. Two launches that
    record at once (where the writer lock does not keep them apart) may leave the smaller token; the
    larger writes its own again at its first check, and the smaller leaves at its next."""
    admit(fence)
    fence.out.mkdir(parents=True, exist_ok=True)
    fence._write()
    admit(fence)


_ARMED: Fence | None = None


def arm(fence: Fence | None) -> None:
    """Check ``fence`` before this process's writes from now on (every rank of a launch with a token)."""
    global _ARMED
    _ARMED = fence


def disarm() -> None:
    arm(None)


def armed() -> Fence | None:
    return _ARMED


def check(discard: str | os.PathLike[str] | None = None) -> None:
    """Before a write the stage's readers see: nothing without an armed fence; a stale process leaves
    here (one line on its stderr, ``STALE_EXIT``), removing ``discard`` first (the hidden temporary file
    of the write it was about to publish). A file that records an older attempt of the stage (two
    launches that recorded at once) gets this launch's token again."""
    fence = _ARMED
    if fence is None:
        return
    doc = fence.current()
    if fence.stale(doc):
        if discard is not None:
            try:
                os.unlink(discard)
            except OSError:
                pass
        exit_stale(fence, doc)
    if doc is not None and doc["token"] < fence.token:
        fence._write()


def exit_stale(fence: Fence, doc: dict) -> None:
    """Leave at once: the line goes to file descriptor 2 itself (not through a rank log's tee), and
    ``os._exit`` runs nothing after it."""
    try:
        os.write(2, f"solar: {fence.line(doc)}\n".encode())
    finally:
        os._exit(STALE_EXIT)
