"""Sharded checkpoints (issue 38) under torchrun over gloo: a world-4 FSDP2 save is every rank's own
shards through torch.distributed.checkpoint; it verifies only whole; it initialises runs at world 2
sharded and world 1 unsharded with the saved weights bit for bit, generates with `solar infer`,
resumes at another sharding, exports to the whole files an unsharded save writes, and is a base model
(model.pretrained_path) with the weights its export holds."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.helpers import TINY, infer, result, steps, train

pytestmark = pytest.mark.slow

CONFIG = TINY["wan22_ti2v_5b"]
INFER = CONFIG.parent / "infer_stage0p5_fm_81f.yaml"


def _sets(data, out, world, *extra, sharding="full_shard"):
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=100",
            f"distributed.world_size={world}", f"distributed.sharding={sharding}", "train.global_batch_size=4",
            f"train.gradient_accumulation={4 // world}", "runtime.validate_every=0", "runtime.validation_steps=[]",
            *extra]


@pytest.fixture(scope="module")
def sharded(wan_data, tmp_path_factory):
    """Tiny Wan Stage0.5 at world 4, full_shard: checkpoints at steps 2 and 3 (3 steps), then stopped."""
    run = tmp_path_factory.mktemp("sharded") / "run"
    proc = train(CONFIG, _sets(wan_data, run, 4, "train.max_steps=4", "runtime.save_every=0",
                               "runtime.save_steps=[2]", "runtime.exit_after_step=3"), nproc=4, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def _whole(path):
    return {k: load_file(path / "model" / f"{k}.safetensors") for k in ("live", "ema")}


def test_every_rank_writes_its_own_shards_and_verify_needs_them_all(sharded, cli, tmp_path):
    ckpt = sharded / "checkpoints" / "step_00000002"
    report = json.loads(cli("checkpoint", "verify", str(ckpt)).out)
    assert report["valid"], report["problems"]
    role = report["roles"]["model"]
    assert role["layout"] == "sharded" and role["weights"] == ["live", "ema"]
    shard_files = sorted(p for p in (ckpt / "shards").iterdir())
    assert len(shard_files) == 4 and [m for m in role["members"] if m.startswith("shards/")] == \
        [f"shards/{p.name}" for p in shard_files]
    assert not (ckpt / "model" / "live.safetensors").exists()
    sizes = [p.stat().st_size for p in shard_files]
    assert all(abs(size / sum(sizes) - 0.25) < 0.03 for size in sizes), sizes   # each rank about a quarter
    # a rank's part gone: the checkpoint no longer verifies, and the loaders never see it as one
    copy = tmp_path / "checkpoints" / "step_00000002"
    shutil.copytree(ckpt, copy)
    (copy / "shards" / shard_files[1].name).unlink()
    broken = cli("checkpoint", "verify", str(copy))
    assert broken.code == 2 and f"member shards/{shard_files[1].name} is missing" in broken.out


def test_shard_coverage_is_checked_row_by_row(sharded):
    from solar.storage.checkpoints import _shard_problems

    ckpt = sharded / "checkpoints" / "step_00000002"
    files = sorted(f"shards/{p.name}" for p in (ckpt / "shards").iterdir())
    assert _shard_problems(ckpt, files) == []
    problems = _shard_problems(ckpt, files[:3])
    assert problems and all(" of " in p and "rows" in p for p in problems)
    assert all(p.startswith("tensor model/") for p in problems)
    # a rank's file counted twice (a foreign copy of its rows): every tensor holds more rows than it has
    doubled = _shard_problems(ckpt, files + files[:1])
    held = [re.search(r"hold (\d+) of (\d+) rows", p) for p in doubled]
    assert doubled and all(m and int(m.group(1)) > int(m.group(2)) for m in held), doubled[:3]


def test_weights_load_at_world_2_sharded_and_world_1_unsharded_bit_for_bit(sharded, wan_data, tmp_path, cli):
    """A step at learning rate 0 (linear decay to 0 over one step) changes no weight, so each run's own
    save holds what it loaded."""
    source = sharded / "checkpoints" / "step_00000002"
    exported = tmp_path / "export"
    done = cli("checkpoint", "export", str(source), "--out", str(exported))
    assert done.code == 0, done.err
    saved = _whole(exported)
    init = ["checkpoint.mode=weights_only", f"checkpoint.path={source}", "checkpoint.weights=live",
            "train.optimizer.schedule=linear", "train.optimizer.min_lr_ratio=0", "train.optimizer.warmup_steps=0",
            "train.optimizer.weight_decay=0", "train.max_steps=1", "runtime.save_every=1"]
    for world, sharding in ((2, "full_shard"), (1, "none")):
        out = tmp_path / f"w{world}"
        proc = train(CONFIG, _sets(wan_data, out, world, *init, sharding=sharding), nproc=world, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ckpt = out / "checkpoints" / "step_00000001"
        if sharding == "none":
            assert (ckpt / "model" / "live.safetensors").is_file()   # unsharded: today's whole files
            live = load_file(ckpt / "model" / "live.safetensors")
        else:
            again = tmp_path / f"export-w{world}"
            assert cli("checkpoint", "export", str(ckpt), "--out", str(again)).code == 0
            live = _whole(again)["live"]
        assert live.keys() == saved["live"].keys()
        assert all(torch.equal(live[k], saved["live"][k]) for k in live)
        if sharding == "none":
            # the export writes exactly what an unsharded save writes for the same weights
            assert (ckpt / "model" / "live.safetensors").read_bytes() == \
                (exported / "model" / "live.safetensors").read_bytes()


def test_solar_infer_generates_from_a_sharded_checkpoint_as_from_its_export(sharded, wan_data, tmp_path, cli):
    from solar.generation.video import read_frames

    source = sharded / "checkpoints" / "step_00000002"
    exported = tmp_path / "export"
    assert cli("checkpoint", "export", str(source), "--out", str(exported)).code == 0
    assert json.loads((exported / "release-manifest.json").read_text())["load"]["default_weights"] == "ema"
    frames = []
    # the run's step-3 checkpoint too: frames that depend on the weights differ from it. Two latents are
    # decoded: TI2V's first one is the image condition, the same whatever the weights (with one latent the
    # frames of every checkpoint were equal)
    for name, path in (("sharded", source), ("export", exported), ("other", sharded / "checkpoints" / "step_00000003")):
        out = tmp_path / f"infer-{name}"
        proc = infer(INFER, [f"data.root={wan_data}", f"checkpoint.path={path}", "checkpoint.weights=ema",
                             f"runtime.output_dir={out}", "validation.sample_count=1", "validation.decode_latents=2"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        [slot] = sorted((out / "generation").glob("*/slot_000000"))
        frames.append(read_frames(slot / "generated.mp4"))
    assert torch.equal(frames[0], frames[1])
    assert not torch.equal(frames[0], frames[2])   # the rows read are the weights, not something both paths share


def test_a_sharded_checkpoint_resumes_at_another_world(wan_data, tmp_path):
    """A world-4 sharded run stopped after step 3 goes on from its step-2 checkpoint sharded at world 2
    (accumulation 2: the same global batch), with the uninterrupted world-4 run's steps 3 and 4, each
    rank reading its rows of every role from the world-4 shards. (From a sharded checkpoint to an
    unsharded run at another world: tests/e2e/test_topology.py.)"""
    reference = tmp_path / "reference"
    proc = train(CONFIG, _sets(wan_data, reference, 4, "train.max_steps=4", "runtime.save_every=0"), nproc=4,
                 timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = {e["step"]: e for e in steps(reference)}
    run = tmp_path / "run"
    first = train(CONFIG, _sets(wan_data, run, 4, "train.max_steps=4", "runtime.save_every=0",
                                "runtime.save_steps=[2]", "runtime.exit_after_step=3"), nproc=4, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    proc = train(CONFIG, _sets(wan_data, run, 2, "train.max_steps=4", "runtime.save_every=0",
                               "runtime.save_steps=[2]", "checkpoint.mode=full_resume",
                               f"checkpoint.path={run / 'checkpoints' / 'step_00000002'}"), nproc=2, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the resumed launch's own steps (the event log holds both launches: the first one's step 3 too)
    events = [json.loads(line) for line in (run / "events" / "rank-00000.jsonl").read_text().splitlines()]
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    assert len(starts) == 2
    resumed = [e for e in events[starts[-1]:] if e["event"] == "step"]
    assert [e["step"] for e in resumed] == [3, 4]   # from step_2: step 3 again, then 4
    for e in resumed:
        for key in ("loss_mean", "grad_norm"):
            assert e[key] == pytest.approx(want[e["step"]][key], rel=1e-5), (e["step"], key)
    assert result(run)["status"] == "complete"


@pytest.mark.parametrize("saving", ["sync", "async"])
def test_a_rank_meeting_a_full_volume_fails_every_rank_with_the_path(saving, wan_data, tmp_path):
    """Rank 1's shard write fails inside torch.distributed.checkpoint as a full volume's would: every
    rank ends with the classified one-line error naming the directory, the partial is removed, and the
    earlier checkpoint stays valid."""
    from solar.storage import checkpoints as ckpt

    out = tmp_path / "run"
    background = ["runtime.async_checkpoint=true"] if saving == "async" else []
    proc = train(CONFIG, _sets(wan_data, out, 2, "train.max_steps=4", "runtime.save_every=2", *background),
                 nproc=2, extra_env={"SOLAR_ALLOW_FAULTS": "1", "SOLAR_INJECT_FAULT": "enospc:step=4:rank=1"},
                 timeout=600)
    assert proc.returncode != 0
    _every_rank_says_the_volume_is_full(proc.stderr, out, world=2)
    assert "CheckpointException" not in proc.stderr   # DCP's gathered failure is raised as the rank's own error
    doc = result(out)
    assert doc["status"] == "failed" and doc["error_type"] == "storage_full"
    assert not [p for p in (out / "checkpoints").iterdir() if ckpt.PARTIAL_DIR.match(p.name)]
    assert [(c["step"], c["valid"]) for c in ckpt.list_checkpoints(out)] == [(2, True)]


def _every_rank_says_the_volume_is_full(stderr: str, out, *, world: int) -> None:
    """One classified line per rank naming the checkpoint directory, and no rank's traceback (torchrun's
    own summary of the failed ranks is its business: no frame of the trainer appears in it)."""
    lines = [line for line in stderr.splitlines() if line.startswith("solar: error:")]
    assert len(lines) == world, stderr[-3000:]
    assert all("checkpoint step 4: " in line and "no space left" in line and str(out / "checkpoints") in line
               for line in lines), lines
    assert "solar/train/" not in stderr and "solar/launch/" not in stderr, stderr[-3000:]


@pytest.fixture
def small_volume(tmp_path):
    """A tmpfs mounted for the test (root only; skipped elsewhere), unmounted after it."""
    import subprocess

    where = tmp_path / "volume"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_volume_that_fills_during_a_sharded_save_fails_every_rank_through_dcps_own_writer(small_volume, wan_data):
    """No injected fault: two ranks each see room for their own shards, the volume holds less than both,
    and the one whose write meets ENOSPC inside torch.distributed.checkpoint's writer fails the save on
    every rank; the partial goes and the step-2 checkpoint stays valid."""
    import subprocess

    from solar.storage import checkpoints as ckpt

    out = small_volume / "run"
    first = train(CONFIG, _sets(wan_data, out, 2, "train.max_steps=4", "runtime.save_every=2",
                                "runtime.exit_after_step=2"), nproc=2, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    used = shutil.disk_usage(small_volume).used
    size = sum(p.stat().st_size for p in (out / "checkpoints" / "step_00000002").rglob("*") if p.is_file())
    # room for three quarters of the next checkpoint: more than one rank's half, less than both
    limit = (used + size * 3 // 4) // 4096 * 4096
    subprocess.run(["mount", "-o", f"remount,size={limit}", str(small_volume)], check=True)
    proc = train(CONFIG, _sets(wan_data, out, 2, "train.max_steps=4", "runtime.save_every=2",
                               "checkpoint.mode=full_resume", f"checkpoint.path={out / 'checkpoints' / 'step_00000002'}"),
                 nproc=2, timeout=600)
    assert proc.returncode != 0
    _every_rank_says_the_volume_is_full(proc.stderr, out, world=2)
    doc = result(out)
    assert doc["status"] == "failed" and doc["error_type"] == "storage_full"
    assert not [p for p in (out / "checkpoints").iterdir() if ckpt.PARTIAL_DIR.match(p.name)]
    assert [(c["step"], c["valid"]) for c in ckpt.list_checkpoints(out)] == [(2, True)]


def test_a_sharded_checkpoint_is_a_base_model_with_the_weights_its_export_holds(sharded, wan_data, tmp_path, cli):
    """``model.pretrained_path`` = the world-4 sharded checkpoint: the launch's check accepts it and a
    world-1 model starts with its EMA assembled from the four ranks' shards, as its export holds it;
    the launch's line says how to take the live weights instead (docs/base-model.md)."""
    from solar.config.resolve import resolve_file
    from solar.train.setup import base_note, build_parts, preflight_weights

    source = sharded / "checkpoints" / "step_00000002"
    exported = tmp_path / "export"
    assert cli("checkpoint", "export", str(source), "--out", str(exported)).code == 0
    ema = _whole(exported)["ema"]
    resolved = resolve_file(str(CONFIG), [*_sets(wan_data, tmp_path / "run", 1, sharding="none"),
                                          f"model.pretrained_path={source}"], expected_action="train")
    preflight_weights(resolved)
    parts = build_parts(resolved, 0, torch.device("cpu"))
    parts.stream.close()
    state = parts.model.state_dict()
    assert state.keys() == ema.keys() and all(torch.equal(state[k], ema[k]) for k in ema)
    assert "`solar checkpoint export` it and name its model/live.safetensors" in base_note(resolved.config)
