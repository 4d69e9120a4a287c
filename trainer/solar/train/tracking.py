"""Rank 0's experiment trackers: TensorBoard event files and an MLflow run (docs/tracking.md).

Both take the same per-step scalars (``step_scalars``: the step event's numbers, the loss being the
mean over ranks the event calls ``loss_mean``), the validation summaries and the run's GPU hours, and
are held behind one small interface (``Tracking``: ``step``, ``validation``, ``committed``,
``finish``, ``upload_result``); a tracker that cannot be used costs one warning line, never the step.

TensorBoard (``tensorboard``, the ``tracking`` extra): ``<output_dir>/tensorboard/`` holds one event
file per launch, named so that the launches sort in order. Records are written by tensorboard's own
record writer in the training thread, one flush per step after ``fence.check()`` (a stale attempt
writes nothing; no background thread writes behind the fence). A launch that begins at step ``s``
(a resume, a rewind, a restart from 0) opens its file with a ``SessionLog.START`` at step ``s + 1``:
TensorBoard's readers then discard what earlier launches wrote at steps after ``s`` (the orphaned
steps a crash or a rewind left), so every step keeps one value, the newest launch's.

MLflow (``MLFLOW_TRACKING_URI`` set; ``mlflow-skinny`` or ``mlflow``, imported only then): a run in
``MLFLOW_EXPERIMENT_NAME`` (default: the SolarRun's name, else the config's ``name``), its id kept in
``<output_dir>/mlflow-run.json`` so that a resumed stage continues it. MLflow keeps every value logged
at a step, so a step's metrics are sent once the checkpoint that covers it is committed (or the launch
completed): a resume then starts after the last step sent, and each step has one value. A rewind
(a launch that begins before the last step sent) starts a new MLflow run tagged with the one it
rewinds (``solar.rewound_from``).
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from pathlib import Path

from solar.config.canonical import pretty_bytes
from solar.storage import fence
from solar.storage.atomic import write_replace

TENSORBOARD_DIR = "tensorboard"
MLFLOW_FILE = "mlflow-run.json"
GIB = 2**30


def warn(text: str) -> None:
    print(f"solar: warning: {text}", file=sys.stderr)


# --- what is tracked ------------------------------------------------------------------------
def step_scalars(event: dict, *, dp_world: int = 1, world: int = 1, tokens_per_clip: int = 0,
                 flops_per_clip: float = 0.0, peak_flops: float | None = None) -> dict[str, float]:
    """The scalars of one step event (``Loop.step`` or Stage2's outer step): loss (mean over ranks),
    grad norm and lr of each role the step updated (``train/...``; Stage2 ``critic/...`` every step,
    ``student/...`` at its updates), step time, tokens/s and MFU per device (as the progress line
    counts them), and memory in GiB. Non-finite and missing values are left out."""
    out: dict[str, float] = {}
    if "student_updated" in event:   # Stage2
        out.update({"critic/loss": event.get("loss_mean"), "critic/grad_norm": event.get("grad_norm"),
                    "critic/lr": event.get("lr")})
        if event["student_updated"]:
            out.update({"student/loss": event.get("student_loss_mean", event.get("student_loss")),
                        "student/grad_norm": event.get("student_grad_norm"), "student/lr": event.get("student_lr"),
                        "student/update": event.get("student_step")})
    else:
        out.update({"train/loss": event.get("loss_mean"), "train/grad_norm": event.get("grad_norm"),
                    "train/lr": event.get("lr")})
    seconds = event.get("step_seconds")
    out["perf/step_seconds"] = seconds
    clips = len(event.get("samples") or []) * dp_world
    if clips and seconds and seconds > 0:
        if tokens_per_clip:
            out["perf/tokens_per_second_per_device"] = tokens_per_clip * clips / world / seconds
        if peak_flops and flops_per_clip:
            out["perf/mfu"] = flops_per_clip * clips / world / seconds / peak_flops
    for key, value in (event.get("memory") or {}).items():
        if isinstance(value, (int, float)):
            out[f"memory/{key.removesuffix('_bytes')}_gib"] = value / GIB
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def validation_scalars(summary: dict) -> dict[str, float]:
    """A validation event's numbers: slots ok and in error, and its seconds."""
    return {f"validation/{k}": float(summary[k]) for k in ("ok_slots", "error_slots", "slots", "seconds")
            if isinstance(summary.get(k), (int, float))}


def flat_params(config: dict) -> dict[str, str]:
    """The resolved config as ``a.b.c -> value`` (``solar.config.changes.flatten``; lists and null as JSON)."""
    from solar.config.changes import flatten

    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in flatten(config).items()}


