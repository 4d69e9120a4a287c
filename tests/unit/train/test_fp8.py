"""``model.fp8_linear`` on the CPU (torchao's float8 layers run there too): which layers convert,
through the real build paths (Stage0.5/1 ``build_parts``, Stage2's roles), and the stated bound on
the difference from the unconverted model on the tiny Wan configs — the model's output and
gradients within 5% relative (L2), the loss within 1% relative, for the Stage0.5 FM forward and
Stage1 TF-AnyFlow's forwards without grad plus its forward with grad; measured about 0.7% / 1.2% /
0.02% (output / gradients / loss). ``high_precision`` (validation generation) gives the unconverted
model's numbers exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from solar.config import families
from solar.config.resolve import resolve_file
from solar.launch.batch import Batch
from solar.models.registry import model_from_config
from solar.models.wan.model import WanConfig, WanDiT
from tests.conftest import CONFIGS
from tests.unit.models.wan_helpers import moving_cameras

pytest.importorskip("torchao.float8")

from solar.train import fp8  # noqa: E402

WAN = CONFIGS / "tiny" / "wan22_ti2v_5b"
OUTPUT_BOUND, GRAD_BOUND, LOSS_BOUND = 0.05, 0.05, 0.01
OUTSIDE_BLOCKS = {"patch_embedding", "condition_embedder", "proj_out"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _flat_grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for _, p in sorted(model.named_parameters()) if p.grad is not None])


def _tiny_wan(seed: int = 0):
    dims = families.spec("wan22_ti2v_5b").dims("tiny")
    torch.manual_seed(seed)
    model = WanDiT(WanConfig(dims, camera_transform="linear", attention_backend="sdpa"))
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(2, dims.in_channels, 6, 8, 12, generator=g)
    inputs = (x, torch.rand(2, 6, generator=g) * 1000, torch.randn(2, 16, dims.text_dim, generator=g))
    return model, inputs, torch.eye(4).repeat(2, 6, 1, 1), torch.randn(x.shape, generator=g)


def _fm_step(model, inputs, cams, target):
    model.zero_grad(set_to_none=True)
    out = model(*inputs, cameras=cams)
    loss = (out - target).square().mean()
    loss.backward()
    return out.detach(), loss.detach(), _flat_grads(model)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_block_linears_convert_and_stay_within_the_bound(recipe):
    model, inputs, cams, target = _tiny_wan()
    converted = copy.deepcopy(model)
    names = fp8.eligible(converted)
    assert fp8.convert(converted, recipe) == len(names) == 20  # 2 blocks x (q k v o of both attentions, FFN 2)
    kinds = {name: type(module).__name__ for name, module in converted.named_modules()}
    assert all(kinds[name] == "Float8Linear" for name in names)
    assert all(name.startswith("blocks.") for name in names)
    plain = {name for name, kind in kinds.items() if kind == "Linear"}
    assert plain and {name.split(".")[0] for name in plain} <= OUTSIDE_BLOCKS  # embeddings and proj_out stay
    assert [n for n, _ in converted.named_parameters()] == [n for n, _ in model.named_parameters()]
    out0, loss0, grads0 = _fm_step(model, inputs, cams, target)
    out, loss, grads = _fm_step(converted, inputs, cams, target)
    assert 0 < _rel(out, out0) < OUTPUT_BOUND  # FP8 did change the numbers, within the bound
    assert 0 < _rel(grads, grads0) < GRAD_BOUND
    assert abs(float(loss - loss0)) < LOSS_BOUND * float(loss0)
    assert torch.isfinite(grads).all()
    with fp8.high_precision(converted):
        out_hp, loss_hp, grads_hp = _fm_step(converted, inputs, cams, target)
    torch.testing.assert_close(out_hp, out0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads_hp, grads0, rtol=1e-6, atol=1e-6)
    out_again, _, _ = _fm_step(converted, inputs, cams, target)  # FP8 again after the context
    assert torch.equal(out_again, out)


@pytest.mark.parametrize("config, count", [("wan22_i2v_a14b/train_stage0p5_fm_81f.yaml", 20),
                                           ("ltx25/train_stage0p5_fm_153f.yaml", 20),
                                           ("minimax_h3/train_stage0p5_fm_158f.yaml", 12)])
def test_every_family_converts_its_token_wise_block_linears(config, count):
    cfg = resolve_file(CONFIGS / "tiny" / config, ["data.root=/d", "runtime.output_dir=/o", "model.training_mode=full",
                                                    "model.lora=null", "model.fp8_linear=tensorwise"]).config
    model = model_from_config(cfg, device="meta")
    assert fp8.convert(model, "tensorwise") == count  # q k v o of each attention and the FFN's two, per block
    names = {name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"}
    left = {name for name, module in model.named_modules() if type(module) is torch.nn.Linear}
    assert not {n for n in names if "adaln" in n or "norm" in n}
    if "minimax_h3" in config:  # its blocks' modulation projections stay (one row per sample)
        assert {n for n in left if ".adaln_proj." in n and n.startswith("transformer_blocks.")}


def test_off_converts_nothing():
    model, *_ = _tiny_wan()
    assert fp8.convert(model, "off") == 0
    assert not fp8.converted(model)


def test_stage1_forwards_without_grad_run_in_fp8_within_the_bound():
    from solar.train.stage1_step import anyflow_loss

    cfg = resolve_file(WAN / "train_stage1_tf_anyflow_81f.yaml",
                       ["data.root=/data", "runtime.output_dir=/out", "checkpoint.path=null",
                        "checkpoint.weights=null"]).config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cpu")
    d = model.cfg.dims
    g = torch.Generator().manual_seed(11)
    batch = Batch(latents=torch.randn(2, d.out_channels, 9, 4, 6, generator=g),
                  prompt=torch.randn(2, 5, d.text_dim, generator=g), prompt_mask=torch.ones(2, 5),
                  cameras=moving_cameras(9, batch=2), image_condition=None,
                  identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(2)])
    negative = torch.randn(5, d.text_dim, generator=g)
    converted = copy.deepcopy(model)
    assert fp8.convert(converted, "tensorwise") > 0
    calls = []
    for layer in fp8.converted(converted):
        layer.register_forward_hook(lambda m, i, o: calls.append(torch.is_grad_enabled()))

    def step(m):
        m.zero_grad(set_to_none=True)
        loss, _ = anyflow_loss(m, cfg, batch, step=3, dp_rank=0, dp_world=1, micro=0, gather=lambda rows: rows,
                               negative=negative)
        loss.backward()
        return loss.detach(), _flat_grads(m)

    loss0, grads0 = step(model)
    loss, grads = step(converted)
    assert False in calls and True in calls  # the forwards without grad and the one with grad both ran in FP8
    assert abs(float(loss - loss0)) < LOSS_BOUND * abs(float(loss0))
    assert _rel(grads, grads0) < GRAD_BOUND and torch.isfinite(grads).all()


@pytest.fixture(scope="module")
def wan_data(tmp_path_factory):
    from solar.data.synth import synthesize

    root = tmp_path_factory.mktemp("fp8data") / "data"
    synthesize("wan22_ti2v_5b", root, samples=2, seed=1)
    return root


@pytest.mark.parametrize("config", ["train_stage0p5_fm_81f.yaml", "train_stage1_tf_anyflow_81f.yaml"])
def test_build_parts_converts_the_trained_model(config, wan_data, tmp_path):
    from solar.train.setup import build_parts

    sets = [f"data.root={wan_data}", f"runtime.output_dir={tmp_path}"]
    plain = build_parts(resolve_file(WAN / config, sets), 0, torch.device("cpu"))
    parts = build_parts(resolve_file(WAN / config, [*sets, "model.fp8_linear=rowwise"]), 0, torch.device("cpu"))
    assert plain.fp8_linears == 0 and parts.fp8_linears == len(fp8.converted(parts.model)) == 20
    assert parts.names == plain.names  # the same trainable parameters, in optimizer order
    for name in parts.names:  # the same seeded initialisation, filled through the converted layers
        assert torch.equal(parts.params[name], plain.params[name]), name


def test_stage2_converts_every_role(wan_data, tmp_path):
    from solar.train.stage2 import build_stage2

    sets = [f"data.root={wan_data}", f"runtime.output_dir={tmp_path}", "model.fp8_linear=tensorwise"]
    parts, stage2 = build_stage2(resolve_file(WAN / "train_stage2_sgf_81f.yaml", sets), 0, torch.device("cpu"))
    assert [m["fp8_linears"] for m in stage2.models] == [20, 20, 20]  # student, teacher, critic
    assert parts.fp8_linears == 60
    assert len(fp8.converted(stage2.teacher)) == len(fp8.converted(stage2.critic.model)) == 20
