"""A run directory's bookkeeping files (no torch): what rank 0 writes at launch and at the end,
and the per-rank event logs and heartbeats.

    resolved-config.json        canonical JSON of the resolved config (first launch)
    launch-manifest.json        solar.launch.v1 (first launch); later launches: launches/NNNN.json
    environment.json            the latest launch's `solar environment probe` (for `solar report`)
    run-result.json             solar.run-result.v1, replaced at the end of every launch
    events/rank-NNNNN.jsonl     one JSON object per line (steps, checkpoints, validations, errors)
    heartbeat/rank-NNNNN.json   last phase, last collective entered, step, wall time, pid, host
    logs/rank-NNNNN.log         the rank's stdout/stderr and failure tracebacks, across launches
    .writer.lock                the one writer's lock (rank 0 of the live launch; released when it dies)
    .fence.json                 the stage's current attempt (``solar.storage.fence``; launches with a token)
    superseded/NNNN/, checkpoints/superseded/NNNN/, validation/superseded/NNNN/
                                what launch NNNN moved aside before its first step: a restart of a run that
                                committed nothing, a rewind to an older checkpoint (``solar.storage.supersede``)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from solar.config.canonical import canonical_bytes, digest, pretty_bytes
from solar.errors import SolarError
from solar.storage import fence, supersede
from solar.storage.supersede import Supersede
from solar.storage.atomic import write_create_only, write_replace

LAUNCH_SCHEMA = "solar.launch.v1"
RESULT_SCHEMA = "solar.run-result.v1"
def code_revision(repo: Path | None = None) -> dict:
    repo = repo or Path(__file__).resolve().parents[3]
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()) if rev else None
    except (OSError, subprocess.SubprocessError):
        rev, dirty = None, None
    return {"revision": rev or os.environ.get("SOLAR_CODE_REVISION") or None, "dirty": dirty}


def identity(config: dict) -> dict:
    """The config without the keys a resume may change freely or with a recorded line (execution and
    schedule keys, ``solar.config.changes``): what makes the run the run it is."""
    from solar.config.changes import RECIPE, flatten, kind_of

    return {k: v for k, v in flatten(json.loads(canonical_bytes(config))).items() if kind_of(k) == RECIPE}


def launch_identity_digest(config: dict) -> str:
    return digest(identity(config))


def launch_manifest(resolved, init: dict, changes: list[dict] | None = None) -> dict:
    cfg = resolved.config_dict
    doc = {"schema": LAUNCH_SCHEMA, "action": cfg["action"], "name": cfg["name"], "route": resolved.route.key,
           "source_config": {"path": resolved.source, "digest": resolved.source_digest},
           "resolved_config_digest": resolved.resolved_digest, "code": code_revision(),
           "topology": resolved.topology.as_dict(), "init": init,
           "launch_identity_digest": launch_identity_digest(cfg)}
    if changes:
        doc["changes"] = changes
    return doc


def launch_records(output_dir: Path) -> list[Path]:
    """The run directory's launch manifests that exist, oldest first: ``launch-manifest.json`` (the
    first launch), then ``launches/NNNN-launch-manifest.json`` (each later one, ``write_launch``)."""
    first = output_dir / "launch-manifest.json"
    return [*([first] if first.is_file() else []), *sorted((output_dir / "launches").glob("*-launch-manifest.json"))]


def latest_config(output_dir: Path) -> dict:
    """The resolved config of the run directory's latest launch (``launches/NNNN-resolved-config.json``,
    else ``resolved-config.json``): what a resume is compared with."""
    records = sorted((output_dir / "launches").glob("*-resolved-config.json"))
    return json.loads((records[-1] if records else output_dir / "resolved-config.json").read_text())


_VERB = {"train": "a training run", "infer": "an inference run"}
# What a launch that stopped before its launch manifest leaves: the directory is still unused.
_UNUSED = (".writer.lock", fence.FENCE_FILE, "resolved-config.json")


@dataclass(frozen=True)
class Prepared:
    """What the checks decided for the launch (rank 0, before anything is written): a resume's or a
    restart's config changes against the latest launch, and what moves aside first (a restart of a
    directory that committed nothing, a rewind to an older checkpoint: ``solar.storage.supersede``)."""

    review: object = None          # solar.config.changes.Review
    supersede: Supersede | None = None


def prepare(output_dir: Path, resolved, *, resuming: bool, completed_step: int | None = None) -> Prepared | None:
    """Check the directory may be used; raise before anything is written. A resume (or a continued
    generation) returns its ``solar.config.changes.Review`` against the run's latest launch: a
    training resume may change execution keys freely, schedule keys with a recorded line and recipe
    keys listed in ``checkpoint.accept_changes``; a continued generation execution keys only (not its
    checkpoint). A resume from an older checkpoint than the directory's newest is a rewind. A fresh
    training launch into a directory whose run committed no checkpoint starts it over (by hand with
    the run's recipe; for a SolarRun stage, ``owner``, whatever the spec now says). Every refusal
    names each differing key with both values."""
    from solar.config import changes

    if output_dir.exists() and not output_dir.is_dir():
        raise SolarError(f"runtime.output_dir {output_dir} is a file")
    existing = output_dir / "launch-manifest.json"
    # the lock, the fence and an unrecorded config alone: unused (a launch that stopped before its manifest)
    if not output_dir.exists() or (not existing.is_file() and all(p.name in _UNUSED for p in output_dir.iterdir())):
        if resuming:
            raise SolarError(f"checkpoint.mode=full_resume but {output_dir} holds no run to resume")
        return None
    if not existing.is_file():
        raise SolarError(f"runtime.output_dir {output_dir} is not empty and holds no Solar run; use a new directory")
    recorded = json.loads(existing.read_text())
    action, name = resolved.config_dict["action"], recorded.get("name")
    if recorded.get("action", action) != action:
        raise SolarError(f"runtime.output_dir {output_dir} holds {_VERB.get(recorded.get('action'), 'another run')} "
                         f"({name!r}); solar {action} needs a new directory")
    old, new = latest_config(output_dir), json.loads(canonical_bytes(resolved.config_dict))
    if not resuming:
        return _restart(output_dir, name, old, new)
    if action == "infer":
        differ = [c for c in changes.diff(old, new) if c.kind != changes.EXECUTION or c.key.startswith("checkpoint.")]
        if differ:
            raise SolarError(f"{output_dir} holds an unfinished generation with another config: "
                             f"{changes.listing(differ)}; continue it with the same config or use a new "
                             "runtime.output_dir")
        return changes.Review([], [], [])
    try:
        review = changes.review(old, new, completed_step=completed_step, where=str(output_dir))
    except ValueError as exc:
        raise SolarError(str(exc)) from None
    path = (new.get("checkpoint") or {}).get("path")
    back = supersede.rewind(output_dir, path, completed_step) if completed_step is not None and path else None
    return Prepared(review, back)


def _restart(output_dir: Path, name, old: dict, new: dict) -> Prepared:
    """A fresh training launch into a directory that holds a run: refused when the run committed a
    checkpoint (naming the newest and how to resume it); otherwise the run starts over, unless a
    launch by hand changes its recipe (execution and schedule keys may change; for a SolarRun stage
    anything may: its spec was changed on purpose). The changes are recorded as a resume's are."""
    from solar.config import changes

    committed = supersede.committed_steps(output_dir)
    differ = [c for c in changes.diff(old, new) if c.key not in ("checkpoint.mode", "checkpoint.path")]
    if committed:
        newest = output_dir / "checkpoints" / f"step_{committed[-1]:08d}"
        other = [c for c in differ if c.kind != changes.EXECUTION]
        config = f" (this launch's config differs: {changes.listing(other)})" if other else ""
        raise SolarError(f"runtime.output_dir {output_dir} already holds run {name!r} with checkpoints up to step "
                         f"{committed[-1]}{config}; use a new directory, or resume it with --set "
                         f"checkpoint.mode=full_resume --set checkpoint.path={newest}")
    recipe = [c for c in differ if c.kind == changes.RECIPE]
    if recipe and owner() is None:
        raise SolarError(f"runtime.output_dir {output_dir} holds run {name!r}, which committed no checkpoint, with "
                         f"another recipe: {changes.listing(recipe)}; with the run's recipe it starts over in place "
                         "(execution and schedule keys may differ), or use a new runtime.output_dir")
    review = changes.Review(execution=[c for c in differ if c.kind == changes.EXECUTION],
                            schedule=[c for c in differ if c.kind == changes.SCHEDULE], accepted=recipe)
    return Prepared(review, supersede.restart(output_dir, len(launch_records(output_dir))))


def next_launch_number(output_dir: Path) -> int:
    """The number of the launch about to be recorded: 0 for the first (``launch-manifest.json``), then
    the next free ``launches/NNNN``."""
    if not (output_dir / "launch-manifest.json").exists():
        return 0
    return max((int(p.name[:4]) for p in (output_dir / "launches").glob("[0-9][0-9][0-9][0-9]-*.json")), default=0) + 1


def write_launch(output_dir: Path, resolved, init: dict, changes: list[dict] | None = None,
                 extra: dict | None = None) -> None:
    """The launch's record (``extra``: a restart's or rewind's entry, ``solar.storage.supersede``)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    doc = launch_manifest(resolved, init, changes)
    doc.update(extra or {})
    manifest = pretty_bytes(doc)
    config = canonical_bytes(resolved.config_dict) + b"\n"
    index = next_launch_number(output_dir)
    if index == 0:   # a config without its manifest is an unrecorded launch's: replaced
        write_replace(output_dir / "resolved-config.json", config)
        write_create_only(output_dir / "launch-manifest.json", manifest, what="launch-manifest.json")
        return
    launches = output_dir / "launches"
    launches.mkdir(exist_ok=True)
    write_create_only(launches / f"{index:04d}-launch-manifest.json", manifest, what="launch record")
    write_create_only(launches / f"{index:04d}-resolved-config.json", config, what="launch record")


LOCK_FILE = ".writer.lock"


class WriterLock:
    """The run directory's one writer (issue 45 item 7): an exclusive ``flock`` on ``<dir>/.writer.lock``
    (of its open file, so no other descriptor of the file in the holder drops it; over NFS Linux
    takes it as a POSIX lock on the server), held by rank 0 of the launch for as long as it runs. The
    kernel releases it when its holder dies, so a crash never leaves a stale lock; the file itself
    stays (its text names the latest holder: host, pid, since, and its fencing token when it has one).

    A launch whose token is larger than the holder's (the holder's attempt was replaced: a SIGSTOPped
    or partitioned process whose lock its filesystem keeps) goes ahead without the lock (``fenced``
    names the holder): the fence stops the holder's writes, and the lock is taken, on a thread
    waiting for it, once the holder lets go."""

    def __init__(self, fd: int, path: Path, token: int | None = None, owner: dict | None = None,
                 fenced: str | None = None) -> None:
        self.fd, self.path, self.token, self.owner, self.fenced = fd, path, token, owner, fenced

    def record(self) -> None:
        """Name this process as the holder (rank 0, once the launch goes ahead)."""
        fence.check()
        text = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "token": self.token, "owner": self.owner}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text, 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hold(output_dir: Path, token: int | None = None, owner: dict | None = None) -> WriterLock:
    """Take ``output_dir``'s writer lock, or a SolarError naming the live launch that holds it. Asked
    after every other check of the launch passed (it creates the directory and the lock file). With a
    fencing token (``token``, ``owner``: ``solar.storage.fence``) a holder of an older attempt of the
    same stage does not hold the launch back (``WriterLock.fenced``), and a holder of a newer one
    refuses it as stale (``fence.Stale``)."""
    import fcntl
    import threading

    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        who = _recorded(path)
        theirs = who.get("token")
        if token is not None and isinstance(theirs, int) and who.get("owner") == owner:
            if theirs < token:
                threading.Thread(target=_wait_for, args=(fd,), name="writer-lock", daemon=True).start()
                return WriterLock(fd, path, token, owner, fenced=f"attempt {theirs} ({_holder(path)})")
            if theirs > token:
                os.close(fd)
                doc = {"token": theirs, "host": who.get("host"), "pid": who.get("pid"), "since": who.get("since")}
                raise fence.Stale(fence.Fence(output_dir, token, owner).line(doc, starting=True))
        os.close(fd)
        raise SolarError(f"runtime.output_dir {output_dir} is being written by a live launch ({_holder(path)}); "
                         "a second writer would interleave its steps and checkpoints: wait for it to end, or stop "
                         "it (SIGTERM saves a checkpoint) and resume") from None
    return WriterLock(fd, path, token, owner)


def _wait_for(fd: int) -> None:
    """Take the lock a fenced holder still holds, once it lets go (a daemon thread of the launch)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:   # the launch ended first and closed the file
        pass


