"""`solar train` end to end on CPU: families under torchrun, exact resume, SP, faults, run dirs."""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from solar.data.synth import synthesize
from solar.launch.materialize import role_tensors
from tests.e2e.helpers import TINY, result, steps, train
from tests.support.files import snapshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(wan_data, tmp_path_factory):
    base = tmp_path_factory.mktemp("synth")
    synthesized = {f: synthesize(f, base / f, samples=4, seed=1) and base / f for f in TINY if f != "wan22_ti2v_5b"}
    return {"wan22_ti2v_5b": wan_data, **synthesized}


def _events(run, rank):
    return [json.loads(line) for line in (run / "events" / f"rank-{rank:05d}.jsonl").read_text().splitlines()]


def _sets(data_root, out, *extra):
    return [f"data.root={data_root}", f"runtime.output_dir={out}", "runtime.log_every=100", *extra]


@pytest.mark.parametrize("family", list(TINY))
def test_tiny_stage0p5_under_torchrun_learns(family, data, tmp_path):
    out = tmp_path / "run"
    lora = family in ("ltx25_video", "minimax_h3")
    world = ["distributed.world_size=2"] + ([] if family == "minimax_h3" else ["train.global_batch_size=8"])
    if family == "minimax_h3":
        world.append("train.global_batch_size=4")  # SP 2: one logical DP rank
    # The tiny configs validate every 4 steps (full-length decodes and encodes, most of this test's time):
    # validate once, at step 20, instead, so every family still decodes whole clips in both passes under
    # torchrun, and trains on after a validation. 30 steps: the mean loss of the last 10 is 0.2-0.4 below the
    # first 10's in every family (60 steps only widened that gap).
    proc = train(TINY[family], _sets(data[family], out, *world, "train.micro_batch_size=2",
                                     "train.gradient_accumulation=2", "train.max_steps=30", "runtime.save_every=15",
                                     "runtime.validate_every=0", "runtime.validation_steps=[20]",
                                     f"train.optimizer.lr={'1e-2' if lora else '1e-3'}"),
                 nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [e["loss_mean"] for e in steps(out)]
    assert len(losses) == 30
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first - 0.05, (first, last)
    assert result(out)["status"] == "complete"
    assert steps(out, rank=1)[0]["loss_mean"] == losses[0]  # every rank agrees on the mean


@pytest.mark.parametrize("sharding, saving", [("full_shard", "sync"), ("none", "async")])
def test_resume_is_bitwise_exact(sharding, saving, data, tmp_path):
    """The interrupted run saves in the background when ``saving`` is async (with one more save at step
    2, committed while training goes on); its checkpoints equal the uninterrupted run's synchronous
    ones byte for byte. (A synchronous unsharded resume is exercised by the SIGTERM and solar-run tests.)"""
    base = _sets(data["wan22_ti2v_5b"], "{out}", "distributed.world_size=2", "train.global_batch_size=2",
                 "train.max_steps=6", "runtime.save_every=0", "data.random_start=true", "data.shuffle_buffer=2",
                 f"distributed.sharding={sharding}",
                 # the config's validation at step 4 (between the interruption and the end) stays; decoding one
                 # latent of each slot instead of the whole clip keeps it short
                 "validation.decode_latents=1")
    fill = lambda out: [s.replace("{out}", str(out)) for s in base]  # noqa: E731
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert train(TINY["wan22_ti2v_5b"], fill(straight), nproc=2).returncode == 0
    background = ["runtime.async_checkpoint=true", "runtime.save_steps=[2]"] if saving == "async" else []
    first = train(TINY["wan22_ti2v_5b"], fill(split) + background + ["runtime.exit_after_step=3"], nproc=2)
    assert first.returncode == 0 and result(split)["status"] == "stopped", first.stderr[-2000:]
    resumed = train(TINY["wan22_ti2v_5b"], fill(split) + background + [
        "checkpoint.mode=full_resume", f"checkpoint.path={split}/checkpoints/step_00000003"], nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert result(split)["status"] == "complete"
    if saving == "async":
        assert [c["step"] for c in result(split)["checkpoints"]] == [6]
        saves = [e for e in _events(split, 0) if e["event"] == "checkpoint"]
        assert [e["step"] for e in saves] == [2, 3, 6] and all("blocking_seconds" in e for e in saves)
        assert not list((split / "checkpoints").glob(".*partial"))
    a, b = straight / "checkpoints" / "step_00000006", split / "checkpoints" / "step_00000006"
    for kind in ("live", "ema", "optimizer"):   # whole files, or every rank's shards under FSDP2
        x, y = role_tensors(a, "model", kind), role_tensors(b, "model", kind)
        assert x.keys() == y.keys() != set() and all(torch.equal(x[k].read(), y[k].read()) for k in x), kind
    for member in ("model/optimizer.json", "trainer.json", "rng/rank-00000.json", "rng/rank-00001.json",
                   "data/rank-00000.json", "data/rank-00001.json"):
        assert (a / member).read_bytes() == (b / member).read_bytes(), member
    if sharding == "none":
        for member in ("model/live.safetensors", "model/ema.safetensors", "model/optimizer.safetensors"):
            assert (a / member).read_bytes() == (b / member).read_bytes(), member
    for rank in (0, 1):
        assert [e["loss"] for e in steps(straight, rank)] == [e["loss"] for e in steps(split, rank)]
    assert (split / "launches").is_dir()  # the resumed launch is recorded beside the first
    usage = result(split)["usage"]  # GPU time: both launches, world size x wall time each
    assert [(a["status"], a["world_size"]) for a in usage["attempts"]] == [("stopped", 2), ("complete", 2)]
    assert all(a["gpu_seconds"] > 0 and a["gpu_seconds"] == pytest.approx(2 * a["wall_seconds"], abs=2e-3)
               for a in usage["attempts"])
    assert usage["gpu_seconds"] == pytest.approx(sum(a["gpu_seconds"] for a in usage["attempts"]), abs=2e-3)


def test_fsdp2_and_activation_checkpointing_match_plain_data_parallel(data, tmp_path):
    common = ["distributed.world_size=2", "train.global_batch_size=2", "train.max_steps=3", "runtime.save_every=0"]
    plain, sharded = tmp_path / "plain", tmp_path / "sharded"
    assert train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], plain, *common), nproc=2).returncode == 0
    proc = train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], sharded, *common, "distributed.sharding=full_shard",
                                              "distributed.activation_checkpointing=true"), nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for x, y in zip(steps(plain), steps(sharded)):
        assert abs(x["loss"] - y["loss"]) < 1e-5
    a = load_file(plain / "checkpoints" / "step_00000003" / "model" / "live.safetensors")
    b = {k: v.read() for k, v in role_tensors(sharded / "checkpoints" / "step_00000003", "model", "live").items()}
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.parametrize("fault, rank, error_type, fragment", [
    ("nan_batch", 1, "non_finite", "rank 1: non-finite loss nan at step 2 (sample 'synth-train-"),
    ("raise", 0, "error", "rank 0: RuntimeError: injected fault (SOLAR_INJECT_FAULT) at step 2"),
])
def test_injected_faults_end_every_rank_together(fault, rank, error_type, fragment, data, tmp_path):
    out = tmp_path / "run"
    started = time.monotonic()
    proc = train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], out, "distributed.world_size=2",
                                              "train.global_batch_size=2", "train.max_steps=4"), nproc=2,
                 extra_env={"SOLAR_INJECT_FAULT": f"{fault}:step=2:rank={rank}"})
    assert time.monotonic() - started < 60
    assert proc.returncode != 0
    doc = result(out)
    assert doc["status"] == "failed" and doc["error_type"] == error_type
    assert fragment in doc["message"]
    for r in (0, 1):
        errors = [json.loads(line) for line in (out / "events" / f"rank-{r:05d}.jsonl").read_text().splitlines()
                  if '"error"' in line]
        assert errors and errors[-1]["message"] == doc["message"]
    assert "solar: error:" in proc.stderr