# --- TensorBoard ----------------------------------------------------------------------------
class TensorBoardSink:
    """One launch's event file under ``<output_dir>/tensorboard/``, written in the caller's thread."""

    def __init__(self, out: Path, start: int) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._pb = event_pb2
        folder = Path(out) / TENSORBOARD_DIR
        earlier = list(folder.glob("events.out.tfevents.*")) if folder.is_dir() else []
        fence.check()
        folder.mkdir(parents=True, exist_ok=True)
        # launches sort by their number: TensorBoard reads a directory's files in name order
        name = f"events.out.tfevents.{len(earlier) + 1:05d}.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = folder / name
        # buffered: a record reaches the file only at _flush, after the fence check
        self._writer = RecordWriter(open(self.path, "ab"))  # noqa: SIM115 (closed in finish())
        # Every launch's file opens with a SessionLog.START at its first step: TensorBoard's readers take the
        # first START they see as the session's beginning and each later one as a restart, before which
        # they discard every value at or after its step (by any launch before it).
        self._event(file_version="brain.Event:2", step=start + 1)
        self._event(step=start + 1, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
        self._flush()

    def _event(self, **fields) -> None:
        self._writer.write(self._pb.Event(wall_time=time.time(), **fields).SerializeToString())

    def _flush(self) -> None:
        fence.check()
        self._writer.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto import summary_pb2

        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                             for k, v in sorted(values.items())])
        self._event(step=step, summary=summary)
        self._flush()

    def committed(self, step: int) -> None:
        pass

    def finish(self, status: str) -> None:
        try:
            self._writer.close()
        except OSError:
            pass

    def upload_result(self, out: Path) -> None:
        pass


# --- MLflow ---------------------------------------------------------------------------------
def experiment_name(config_name: str, environ=os.environ) -> str:
    """``MLFLOW_EXPERIMENT_NAME``, else the SolarRun's name (``SOLAR_RUN_NAME``, set in its stage pods),
    else the config's name."""
    return environ.get("MLFLOW_EXPERIMENT_NAME") or environ.get("SOLAR_RUN_NAME") or config_name