def _recorded(path: Path) -> dict:
    try:
        who = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return who if isinstance(who, dict) else {}


def _holder(path: Path) -> str:
    who = _recorded(path)
    if not who.get("pid"):
        return "its holder not yet recorded"
    return f"host {who.get('host')}, pid {who.get('pid')}, since {who.get('since')}"


def write_environment(output_dir: Path) -> None:
    """``environment.json``: what this launch ran on (``solar environment probe``), for the report."""
    from solar.environment import probe

    write_replace(output_dir / "environment.json", pretty_bytes(probe()))


def owner(environ=os.environ) -> dict | None:
    """The SolarRun stage this launch runs for (``SOLAR_RUN_UID``, ``SOLAR_RUN_STAGE``: the operator
    sets them in every stage job), recorded in run-result.json so that a stage's evidence written by
    another run is recognised; None when launched by hand."""
    uid, stage = environ.get("SOLAR_RUN_UID"), environ.get("SOLAR_RUN_STAGE")
    return {"run_uid": uid, "stage": stage} if uid and stage else None


def write_result(output_dir: Path, status: str, *, error_type: str | None = None, message: str | None = None,
                 final: dict | None = None, checkpoints: list | None = None, validations: list | None = None,
                 usage: dict | None = None) -> None:
    doc = {"schema": RESULT_SCHEMA, "status": status, "checkpoints": checkpoints or [],
           "validations": validations or []}
    if owner() is not None:
        doc["owner"] = owner()
    if usage is not None:
        doc["usage"] = usage
    if error_type is not None:
        doc["error_type"] = error_type
    if message is not None:
        doc["message"] = message
    if final is not None:
        doc["final"] = final
    write_replace(output_dir / "run-result.json", pretty_bytes(doc))


