"""The recipe end to end on CPU: Stage0.5 -> Stage1 TF-AnyFlow -> Stage2 DMD via SGF -> inference,
each stage loading the previous stage's real checkpoint through its real load path."""

from __future__ import annotations

import json
import shutil

import pytest

from solar.data.synth import synthesize
from tests.conftest import CONFIGS
from tests.e2e.helpers import infer, result, steps, train

pytestmark = pytest.mark.slow

WAN = CONFIGS / "tiny" / "wan22_ti2v_5b"
H3 = CONFIGS / "tiny" / "minimax_h3"


def _sets(data, out, *extra):
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=100", *extra]


def _roles(student, teacher, weights=("ema", "ema")):
    return (f"checkpoint.roles={{student: {{path: {student}, weights: {weights[0]}}}, "
            f"teacher: {{path: {teacher}, weights: {weights[1]}}}, critic: {{path: {teacher}, weights: {weights[1]}}}}}")


def _complete(root):
    doc = json.loads((root / "COMPLETE.json").read_text())
    assert doc["status"] == "complete" and doc["error_slots"] == 0, doc
    return doc


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def wan(wan_data, wan_stage0p5, tmp_path_factory):
    """The whole Wan TI2V-5B pipeline, once for the module's tests; Stage0.5 is the session's shared
    4-step run (its step-4 checkpoint and validation), read-only."""
    base = tmp_path_factory.mktemp("wan")
    data = wan_data
    s05, s1, s2 = wan_stage0p5, base / "stage1", base / "stage2"
    _ok(train(WAN / "train_stage1_tf_anyflow_81f.yaml", _sets(
        data, s1, "checkpoint.mode=weights_only", f"checkpoint.path={s05}/checkpoints/step_00000004",
        "checkpoint.weights=ema")))
    _ok(train(WAN / "train_stage2_sgf_81f.yaml", _sets(
        data, s2, "checkpoint.mode=roles", _roles(f"{s1}/checkpoints/step_00000004", f"{s05}/checkpoints/step_00000004"),
        "train.max_steps=12", "runtime.save_every=6", "runtime.validate_every=6", "train.ema.start_step=2",
        "runtime.exit_after_step=7")))
    _ok(train(WAN / "train_stage2_sgf_81f.yaml", _sets(
        data, s2, "checkpoint.mode=full_resume", f"checkpoint.path={s2}/checkpoints/step_00000007",
        "train.max_steps=12", "runtime.save_every=6", "runtime.validate_every=6", "train.ema.start_step=2")))
    return {"data": data, "stage0p5": s05, "stage1": s1, "stage2": s2, "base": base}


def test_wan_stages_load_each_other_and_validate(wan):
    _complete(wan["stage0p5"] / "validation" / "step_00000004")
    _complete(wan["stage1"] / "validation" / "step_00000004")
    init = json.loads((wan["stage1"] / "launch-manifest.json").read_text())["init"]
    assert init["mode"] == "weights_only" and init["sources"][0]["path"].endswith("stage0p5/checkpoints/step_00000004")
    s2 = wan["stage2"]
    # LIVE only until the student EMA exists (student update 2 = outer step 11), then LIVE + EMA
    assert _complete(s2 / "validation" / "step_00000006")["passes"] == ["live-self-forcing4"]
    assert _complete(s2 / "validation" / "step_00000012")["passes"] == ["live-self-forcing4", "ema-self-forcing4"]
    manifest = json.loads((s2 / "checkpoints" / "step_00000012" / "manifest.json").read_text())
    assert set(manifest["roles"]) == {"student", "critic"}
    assert manifest["roles"]["student"]["weights"] == ["live", "ema"]
    assert manifest["contract"]["stage"] == "stage2"
    trainer = json.loads((s2 / "checkpoints" / "step_00000012" / "trainer.json").read_text())
    assert trainer["student_step"] == 2 and trainer["teacher"]["path"].endswith("stage0p5/checkpoints/step_00000004")


@pytest.mark.parametrize("stage, config, validated_pass", [
    ("stage0p5", "infer_stage0p5_fm_81f.yaml", "ema-unipc"),
    ("stage1", "infer_stage1_tf_anyflow_81f.yaml", "ema-flowmap4"),
])
def test_stage0p5_and_stage1_inference_reproduce_validation(stage, config, validated_pass, wan, tmp_path):
    """The example infer configs of the earlier stages on their checkpoints: the same frames as the
    training run's validation of the same weights (UniPC; Stage1's 4-step flow map with the KV cache)."""
    from solar.generation.video import read_frames

    out = tmp_path / "infer"
    _ok(infer(WAN / config, [f"data.root={wan['data']}", f"runtime.output_dir={out}",
                              f"checkpoint.path={wan[stage]}/checkpoints/step_00000004"]))
    _complete(out / "generation")
    made_pass = "model-" + validated_pass.split("-", 1)[1]
    for slot in (0, 1):
        made = read_frames(out / "generation" / made_pass / f"slot_{slot:06d}" / "generated.mp4")
        seen = read_frames(wan[stage] / "validation" / "step_00000004" / validated_pass / f"slot_{slot:06d}" /
                           "generated.mp4")
        assert (made == seen).all()


