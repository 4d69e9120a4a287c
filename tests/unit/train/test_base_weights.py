"""``solar.launch.base_weights``: what a ``model.pretrained_path`` names, which weights of a Solar
checkpoint a run starts from, and the one line a path that is no base model is refused with. The
checkpoints here are real (``storage.checkpoints.begin``/``commit``) with tiny safetensors members."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from solar.launch import base_weights as bw
from solar.launch.materialize import released
from solar.models.weights import WeightsError

WEIGHTS = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(2)}


def _checkpoint(tmp_path, *, role="model", kinds=("live", "ema"), family="wan22_ti2v_5b", adapter_only=False):
    from solar.storage.checkpoints import begin, commit

    partial = begin(tmp_path / "run", 3)
    (partial / role).mkdir()
    for i, kind in enumerate(kinds):
        save_file({k: v + i for k, v in WEIGHTS.items()}, str(partial / role / f"{kind}.safetensors"))
    roles = {role: {"weights": list(kinds), "members": [f"{role}/{k}.safetensors" for k in kinds]}}
    return commit(partial, step=3, contract={"family": family}, roles=roles,
                  trainer_state={"adapter_only": adapter_only, "base": "/released/wan"})


def test_a_checkpoint_directory_starts_from_its_ema_and_a_named_file_from_itself(tmp_path):
    ckpt = _checkpoint(tmp_path)
    chosen = bw.solar_source(ckpt)
    assert (chosen.checkpoint, chosen.role, chosen.weights, chosen.step, chosen.chosen) == \
        (ckpt, "model", "ema", 3, True)
    assert torch.equal(released("wan22_ti2v_5b", str(ckpt))["a.weight"].read(), WEIGHTS["a.weight"] + 1)
    live = ckpt / "model" / "live.safetensors"
    assert bw.solar_source(live).weights == "live" and not bw.solar_source(live).chosen
    assert torch.equal(released("wan22_ti2v_5b", str(live))["a.weight"].read(), WEIGHTS["a.weight"])
    assert f"{live} names the live weights" in bw.note(str(ckpt), chosen)
    assert bw.solar_source(ckpt / "model") == chosen   # the role's folder: as the directory
    only_live = _checkpoint(tmp_path / "b", kinds=("live",))
    assert bw.solar_source(only_live).weights == "live"
    assert bw.note(str(only_live), bw.solar_source(only_live)).endswith("the live weights of step 3 (it has no EMA)")


@pytest.mark.parametrize(("make", "found"), [
    (lambda p: _checkpoint(p, adapter_only=True), "holds LoRA adapters only (trained on the base /released/wan)"),
    (lambda p: _checkpoint(p, role="student"), "has no model weights (its roles: student; name one role's weight "
                                               "file, e.g. "),
    (lambda p: _checkpoint(p, family="ltx25_video"), "a Solar ltx25_video checkpoint"),
    (lambda p: _checkpoint(p, kinds=("live", "optimizer")) / "model" / "optimizer.safetensors",
     "holds optimizer state, not weights"),
])
def test_a_solar_checkpoint_that_is_no_base_is_named_as_such(tmp_path, make, found):
    path = make(tmp_path)
    with pytest.raises(WeightsError) as caught:
        released("wan22_ti2v_5b", str(path))
    assert str(caught.value).startswith(f"model.pretrained_path {path}: ") and found in str(caught.value)


def test_an_unfinished_checkpoint_is_refused_with_the_checkpoint_reader_s_reason(tmp_path):
    ckpt = _checkpoint(tmp_path)
    (ckpt / "model" / "ema.safetensors").write_bytes(b"short")
    with pytest.raises(WeightsError, match=rf"^model.pretrained_path {ckpt}: the Solar checkpoint {ckpt} is not "
                                           r"usable: member model/ema.safetensors has 5 bytes"):
        released("wan22_ti2v_5b", str(ckpt))


def test_paths_that_are_no_weights_say_what_they_are(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    for name in ("a.txt", "b.json", "c.yaml", "d.md"):
        (tmp_path / "notes" / name).write_text("x")
    (tmp_path / "config.yaml").write_text("x")
    assert bw.plain_problem(str(tmp_path / "none")) == "no such file or directory"
    assert bw.plain_problem(str(tmp_path / "empty")).startswith("an empty directory; a base model is")
    assert bw.plain_problem(str(tmp_path / "notes")).startswith(
        "a directory with no weights (it holds a.txt, b.json, c.yaml (+1 more))")
    assert "not weights" in bw.plain_problem(str(tmp_path / "config.yaml"))
    save_file(WEIGHTS, str(tmp_path / "notes" / "w.safetensors"))
    assert bw.plain_problem(str(tmp_path / "notes")) is None   # weight files: the conversion checks them


def test_the_refusal_names_the_path_once_and_checkpoint_mode():
    for raw in ("weights /w: no such file or directory", "model.pretrained_path /w: no such file or directory",
                "model.pretrained_path: weights /w: no such file or directory"):
        line = str(bw.with_hint(WeightsError(raw), "/w"))
        assert line == f"model.pretrained_path /w: no such file or directory; {bw.HINT}", raw
    fit = str(bw.with_hint(WeightsError("model.pretrained_path /w do not fit the model: 1 missing: x"), "/w"))
    assert fit == f"model.pretrained_path /w do not fit the model: 1 missing: x; {bw.HINT}"
    assert str(bw.with_hint(bw.with_hint(WeightsError("gone"), "/w"), "/w")).count(bw.HINT) == 1
    assert "checkpoint.mode=weights_only" in bw.HINT and "checkpoint.mode=full_resume" in bw.HINT


def test_the_launch_record_names_the_weights_a_solar_base_gave(tmp_path):
    ckpt = _checkpoint(tmp_path)
    assert bw.record(str(ckpt)) == {"role": "model", "path": str(ckpt), "weights": "ema", "step": 3,
                                    "checkpoint": str(ckpt)}
    live = ckpt / "model" / "live.safetensors"
    assert bw.record(str(live), "base")["weights"] == "live" and bw.record(str(live), "base")["role"] == "base"
    assert bw.record(str(tmp_path / "diffusers")) == {"role": "model", "path": str(tmp_path / "diffusers"),
                                                      "weights": "released"}


def test_a_stage2_lora_base_is_checked_before_the_launch_writes(tmp_path):
    """Stage2 builds its roles on ``model.pretrained_path`` (LoRA): the launch's check reads what the
    path is (it used to return at once for Stage2, and the build failed after the run directory)."""
    from solar.config.resolve import resolve_file
    from solar.train.setup import preflight_weights
    from tests.conftest import CONFIGS

    (tmp_path / "empty").mkdir()
    config = CONFIGS / "tiny" / "minimax_h3" / "train_stage2_sgf_158f.yaml"
    resolved = resolve_file(str(config), [f"model.pretrained_path={tmp_path / 'empty'}", f"data.root={tmp_path}",
                                          f"runtime.output_dir={tmp_path / 'out'}"], expected_action="train")
    assert resolved.config.model.training_mode == "lora"
    with pytest.raises(WeightsError, match=rf"^model.pretrained_path {tmp_path / 'empty'}: an empty directory"):
        preflight_weights(resolved)