class MlflowSink:
    """The stage's MLflow run: params once, metrics of committed steps in batches, tags, the result."""

    def __init__(self, resolved, out: Path, start: int, uri: str, environ=os.environ) -> None:
        for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                           ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")):
            os.environ.setdefault(key, value)
        import logging

        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)   # our one line says it
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.out, self.uri = Path(out), uri
        self.client = MlflowClient(tracking_uri=uri)
        self.pending: list[tuple[int, dict[str, float]]] = []
        cfg = resolved.config
        name = experiment_name(cfg.name, environ)
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)
        kept = self._kept()
        stage = environ.get("SOLAR_RUN_STAGE")
        tags = {"solar.config": cfg.name, "solar.route": resolved.route.key, "solar.output_dir": str(self.out),
                "solar.launch_start_step": str(start)}
        for tag, var in (("solar.run", "SOLAR_RUN_NAME"), ("solar.run_uid", "SOLAR_RUN_UID"),
                         ("solar.stage", "SOLAR_RUN_STAGE"), ("solar.attempt", fence.ENV)):
            if environ.get(var):
                tags[tag] = environ[var]
        self.logged_through = 0
        if kept is not None and kept.get("experiment_id") == experiment_id and start >= kept.get("logged_through", 0):
            self.run_id, self.logged_through = kept["run_id"], kept.get("logged_through", 0)
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            if kept is not None and start < kept.get("logged_through", 0):
                tags["solar.rewound_from"] = kept["run_id"]
            run = self.client.create_run(experiment_id, run_name=stage or cfg.name)
            self.run_id = run.info.run_id
        self.experiment_id = experiment_id
        have = self.client.get_run(self.run_id).data.params
        self._params({k: v for k, v in flat_params(resolved.config_dict).items() if k not in have})
        self._batch(tags=[RunTag(k, v) for k, v in tags.items()])
        self._keep()

    def _kept(self) -> dict | None:
        try:
            doc = json.loads((self.out / MLFLOW_FILE).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("tracking_uri") == self.uri and doc.get("run_id") else None

    def _keep(self) -> None:
        write_replace(self.out / MLFLOW_FILE, pretty_bytes({
            "tracking_uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id,
            "logged_through": self.logged_through}))

    def _params(self, params: dict[str, str]) -> None:
        from mlflow.utils import validation

        longest = getattr(validation, "MAX_PARAM_VAL_LENGTH", 500)
        items = [self._Param(k[:250], v if len(v) <= longest else v[:longest - 3] + "...")
                 for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            self._batch(params=items[i:i + 100])

    def _batch(self, **entities) -> None:
        self.client.log_batch(self.run_id, **entities)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.pending.append((step, values))
        if step <= self.logged_through:   # a validation of a step already sent (after its checkpoint)
            self.committed(step)

    def committed(self, step: int) -> None:
        """Send the steps up to ``step`` (a committed checkpoint covers them)."""
        ready = [(s, v) for s, v in self.pending if s <= step]
        self.pending = [(s, v) for s, v in self.pending if s > step]
        stamp = int(time.time() * 1000)
        metrics = [self._Metric(k, v, stamp, s) for s, values in ready for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self._batch(metrics=metrics[i:i + 1000])
        if step > self.logged_through:
            self.logged_through = step
            self._keep()

    def finish(self, status: str) -> None:
        if status == "complete" and self.pending:
            self.committed(max(s for s, _ in self.pending))
        self.pending = []
        self.client.set_terminated(self.run_id, {"complete": "FINISHED", "stopped": "KILLED"}.get(status, "FAILED"))

    def upload_result(self, out: Path) -> None:
        path = Path(out) / "run-result.json"
        if path.is_file():
            self.client.log_artifact(self.run_id, str(path))


# --- the interface the loop calls -----------------------------------------------------------
class Tracking:
    """Rank 0's trackers for one launch. A tracker that raises is dropped with one warning line."""

    def __init__(self, sinks: dict, *, dp_world: int = 1, world: int = 1, tokens_per_clip: int = 0,
                 flops_per_clip: float = 0.0, peak_flops: float | None = None, gpu_seconds_before: float = 0.0,
                 started: float | None = None) -> None:
        self.sinks = sinks
        self.shape = dict(dp_world=dp_world, world=world, tokens_per_clip=tokens_per_clip,
                          flops_per_clip=flops_per_clip, peak_flops=peak_flops)
        self.gpu_seconds_before, self.world = gpu_seconds_before, world
        self.started = started if started is not None else time.time()

    def _each(self, method: str, *args) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker never costs the training
                self.sinks.pop(name, None)
                warn(f"{name} logging stopped: {type(exc).__name__}: {_short(exc)}")

    def gpu_hours(self) -> float:
        return (self.gpu_seconds_before + self.world * max(time.time() - self.started, 0.0)) / 3600

    def step(self, event: dict) -> None:
        values = step_scalars(event, **self.shape)
        values["usage/gpu_hours"] = self.gpu_hours()
        self._each("scalars", event["step"], values)

    def validation(self, summary: dict) -> None:
        if isinstance(summary.get("step"), int):
            self._each("scalars", summary["step"], validation_scalars(summary))

    def committed(self, step: int) -> None:
        self._each("committed", step)

    def finish(self, status: str) -> None:
        self._each("finish", status)

    def upload_result(self, out: Path) -> None:
        self._each("upload_result", out)


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def open_tracking(resolved, out: Path, *, rank: int, start: int, dp_world: int, world: int, tokens_per_clip: int,
                  flops_per_clip: float, peak_flops: float | None, started: float | None,
                  environ=os.environ) -> Tracking | None:
    """Rank 0's trackers (None on other ranks): TensorBoard when its package is installed, MLflow when
    ``MLFLOW_TRACKING_URI`` is set and its server answers."""
    if rank != 0:
        return None
    sinks: dict = {}
    try:
        sinks["TensorBoard"] = TensorBoardSink(out, start)
    except ImportError:
        warn("tensorboard is not installed: no TensorBoard event files (pip install 'solar-wm-ops[tracking]')")
    except OSError as exc:   # the volume refused its folder or file: the run's own writes meet it and say so
        warn(f"no TensorBoard event files: {type(exc).__name__}: {_short(exc)}")
    uri = environ.get("MLFLOW_TRACKING_URI")
    if uri:
        try:
            sinks["MLflow"] = MlflowSink(resolved, out, start, uri, environ)
        except ImportError:
            warn("MLFLOW_TRACKING_URI is set but mlflow is not installed: nothing logged to MLflow "
                 "(pip install 'solar-wm-ops[tracking]')")
        except Exception as exc:  # noqa: BLE001 - an unreachable server never costs the training
            warn(f"MLflow at {uri} did not answer ({type(exc).__name__}: {_short(exc)}): nothing logged to MLflow")
    try:
        before = json.loads((Path(out) / "run-result.json").read_text()).get("usage", {}).get("gpu_seconds", 0.0)
    except (OSError, ValueError, AttributeError):
        before = 0.0
    return Tracking(sinks, dp_world=dp_world, world=world, tokens_per_clip=tokens_per_clip,
                    flops_per_clip=flops_per_clip, peak_flops=peak_flops,
                    gpu_seconds_before=before if isinstance(before, (int, float)) else 0.0, started=started)
