"""Periodic validation inside `solar train` and `solar infer` on one generation path (CPU, tiny Wan)."""

from __future__ import annotations

import re

import gzip
import json
import os

import pytest

from solar.config.canonical import blake2s_hex
from solar.data.synth import synthesize
from solar.generation.video import read_frames
from tests.conftest import CONFIGS
from tests.e2e.helpers import TINY, infer, result, train
from tests.support.files import snapshot

pytestmark = pytest.mark.slow

CONFIG = TINY["wan22_ti2v_5b"]
INFER = CONFIGS / "tiny" / "wan22_ti2v_5b" / "infer_stage0p5_fm_81f.yaml"
PASSES = ("live-unipc", "ema-unipc")


@pytest.fixture(scope="module")
def data(wan_data):
    return wan_data


def _sets(data_root, out, *extra):
    return [f"data.root={data_root}", f"runtime.output_dir={out}", "runtime.log_every=100", "train.max_steps=4",
            "runtime.save_every=2", "runtime.validate_every=2", *extra]


def _infer(sets: list[str]):
    return infer(INFER, sets)


def _manifest(root, pass_name, slot):
    return json.loads((root / pass_name / f"slot_{slot:06d}" / "manifest.json").read_text())


def _complete(root):
    return json.loads((root / "COMPLETE.json").read_text())


@pytest.fixture(scope="module")
def validated(wan_stage0p5):
    """``_sets``' run (4 steps, saved and validated every 2), shared with other modules: read-only."""
    return wan_stage0p5


def test_validation_at_two_steps_writes_every_slot_of_every_pass(validated):
    for step in (2, 4):
        root = validated / "validation" / f"step_{step:08d}"
        assert _complete(root) == {"schema": "solar.validation-complete.v1", "step": step, "passes": list(PASSES),
                                   "slots": 4, "ok_slots": 4, "error_slots": 0, "status": "complete"}
        for name in PASSES:
            assert _complete(root / name)["passes"] == [name]
            for slot in (0, 1):
                m = _manifest(root, name, slot)
                assert (m["status"], m["pass"], m["step"], m["slot"], m["solver"], m["steps"]) == \
                    ("ok", name, step, slot, "unipc", 4)
                assert m["weights"] == name.split("-")[0]
                for artifact in m["artifacts"]:
                    data = (root / name / f"slot_{slot:06d}" / artifact["path"]).read_bytes()
                    assert (len(data), blake2s_hex(data)) == (artifact["bytes"], artifact["blake2s"])
                directory = root / name / f"slot_{slot:06d}"
                assert read_frames(directory / "generated.mp4").shape == (81, 64, 96, 3)
                assert read_frames(directory / "compare.mp4").shape == (81, 64, 192, 3)
    plan = json.loads((validated / "validation" / "frozen-plan.json").read_text())
    assert [s["sample_id"] for s in plan["slots"]] == [_manifest(root, "live-unipc", i)["sample_id"] for i in (0, 1)]
    assert [v["step"] for v in result(validated)["validations"]] == [2, 4]
    # compare.mp4 = [ground truth | generated]: the left half is the sample's own clip whatever the
    # weights (every pass and step agree), the right half is the pass's generated video
    for slot in (0, 1):
        lefts, rights = [], []
        for step in (2, 4):
            for name in PASSES:
                directory = validated / "validation" / f"step_{step:08d}" / name / f"slot_{slot:06d}"
                frames = read_frames(directory / "compare.mp4").int()
                lefts.append(frames[:, :, :96])
                rights.append(frames[:, :, 96:])
                generated = read_frames(directory / "generated.mp4").int()
                # the same frames, encoded twice (x264 veryfast at CRF 18 on this noise-like content:
                # ~4.4, against > 15 between different videos)
                assert (rights[-1] - generated).abs().float().mean() < 6
        same = [float((left - lefts[0]).abs().float().mean()) for left in lefts]
        apart = [float((right - lefts[0]).abs().float().mean()) for right in rights]
        # equal up to H.264 (each half is encoded beside a different right half): ~3.4 here, against
        # ~24 between the ground truth and a generated video
        assert max(same) < 6 and min(apart) > 15, (same, apart)
    # the live pass at step 2 and step 4 differ: the model trained in between
    a = read_frames(validated / "validation" / "step_00000002" / "live-unipc" / "slot_000000" / "generated.mp4")
    b = read_frames(validated / "validation" / "step_00000004" / "live-unipc" / "slot_000000" / "generated.mp4")
    assert not (a == b).all()


