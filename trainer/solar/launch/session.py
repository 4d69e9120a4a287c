"""One launch's records, the same for ``solar train`` and ``solar infer``.

Rank 0 checks the run directory and the launch's sources before anything is written and every rank
learns its verdict; then rank 0 writes ``resolved-config.json``, ``launch-manifest.json`` and
``environment.json``, every rank opens its log, events and heartbeat, and at the end rank 0 writes
``run-result.json`` (complete, stopped or failed, with the error type and message every rank agreed
on, and ``usage``: this launch's GPU time, world size x wall time from the first rank's start, after
the earlier launches of the same directory). A failure is recorded on each rank by
``run_dir.record_failure``.

A launch with a fencing token (``SOLAR_ATTEMPT``: the operator's pods and ``solar run`` set it) is also
its stage's current attempt: rank 0 refuses it when the stage records a newer attempt and otherwise
records its token before anything else is written, and every rank checks the fence before each of its
writes until the launch is closed (``solar.storage.fence``: a stale process exits 3, writing nothing).

    session = Session(resolved, dist, out, verb="training")
    session.check(lambda: ...)              # SolarError on every rank when rank 0 refuses
    try:
        session.open()
        ...                                 # the verb's work
    except BaseException as exc:
        session.failed(exc)
    finally:
        session.close(status, final=..., checkpoints=..., validations=...)
    session.raise_failure()
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from solar.errors import SolarError
from solar.launch.base_weights import record as base_record
from solar.launch.distributed import Dist
from solar.launch.errors import error_type
from solar.run.failure import REFUSED_PREFIX
from solar.storage import fence, run_dir, supersede


def init_record(cfg) -> dict:
    """The launch manifest's ``init``: the mode and every weight source it reads."""
    ck = cfg.checkpoint
    sources = []
    if ck.mode == "none" and cfg.model.pretrained_path:
        sources.append(base_record(cfg.model.pretrained_path))
    elif ck.mode in ("weights_only", "full_resume"):
        sources.append({"role": "model", "path": ck.path, "weights": ck.weights or "all"})
    elif ck.mode == "roles":
        for role in ("student", "teacher", "critic"):
            spec = getattr(ck.roles, role)
            sources.append({"role": role, "path": spec.path, "weights": spec.weights})
    if cfg.model.training_mode == "lora" and cfg.model.pretrained_path and ck.mode != "none":
        sources.append(base_record(cfg.model.pretrained_path, "base"))
    return {"mode": ck.mode, "sources": sources}


# Where Kubernetes reads a container's termination message (the kubelet creates the file; the pod's
# status then carries its text): a refusal is left there for the operator, which does not retry it.
TERMINATION_LOG = "/dev/termination-log"


def note_refusal(message: str, environ=os.environ) -> None:
    """Leave a refusal (rank-local rank 0 only, one per pod) in the container's termination message when
    the file exists (``SOLAR_TERMINATION_LOG`` names another path, as a test's kubelet does); nothing
    on a workstation, where there is no such file."""
    path = environ.get("SOLAR_TERMINATION_LOG", TERMINATION_LOG)
    if environ.get("LOCAL_RANK", "0") != "0" or not os.path.isfile(path):
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write((REFUSED_PREFIX + " ".join(message.split()))[:4000])   # the kubelet keeps 4096 bytes
    except OSError:
        pass


def _message(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, SolarError) else f"{type(exc).__name__}: {exc}"