def usage(output_dir: Path, *, world: int, device: str, started: float, ended: float, status: str) -> dict:
    """``run-result.json``'s ``usage``: this launch's GPU time (world size x wall time from its first
    rank's start to its end) after the earlier launches of the same run directory (their results,
    failed and stopped ones included), and the totals."""
    try:
        earlier = json.loads((output_dir / "run-result.json").read_text()).get("usage", {}).get("attempts", [])
    except (OSError, ValueError, AttributeError):
        earlier = []
    wall = max(ended - started, 0.0)
    attempts = [*earlier, {"status": status, "world_size": world, "device": device, "started": _iso(started),
                           "ended": _iso(ended), "wall_seconds": round(wall, 3), "gpu_seconds": round(world * wall, 3)}]
    return {"gpu_seconds": round(sum(a.get("gpu_seconds", 0.0) for a in attempts), 3), "attempts": attempts}


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventLog:
    """Append-only JSON lines, flushed per event (fsync on error and checkpoint events)."""

    def __init__(self, output_dir: Path, rank: int) -> None:
        fence.check()
        folder = output_dir / "events"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank-{rank:05d}.jsonl"
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def write(self, event: str, durable: bool = False, **fields) -> None:
        line = json.dumps({"event": event, "time": time.time(), **fields}, sort_keys=True, allow_nan=True) + "\n"
        fence.check()   # right before the write it guards
        self._handle.write(line)
        self._handle.flush()
        if durable:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        try:
            self._handle.close()
        except OSError:   # lines the full volume did not take
            pass


