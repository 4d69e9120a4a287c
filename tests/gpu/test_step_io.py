"""On a CUDA device, issue 18's host-side step pieces: the noise drawn on the CPU generator and the
batch arrive through pinned memory with the host's exact values; the Stage0.5 objective (the tiny
Wan TI2V-5B model, fp32) launches its forward without waiting for the device (CUDA's sync debug
mode raises on any synchronizing call) and gives the CPU's loss and per-sample losses; the records'
losses are read in one copy afterwards. Stage2's critic and student losses (the tiny Wan Stage2
config: the chunked rollout, its replay with grad, the critic's and the guided teacher's scores)
launch without waiting for the device too and give the CPU's losses, and so does chunk-by-chunk
generation (self-forcing, the tiny Wan model). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch.batch import Batch, host_noise, to_device
from solar.models.registry import model_from_config
from solar.objectives import fm
from solar.train.engine import read_records
from solar.train.fm_step import fm_loss
from tests.conftest import CONFIGS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"


def test_noise_and_batch_reach_the_gpu_with_the_host_values():
    shape = (2, 48, 21, 44, 80)  # one released-shape clip's latents, twice
    host = torch.randn(shape, generator=fm.clip_generator(42, 3, 0))
    on_gpu = host_noise(shape, fm.clip_generator(42, 3, 0), torch.device("cuda"))
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), host)
    t = torch.randn(4, 512, 64)
    moved = to_device(t, "cuda")
    t_after = t.clone()
    assert moved.is_cuda and torch.equal(moved.cpu(), t) and torch.equal(t, t_after) and not t.is_pinned()


def _batch(channels: int, text_dim: int, device) -> Batch:
    g = torch.Generator().manual_seed(5)
    b = Batch(latents=torch.randn(2, channels, 3, 4, 6, generator=g), prompt=torch.randn(2, 5, text_dim, generator=g),
              prompt_mask=torch.ones(2, 5), cameras=torch.eye(4).expand(2, 3, 4, 4).clone(), image_condition=None,
              identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(2)])
    return b.to(device)


@pytest.fixture
def no_tf32():
    """fp32 convolutions and matmuls on the GPU as on the CPU (cuDNN convolutions use TF32 by default)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_stage0p5_objective_does_not_wait_for_the_device_and_matches_the_cpu(no_tf32):
    cfg = resolve_file(CONFIG, ["data.root=/data", "runtime.output_dir=/out"]).config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cpu")
    d = model.cfg.dims
    cpu_loss, cpu_records = fm_loss(model, cfg, _batch(d.out_channels, d.text_dim, "cpu"), step=7, dp_rank=0, micro=0)
    cpu_records = read_records(cpu_records)
    model = model.cuda()
    batch = _batch(d.out_channels, d.text_dim, "cuda")
    fm_loss(model, cfg, batch, step=7, dp_rank=0, micro=0)  # warm-up: pinned blocks, kernels, lazy set-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, records = fm_loss(model, cfg, batch, step=7, dp_rank=0, micro=0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    loss.backward()
    assert all(r["loss"].is_cuda for r in records)
    records = read_records(records)
    assert float(loss) == pytest.approx(float(cpu_loss), rel=1e-4)
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in cpu_records], rel=1e-4)
    assert [r["timestep"] for r in records] == [r["timestep"] for r in cpu_records]


def test_stage2_losses_do_not_wait_for_the_device_and_match_the_cpu(tmp_path, no_tf32):
    """Every draw of a Stage2 update (rollout noise, re-noising per chunk level, score levels and
    noise) comes from the clip's CPU generator through pinned memory, and the DMD gradient's size is read
    after the update is queued: nothing in the forwards holds the host until the GPU catches up."""
    from tests.unit.train.test_stage2 import _setup

    state, student, batch = _setup("wan22_ti2v_5b", tmp_path)

    def losses():
        critic, _ = state.critic_loss(student, batch, fm.ClipDraws(3, 6, 0, 1, "critic"))
        loss, extra = state.student_loss(student, batch, fm.ClipDraws(3, 6, 0, 1, "student"))
        return critic, loss, extra["dmd_gradient"]

    cpu = [float(v.detach()) for v in losses()]
    for model in (student, state.teacher, state.critic.model):
        model.cuda()
    batch = batch.to("cuda")
    losses()   # warm-up: pinned blocks, kernels, block masks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = losses()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(v.is_cuda for v in got)
    assert [float(v.detach()) for v in got] == pytest.approx(cpu, rel=1e-3)


@pytest.mark.parametrize("anyflow, solver, steps", [(False, "self_forcing", 4), (True, "flowmap", 2)])
def test_chunk_generation_does_not_wait_for_the_device_and_matches_the_cpu(anyflow, solver, steps, no_tf32):
    """The rollout's noise and every self-forcing re-noising draw reach the GPU through pinned memory:
    a whole rollout (three chunks, commits included) queues without the host waiting."""
    import copy

    from solar.generation.autoregressive import sample_autoregressive
    from tests.unit.generation.test_autoregressive import WAN, _batch, _cfg, _model

    model = copy.deepcopy(_model(WAN, anyflow))
    batch = _batch(WAN, 9)

    def rollout(m, b):
        return sample_autoregressive(m, _cfg(WAN), b, noise_seed=5, solver=solver, steps=steps)

    cpu = rollout(model, batch)
    model, batch = model.cuda(), batch.to("cuda")
    rollout(model, batch)   # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = rollout(model, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got.cpu(), cpu, rtol=1e-3, atol=1e-4)
