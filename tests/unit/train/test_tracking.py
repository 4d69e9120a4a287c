"""The trackers (solar.train.tracking) on their own: the scalars a step event gives each role, TensorBoard
event files read back with TensorBoard's own reader across launches that begin before the steps an
earlier one wrote, a tracker that fails dropped with one warning line, the config as MLflow params,
and an MLflow server that does not answer."""

from __future__ import annotations

import math

import pytest

from solar.train import tracking as T
from tests.e2e.conftest import free_port


def _acc(out):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / T.TENSORBOARD_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _served(out):
    """The loss as TensorBoard's Python server reads it (``--load_fast=false``: plugin_event_accumulator,
    which takes the first SessionLog.START it sees for the session's beginning)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(out / T.TENSORBOARD_DIR))
    acc.Reload()
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors("train/loss")]


def _launch(out, start: int, values: dict[int, float]) -> None:
    sink = T.TensorBoardSink(out, start)
    for step, value in values.items():
        sink.scalars(step, {"train/loss": value})
    sink.finish("complete")


def test_a_launch_that_begins_earlier_discards_what_came_after_its_start(tmp_path):
    _launch(tmp_path, 0, {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})   # steps 3 and 4 orphaned (the checkpoint was 2)
    _launch(tmp_path, 2, {3: 30.0, 4: 40.0, 5: 50.0})         # a resume from step 2
    assert _acc(tmp_path)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]
    assert _served(tmp_path) == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]
    _launch(tmp_path, 1, {2: 200.0})                          # a rewind to step 1, stopped after step 2
    assert _acc(tmp_path)["train/loss"] == [(1, 1.0), (2, 200.0)]
    assert _served(tmp_path) == [(1, 1.0), (2, 200.0)]
    names = sorted(p.name for p in (tmp_path / T.TENSORBOARD_DIR).iterdir())
    assert [n.split(".")[3] for n in names] == ["00001", "00002", "00003"]   # read in launch order


def test_single_model_and_stage2_scalars():
    memory = {"host_peak_rss_bytes": 3 * 2**30, "cuda_peak_bytes": 2**30}
    fm = {"step": 7, "loss": 9.0, "loss_mean": 0.5, "grad_norm": 0.25, "lr": 1e-3, "step_seconds": 2.0,
          "samples": [{}, {}], "memory": memory}
    got = T.step_scalars(fm, dp_world=2, world=4, tokens_per_clip=100, flops_per_clip=1e12, peak_flops=1e12)
    assert got == {"train/loss": 0.5, "train/grad_norm": 0.25, "train/lr": 1e-3, "perf/step_seconds": 2.0,
                   "perf/tokens_per_second_per_device": 100 * 4 / 4 / 2.0, "perf/mfu": 4 / 4 / 2.0,
                   "memory/host_peak_rss_gib": 3.0, "memory/cuda_peak_gib": 1.0}
    critic_only = {**fm, "student_updated": False, "grad_norm": float("nan")}
    got = T.step_scalars(critic_only)
    assert got["critic/loss"] == 0.5 and "critic/grad_norm" not in got   # a non-finite value is left out
    assert not any(k.startswith(("student/", "train/")) for k in got) and "perf/mfu" not in got
    both = {**fm, "student_updated": True, "student_loss": 0.9, "student_loss_mean": 0.7, "student_grad_norm": 3.0,
            "student_lr": 2e-4, "student_step": 2}
    got = T.step_scalars(both)
    assert (got["student/loss"], got["student/grad_norm"], got["student/lr"], got["student/update"]) == \
        (0.7, 3.0, 2e-4, 2.0)   # the mean over ranks, not rank 0's own
    assert T.validation_scalars({"step": 4, "slots": 2, "ok_slots": 1, "error_slots": 1, "seconds": 3.5,
                                 "status": "partial"}) == \
        {"validation/slots": 2.0, "validation/ok_slots": 1.0, "validation/error_slots": 1.0, "validation/seconds": 3.5}


def test_a_tracker_that_fails_is_dropped_with_one_line_and_the_others_go_on(tmp_path, capsys):
    broken = T.TensorBoardSink(tmp_path / "broken", 0)
    broken._writer.close()   # its file is gone: every write raises
    kept = T.TensorBoardSink(tmp_path / "kept", 0)
    track = T.Tracking({"TensorBoard": broken, "Other": kept}, world=2, gpu_seconds_before=7200.0)
    for step in (1, 2, 3):
        track.step({"step": step, "loss_mean": float(step), "grad_norm": 1.0, "lr": 0.1, "step_seconds": 0.1})
    track.finish("complete")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("solar: warning: TensorBoard logging stopped: ValueError"), err
    series = _acc(tmp_path / "kept")
    assert [v for _, v in series["train/loss"]] == [1.0, 2.0, 3.0]
    assert all(2.0 <= v < 2.01 for _, v in series["usage/gpu_hours"])   # 2 h before this launch, 2 ranks since


def test_the_config_flattens_to_params():
    assert T.flat_params({"a": {"b": 1, "c": {"d": "x"}, "e": [1, 2], "f": None, "g": {}}}) == \
        {"a.b": "1", "a.c.d": "x", "a.e": "[1, 2]", "a.f": "null", "a.g": "{}"}


def test_an_unreachable_mlflow_costs_one_line_and_tensorboard_still_writes(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow")
    from solar.config.resolve import resolve_file
    from tests.conftest import CONFIGS

    resolved = resolve_file(CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml",
                            [f"runtime.output_dir={tmp_path}", f"data.root={tmp_path / 'data'}"],
                            expected_action="train")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"}
    track = T.open_tracking(resolved, tmp_path, rank=0, start=0, dp_world=1, world=1, tokens_per_clip=0,
                            flops_per_clip=0.0, peak_flops=None, started=None, environ=env)
    assert list(track.sinks) == ["TensorBoard"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"solar: warning: MLflow at {env['MLFLOW_TRACKING_URI']} did not "
                                               "answer"), err
    assert not (tmp_path / T.MLFLOW_FILE).exists()
    assert T.open_tracking(resolved, tmp_path, rank=1, start=0, dp_world=1, world=1, tokens_per_clip=0,
                           flops_per_clip=0.0, peak_flops=None, started=None, environ=env) is None


def test_the_experiment_is_named_by_mlflow_then_the_solarrun_then_the_config():
    assert T.experiment_name("cfg", {}) == "cfg"
    assert T.experiment_name("cfg", {"SOLAR_RUN_NAME": "run"}) == "run"
    assert T.experiment_name("cfg", {"SOLAR_RUN_NAME": "run", "MLFLOW_EXPERIMENT_NAME": "mine"}) == "mine"
    assert math.isfinite(T.GIB)


def test_a_tensorboard_folder_the_volume_refuses_costs_one_line_not_the_launch(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    (tmp_path / T.TENSORBOARD_DIR).write_text("a file where the folder goes")
    track = T.open_tracking(None, tmp_path, rank=0, start=0, dp_world=1, world=1, tokens_per_clip=0,
                            flops_per_clip=0.0, peak_flops=None, started=None, environ={})
    assert track is not None and track.sinks == {}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("solar: warning: no TensorBoard event files: "), err