class Heartbeat:
    def __init__(self, output_dir: Path, rank: int) -> None:
        fence.check()
        folder = output_dir / "heartbeat"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank-{rank:05d}.json"
        self.state = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "phase": "start", "step": 0,
                      "collective": None, "time": time.time()}

    def update(self, **changes) -> None:
        """Rewrite the heartbeat (several times per training step): atomic, not fsynced, since the
        step waits on it (two fsyncs per phase used to idle the GPU between phases, issue 18) and
        a heartbeat only speaks for a machine that is up; a killed process leaves its last one. On a
        full or failing volume the heartbeat is skipped (the run's own writes meet the volume and say
        so), never the step, the error exchange or the checkpoint it was reporting on."""
        self.state.update(changes, time=time.time())
        try:
            write_replace(self.path, json.dumps(self.state, sort_keys=True).encode(), durable=False)
        except OSError:
            pass

    def collective(self, name: str, seq: int) -> None:
        self.update(collective={"name": name, "seq": seq})


def record_failure(error: BaseException, *, error_type: str, message: str, events: EventLog | None,
                   heartbeat: Heartbeat | None, rank_log: RankLog | None) -> None:
    """The evidence a failed launch leaves on this rank: the traceback in its log, an ``error`` event
    (with the failing ranks of a collective failure and the phase), and a heartbeat that keeps the
    phase it failed in."""
    phase = heartbeat.state["phase"] if heartbeat is not None else None
    if rank_log is not None:
        rank_log.exception(error)
    if events is not None:
        try:
            events.write("error", durable=True, error_type=error_type, message=message,
                         ranks=getattr(error, "ranks", None) or [], phase=phase)
        except OSError:   # the volume that failed the launch may not take its evidence either
            pass
    if heartbeat is not None:
        heartbeat.update(failed_in=phase, phase="failed")


