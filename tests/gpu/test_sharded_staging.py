"""On a CUDA device, what differs from the CPU in a sharded save's staging (issue 38): this rank's
shards of FSDP2 DTensors on the GPU are copied into pinned host buffers without waiting (the copy is
asynchronous until ``Staging.ready``), reused from save to save, wrapped as DTensors again with the
original placements, and hold the GPU's exact values; ``Fresh`` (a save written at once) copies to
plain host memory. A one-rank process group over NCCL stands in for the cluster. Skipped without CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    if started:
        dist.destroy_process_group()


def test_this_ranks_shards_land_in_reused_pinned_buffers_with_the_gpu_values(group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from solar.train import checkpoint_shards as shards
    from solar.train.checkpoint_save import Fresh, Staging

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)).cuda()
    fully_shard(model, mesh=init_device_mesh("cuda", (1,)))
    state = {f"model/live/{k}": v for k, v in model.state_dict().items()}
    assert all(isinstance(v, DTensor) and v.device.type == "cuda" for v in state.values())
    staging = Staging()
    staged = shards.stage(state, staging)
    staging.ready()
    assert staging.cuda
    for key, value in staged.items():
        assert isinstance(value, DTensor) and value.placements == state[key].placements
        local = value.to_local()
        assert local.device.type == "cpu" and local.is_pinned()
        assert torch.equal(local, state[key].to_local().cpu())
    buffers = {k: b.data_ptr() for k, b in staging.buffers.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    again = shards.stage({f"model/live/{k}": v for k, v in model.state_dict().items()}, staging)
    staging.ready()
    assert {k: b.data_ptr() for k, b in staging.buffers.items()} == buffers   # reused, not reallocated
    assert all(torch.equal(again[k].to_local(), v.to_local().cpu()) for k, v in
               {f"model/live/{k}": v for k, v in model.state_dict().items()}.items())
    fresh = shards.stage(state, Fresh())
    assert all(not v.to_local().is_pinned() and v.to_local().device.type == "cpu" for v in fresh.values())


def test_staged_gpu_shards_save_through_the_checkpoint_group_and_read_back(group, tmp_path):
    """The staged host DTensors go through DCP over a gloo group (``Dist.checkpoint_group``'s
    backend) and the shard files hold the GPU's values (``materialize.role_tensors`` reads them)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from solar.launch.materialize import shards as read_shards
    from solar.train import checkpoint_shards as shards
    from solar.train.checkpoint_save import Staging

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 16)).cuda()
    fully_shard(model, mesh=init_device_mesh("cuda", (1,)))
    state = {f"model/live/{k}": v for k, v in model.state_dict().items()}
    staging = Staging()
    staged = shards.stage(state, staging)
    staging.ready()
    gloo = dist.new_group(backend="gloo")
    shards.save(staged, tmp_path, gloo)
    (tmp_path / "shards.json").write_bytes(shards.layout_document(staged, 1))
    got = read_shards(tmp_path)   # every tensor assembled from the shard files' pieces
    assert sorted(got) == sorted(state)
    for key, value in state.items():
        assert torch.equal(got[key].read(), value.full_tensor().cpu()), key