def test_stage2_cadence_and_ema_counting(wan):
    events = steps(wan["stage2"])  # both launches append to the same event log
    by_step = {e["step"]: e for e in events}
    assert sorted(by_step) == list(range(1, 13))
    assert [s for s, e in sorted(by_step.items()) if e["student_updated"]] == [6, 11]
    assert [by_step[s]["student_step"] for s in (5, 6, 10, 11, 12)] == [0, 1, 1, 2, 2]
    assert [s for s, e in sorted(by_step.items()) if e["ema"]][0] == 11  # created at student update 2
    assert set(by_step[6]["losses"]) == {"critic", "student"} and set(by_step[7]["losses"]) == {"critic"}


def test_stage2_resume_is_exact(wan, tmp_path):
    straight = tmp_path / "straight"
    s05, s1 = wan["stage0p5"], wan["stage1"]
    _ok(train(WAN / "train_stage2_sgf_81f.yaml", _sets(
        wan["data"], straight, "checkpoint.mode=roles",
        _roles(f"{s1}/checkpoints/step_00000004", f"{s05}/checkpoints/step_00000004"),
        "train.max_steps=12", "runtime.save_every=6", "runtime.validate_every=6", "train.ema.start_step=2")))
    a, b = straight / "checkpoints" / "step_00000012", wan["stage2"] / "checkpoints" / "step_00000012"
    for member in ("student/live.safetensors", "student/ema.safetensors", "student/optimizer.safetensors",
                   "student/optimizer.json", "critic/live.safetensors", "critic/optimizer.safetensors",
                   "critic/optimizer.json", "trainer.json", "rng/rank-00000.json", "data/rank-00000.json"):
        assert (a / member).read_bytes() == (b / member).read_bytes(), member
    assert [e["loss"] for e in steps(straight)] == [e["loss"] for e in steps(wan["stage2"])]


def test_stage2_inference_fixed_and_camera_length(wan, tmp_path):
    ckpt = wan["stage2"] / "checkpoints" / "step_00000012"
    out = tmp_path / "fixed"
    _ok(infer(WAN / "infer_stage2_sgf_81f.yaml", [f"data.root={wan['data']}", f"runtime.output_dir={out}",
                                                   f"checkpoint.path={ckpt}"]))
    _complete(out / "generation")
    from solar.generation.video import read_frames

    made = read_frames(out / "generation" / "model-self-forcing4" / "slot_000000" / "generated.mp4")
    seen = read_frames(wan["stage2"] / "validation" / "step_00000012" / "ema-self-forcing4" / "slot_000000" /
                       "generated.mp4")
    assert (made == seen).all()  # the infer config's weights: ema
    package = tmp_path / "package"
    shutil.copytree(ckpt, package)
    (package / "release-manifest.json").write_text(json.dumps(
        {"schema": "solar.release.v1", "load": {"default_weights": "ema"}, "identity": {"name": "tiny"}}))
    out = tmp_path / "camera"
    _ok(infer(WAN / "infer_stage2_sgf_camera_length.yaml", [f"data.root={wan['data']}", f"runtime.output_dir={out}",
                                                             f"checkpoint.path={package}"]))
    _complete(out / "generation")
    for slot in (0, 1):
        m = json.loads((out / "generation" / "model-self-forcing4" / f"slot_{slot:06d}" / "manifest.json").read_text())
        # 153 synthetic frames: the longest whole 3-latent rollout from the slot's start
        latents = 1 + (153 - m["start_frame"] - 1) // 4
        assert m["rollout_latents"] == latents // 3 * 3 and m["frames"] == 1 + 4 * (m["rollout_latents"] - 1)
        assert m["weights"] == "ema"