@pytest.mark.parametrize("weights", ["ema", "live"])
def test_infer_on_the_checkpoint_reproduces_validation_frames(weights, validated, data, tmp_path):
    out = tmp_path / "infer"
    proc = _infer([f"data.root={data}", f"runtime.output_dir={out}", f"checkpoint.weights={weights}",
                   f"checkpoint.path={validated}/checkpoints/step_00000004"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "infer complete: 2/2 slots ok" in proc.stderr
    _slot_lines_add_up(proc.stderr, "model-unipc", slots=2)
    gen, val = out / "generation", validated / "validation" / "step_00000004"
    assert _complete(gen)["status"] == "complete" and _complete(gen)["step"] is None
    for slot in (0, 1):
        m, v = _manifest(gen, "model-unipc", slot), _manifest(val, f"{weights}-unipc", slot)
        assert m["weights"] == weights  # the resolved role of the `model` pass is recorded
        for key in ("sample_id", "start_frame", "noise_seed", "solver", "steps"):
            assert m[key] == v[key], key
        made = read_frames(gen / "model-unipc" / f"slot_{slot:06d}" / "generated.mp4")
        seen = read_frames(val / f"{weights}-unipc" / f"slot_{slot:06d}" / "generated.mp4")
        assert (made == seen).all()  # bit-exact decoded frames


def test_infer_resolves_the_role_from_the_release_manifest(validated, data, tmp_path):
    import shutil

    package = tmp_path / "package"
    shutil.copytree(validated / "checkpoints" / "step_00000004", package)
    (package / "release-manifest.json").write_text(json.dumps(
        {"schema": "solar.release.v1", "load": {"default_weights": "ema"}, "identity": {"name": "tiny"}}))
    out = tmp_path / "infer"
    proc = _infer([f"data.root={data}", f"runtime.output_dir={out}", "checkpoint.weights=null",
                   f"checkpoint.path={package}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _manifest(out / "generation", "model-unipc", 0)["weights"] == "ema"


def test_killed_mid_validation_leaves_no_marker_and_resume_completes_it(data, tmp_path):
    out = tmp_path / "run"
    killed = train(CONFIG, _sets(data, out), extra_env={"SOLAR_INJECT_FAULT": "kill_validation:step=2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    root = out / "validation" / "step_00000002"
    assert not (root / "COMPLETE.json").exists()
    written = sorted(root.glob("*/slot_*/manifest.json"))
    assert len(written) == 1  # killed right after its first slot
    kept = {p: p.read_bytes() for p in written[0].parent.iterdir()}
    resumed = train(CONFIG, _sets(data, out, "checkpoint.mode=full_resume",
                                  f"checkpoint.path={out}/checkpoints/step_00000002"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _complete(root)["status"] == "complete" and _complete(root)["slots"] == 4
    assert {p: p.read_bytes() for p in written[0].parent.iterdir()} == kept  # finished slots are not redone
    assert not list(root.glob("*/.slot_*"))
    assert _complete(out / "validation" / "step_00000004")["status"] == "complete"
    assert result(out)["status"] == "complete"


def test_killed_in_the_last_validation_resumes_from_the_final_checkpoint_and_completes(data, tmp_path):
    """A launch killed after its last checkpoint has only the final validation and run-result left."""
    out = tmp_path / "run"
    killed = train(CONFIG, _sets(data, out), extra_env={"SOLAR_INJECT_FAULT": "kill_validation:step=4"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "checkpoints" / "step_00000004" / "COMPLETE.json").is_file()
    assert not (out / "validation" / "step_00000004" / "COMPLETE.json").exists()
    resumed = train(CONFIG, _sets(data, out, "checkpoint.mode=full_resume",
                                  f"checkpoint.path={out}/checkpoints/step_00000004"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 4 is train.max_steps; nothing left to train" in resumed.stderr
    assert _complete(out / "validation" / "step_00000004")["status"] == "complete"
    assert result(out)["status"] == "complete"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]


def _rewrite_test_index(data, change):
    path = data / "test-index.jsonl.gz"
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    rows = change(rows)
    path.write_bytes(gzip.compress("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()))


@pytest.fixture
def own_data(tmp_path):
    root = tmp_path / "data"
    synthesize("wan22_ti2v_5b", root, samples=4, seed=3)
    return root


def test_a_slot_whose_input_fails_gets_an_error_manifest_and_the_step_is_partial(own_data, tmp_path):
    out = tmp_path / "run"
    first = train(CONFIG, _sets(own_data, out, "runtime.exit_after_step=2"))
    assert first.returncode == 0, first.stderr[-3000:]
    plan = json.loads((out / "validation" / "frozen-plan.json").read_text())
    lost = plan["slots"][1]
    # the sample's bytes rot inside its shard after the plan was frozen
    rows = [json.loads(line) for line in gzip.decompress((own_data / "test-index.jsonl.gz").read_bytes()).splitlines()]
    row = next(r for r in rows if r["sample_id"] == lost["sample_id"])
    with open(own_data / row["shard"], "r+b") as shard:
        shard.seek(row["member_offset"])
        shard.write(b"\xff" * 64)
    resumed = train(CONFIG, _sets(own_data, out, "checkpoint.mode=full_resume",
                                  f"checkpoint.path={out}/checkpoints/step_00000002"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    root = out / "validation" / "step_00000004"
    assert _complete(root) == {"schema": "solar.validation-complete.v1", "step": 4, "passes": list(PASSES),
                               "slots": 4, "ok_slots": 2, "error_slots": 2, "status": "partial"}
    for name in PASSES:
        assert _complete(root / name)["status"] == "partial"
        bad, good = _manifest(root, name, 1), _manifest(root, name, 0)
        assert bad["status"] == "error" and bad["artifacts"] == [] and lost["sample_id"] in bad["error"]
        assert sorted(p.name for p in (root / name / "slot_000001").iterdir()) == ["manifest.json"]
        assert good["status"] == "ok"
    assert f"slot 1 ({lost['sample_id']}) failed" in resumed.stderr
    assert result(out)["validations"][-1]["status"] == "partial"


def test_a_frozen_plan_that_no_longer_matches_is_refused(own_data, tmp_path):
    out = tmp_path / "run"
    assert train(CONFIG, _sets(own_data, out, "runtime.exit_after_step=2")).returncode == 0
    _rewrite_test_index(own_data, lambda rows: rows[::-1])  # the test index was regenerated in another order
    before = snapshot(out)
    resumed = train(CONFIG, _sets(own_data, out, "checkpoint.mode=full_resume",
                                  f"checkpoint.path={out}/checkpoints/step_00000002"))
    assert resumed.returncode == 2
    assert "no longer matches the frozen validation plan (test_index_sample_id_digest: frozen" in resumed.stderr
    assert resumed.stderr.count("\n") == 1
    assert snapshot(out) == before  # nothing written, no directory made


def test_infer_never_overwrites_a_finished_generation(validated, data, tmp_path):
    out = tmp_path / "infer"
    sets = [f"data.root={data}", f"runtime.output_dir={out}", f"checkpoint.path={validated}/checkpoints/step_00000004"]
    assert _infer(sets).returncode == 0
    again = _infer(sets)
    assert again.returncode == 2 and "already holds a finished generation" in again.stderr


def _without_pyav(tmp_path) -> dict:
    """An environment whose ``import av`` fails, as on a machine without PyAV: a package of that name
    ahead of site-packages that raises on import."""
    shadow = tmp_path / "no-pyav" / "av"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'av'\")\n")
    return {"PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}


def test_a_launch_that_could_not_write_its_videos_is_refused_before_any_work(validated, data, tmp_path):
    """Without PyAV every slot would fail after its generation (on a GPU machine: `solar infer`
    generated both 5B slots, then failed both at the video write); the launch is refused at once,
    in one line, exit 2, with nothing written."""
    hidden = _without_pyav(tmp_path)
    out = tmp_path / "infer"
    refused = infer(INFER, [f"data.root={data}", f"runtime.output_dir={out}",
                            f"checkpoint.path={validated}/checkpoints/step_00000004"], extra_env=hidden)
    assert refused.returncode == 2, refused.stderr
    assert "write MP4 files through PyAV, which cannot be imported" in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert not [p for p in out.rglob("*") if p.is_file()]
    run = tmp_path / "run"
    refused = train(CONFIG, _sets(data, run), extra_env=hidden)
    assert refused.returncode == 2 and "pip install 'av>=12'" in refused.stderr
    assert not [p for p in run.rglob("*") if p.is_file()]
    trains = train(CONFIG, _sets(data, tmp_path / "plain", "runtime.validate_every=0"), extra_env=hidden)
    assert trains.returncode == 0, trains.stderr   # a run that writes no video does not need PyAV


@pytest.mark.parametrize("layout", [["distributed.sharding=full_shard", "train.global_batch_size=2"],
                                    ["distributed.sequence_parallel_size=2", "train.global_batch_size=1"]])
def test_slots_belong_to_logical_dp_ranks_under_torchrun(layout, tmp_path):
    data = tmp_path / "data"
    synthesize("wan22_ti2v_5b", data, samples=12, seed=3)  # three test rows
    out = tmp_path / "run"
    # one decoded latent per slot: ownership and equality do not need whole clips
    proc = train(CONFIG, _sets(data, out, "distributed.world_size=2", "train.max_steps=2", "validation.sample_count=3",
                               "validation.decode_latents=1", *layout), nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = out / "validation" / "step_00000002"
    assert _complete(root)["status"] == "complete" and _complete(root)["slots"] == 6
    dp_world = 1 if "sequence_parallel_size=2" in layout[0] else 2
    for name in PASSES:
        for slot in range(3):
            m = _manifest(root, name, slot)
            assert m["status"] == "ok" and m["logical_dp_rank"] == slot % dp_world
    # the same checkpoint generated by one process gives the same frames
    gen = tmp_path / "infer"
    single = _infer([f"data.root={data}", f"runtime.output_dir={gen}", "checkpoint.weights=live",
                     f"checkpoint.path={out}/checkpoints/step_00000002", "validation.sample_count=3",
                     "validation.decode_latents=1"])
    assert single.returncode == 0, single.stderr[-3000:]
    for slot in range(3):
        a = read_frames(gen / "generation" / "model-unipc" / f"slot_{slot:06d}" / "generated.mp4").float()
        b = read_frames(root / "live-unipc" / f"slot_{slot:06d}" / "generated.mp4").float()
        assert (a - b).abs().mean() < 0.5, slot  # SP reorders float sums; sharding alone does not


def test_validation_leaves_training_untouched(validated, data, tmp_path):
    """EMA swapped in and back, no RNG drawn from the training streams: the same run without
    validation ends with the same bytes."""
    plain = tmp_path / "plain"
    assert train(CONFIG, _sets(data, plain, "runtime.validate_every=0")).returncode == 0
    assert not (plain / "validation").exists()
    for member in ("model/live.safetensors", "model/ema.safetensors", "model/optimizer.safetensors",
                   "rng/rank-00000.json", "data/rank-00000.json"):
        a = (plain / "checkpoints" / "step_00000004" / member).read_bytes()
        assert a == (validated / "checkpoints" / "step_00000004" / member).read_bytes(), member


SLOT_LINE = re.compile(r"solar: (\S+) slot (\d+)/(\d+) \((\S+)\) ([\d.]+)s \((.*)\)$")
PHASES = ("read", "generate", "truth", "decode", "encode", "files")


def _slot_lines_add_up(stderr: str, name: str, *, slots: int) -> None:
    """The per-slot timing line: one per slot of the pass, every phase of the slot's path named once in
    order, and the phases adding up to the slot's total (each rounded to 0.1 s)."""
    found = [m for m in map(SLOT_LINE.search, stderr.splitlines()) if m and m.group(1) == name]
    assert sorted(int(m.group(2)) for m in found) == list(range(1, slots + 1)), stderr[-2000:]
    for m in found:
        parts = m.group(6).split()
        names, values = parts[0::2], [float(v) for v in parts[1::2]]
        assert tuple(names) == PHASES, m.group(0)
        assert all(v >= 0 for v in values) and abs(sum(values) - float(m.group(5))) <= 0.05 * len(values) + 0.05, \
            m.group(0)
