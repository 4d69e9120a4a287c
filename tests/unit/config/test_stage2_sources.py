"""Stage2's three role sources (semantics.md §1, §5): refused in the config when a role is missing or
teacher and critic differ, and refused before any model is allocated when a source checkpoint's
contract does not fit its role (family, camera transform, stage/objective, role ``model``, weights).
Source checkpoints are small hand-made directories committed through the real transaction."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from solar.config.resolve import resolve_file
from solar.storage import checkpoints as ckpt
from solar.storage.checkpoints import CheckpointError
from solar.train.setup import contract_of
from solar.train.sources import check_roles, preflight_sources
from solar.train.stage2 import build_stage2
from tests.conftest import CONFIGS
from tests.unit.config.refusal import refused_line

TINY = CONFIGS / "tiny"
WAN_S2 = TINY / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml"
H3_S2 = TINY / "minimax_h3" / "train_stage2_sgf_158f.yaml"
WAN_FM = TINY / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
WAN_ANYFLOW = TINY / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
H3_FM = TINY / "minimax_h3" / "train_stage0p5_fm_158f.yaml"
BASE = ["data.root=/data", "runtime.output_dir=/out"]


def _roles(student="/ck/s1", teacher="/ck/fm", critic="/ck/fm", weights=("ema", "ema", "ema"), skip=()) -> list[str]:
    sets = ["checkpoint.mode=roles"]
    for role, path, w in zip(("student", "teacher", "critic"), (student, teacher, critic), weights):
        if role not in skip:
            sets += [f"checkpoint.roles.{role}.path={path}", f"checkpoint.roles.{role}.weights={w}"]
    return sets


# --- config-level refusals (contracts.py) ----------------------------------------------------------

CASES = {
    "critic-differs-from-teacher": (WAN_S2, _roles(critic="/ck/other"),
                                    "checkpoint.roles.critic.path must equal checkpoint.roles.teacher.path: "
                                    "teacher and critic start from the same Stage0.5 source"),
    "h3-critic-differs-from-teacher": (H3_S2, _roles(teacher="/ck/a", critic="/ck/b"),
                                       "checkpoint.roles.critic.path must equal checkpoint.roles.teacher.path"),
    "student-missing": (WAN_S2, _roles(skip=("student",)),
                        "checkpoint.roles.student: required for checkpoint.mode=roles (student, teacher and critic)"),
    "teacher-missing": (WAN_S2, _roles(skip=("teacher",)),
                        "checkpoint.roles.teacher: required for checkpoint.mode=roles (student, teacher and critic)"),
    "critic-missing": (H3_S2, _roles(skip=("critic",)),
                       "checkpoint.roles.critic: required for checkpoint.mode=roles (student, teacher and critic)"),
    "roles-block-absent": (WAN_S2, ["checkpoint.mode=roles"],
                           "checkpoint.roles.student: required for checkpoint.mode=roles"),
    "role-without-weights": (WAN_S2, [*_roles(skip=("student",)), "checkpoint.roles.student.path=/ck/s1"],
                             "checkpoint.roles.student.weights: required key is missing"),
    "single-path-with-roles": (WAN_S2, [*_roles(), "checkpoint.path=/ck/s1"],
                               "checkpoint.path: checkpoint.mode=roles reads checkpoint.roles.<role>; remove it"),
    "weights-only-on-stage2": (WAN_S2, ["checkpoint.mode=weights_only", "checkpoint.path=/ck/s1",
                                        "checkpoint.weights=ema"],
                               "checkpoint.mode=weights_only: Stage2 initialises three roles; use "
                               "checkpoint.mode=roles with checkpoint.roles.{student,teacher,critic}"),
    "roles-without-mode": (WAN_S2, _roles()[1:],
                           "checkpoint.roles: checkpoint.mode is none (fresh start); set checkpoint.mode to use "
                           "a source; remove it"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_refusal(case, cli, tmp_path):
    path, sets, fragment = CASES[case]
    assert fragment in refused_line(cli, path, [*BASE, *sets], tmp_path)


def test_same_teacher_and_critic_resolve(cli, tmp_path):
    argv = ["config", "resolve", "--config", str(WAN_S2), "--output", str(tmp_path / "r.json")]
    for item in [*BASE, *_roles(weights=("ema", "live", "ema"))]:
        argv += ["--set", item]
    assert cli(*argv).code == 0


# --- checkpoint contracts, checked before allocation (stage2.check_roles) ---------------------------

def _contract(config, **over) -> dict:
    return {**contract_of(resolve_file(config, BASE)), **over}


def _checkpoint(run, contract: dict, *, roles=("model",), weights=("live", "ema"), trainer=None, complete=True):
    """A committed checkpoint directory with tiny safetensors members for each role."""
    partial = ckpt.begin(run, 1)
    entries = {}
    for role in roles:
        (partial / role).mkdir()
        for w in weights:
            save_file({"w": torch.zeros(2)}, str(partial / role / f"{w}.safetensors"))
        entries[role] = {"weights": list(weights), "members": [f"{role}/{w}.safetensors" for w in weights]}
    if trainer is not None:
        (partial / "trainer.json").write_text(json.dumps(trainer))
    if not complete:
        return partial
    return ckpt.commit(partial, step=1, contract=contract, roles=entries, trainer_state={"step": 1})


@pytest.fixture
def sources(tmp_path):
    """Valid Wan sources: Stage1 AnyFlow (student) and Stage0.5 FM (teacher and critic)."""
    return {"student": _checkpoint(tmp_path / "s1", _contract(WAN_ANYFLOW)),
            "fm": _checkpoint(tmp_path / "s05", _contract(WAN_FM))}


def _stage2(student, fm, *extra, config=WAN_S2, student_weights="ema", fm_weights="ema"):
    return resolve_file(config, [*BASE, *_roles(str(student), str(fm), str(fm),
                                               (student_weights, fm_weights, fm_weights)), *extra])


def test_valid_sources_pass(sources):
    resolved = _stage2(sources["student"], sources["fm"])
    manifests = check_roles(resolved.config, resolved.route)
    assert set(manifests) == {"student", "teacher", "critic"}
    assert manifests["student"]["contract"]["objective"] == "anyflow_forward_map"
    preflight_sources(resolved)  # the launch's check, before anything is written


def _refused(resolved, fragment: str) -> str:
    with pytest.raises(CheckpointError) as info:
        check_roles(resolved.config, resolved.route)
    message = str(info.value)
    assert "\n" not in message and fragment in message, message
    with pytest.raises(CheckpointError):  # the launch's preflight refuses the same way
        preflight_sources(resolved)
    return message


def test_teacher_with_another_camera_transform(sources, tmp_path):
    fm = _checkpoint(tmp_path / "logd4", _contract(WAN_FM, camera_translation_transform="logd4"))
    _refused(_stage2(sources["student"], fm),
             f"checkpoint.roles.teacher.path {fm} cannot initialise the teacher: its camera translation "
             "transform is logd4, this run uses linear")


def test_student_with_another_camera_transform(sources, tmp_path):
    student = _checkpoint(tmp_path / "logd4", _contract(WAN_ANYFLOW, camera_translation_transform="logd4"))
    _refused(_stage2(student, sources["fm"]),
             f"checkpoint.roles.student.path {student} cannot initialise the student: its camera translation "
             "transform is logd4, this run uses linear")


def test_h3_source_with_linear_transform(tmp_path):
    student = _checkpoint(tmp_path / "s1", _contract(TINY / "minimax_h3" / "train_stage1_tf_anyflow_158f.yaml"))
    fm = _checkpoint(tmp_path / "s05", _contract(H3_FM, camera_translation_transform="linear"))
    resolved = _stage2(student, fm, config=H3_S2)
    _refused(resolved, "cannot initialise the teacher: its camera translation transform is linear, this run uses "
                       "logd4")


def test_source_without_the_model_role(sources, tmp_path):
    # a Stage0.5 contract whose checkpoint holds only Stage2's roles
    fm = _checkpoint(tmp_path / "roles", _contract(WAN_FM), roles=("student", "critic"))
    _refused(_stage2(sources["student"], fm),
             f"checkpoint.roles.teacher.path {fm} cannot initialise the teacher: it has no single-model weights "
             "(role model)")


def test_stage2_checkpoint_as_teacher(sources, tmp_path):
    s2 = _checkpoint(tmp_path / "s2", _contract(WAN_S2), roles=("student", "critic"))
    _refused(_stage2(sources["student"], s2),
             "cannot initialise the teacher: the teacher starts from Stage0.5 flow matching weights; the checkpoint "
             "is stage2 flow_matching")


def test_fm_checkpoint_as_student(sources):
    _refused(_stage2(sources["fm"], sources["fm"]),
             "cannot initialise the student: the student starts from Stage1 AnyFlow (anyflow_forward_map) weights; "
             "the checkpoint is stage0p5 flow_matching")


def test_source_of_another_family(sources, tmp_path):
    fm = _checkpoint(tmp_path / "h3", _contract(H3_FM, camera_translation_transform="linear"))
    _refused(_stage2(sources["student"], fm),
             "cannot initialise the teacher: it is a minimax_h3 checkpoint, this run is wan22_ti2v_5b")


def test_source_without_the_requested_weights(sources, tmp_path):
    student = _checkpoint(tmp_path / "live", _contract(WAN_ANYFLOW), weights=("live",))
    _refused(_stage2(student, sources["fm"]), "cannot initialise the student: it has no ema weights (it holds live)")


def test_unfinished_source(sources, tmp_path):
    partial = _checkpoint(tmp_path / "partial", _contract(WAN_FM), complete=False)
    _refused(_stage2(sources["student"], partial),
             f"checkpoint.roles.teacher.path {partial} is not usable: a partial (unfinished) checkpoint")


def test_solar_train_refuses_before_writing(sources, tmp_path, cli):
    fm = _checkpoint(tmp_path / "logd4", _contract(WAN_FM, camera_translation_transform="logd4"))
    out = tmp_path / "out"
    argv = ["train", "--config", str(WAN_S2)]
    for item in [f"data.root={tmp_path / 'data'}", f"runtime.output_dir={out}", "runtime.validate_every=0",
                 "runtime.validation_steps=[]", *_roles(str(sources["student"]), str(fm), str(fm))]:
        argv += ["--set", item]
    result = cli(*argv, env={"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    assert result.code == 2, result.err
    (line,) = result.err.splitlines()
    assert "cannot initialise the teacher: its camera translation transform is logd4" in line
    assert not out.exists()


# --- a Stage2 full resume re-verifies its own contract and the recorded teacher ----------------------

def _stage2_checkpoint(run, teacher: dict | None, **over):
    return _checkpoint(run, _contract(WAN_S2, **over), roles=("student", "critic"),
                       trainer={"step": 1, "student_step": 0, "ema": {}, "teacher": teacher})


def _resume(path):
    return resolve_file(WAN_S2, [*BASE, "checkpoint.mode=full_resume", f"checkpoint.path={path}"])


def test_resume_with_another_camera_transform_is_refused_before_allocation(tmp_path, monkeypatch):
    import solar.train.stage2 as stage2

    monkeypatch.setattr(stage2, "model_from_config", lambda *a, **k: pytest.fail("allocated a model"))
    path = _stage2_checkpoint(tmp_path / "run", None, camera_translation_transform="logd4")
    with pytest.raises(CheckpointError, match="a full resume needs camera_translation_transform 'linear', the "
                                              "checkpoint has 'logd4'"):
        build_stage2(_resume(path), 0, torch.device("cpu"))


def test_resume_whose_recorded_teacher_no_longer_fits_is_refused(tmp_path, monkeypatch):
    import solar.train.stage2 as stage2

    monkeypatch.setattr(stage2, "model_from_config", lambda *a, **k: pytest.fail("allocated a model"))
    fm = _checkpoint(tmp_path / "s05", _contract(WAN_FM, camera_translation_transform="logd4"))
    path = _stage2_checkpoint(tmp_path / "run", {"path": str(fm), "weights": "ema"})
    with pytest.raises(CheckpointError, match=f"teacher source {fm}: its camera translation transform is logd4"):
        build_stage2(_resume(path), 0, torch.device("cpu"))
