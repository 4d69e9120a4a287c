"""``runtime.save_every_seconds`` (issue 52 item 4): off (0) by default and shown by ``solar config
resolve``; a non-negative number of seconds; refused (one line, exit 2, nothing written) when negative,
not a number, or in an inference config; a resume changes it freely (an execution key). The released
training configs save at least every 10 minutes of training (docs/resume.md has the arithmetic)."""

from __future__ import annotations

import json

import pytest

from solar.config import changes
from solar.config.resolve import resolve_file
from tests.conftest import CONFIGS
from tests.unit.config.refusal import refused_line, resolve

TINY = CONFIGS / "tiny" / "wan22_ti2v_5b"
WAN_FM = TINY / "train_stage0p5_fm_81f.yaml"
BASE = ["data.root=/data", "runtime.output_dir=/out"]
RELEASED_TRAINING = sorted(p for p in CONFIGS.rglob("train_*.yaml") if "tiny" not in p.parts)


def _runtime(cli, sets, tmp_path) -> dict:
    result, out = resolve(cli, WAN_FM, [*BASE, *sets], tmp_path)
    assert result.code == 0, result.err
    document = json.loads(out.read_text())
    out.unlink()
    return document.get("config", document)["runtime"]


def test_off_by_default_and_seconds_as_int_or_float(cli, tmp_path):
    assert _runtime(cli, [], tmp_path)["save_every_seconds"] == 0.0
    assert _runtime(cli, ["runtime.save_every_seconds=600"], tmp_path)["save_every_seconds"] == 600.0
    both = _runtime(cli, ["runtime.save_every_seconds=2.5", "runtime.save_every=100"], tmp_path)
    assert (both["save_every_seconds"], both["save_every"]) == (2.5, 100)   # combinable


@pytest.mark.parametrize("value, line", [
    ("-1", "runtime.save_every_seconds: input should be greater than or equal to 0; got -1"),
    ("true", "runtime.save_every_seconds: input should be a valid number; got True"),
    ('"600"', "runtime.save_every_seconds: input should be a valid number; got the string '600' (it was quoted)"),
    (".inf", "non-finite number '.inf' is not allowed"),
    ("[600]", "runtime.save_every_seconds: input should be a valid number"),
])
def test_refused_unless_a_non_negative_number(value, line, cli, tmp_path):
    assert line in refused_line(cli, WAN_FM, [*BASE, f"runtime.save_every_seconds={value}"], tmp_path)


def test_inference_saves_nothing(cli, tmp_path):
    sets = [*BASE, "checkpoint.path=/c", "runtime.save_every_seconds=60"]
    assert refused_line(cli, TINY / "infer_stage0p5_fm_81f.yaml", sets, tmp_path) == (
        "solar: error: runtime.save_every_seconds: inference runs save no checkpoints; remove it")


def test_a_resume_changes_it_freely():
    assert changes.kind_of("runtime.save_every_seconds") == changes.EXECUTION
    old = resolve_file(WAN_FM, BASE).config_dict
    new = resolve_file(WAN_FM, [*BASE, "runtime.save_every_seconds=600"]).config_dict
    review = changes.review(old, new, completed_step=2, where="/out")
    assert [c.key for c in review.execution] == ["runtime.save_every_seconds"] and not review.recorded
    # a run whose latest launch predates the key (its resolved config lacks it) resumes freely too
    del old["runtime"]["save_every_seconds"]
    assert [c.key for c in changes.review(old, new, completed_step=2, where="/out").execution] == \
        ["runtime.save_every_seconds"]


@pytest.mark.parametrize("path", RELEASED_TRAINING, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_released_training_configs_save_every_ten_minutes_of_training(path):
    text = path.read_text()
    assert "  save_every_seconds: 600\n" in text and "  save_every: " in text   # both cadences