class Session:
    """The records of one launch in ``out`` (``verb`` names it in the final error: "training failed")."""

    def __init__(self, resolved, dist: Dist, out: Path, *, verb: str) -> None:
        self.resolved, self.dist, self.out, self.verb = resolved, dist, Path(out), verb
        self.events: run_dir.EventLog | None = None
        self.heartbeat: run_dir.Heartbeat | None = None
        self.rank_log: run_dir.RankLog | None = None
        self.error: BaseException | None = None
        self.started: float | None = None
        self.prepared: run_dir.Prepared | None = None   # rank 0: what the checks returned (run_dir.prepare)
        self.superseded: dict | None = None             # rank 0: the restart's or rewind's record
        self.lock: run_dir.WriterLock | None = None   # rank 0: the run directory's writer lock

    def check(self, checks: Callable[[], object]) -> None:
        """Run ``checks`` on rank 0 before anything is written; a refusal ends every rank with the
        same ``SolarError`` (and the process group closed). What ``checks`` returns (a resume's
        changes, a restart or rewind: ``run_dir.Prepared``) is carried out and recorded by ``open``."""
        from solar import STARTED

        d = self.dist
        verdict, stale, mine = None, False, None
        if d.rank == 0:
            try:
                self.prepared = checks()
                mine = self._fence()
                if mine is not None:
                    fence.admit(mine)   # a stale attempt starting late writes nothing, not even the lock file
                token, owner = (mine.token, mine.owner) if mine is not None else (None, None)
                self.lock = run_dir.hold(self.out, token, owner)   # one writer per directory, once every check passed
                if self.lock.fenced:
                    print(f"solar: {self.out} is held by {self.lock.fenced}, an older attempt of this stage: it is "
                          f"fenced (it writes nothing more); attempt {token} goes ahead", file=sys.stderr)
                if mine is not None:
                    fence.record(mine)
            except SolarError as exc:
                verdict, stale = str(exc), isinstance(exc, fence.Stale)
        shared = d.all_gather_object((verdict, stale, STARTED), "prepare")
        (verdict, stale, _), self.started = shared[0], min(started for *_, started in shared)  # the first rank's start
        if verdict:
            if self.lock is not None:
                self.lock.release()
            d.close()
            if stale:   # not a refusal of the input: the stage went on without this attempt
                raise fence.Stale(verdict)
            note_refusal(verdict)
            raise SolarError(verdict)
        fence.arm(mine if d.rank == 0 else self._fence())   # every rank checks before its writes

    def _fence(self) -> fence.Fence | None:
        """This launch's fence in its run directory, None without a token (a launch by hand)."""
        token = fence.token_from()
        return fence.Fence(self.out, token, run_dir.owner()) if token is not None else None

    def open(self) -> None:
        """The launch files (rank 0), then every rank's log, events and heartbeat."""
        d, out = self.dist, self.out
        review = self.prepared.review if self.prepared is not None else None
        back = self.prepared.supersede if self.prepared is not None else None
        recorded = review.recorded if review is not None else []
        if d.rank == 0:
            if self.lock is not None:
                self.lock.record()
            extra = None
            if back is not None:   # before the launch's own record, which says what moved
                print(f"solar: {back.line(out)}", file=sys.stderr)
                self.superseded = supersede.apply(back, out, run_dir.next_launch_number(out))
                extra = {back.kind: self.superseded}
            run_dir.write_launch(out, self.resolved, init_record(self.resolved.config), recorded, extra)
            run_dir.write_environment(out)
            for line in review.lines() if review is not None else []:
                print(f"solar: {line}", file=sys.stderr)
        d.barrier("launch-written")
        self.rank_log = run_dir.RankLog(out, d.rank)
        self.events, self.heartbeat = run_dir.EventLog(out, d.rank), run_dir.Heartbeat(out, d.rank)
        d.on_collective = self.heartbeat.collective
        self.events.write("start", rank=d.rank, world=d.world, pid=os.getpid(), route=self.resolved.route.key)
        if d.rank == 0 and back is not None:
            self.events.write("restarted" if back.kind == "restart" else "rewound", durable=True, **self.superseded)
        if d.rank == 0 and recorded:
            self.events.write("config_changes", durable=True, changes=recorded)

    def failed(self, exc: BaseException) -> None:
        """What ended the launch (its traceback printed under SOLAR_DEBUG=1)."""
        self.error = exc
        if os.environ.get("SOLAR_DEBUG") == "1":
            traceback.print_exc()

    def close(self, status: str, *, final: dict | None = None, checkpoints: list | None = None,
              validations: list | None = None) -> None:
        """Record the outcome (``status`` when nothing failed), close the rank's files and the
        process group. run-result.json is written only once the launch manifest exists."""
        d, out, error = self.dist, self.out, self.error
        try:
            if error is not None:
                kind, message = error_type(error), _message(error)
                run_dir.record_failure(error, error_type=kind, message=message, events=self.events,
                                       heartbeat=self.heartbeat, rank_log=self.rank_log)
                if d.rank == 0 and (out / "launch-manifest.json").exists():
                    try:
                        run_dir.write_result(out, "failed", error_type=kind, message=message, final=final,
                                             checkpoints=checkpoints, validations=validations,
                                             usage=self._usage("failed"))
                    except OSError as exc:   # the volume that failed the launch may not take its result
                        print(f"solar: warning: run-result.json not written ({exc.strerror or exc})", file=sys.stderr)
            else:
                if self.heartbeat is not None:
                    self.heartbeat.update(phase=status)
                if self.events is not None:
                    self.events.write(status, durable=True, **(final or {}))
                if d.rank == 0:
                    run_dir.write_result(out, status, final=final, checkpoints=checkpoints, validations=validations,
                                         usage=self._usage(status))
        finally:
            if self.lock is not None:
                self.lock.release()
            if self.events is not None:
                self.events.close()
            if self.rank_log is not None:
                self.rank_log.close()
            fence.disarm()
            d.close()

    def _usage(self, status: str) -> dict:
        import time

        from solar import STARTED

        d = self.dist
        return run_dir.usage(self.out, world=d.world, device=d.device.type, started=self.started or STARTED,
                             ended=time.time(), status=status)

    def raise_failure(self) -> None:
        """Re-raise what ended the launch: a SolarError as it is, anything else as
        ``<verb> failed: Type: message``."""
        error = self.error
        if error is None:
            return
        if isinstance(error, SolarError):
            raise error
        raise SolarError(f"{self.verb} failed: {type(error).__name__}: {error}") from error
