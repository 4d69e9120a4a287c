"""Adapter-only (LoRA) checkpoints on disk, end to end (tiny LTX-2.5, CPU): a base converted with
`solar model convert`, `solar train` with LoRA on top of ``model.pretrained_path``, `solar infer`
from the checkpoint with the same base, and an exact resume from an adapter checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from solar.config import families
from solar.config.canonical import blake2s_hex
from solar.data.synth import synthesize
from solar.generation.video import read_frames
from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import TINY, env, infer, result, steps, train

pytestmark = pytest.mark.slow

FAMILY = "ltx25_video"
CONFIG = TINY[FAMILY]
INFER = CONFIGS / "tiny" / "ltx25" / "infer_stage0p5_fm_153f.yaml"
LORA = dict(rank=4, alpha=4.0, targets=["q", "k", "v", "o", "ffn"])  # the tiny configs' adapters


def _snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth") / "ltx"
    synthesize(FAMILY, root, samples=4, seed=1)
    return root


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny "released" LTX-2.5 base: a diffusers transformer (random weights, audio stream included)
    through the real `solar model convert`. Returns its path and its bytes as written."""
    from tests.unit.models.family_helpers import LTX25_DIFFUSERS, ltx_reference

    root = tmp_path_factory.mktemp("base")
    ltx_reference(families.spec(FAMILY).dims("tiny"), LTX25_DIFFUSERS, seed=7).save_pretrained(root / "diffusers")
    proc = subprocess.run([sys.executable, "-m", "solar", "model", "convert", "--family", "ltx-2.5", "--from",
                           "diffusers", str(root / "diffusers"), "--out", str(root / "solar")],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["source"]["dropped_tensors"] > 0  # the audio stream is set aside
    return root / "solar", _snapshot(root / "solar")


def _sets(data_root, out, base_path, *extra):
    # Validation at the last step only, one slot, two decoded latents (the first is the clean image
    # condition, so one latent would look the same whatever the model).
    return [f"data.root={data_root}", f"runtime.output_dir={out}", f"model.pretrained_path={base_path}",
            "runtime.log_every=100", "train.max_steps=4", "runtime.save_every=2", "runtime.validate_every=4",
            "validation.sample_count=1", "validation.decode_latents=2", *extra]


def _infer(sets: list[str]):
    return infer(INFER, sets)


@pytest.fixture(scope="module")
def trained(data, base, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    proc = train(CONFIG, _sets(data, out, base[0]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result(out)["status"] == "complete"
    return out


def _adapter_names() -> set[str]:
    from solar.models.lora import apply_lora
    from solar.models.registry import build

    model = build(FAMILY, families.spec(FAMILY).dims("tiny"), device="meta")
    apply_lora(model, FAMILY, **LORA)
    return {k for k in model.state_dict() if ".lora_" in k}


def test_checkpoints_hold_only_the_adapters(trained, base):
    expected = _adapter_names()
    assert expected and any(".lora_A." in k for k in expected) and any(".lora_B." in k for k in expected)
    base_bytes = sum(len(v) for v in base[1].values())
    lora_b = {}
    for step in (2, 4):
        ckpt = trained / "checkpoints" / f"step_{step:08d}"
        for role in ("live", "ema"):
            tensors = load_file(ckpt / "model" / f"{role}.safetensors")
            assert set(tensors) == expected, role
        assert (ckpt / "model" / "live.safetensors").stat().st_size < base_bytes / 4
        optimizer = json.loads((ckpt / "model" / "optimizer.json").read_text())
        assert set(optimizer["names"]) == expected
        assert {k.split("::")[0] for k in load_file(ckpt / "model" / "optimizer.safetensors")} == expected
        manifest = json.loads((ckpt / "manifest.json").read_text())
        assert manifest["trainer_state"]["adapter_only"] is True
        assert manifest["trainer_state"]["base"] == str(base[0])
        assert manifest["roles"]["model"]["weights"] == ["live", "ema"]
        lora_b[step] = {k: v for k, v in load_file(ckpt / "model" / "live.safetensors").items() if ".lora_B." in k}
    # The adapters trained (B starts at zero) and kept training between the two saves.
    assert any(v.abs().max() > 0 for v in lora_b[2].values())
    assert any(not (lora_b[2][k] == lora_b[4][k]).all() for k in lora_b[4])
    launch = json.loads((trained / "launch-manifest.json").read_text())
    assert launch["init"] == {"mode": "none",
                              "sources": [{"role": "model", "path": str(base[0]), "weights": "released"}]}
    assert _snapshot(base[0]) == base[1]  # training never writes to its base


def test_infer_on_the_adapter_checkpoint_with_its_base_reproduces_validation(trained, data, base, tmp_path):
    out = tmp_path / "infer"
    proc = _infer([f"data.root={data}", f"runtime.output_dir={out}", f"model.pretrained_path={base[0]}",
                   f"checkpoint.path={trained}/checkpoints/step_00000004", "checkpoint.weights=ema",
                   "inference.sample_count=1", "validation.decode_latents=2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "infer complete: 1/1 slots ok" in proc.stderr
    gen = out / "generation"
    complete = json.loads((gen / "COMPLETE.json").read_text())
    assert (complete["status"], complete["slots"], complete["ok_slots"], complete["passes"]) == \
        ("complete", 1, 1, ["model-unipc"])
    assert result(out)["status"] == "complete"
    slot = gen / "model-unipc" / "slot_000000"
    m = json.loads((slot / "manifest.json").read_text())
    assert (m["status"], m["weights"], m["frames"]) == ("ok", "ema", 9)  # two latents: 1 + 8 frames
    assert sorted(a["path"] for a in m["artifacts"]) == ["compare.mp4", "generated.mp4"]
    for artifact in m["artifacts"]:
        blob = (slot / artifact["path"]).read_bytes()
        assert (len(blob), blake2s_hex(blob)) == (artifact["bytes"], artifact["blake2s"])
    made = read_frames(slot / "generated.mp4")
    assert made.shape == (9, 128, 192, 3)
    # Base + adapters at inference are exactly the model the training run validated.
    seen = read_frames(trained / "validation" / "step_00000004" / "ema-unipc" / "slot_000000" / "generated.mp4")
    assert (made == seen).all()
    assert _snapshot(base[0]) == base[1]


def test_adapters_without_their_base_are_refused(trained, data, base, tmp_path):
    ckpt = trained / "checkpoints" / "step_00000004"
    why = f"checkpoint.path {ckpt} holds LoRA adapters only (trained on the base {base[0]}); set model.pretrained_path"
    out = tmp_path / "infer"
    proc = _infer([f"data.root={data}", f"runtime.output_dir={out}", "model.pretrained_path=null",
                   f"checkpoint.path={ckpt}", "checkpoint.weights=ema", "inference.sample_count=1"])
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr[-2000:]
    assert not (out / "generation" / "COMPLETE.json").exists()
    run = tmp_path / "child"  # (a full resume without the base changes the run's config: see below)
    proc = train(CONFIG, _sets(data, run, "null", "checkpoint.mode=weights_only", f"checkpoint.path={ckpt}",
                               "checkpoint.weights=live"))
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr[-2000:]
    assert not (run / "checkpoints").exists()


def test_resume_from_an_adapter_checkpoint_is_exact(trained, data, base, tmp_path):
    split = tmp_path / "split"
    first = train(CONFIG, _sets(data, split, base[0], "runtime.exit_after_step=2"))
    assert first.returncode == 0 and result(split)["status"] == "stopped", first.stderr[-2000:]
    source = split / "checkpoints" / "step_00000002"
    before = _snapshot(split)
    without_base = train(CONFIG, _sets(data, split, "null", "checkpoint.mode=full_resume", f"checkpoint.path={source}"))
    assert without_base.returncode == 2, without_base.stderr[-2000:]
    assert "holds a run with another recipe: model.pretrained_path " in without_base.stderr  # the base is the run's
    assert _snapshot(split) == before  # refused before anything is written
    resumed = train(CONFIG, _sets(data, split, base[0], "checkpoint.mode=full_resume", f"checkpoint.path={source}"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert result(split)["status"] == "complete"
    assert [e["step"] for e in steps(split)] == [1, 2, 3, 4]
    assert [e["loss"] for e in steps(split)] == [e["loss"] for e in steps(trained)]
    a, b = trained / "checkpoints" / "step_00000004", split / "checkpoints" / "step_00000004"
    for member in ("model/live.safetensors", "model/ema.safetensors", "model/optimizer.safetensors",
                   "model/optimizer.json", "trainer.json", "rng/rank-00000.json", "data/rank-00000.json"):
        assert (a / member).read_bytes() == (b / member).read_bytes(), member
    assert json.loads((b / "manifest.json").read_text())["trainer_state"]["adapter_only"] is True
    assert set(load_file(b / "model" / "live.safetensors")) == _adapter_names()
    assert _snapshot(base[0]) == base[1]


def test_stage2_roles_from_adapter_checkpoints_need_the_base(tmp_path):
    """The same refusal for Stage2's role sources (tiny H3, LoRA), checked in the launch's preflight."""
    import torch
    from safetensors.torch import save_file

    from solar.config.resolve import resolve_file
    from solar.storage import checkpoints as ckpt
    from solar.storage.checkpoints import CheckpointError
    from solar.train.setup import contract_of
    from solar.train.sources import preflight_sources

    h3 = CONFIGS / "tiny" / "minimax_h3"
    common = ["data.root=/data", "runtime.output_dir=/out"]

    def adapter_checkpoint(run, config):
        partial = ckpt.begin(run, 1)
        (partial / "model").mkdir()
        for w in ("live", "ema"):
            save_file({"blocks.0.attn.to_q.lora_A.weight": torch.zeros(2, 2)},
                      str(partial / "model" / f"{w}.safetensors"))
        return ckpt.commit(partial, step=1, contract=contract_of(resolve_file(config, common)),
                           roles={"model": {"weights": ["live", "ema"],
                                            "members": ["model/live.safetensors", "model/ema.safetensors"]}},
                           trainer_state={"step": 1, "adapter_only": True, "base": "/released/h3"})

    student = adapter_checkpoint(tmp_path / "s1", h3 / "train_stage1_tf_anyflow_158f.yaml")
    fm = adapter_checkpoint(tmp_path / "s05", h3 / "train_stage0p5_fm_158f.yaml")
    roles = ["checkpoint.mode=roles"] + [f"checkpoint.roles.{r}.{k}={v}" for r, p in
                                         (("student", student), ("teacher", fm), ("critic", fm))
                                         for k, v in (("path", p), ("weights", "ema"))]
    config = h3 / "train_stage2_sgf_158f.yaml"
    with pytest.raises(CheckpointError, match=rf"checkpoint.roles.student.path {student} holds LoRA adapters only "
                                              r"\(trained on the base /released/h3\); set model.pretrained_path"):
        preflight_sources(resolve_file(config, [*common, *roles, "model.pretrained_path=null"]))
    preflight_sources(resolve_file(config, [*common, *roles, "model.pretrained_path=/released/h3"]))
