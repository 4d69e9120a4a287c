"""A Solar run's own weights as the base model of a new run (issue 53, item 6).

The session's tiny Wan Stage0.5 run (``wan_stage0p5``) is exported with `solar checkpoint export`;
a new Stage0.5 run then starts from ``model.pretrained_path`` = the export's ``model/ema.safetensors``,
the export directory and the run's checkpoint directory: each launch trains, says in one line which
weights it took (and records them in its launch manifest), prints no foreign warning, and its model
starts with exactly those weights (the EMA, which differs from the live weights; the live file gives
the live weights). A path that is no base
model is refused before anything is written, in one line (exit 2) naming ``model.pretrained_path``,
what it found and ``checkpoint.mode``."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.e2e.helpers import TINY, result, steps, train

pytestmark = pytest.mark.slow

CONFIG = TINY["wan22_ti2v_5b"]
STEP = "step_00000004"


def _sets(data, out, base) -> list[str]:
    return [f"data.root={data}", f"runtime.output_dir={out}", f"model.pretrained_path={base}", "train.max_steps=1",
            "runtime.save_every=0", "runtime.validate_every=0", "runtime.validation_steps=[]", "runtime.log_every=1"]


def _args(sets: list[str]) -> list[str]:
    return ["train", "--config", str(CONFIG), *[a for s in sets for a in ("--set", s)]]


def _tree(root) -> dict:
    """Every path under ``root`` (directories included) with a file's bytes."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def exported(wan_stage0p5, tmp_path_factory):
    from solar.train.checkpoint_export import export

    return export(wan_stage0p5 / "checkpoints" / STEP, tmp_path_factory.mktemp("base") / "export")


def _initial(data, base, tmp_path) -> dict[str, torch.Tensor]:
    """The weights a run with ``model.pretrained_path=base`` starts from, as `solar train` builds it."""
    from solar.config.resolve import resolve_file
    from solar.train.setup import build_parts, preflight_weights

    resolved = resolve_file(str(CONFIG), _sets(data, tmp_path / "unused", base), expected_action="train")
    preflight_weights(resolved)   # the launch's check accepts what the load takes
    parts = build_parts(resolved, 0, torch.device("cpu"))
    parts.stream.close()
    return {k: v.detach().clone() for k, v in parts.model.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_export_its_weight_file_and_a_checkpoint_each_start_a_run(wan_stage0p5, exported, wan_data, tmp_path,
                                                                      capsys):
    ema = load_file(exported / "model" / "ema.safetensors")
    live = load_file(exported / "model" / "live.safetensors")
    assert not _same(ema, live)   # the test tells which weights a run took
    ckpt = wan_stage0p5 / "checkpoints" / STEP
    forms = {exported / "model" / "ema.safetensors": "the EMA weights of step 4",
             exported: "the EMA weights of step 4 (a Solar checkpoint's EMA where it has one",
             ckpt: "the EMA weights of step 4 (a Solar checkpoint's EMA where it has one"}
    for base in forms:
        assert _same(_initial(wan_data, base, tmp_path), ema), base
    assert _same(_initial(wan_data, exported / "model" / "live.safetensors", tmp_path), live)
    capsys.readouterr()
    for i, (base, says) in enumerate(forms.items()):
        out = tmp_path / f"run{i}"
        proc = train(CONFIG, _sets(wan_data, out, base))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"solar: model.pretrained_path {base}: {says}" in proc.stderr, proc.stderr
        assert "Warning" not in proc.stderr and "warn" not in proc.stderr.lower(), proc.stderr
        assert result(out)["status"] == "complete" and [s["step"] for s in steps(out)] == [1]
        init = json.loads((out / "launch-manifest.json").read_text())["init"]
        holder = ckpt if base == ckpt else exported
        assert init == {"mode": "none", "sources": [{"role": "model", "path": str(base), "weights": "ema", "step": 4,
                                                     "checkpoint": str(holder)}]}, init
    assert f"{ckpt / 'model' / 'live.safetensors'} names the live weights" in proc.stderr   # the last launch's


def test_what_is_no_base_model_is_refused_in_one_line_before_anything_is_written(wan_stage0p5, exported, wan_data,
                                                                                  tmp_path, cli):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("weights elsewhere\n")
    (tmp_path / "notes" / "config.yaml").write_text("a: 1\n")
    foreign = tmp_path / "foreign.safetensors"
    save_file({"encoder.conv_in.weight": torch.zeros(8, 3, 3, 3)}, str(foreign))
    cases = {tmp_path / "empty": "an empty directory",
             tmp_path / "notes": "a directory with no weights (it holds README.txt, config.yaml)",
             foreign: "not a wan22_ti2v_5b diffusers release: cannot infer Wan dims",
             exported / "model" / "optimizer.safetensors": "holds optimizer state, not weights",
             wan_stage0p5: "it is a run directory, not a checkpoint; give one of its 2 checkpoints"}
    out = tmp_path / "run"
    before, export_before = _tree(tmp_path), _tree(exported)
    for base, found in cases.items():
        refused = cli(*_args(_sets(wan_data, out, base)))
        assert refused.code == 2, (base, refused.err)
        line = refused.err
        assert line.count("\n") == 1 and line.startswith(f"solar: error: model.pretrained_path {base}: "), line
        assert found in line and "checkpoint.mode=weights_only" in line and "checkpoint.mode=full_resume" in line, line
        assert _tree(tmp_path) == before and _tree(exported) == export_before, base


def test_a_solar_file_away_from_its_checkpoint_is_refused_without_a_foreign_warning(exported, wan_data, tmp_path):
    """The EMA file copied out of its export has Solar's tiny keys and no manifest: read as a release,
    its dims cannot be inferred (a released Wan's head dim is 128). It used to build a zero-head model,
    leak torch's "Initializing zero-element tensors" UserWarning and report "source [64] vs model [0]"."""
    alone = tmp_path / "copied" / "ema.safetensors"
    alone.parent.mkdir()
    shutil.copyfile(exported / "model" / "ema.safetensors", alone)
    before = _tree(tmp_path)
    proc = train(CONFIG, _sets(wan_data, tmp_path / "run", alone))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"solar: error: model.pretrained_path {alone}: ") and \
        "hidden size 64 is not a multiple of Wan's head dim 128" in proc.stderr, proc.stderr
    assert "Warning" not in proc.stderr and "checkpoint.mode=weights_only" in proc.stderr
    assert _tree(tmp_path) == before
