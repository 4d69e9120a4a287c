"""Every path that runs the model under training or generation enters the one precision policy
(``solar.launch.precision.autocast``): the Stage0.5/1 step, both Stage2 updates, validation and
``solar infer`` — through the real entry points, in-process, on the CPU (where the policy is fp32;
tests/gpu checks that the same calls compute in bf16 on a GPU)."""

from __future__ import annotations

import inspect

import pytest

from solar.launch import precision
from tests.conftest import CONFIGS

WAN = CONFIGS / "tiny" / "wan22_ti2v_5b"


@pytest.fixture
def entered(monkeypatch):
    calls: list[tuple[str, bool]] = []
    real = precision.autocast

    def recording(cfg, device, *, sharded):
        calls.append((inspect.stack()[1].function, sharded))
        return real(cfg, device, sharded=sharded)

    monkeypatch.setattr(precision, "autocast", recording)
    return calls


def test_training_steps_validation_and_infer_enter_the_policy(entered, wan_data_small, tmp_path):
    from solar.infer.launch import infer
    from solar.train.launch import train

    out = tmp_path / "fm"
    train(str(WAN / "train_stage0p5_fm_81f.yaml"),
          [f"data.root={wan_data_small}", f"runtime.output_dir={out}", "train.max_steps=2", "runtime.save_every=2",
           "runtime.validate_every=2", "validation.decode_latents=1"])
    assert ("compute_dtype", False) in entered and ("_sample", False) in entered  # the step; validation
    entered.clear()
    infer(str(WAN / "infer_stage0p5_fm_81f.yaml"),
          [f"data.root={wan_data_small}", f"runtime.output_dir={tmp_path / 'infer'}",
           f"checkpoint.path={out}/checkpoints/step_00000002", "validation.decode_latents=1"])
    assert {c[0] for c in entered} == {"_sample"}
    entered.clear()
    train(str(WAN / "train_stage2_sgf_81f.yaml"),
          [f"data.root={wan_data_small}", f"runtime.output_dir={tmp_path / 'dmd'}", "train.max_steps=6",
           "runtime.save_every=0", "runtime.validate_every=0", "runtime.validation_steps=[]"])
    assert [c[0] for c in entered].count("_update") == 7  # six critic updates and one student update


@pytest.fixture
def wan_data_small(tmp_path):
    from solar.data.synth import synthesize

    synthesize("wan22_ti2v_5b", tmp_path / "data", samples=4, seed=1)
    return tmp_path / "data"