class _Tee:
    """A text stream that also writes to the rank's log file."""

    def __init__(self, stream, log) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        fence.check()   # a stale process's lines stay out of the rank's log
        try:
            self._log.write(text)
        except (ValueError, OSError):  # the log was closed (late output at exit), or its volume is full
            pass
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()
        if not self._log.closed:
            self._log.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding ... of the real stream
        return getattr(self._stream, name)


class RankLog:
    """``logs/rank-NNNNN.log``: this rank's Python-level stdout and stderr (and, on failure, the full
    traceback the console shows only with ``SOLAR_DEBUG=1``), appended across launches."""

    def __init__(self, output_dir: Path, rank: int) -> None:
        fence.check()
        folder = output_dir / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank-{rank:05d}.log"
        self._handle = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in close())
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, self._handle), _Tee(sys.stderr, self._handle)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._handle.write(f"--- launch {stamp} rank {rank} pid {os.getpid()} host {socket.gethostname()}\n")

    def exception(self, exc: BaseException) -> None:
        fence.check()
        try:
            self._handle.write("".join(traceback.format_exception(exc)))
            self._handle.flush()
        except OSError:   # a full volume: the console's one line still says what failed
            pass

    def close(self) -> None:
        sys.stdout, sys.stderr = self._saved
        try:
            self._handle.close()
        except OSError:   # lines the full volume did not take
            pass
