"""On a CUDA device of compute capability >= 8.9 with torchao: ``model.fp8_linear`` against bf16.

- Wan TI2V-5B blocks at the released dims (two blocks, 2,025 tokens), eager and compiled under
  activation checkpointing as the product builds them: output and gradients within 5% relative
  (L2) of the bf16 model, the FM loss within 1%, every gradient finite (the bound
  solar.train.fp8 states); under ``high_precision`` no FP8 matmul runs and the output is as
  accurate (against fp32) as the bf16 model's.
- The product's entry point on the tiny Wan Stage0.5, Stage1 and Stage2 configs with compile on:
  the run completes with finite losses, records the FP8 event with the converted count, and
  (Stage0.5, Stage1) its validation generation (bf16 through ``high_precision``) completes.

Skipped without such a device or without torchao (CI has neither)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from solar.config import families
from solar.models.wan.model import WanConfig, WanDiT
from solar.train.parallelize import apply_activation_checkpointing, apply_compile
from tests.conftest import CONFIGS


def _fp8_device() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _fp8_device(), reason="needs a CUDA device of compute capability >= 8.9")]
fp8 = pytest.importorskip("solar.train.fp8")
pytest.importorskip("torchao.float8")

OUTPUT_BOUND, GRAD_BOUND, LOSS_BOUND = 0.05, 0.05, 0.01


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _released_blocks(layers: int = 2):
    dims = dataclasses.replace(families.spec("wan22_ti2v_5b").dims("released"), num_layers=layers)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = WanDiT(WanConfig(dims, camera_transform="linear", attention_backend="sdpa"))
    g = torch.Generator(device="cuda").manual_seed(1)
    # 5 x 15 x 27 = 2,025 tokens: the released 480x864 latent grid, a token count that is not a multiple of 16
    # (the weight-gradient matmuls pad it)
    x = torch.randn(1, dims.in_channels, 5, 30, 54, device="cuda", generator=g)
    inputs = (x, torch.rand(1, 5, device="cuda", generator=g) * 1000,
              torch.randn(1, 512, dims.text_dim, device="cuda", generator=g))
    cams = torch.eye(4, device="cuda").repeat(1, 5, 1, 1)
    cams[..., :3, 3] = torch.randn(1, 5, 3, device="cuda", generator=g) * 0.1
    return model, inputs, cams, torch.randn(x.shape, device="cuda", generator=g)


def _step(model, inputs, cams, target):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(*inputs, cameras=cams)
        loss = (out.float() - target).square().mean()
    loss.backward()
    grads = torch.cat([p.grad.float().flatten() for _, p in sorted(model.named_parameters()) if p.grad is not None])
    return out.float().detach(), loss.detach(), grads


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("compiled", [False, True])
def test_released_dims_blocks_within_the_bound_of_bf16(recipe, compiled):
    model, inputs, cams, target = _released_blocks()
    converted = copy.deepcopy(model)
    assert fp8.convert(converted, recipe) == 2 * 10  # q k v o of both attentions and the FFN's two, per block
    if compiled:
        apply_activation_checkpointing(converted, policy="save_attention")
        apply_compile(converted)
    out0, loss0, grads0 = _step(model, inputs, cams, target)
    out, loss, grads = _step(converted, inputs, cams, target)
    assert torch.isfinite(grads).all() and torch.isfinite(out).all()
    assert 0 < _rel(out, out0) < OUTPUT_BOUND, _rel(out, out0)
    assert _rel(grads, grads0) < GRAD_BOUND, _rel(grads, grads0)
    assert abs(float(loss - loss0)) < LOSS_BOUND * float(loss0), (float(loss), float(loss0))
    with torch.no_grad(), fp8.high_precision(converted), torch.autocast("cuda", dtype=torch.bfloat16), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out_hp = converted(*inputs, cameras=cams).float()
    with torch.no_grad():
        out32 = model(*inputs, cameras=cams).float()
    # no FP8 matmul runs, and the output is as accurate as the bf16 model's (against fp32). Not "as
    # close to the bf16 model as FP8 is / 3": bf16's own error dominates the output (on the CPU at these
    # dims, against fp32: bf16 0.551%, high_precision 0.551%, FP8 0.621%), and high_precision rounds
    # differently from nn.Linear (the bias added after the matmul's rounding): 0.22% from bf16 there
    assert not [e.name for e in prof.events() if "_scaled_mm" in e.name]
    assert _rel(out_hp, out32) <= 1.1 * _rel(out0, out32), (_rel(out_hp, out32), _rel(out0, out32))


VALIDATE = ["train.max_steps=2", "runtime.validate_every=2", "validation.decode_latents=1"]


@pytest.mark.parametrize("config, recipe, sets, linears", [
    ("train_stage0p5_fm_81f.yaml", "tensorwise", VALIDATE, 20),
    ("train_stage1_tf_anyflow_81f.yaml", "rowwise", VALIDATE, 20),
    # student, frozen teacher and critic: six critic updates and a student update
    ("train_stage2_sgf_81f.yaml", "tensorwise",
     ["train.max_steps=6", "runtime.validate_every=0", "runtime.validation_steps=[]"], 60)])
def test_product_entry_point_trains_in_fp8(config, recipe, sets, linears, tmp_path):
    from solar.data.synth import synthesize
    from solar.train.launch import train

    synthesize("wan22_ti2v_5b", tmp_path / "data", samples=4, seed=1)
    out = tmp_path / "run"
    assert train(str(CONFIGS / "tiny" / "wan22_ti2v_5b" / config),
                 [f"data.root={tmp_path / 'data'}", f"runtime.output_dir={out}", "runtime.device=cuda",
                  "runtime.compile=true", f"model.fp8_linear={recipe}", *sets]) == 0
    events = [json.loads(line) for line in (out / "events" / "rank-00000.jsonl").read_text().splitlines()]
    [record] = [e for e in events if e["event"] == "fp8"]
    assert record["recipe"] == recipe and record["linears"] == linears
    steps = [e for e in events if e["event"] == "step"]
    assert steps and all(torch.isfinite(torch.tensor(e["loss"])) for e in steps)
    if "runtime.validate_every=2" in sets:  # validation generation (bf16 through high_precision) completes
        assert [e for e in events if e["event"] == "validation"]
    result = json.loads((out / "run-result.json").read_text())
    assert result["status"] == "complete", result
