"""Sharded Stage2 under torchrun (gloo, fp32 on CPU): student, critic and teacher under FSDP2 give the
unsharded run's per-step losses and gradient norms (Wan at world 2 full_shard and hybrid_shard over
two node groups; MiniMax-H3 at world 4 with the route's SP 4, its roles on one shared LoRA base, is in
test_stage2_shared_base.py); a sharded run resumes exactly from its
own checkpoint, and a sharded checkpoint resumes an unsharded run (and the other way round). Each
clip draws its own rollout exit levels, so ranks run different numbers of chunk forwards: the ranks
with fewer run discarded ones, or these runs would hang in FSDP2's gathers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from solar.launch.materialize import role_tensors

from tests.conftest import CONFIGS, REPO
from tests.e2e.conftest import free_port
from tests.e2e.helpers import env, result, train

pytestmark = pytest.mark.slow

WAN = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml"
KEYS = ("loss", "grad_norm", "student_loss", "student_grad_norm")


def _sets(data, out, world, *extra):
    # one critic update per student update: the student updates from step 2 on (the step-2 checkpoint
    # holds its first update and EMA); validation (self-forcing, EMA) at the last step
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=100", f"distributed.world_size={world}",
            "train.max_steps=4", "train.sgf.critic_updates_per_student=1", "runtime.save_every=0",
            "runtime.save_steps=[2]", "runtime.validate_every=0", "runtime.validation_steps=[4]",
            "validation.decode_latents=1", *extra]


def _steps(run) -> list[dict]:
    events = [json.loads(line) for line in (run / "events" / "rank-00000.jsonl").read_text().splitlines()]
    return [{k: e[k] for k in ("step", *KEYS) if k in e} for e in events if e["event"] == "step"]


def _close(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b):
        for key in KEYS:
            assert (key in x) == (key in y), (x, y)
            if key in x:
                assert abs(x[key] - y[key]) <= rel * max(1.0, abs(y[key])), (key, x, y)


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def wan(wan_data, tmp_path_factory):
    """Wan at world 2: unsharded and full_shard straight to step 4, and the full_shard run stopped
    after its step-2 checkpoint (the student has updated once and has an EMA)."""
    base = tmp_path_factory.mktemp("stage2-sharded")
    runs = {}
    for name, extra in (("plain", ["distributed.sharding=none"]), ("sharded", ["distributed.sharding=full_shard"]),
                        ("split", ["distributed.sharding=full_shard", "runtime.exit_after_step=2"])):
        runs[name] = base / name
        _ok(train(WAN, _sets(wan_data, runs[name], 2, "train.global_batch_size=2", *extra), nproc=2))
    return {"base": base, "data": wan_data, **runs}


def test_full_shard_matches_unsharded_and_validates(wan):
    _close(_steps(wan["sharded"]), _steps(wan["plain"]))
    assert any("student_loss" in s for s in _steps(wan["sharded"]))  # a student update ran sharded
    doc = json.loads((wan["sharded"] / "validation" / "step_00000004" / "COMPLETE.json").read_text())
    assert doc["status"] == "complete" and doc["ok_slots"] == doc["slots"] > 0
    assert result(wan["sharded"])["status"] == "complete"


def test_a_sharded_run_resumes_exactly_from_its_own_checkpoint(wan):
    split, ckpt = wan["split"], wan["split"] / "checkpoints" / "step_00000002"
    assert result(split)["status"] == "stopped"
    _ok(train(WAN, _sets(wan["data"], split, 2, "train.global_batch_size=2", "distributed.sharding=full_shard",
                         "checkpoint.mode=full_resume", f"checkpoint.path={ckpt}"), nproc=2))
    assert _steps(split) == _steps(wan["sharded"])  # both launches append to one event log
    a, b = split / "checkpoints" / "step_00000004", wan["sharded"] / "checkpoints" / "step_00000004"
    assert (a / "shards.json").is_file()   # saved sharded: every rank its own part
    for role, kind in (("student", "live"), ("student", "ema"), ("student", "optimizer"), ("critic", "live"),
                       ("critic", "optimizer")):
        x, y = role_tensors(a, role, kind), role_tensors(b, role, kind)
        assert x.keys() == y.keys() != set(), (role, kind)
        assert all(torch.equal(x[k].read(), y[k].read()) for k in x), (role, kind)
    for member in ("trainer.json", "student/optimizer.json", "critic/optimizer.json"):
        assert (a / member).read_bytes() == (b / member).read_bytes(), member


@pytest.mark.parametrize("sharding", ["none", "full_shard"])
def test_checkpoints_move_between_sharded_and_unsharded_runs(sharding, wan, tmp_path):
    """A full resume may change distributed.sharding: the sharded run's step-2 checkpoint continues
    unsharded, and an unsharded run's continues sharded; the steps after it match the straight runs
    (a reordered reduction moves the last bits only)."""
    run, first = tmp_path / "moved", "full_shard" if sharding == "none" else "none"
    _ok(train(WAN, _sets(wan["data"], run, 2, "train.global_batch_size=2", f"distributed.sharding={first}",
                         "runtime.exit_after_step=2"), nproc=2))
    _ok(train(WAN, _sets(wan["data"], run, 2, "train.global_batch_size=2", f"distributed.sharding={sharding}",
                         "checkpoint.mode=full_resume", f"checkpoint.path={run / 'checkpoints' / 'step_00000002'}"),
              nproc=2))
    _close(_steps(run), _steps(wan["plain"]))
    assert result(run)["status"] == "complete"


def test_hybrid_shard_over_two_node_groups_matches_unsharded(wan, tmp_path):
    """Two torchrun agents (--nnodes 2, two processes each) meet at one rendezvous: the mesh is two node
    groups of two, sharded within a node and replicated across."""
    port = free_port()
    out = tmp_path / "hybrid"
    sets = _sets(wan["data"], out, 4, "train.global_batch_size=4", "distributed.sharding=hybrid_shard",
                 "runtime.validation_steps=[]", "train.max_steps=3")
    args = ["-m", "solar", "train", "--config", str(WAN)]
    for item in sets:
        args += ["--set", item]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={i}",
                               "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                               "--rdzv-id=hybrid", *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    plain = tmp_path / "plain"
    _ok(train(WAN, _sets(wan["data"], plain, 4, "train.global_batch_size=4", "distributed.sharding=none",
                         "runtime.validation_steps=[]", "train.max_steps=3"), nproc=4))
    manifest = json.loads((out / "launch-manifest.json").read_text())
    assert manifest["topology"]["world_size"] == 4
    _close(_steps(out), _steps(plain))