def test_finished_run_directory_is_not_reused(data, tmp_path):
    out = tmp_path / "run"
    sets = _sets(data["wan22_ti2v_5b"], out, "train.max_steps=2")
    assert train(TINY["wan22_ti2v_5b"], sets).returncode == 0
    before = snapshot(out)
    again = train(TINY["wan22_ti2v_5b"], sets)
    assert again.returncode == 2 and "already holds run" in again.stderr and again.stderr.count("\n") == 1
    assert snapshot(out) == before


def test_sigterm_saves_and_stops(data, tmp_path):
    out = tmp_path / "run"
    proc = train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], out, "train.max_steps=100000",
                                              "runtime.save_every=0", "train.optimizer.warmup_steps=1"), wait=False)
    events = out / "events" / "rank-00000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (events.exists() and '"step"' in events.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = result(out)
    assert doc["status"] == "stopped" and doc["checkpoints"]
    from solar.storage.checkpoints import verify

    assert verify(doc["checkpoints"][-1]["path"])["valid"]


def test_weights_only_init_and_contract_checks(data, tmp_path):
    source = tmp_path / "source"
    assert train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], source, "train.max_steps=2")).returncode == 0
    ckpt = source / "checkpoints" / "step_00000002"
    child = tmp_path / "child"
    proc = train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], child, "train.max_steps=2",
                                               "checkpoint.mode=weights_only", f"checkpoint.path={ckpt}",
                                               "checkpoint.weights=ema"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    launch = json.loads((child / "launch-manifest.json").read_text())
    assert launch["init"] == {"mode": "weights_only", "sources": [{"role": "model", "path": str(ckpt), "weights": "ema"}]}
    wrong = train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], tmp_path / "wrong", "train.max_steps=2",
                                               "checkpoint.mode=weights_only", f"checkpoint.path={ckpt}",
                                               "checkpoint.weights=live", "model.camera_translation_transform=logd4"))
    assert wrong.returncode == 2
    assert "its camera translation transform is linear, this run uses logd4" in wrong.stderr
    missing = train(TINY["wan22_ti2v_5b"], _sets(data["wan22_ti2v_5b"], tmp_path / "missing", "train.max_steps=2",
                                                 "checkpoint.mode=weights_only", f"checkpoint.path={ckpt}x",
                                                 "checkpoint.weights=live"))
    assert missing.returncode == 2 and "is not usable: not a directory" in missing.stderr
