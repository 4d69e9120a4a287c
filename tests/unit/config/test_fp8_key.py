"""``model.fp8_linear``: off by default and shown by ``solar config resolve``; refused (one line, exit 2,
nothing written) where it cannot apply — float32 compute, LoRA routes, inference configs — and at
launch without torchao or without a CUDA device of compute capability >= 8.9. None of this needs
torchao installed."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import CONFIGS
from tests.unit.config.refusal import refused_line, resolve

TINY = CONFIGS / "tiny"
WAN_FM = TINY / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
BASE = ["data.root=/data", "runtime.output_dir=/out"]


def _resolve(cli, path, sets, tmp_path) -> dict:
    result, out = resolve(cli, path, sets, tmp_path)
    assert result.code == 0, result.err
    return json.loads(out.read_text())


def _model_block(document: dict) -> dict:
    return document.get("config", document)["model"]


def test_off_by_default_and_resolve_shows_the_recipe(cli, tmp_path):
    assert _model_block(_resolve(cli, WAN_FM, BASE, tmp_path))["fp8_linear"] == "off"
    (tmp_path / "resolved.json").unlink()
    chosen = _resolve(cli, WAN_FM, [*BASE, "model.fp8_linear=rowwise"], tmp_path)
    assert _model_block(chosen)["fp8_linear"] == "rowwise"


def test_a_bare_yaml_off_means_off(cli, tmp_path):
    # YAML 1.1 reads off as false, in a file and in --set alike
    assert _model_block(_resolve(cli, WAN_FM, [*BASE, "model.fp8_linear=off"], tmp_path))["fp8_linear"] == "off"
    (tmp_path / "resolved.json").unlink()
    config = tmp_path / "fp8-off.yaml"
    config.write_text(WAN_FM.read_text().replace("model:\n", "model:\n  fp8_linear: off\n", 1))
    assert "fp8_linear: off" in config.read_text()
    assert _model_block(_resolve(cli, config, BASE, tmp_path))["fp8_linear"] == "off"


def test_shipped_configs_keep_it_off():
    texts = [path.read_text() for path in CONFIGS.rglob("*.yaml")]
    assert texts and not any("fp8_linear" in text for text in texts)


@pytest.mark.parametrize("path, sets, line", [
    (WAN_FM, ["model.fp8_linear=tensorwise", "model.dtype=float32"],
     "model.fp8_linear=tensorwise needs bf16 compute; set model.dtype=auto or bfloat16, or model.fp8_linear=off"),
    (TINY / "ltx25" / "train_stage0p5_fm_153f.yaml", ["model.fp8_linear=rowwise"],
     "model.fp8_linear=rowwise does not apply to LoRA routes (torchao's float8 swaps plain nn.Linear layers; a "
     "LoRA layer computes its frozen base product itself); set model.fp8_linear=off or model.training_mode=full"),
    (WAN_FM, ["model.fp8_linear=rowwise", "model.training_mode=lora", "model.lora.rank=4", "model.lora.alpha=4"],
     "model.fp8_linear=rowwise does not apply to LoRA routes"),
    (TINY / "wan22_ti2v_5b" / "infer_stage0p5_fm_81f.yaml", ["model.fp8_linear=tensorwise", "checkpoint.path=/c"],
     "model.fp8_linear=tensorwise: solar infer computes in bf16 (FP8 is a training recipe); set "
     "model.fp8_linear=off"),
    (WAN_FM, ["model.fp8_linear=fp4"], "model.fp8_linear: must be one of 'off', 'tensorwise' or 'rowwise'; got 'fp4'"),
])
def test_refused_where_it_cannot_apply(path, sets, line, cli, tmp_path):
    assert line in refused_line(cli, path, [*BASE, *sets], tmp_path)


def test_training_on_the_cpu_is_refused_at_launch_before_anything_is_written(cli, tmp_path):
    out = tmp_path / "run"
    result = cli("train", "--config", str(WAN_FM), "--set", f"data.root={tmp_path / 'data'}",
                 "--set", f"runtime.output_dir={out}", "--set", "model.fp8_linear=tensorwise")
    assert result.code == 2 and result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    assert lines[0].startswith("solar: error: model.fp8_linear=tensorwise needs ")  # torchao, or a CUDA device
    assert lines[0].endswith("or set model.fp8_linear=off")
    assert not out.exists()


def test_launch_problems(monkeypatch):
    import importlib.util

    from solar.train import fp8

    assert fp8.launch_problem("off", torch.device("cpu")) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    assert fp8.launch_problem("rowwise", torch.device("cuda", 0)) == (
        "model.fp8_linear=rowwise needs torchao (pip install 'solar[fp8]', torchao>=0.18); install it or set "
        "model.fp8_linear=off")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torchao" else real(name, *a))
    assert "needs a CUDA device (this run is on cpu)" in fp8.launch_problem("rowwise", torch.device("cpu"))
    # The capability check reads the device's compute capability: an A100 (8.0) is refused, an H100/H200 (9.0) and
    # an L40S (8.9) are not.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    for capability, refused in (((8, 0), True), ((8, 9), False), ((9, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        problem = fp8.launch_problem("tensorwise", torch.device("cuda", 0))
        assert (problem is not None) == refused, capability
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert fp8.launch_problem("tensorwise", torch.device("cuda", 0)) == (
        "model.fp8_linear=tensorwise needs compute capability >= 8.9 for FP8 matmuls, NVIDIA A100-SXM4-80GB has 8.0; "
        "use an Ada/Hopper or newer GPU or set model.fp8_linear=off")
