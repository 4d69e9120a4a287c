"""Issue 53 items 1-2: every training stage writes TensorBoard event files and, with MLFLOW_TRACKING_URI,
an MLflow run. The series are read back with TensorBoard's own reader (EventAccumulator) and through
MlflowClient from a real ``mlflow server`` (sqlite store) this module starts, and compared with the
run's per-step records as ``solar report`` reads them (each step the newest launch's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from solar.report import build
from tests.conftest import CONFIGS
from tests.e2e.conftest import free_port
from tests.e2e.helpers import TINY, result, steps, train

pytestmark = pytest.mark.slow

FM = TINY["wan22_ti2v_5b"]
STAGE2 = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml"


def _f32(value: float) -> float:
    """What a TensorBoard scalar keeps of a float (simple_value is a float32)."""
    return float(np.float32(value))


def tensorboard(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the run's tensorboard/ folder as TensorBoard's reader serves it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _records(run: Path) -> dict:
    """The run's own per-step numbers (``solar report``: every step the newest launch's)."""
    return build(run)["series"]


def _sets(data, run, *extra) -> list[str]:
    return [f"data.root={data}", f"runtime.output_dir={run}", "runtime.validate_every=0", "runtime.log_every=100",
            *extra]


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _series_equal_records(run: Path, role: str = "train") -> dict:
    tb, rec = tensorboard(run), _records(run)
    for tag, key in ((f"{role}/loss", "loss"), (f"{role}/lr", "lr"), (f"{role}/grad_norm", "grad_norm")):
        assert tb[tag] == [(s, _f32(v)) for s, v in zip(rec["step"], rec[key])], tag
    return tb


# --- TensorBoard ----------------------------------------------------------------------------
def test_two_ranks_write_tensorboard_once_and_an_unreachable_mlflow_costs_one_line(wan_data, tmp_path):
    """Rank 0 alone writes the event files; the loss is the mean over both ranks (loss_mean), not rank
    0's own; lr, grad norm, throughput, memory, GPU hours and validation are there; an MLflow server
    that does not answer costs one warning line and the run completes."""
    run = tmp_path / "run"
    closed = free_port()
    proc = _ok(train(FM, [f"data.root={wan_data}", f"runtime.output_dir={run}", "distributed.world_size=2",
                          "train.global_batch_size=2", "train.max_steps=3", "runtime.save_every=3",
                          "runtime.validate_every=0", "runtime.validation_steps=[2]", "validation.sample_count=1",
                          "runtime.log_every=100"], nproc=2,
                     extra_env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{closed}"}))
    warnings = [line for line in proc.stderr.splitlines() if "mlflow" in line.lower()]
    assert len(warnings) == 1 and warnings[0].startswith("solar: warning: MLflow at http://127.0.0.1:"), warnings
    assert "Traceback" not in proc.stderr and result(run)["status"] == "complete"
    assert not (run / "mlflow-run.json").exists()
    files = list((run / "tensorboard").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.00001.")   # rank 0's only
    tb = _series_equal_records(run)
    rank0, rank1 = steps(run, 0), steps(run, 1)
    assert all(a["loss"] != b["loss"] for a, b in zip(rank0, rank1))   # the ranks' own losses differ ...
    assert [v for _, v in tb["train/loss"]] == [_f32((a["loss"] + b["loss"]) / 2) for a, b in zip(rank0, rank1)]
    for tag in ("perf/step_seconds", "perf/tokens_per_second_per_device", "memory/host_peak_rss_gib",
                "usage/gpu_hours"):
        assert [s for s, _ in tb[tag]] == [1, 2, 3], tag
    assert [s for s, _ in tb["perf/step_seconds"]] == [1, 2, 3]
    hours = [v for _, v in tb["usage/gpu_hours"]]
    assert 0 < hours[0] <= hours[1] <= hours[2] <= result(run)["usage"]["gpu_seconds"] / 3600 * 1.0001  # float32
    validation = json.loads(next(run.glob("validation/step_00000002/COMPLETE.json")).read_text())
    assert tb["validation/ok_slots"] == [(2, validation["ok_slots"])] and validation["ok_slots"] >= 1
    assert tb["validation/error_slots"] == [(2, 0.0)]


def test_stage2_shows_the_critic_every_step_and_the_student_at_its_updates(wan_data, tmp_path):
    run = tmp_path / "stage2"
    _ok(train(STAGE2, _sets(wan_data, run, "train.max_steps=5", "train.sgf.critic_updates_per_student=2",
                            "runtime.save_every=0")))
    tb = _series_equal_records(run, "critic")
    rec = _records(run)
    assert [s for s, _ in tb["critic/loss"]] == [1, 2, 3, 4, 5]
    student = [(s, _f32(v)) for s, v in zip(rec["step"], rec["student_loss"]) if v is not None]
    assert [s for s, _ in student] == [3, 5] and tb["student/loss"] == student
    events = {e["step"]: e for e in steps(run)}
    assert tb["student/lr"] == [(s, _f32(events[s]["student_lr"])) for s in (3, 5)]
    assert tb["student/grad_norm"] == [(s, _f32(events[s]["student_grad_norm"])) for s in (3, 5)]
    assert tb["student/update"] == [(3, 1.0), (5, 2.0)]
    assert "train/loss" not in tb


# --- MLflow, and TensorBoard across a resume and a rewind -----------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on a sqlite store and a local artifact root, on a free local port."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", f"sqlite:///{root / 'store.db'}",
                             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:   # its workers take their time; the store is the test's own
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def resumed(wan_data, mlflow_server, tmp_path_factory):
    """One run, three launches, logged to MLflow: (1) fails at step 5 after its step-3 checkpoint (step
    4 was logged and is orphaned); (2) resumes step 3 with another learning rate and completes step 6;
    (3) rewinds to step 3 with a third learning rate and completes again. After each launch, the run
    directory, its TensorBoard series and its MLflow runs."""
    run = tmp_path_factory.mktemp("resumed") / "run"
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "issue-53",
           "SOLAR_RUN_STAGE": "fm", "SOLAR_RUN_UID": "uid-53", "SOLAR_RUN_NAME": "tracked", "SOLAR_ATTEMPT": "1"}
    common = _sets(wan_data, run, "train.max_steps=6", "runtime.save_every=3")
    resume = ("checkpoint.mode=full_resume", f"checkpoint.path={run}/checkpoints/step_00000003",
              "checkpoint.accept_changes=[train.optimizer.lr]")
    seen = []
    failed = train(FM, common, extra_env={**env, "SOLAR_INJECT_FAULT": "raise:step=5"})
    assert failed.returncode != 0 and "injected fault" in failed.stderr, failed.stderr[-2000:]
    seen.append((tensorboard(run), json.loads((run / "mlflow-run.json").read_text()), failed.stderr))
    second = _ok(train(FM, [*common, "train.optimizer.lr=0.002", *resume], extra_env={**env, "SOLAR_ATTEMPT": "2"}))
    seen.append((tensorboard(run), json.loads((run / "mlflow-run.json").read_text()), second.stderr))
    records_after_resume = _records(run)
    third = _ok(train(FM, [*common, "train.optimizer.lr=0.003", *resume], extra_env={**env, "SOLAR_ATTEMPT": "3"}))
    seen.append((tensorboard(run), json.loads((run / "mlflow-run.json").read_text()), third.stderr))
    return {"run": run, "seen": seen, "after_resume": records_after_resume, "uri": mlflow_server}


def test_a_resume_and_a_rewind_leave_one_tensorboard_value_per_step_the_newest(resumed):
    run, seen = resumed["run"], resumed["seen"]
    first = seen[0][0]
    assert [s for s, _ in first["train/loss"]] == [1, 2, 3, 4]   # step 4 trained, then step 5 failed
    after_resume, after_rewind = seen[1][0], seen[2][0]
    rec = resumed["after_resume"]
    assert rec["lr"] == [0.001] * 3 + [0.002] * 3   # the premise: the resumed steps differ from the orphaned one
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")):
        assert after_resume[tag] == [(s, _f32(v)) for s, v in zip(rec["step"], rec[key])], tag
    assert _records(run)["lr"] == [0.001] * 3 + [0.003] * 3
    tb = _series_equal_records(run)   # after the rewind: the third launch's steps 4-6
    assert tb == after_rewind and [s for s, _ in tb["train/loss"]] == [1, 2, 3, 4, 5, 6]
    for tag, series in tb.items():   # every series, not only the loss: one value per step
        assert len({s for s, _ in series}) == len(series), tag
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 3   # one file per launch


def _metric(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_holds_params_metrics_tags_and_the_report_and_a_resume_continues_its_run(resumed):
    from mlflow.tracking import MlflowClient

    run, seen = resumed["run"], resumed["seen"]
    client = MlflowClient(resumed["uri"])
    first, second, third = (kept for _, kept, _ in seen)
    assert first["logged_through"] == 3   # the failed launch sent its committed steps only
    assert second["run_id"] == first["run_id"] and second["logged_through"] == 6   # the resume continued its run
    assert third["run_id"] != first["run_id"]   # a rewind starts a run of its own ...
    rewound = client.get_run(third["run_id"])
    assert rewound.data.tags["solar.rewound_from"] == first["run_id"]   # ... naming the one it rewinds

    resumed_run = client.get_run(first["run_id"])
    assert client.get_experiment(resumed_run.info.experiment_id).name == "issue-53"
    assert resumed_run.info.status == "FINISHED" and rewound.info.status == "FINISHED"
    tags = resumed_run.data.tags
    assert (tags["solar.run"], tags["solar.run_uid"], tags["solar.stage"], tags["solar.attempt"]) == \
        ("tracked", "uid-53", "fm", "2")
    assert rewound.data.tags["solar.attempt"] == "3"
    params = resumed_run.data.params
    config = json.loads((run / "resolved-config.json").read_text())   # the first launch's
    assert params["train.max_steps"] == "6" and params["name"] == config["name"]
    assert params["data.root"] == config["data"]["root"] and params["train.optimizer.lr"] == "0.001"
    assert len(params) > 50

    rec = resumed["after_resume"]
    for key, field in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")):
        assert _metric(client, first["run_id"], key) == list(zip(rec["step"], rec[field])), key
    now = _records(run)   # the rewound run holds the steps trained again, from its start step
    assert rewound.data.tags["solar.launch_start_step"] == "3"
    assert _metric(client, third["run_id"], "train/loss") == list(zip(now["step"], now["loss"]))[3:]
    assert _metric(client, third["run_id"], "train/lr") == [(4, 0.003), (5, 0.003), (6, 0.003)]
    assert [s for s, _ in _metric(client, third["run_id"], "usage/gpu_hours")] == [4, 5, 6]

    local = client.download_artifacts(third["run_id"], "run-result.json", str(run.parent / "downloaded"))
    assert json.loads(Path(local).read_text()) == result(run)
    assert [a.path for a in client.list_artifacts(first["run_id"])] == ["run-result.json"]
