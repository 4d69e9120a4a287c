"""Stage2's LoRA roles on one base (tiny MiniMax-H3 on a released base, world 4 at the route's SP 4,
gloo, fp32 on CPU): student, teacher and critic find their frozen bases hold the same bytes and build
one model with an adapter each, sharded or not. The per-step losses and gradient norms and the
validation videos equal those of the same run with a copy of the base per role
(``SOLAR_SHARED_LORA_BASE=0``); the model holds the base once; a sharded run's checkpoint holds each
role as a single-role model names it and continues exactly in an unsharded run with a copy per role."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from solar.config import families
from solar.data.synth import synthesize
from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import env, result, train

pytestmark = pytest.mark.slow

H3 = CONFIGS / "tiny" / "minimax_h3" / "train_stage2_sgf_158f.yaml"
KEYS = ("loss", "grad_norm", "student_loss", "student_grad_norm")
SEPARATE = {"SOLAR_SHARED_LORA_BASE": "0"}


def _events(run, kind: str) -> list[dict]:
    lines = (run / "events" / "rank-00000.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def _steps(run) -> list[dict]:
    return [{k: e[k] for k in ("step", *KEYS) if k in e} for e in _events(run, "step")]


def _videos(run) -> dict[str, str]:
    root = run / "validation" / "step_00000003"
    out = {}
    for manifest in sorted(root.glob("*/slot_*/manifest.json")):
        doc = json.loads(manifest.read_text())
        assert doc["status"] == "ok", doc
        out.update({f"{manifest.parent.parent.name}/{a['path']}": a["blake2s"] for a in doc["artifacts"]})
    return out


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def h3(tmp_path_factory):
    """A tiny "released" H3 base (a diffusers transformer with random weights through the real
    `solar model convert`) and synthetic data."""
    from tests.unit.models.family_helpers import h3_reference

    root = tmp_path_factory.mktemp("h3-shared")
    h3_reference(families.spec("minimax_h3").dims("tiny"), seed=7).save_pretrained(root / "diffusers")
    _ok(subprocess.run([sys.executable, "-m", "solar", "model", "convert", "--family", "minimax-h3", "--from",
                        "diffusers", str(root / "diffusers"), "--out", str(root / "base")], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=120))
    synthesize("minimax_h3", root / "data", samples=4, seed=5)
    return root


def _run(h3, name, *extra, extra_env=None):
    # one critic update per student update: the student updates from step 2 on, saved with the step-2
    # checkpoint (with its EMA)
    out = h3 / name
    sets = [f"data.root={h3 / 'data'}", f"runtime.output_dir={out}", f"model.pretrained_path={h3 / 'base'}",
            "runtime.log_every=100", "train.max_steps=3", "train.sgf.critic_updates_per_student=1",
            "runtime.save_every=0", "runtime.save_steps=[2]", "runtime.validate_every=0",
            "validation.decode_latents=7", *extra]
    return _ok(train(H3, sets, nproc=4, extra_env=extra_env, timeout=600))


@pytest.fixture(scope="module")
def shared(h3):
    """The straight unsharded run on the shared base, validated at its last step."""
    return _run(h3, "shared", "runtime.validation_steps=[3]")


def test_roles_share_one_base_and_train_as_with_a_copy_each(h3, shared):
    _run(h3, "separate", "runtime.validation_steps=[3]", extra_env=SEPARATE)
    assert "share one LoRA base" in shared.stderr
    [one] = _events(h3 / "shared", "models")
    [model] = one["models"]
    assert model["roles"] == ["student", "teacher", "critic"]
    [apart] = _events(h3 / "separate", "models")
    assert [m["roles"] for m in apart["models"]] == [["student"], ["teacher"], ["critic"]]
    assert model["parameter_bytes"] < sum(m["parameter_bytes"] for m in apart["models"]) / 2  # the base once
    assert _steps(h3 / "shared") == _steps(h3 / "separate")
    assert any("student_loss" in s for s in _steps(h3 / "shared"))
    assert _videos(h3 / "shared") == _videos(h3 / "separate") != {}
    assert result(h3 / "shared")["status"] == "complete"


def test_sharded_shared_base_checkpoint_continues_unsharded_with_a_copy_each(h3, shared):
    """full_shard over the four ranks to the step-2 checkpoint, then a full resume unsharded with a
    copy of the base per role: every step as the straight unsharded run (reduction order aside)."""
    from solar.launch.materialize import role_tensors

    run = h3 / "moved"
    _run(h3, "moved", "distributed.sharding=full_shard", "runtime.exit_after_step=2", "runtime.validation_steps=[]")
    ckpt = run / "checkpoints" / "step_00000002"
    for role in ("student", "critic"):  # adapter-only, named as a single-role model names them
        names = list(role_tensors(ckpt, role, "live"))   # every rank's shards of them
        assert names and all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in names), names[:4]
    _run(h3, "moved", "runtime.validation_steps=[]", "checkpoint.mode=full_resume", f"checkpoint.path={ckpt}",
         extra_env=SEPARATE)
    moved, straight = _steps(run), _steps(h3 / "shared")
    assert [s["step"] for s in moved] == [s["step"] for s in straight] == list(range(1, 4))
    for x, y in zip(moved, straight):
        for key in KEYS:
            assert (key in x) == (key in y)
            if key in x:
                assert abs(x[key] - y[key]) <= 1e-5 * max(1.0, abs(y[key])), (key, x, y)
    assert result(run)["status"] == "complete"