@pytest.mark.parametrize("case, fragment", [
    ("student_from_stage0p5", "cannot initialise the student: the student starts from Stage1 AnyFlow"),
    ("student_from_tf_fm", "the checkpoint is stage1 flow_matching"),
    ("teacher_from_stage1", "cannot initialise the teacher: the teacher starts from Stage0.5 flow matching"),
    ("missing_ema", "it has no ema weights"),
    ("incomplete", "is not usable: no COMPLETE.json"),
])
def test_mismatched_sources_are_refused_before_anything_is_written(case, fragment, wan, tmp_path):
    s05, s1 = wan["stage0p5"] / "checkpoints" / "step_00000004", wan["stage1"] / "checkpoints" / "step_00000004"
    student, teacher, weights = s1, s05, ("ema", "ema")
    if case == "student_from_stage0p5":
        student = s05
    elif case == "student_from_tf_fm":
        tf_fm = tmp_path / "tf_fm"
        _ok(train(WAN / "train_stage1_tf_fm_81f.yaml", _sets(
            wan["data"], tf_fm, "checkpoint.mode=weights_only", f"checkpoint.path={s05}", "checkpoint.weights=ema",
            "train.max_steps=1", "runtime.validate_every=0")))
        student = tf_fm / "checkpoints" / "step_00000001"
    elif case == "teacher_from_stage1":
        teacher = s1
    elif case == "missing_ema":
        tf_fm = tmp_path / "early"  # a Stage0.5 checkpoint saved before its EMA exists
        _ok(train(WAN / "train_stage0p5_fm_81f.yaml", _sets(wan["data"], tf_fm, "train.max_steps=1",
                                                              "train.ema.start_step=5", "runtime.validate_every=0")))
        teacher = tf_fm / "checkpoints" / "step_00000001"
    elif case == "incomplete":
        broken = tmp_path / "broken"
        shutil.copytree(s05, broken)
        (broken / "COMPLETE.json").unlink()
        teacher = broken
    out = tmp_path / "run"
    proc = train(WAN / "train_stage2_sgf_81f.yaml", _sets(wan["data"], out, "checkpoint.mode=roles",
                                                          _roles(student, teacher, weights)))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert fragment in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists()


def test_stage1_refuses_a_stage1_source(wan, tmp_path):
    out = tmp_path / "run"
    proc = train(WAN / "train_stage1_tf_anyflow_81f.yaml", _sets(
        wan["data"], out, "checkpoint.mode=weights_only", f"checkpoint.path={wan['stage1']}/checkpoints/step_00000004",
        "checkpoint.weights=ema"))
    assert proc.returncode == 2 and "initialises from stage0p5 weights, the checkpoint is stage1" in proc.stderr
    assert not out.exists()


def test_h3_pipeline_under_torchrun(tmp_path):
    data = tmp_path / "data"
    synthesize("minimax_h3", data, samples=4, seed=5)
    s05, s1, s2 = tmp_path / "stage0p5", tmp_path / "stage1", tmp_path / "stage2"
    _ok(train(H3 / "train_stage0p5_fm_158f.yaml", _sets(data, s05, "train.max_steps=2", "train.global_batch_size=1",
                                                         "runtime.validate_every=2", "train.ema.start_step=1"), nproc=2))
    _complete(s05 / "validation" / "step_00000002")
    _ok(train(H3 / "train_stage1_tf_anyflow_158f.yaml", _sets(
        data, s1, "checkpoint.mode=weights_only", f"checkpoint.path={s05}/checkpoints/step_00000002",
        "checkpoint.weights=ema", "train.max_steps=2", "runtime.save_every=2", "runtime.validate_every=2"), nproc=2))
    _complete(s1 / "validation" / "step_00000002")
    _ok(infer(H3 / "infer_stage1_tf_anyflow_158f.yaml", [f"data.root={data}", f"runtime.output_dir={tmp_path}/infer1",
                                                          f"checkpoint.path={s1}/checkpoints/step_00000002"]))
    _complete(tmp_path / "infer1" / "generation")
    _ok(train(H3 / "train_stage2_sgf_158f.yaml", _sets(
        data, s2, "checkpoint.mode=roles", _roles(f"{s1}/checkpoints/step_00000002", f"{s05}/checkpoints/step_00000002"),
        "train.max_steps=6", "runtime.save_every=6", "runtime.validate_every=6", "runtime.validation_steps=[]"), nproc=4))
    doc = _complete(s2 / "validation" / "step_00000006")
    assert doc["passes"] == ["live-self-forcing4", "ema-self-forcing4"]  # EMA from student update 1 (tiny)
    # the roles' frozen bases come from two checkpoints (whole weights, no released base), equal by digest
    models = [e["models"] for e in map(json.loads, (s2 / "events" / "rank-00000.jsonl").read_text().splitlines())
              if e["event"] == "models"]
    assert [[m["roles"] for m in group] for group in models] == [[["student", "teacher", "critic"]]]
    assert result(s2)["status"] == "complete"
    m = json.loads((s2 / "validation" / "step_00000006" / "live-self-forcing4" / "slot_000000" / "manifest.json")
                   .read_text())
    assert m["rollout_latents"] == 50 and m["frames"] == 158  # 50 latents rolled out, 47 decoded
    out = tmp_path / "infer"
    _ok(infer(H3 / "infer_stage2_sgf_158f.yaml", [f"data.root={data}", f"runtime.output_dir={out}",
                                                   f"checkpoint.path={s2}/checkpoints/step_00000006"]))
    _complete(out / "generation")
