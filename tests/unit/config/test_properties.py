"""Property tests: resolve either succeeds with consistent arithmetic or fails cleanly."""

from __future__ import annotations

import io
import json
import sys
from contextlib import contextmanager

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from solar.cli import main
from solar.config import families
from solar.config.guards import walk
from solar.config.loader import read_document
from solar.config.resolve import resolve_file
from solar.errors import ConfigError
from tests.conftest import CONFIGS

BASE = ["data.root=/data", "runtime.output_dir=/out"]
CONFIG_POOL = [
    CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml",
    CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml",
    CONFIGS / "tiny" / "minimax_h3" / "train_stage1_tf_anyflow_158f.yaml",
    CONFIGS / "tiny" / "ltx25" / "train_stage0p5_fm_153f.yaml",
    CONFIGS / "wan22_i2v_a14b" / "train_stage0p5_fm_81f.yaml",
]
RELEASED_SETS = ["model.pretrained_path=/w", "model.vae_path=/v"]


@contextmanager
def captured():
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    result = {}
    try:
        yield result
    finally:
        sys.stdout, sys.stderr = saved
        out.flush(), err.flush()
        result["out"] = out.buffer.getvalue().decode()
        result["err"] = err.buffer.getvalue().decode()


def _sets_for(path):
    return BASE + ([] if "tiny" in path.parts else RELEASED_SETS)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(CONFIG_POOL),
       world=st.integers(1, 96), sp=st.integers(1, 8), micro=st.integers(1, 4), accum=st.integers(1, 4),
       global_batch=st.one_of(st.none(), st.integers(1, 512)))
def test_random_topologies(path, world, sp, micro, accum, global_batch):
    sets = _sets_for(path) + [f"distributed.world_size={world}", f"distributed.sequence_parallel_size={sp}",
                              f"train.micro_batch_size={micro}", f"train.gradient_accumulation={accum}",
                              f"train.global_batch_size={'' if global_batch is None else global_batch}"]
    try:
        resolved = resolve_file(path, sets)
    except ConfigError as exc:
        message = str(exc)
        assert message and "\n" not in message
        return
    topo = resolved.topology
    cfg = resolved.config
    heads = families.spec(cfg.model.family).dims(cfg.model.profile).num_heads
    assert world % sp == 0 and heads % sp == 0
    assert topo.logical_dp_world_size == world // sp
    assert topo.global_batch_size == topo.logical_dp_world_size * micro * accum
    assert global_batch in (None, topo.global_batch_size)
    assert cfg.train.global_batch_size == topo.global_batch_size
    rule = families.spec(cfg.model.family).sp_rules.get(("train", cfg.train.stage))
    assert rule in (None, sp)


def _keys(path):
    _, tree = read_document(path)
    return sorted({k for k, _, _ in walk(tree) if not k.split(".")[-1].isdigit()})


KEY_POOL = sorted({k for p in CONFIG_POOL for k in _keys(p)} | {
    "model.dims.num_heads", "model.dims.head_dim", "model.lora.rank", "train.anyflow.diffusion_ratio",
    "train.sgf.rollout_latents", "checkpoint.roles.student.path", "inference.sample_count",
    "validation.passes", "no.such.key", "model.family.deeper"})
VALUE = st.one_of(
    st.integers(-3, 300).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["true", "false", "null", "", "[]", "{}", "[1, 2]", "{a: 1}", ".nan", "-.inf",
                     "linear", "logd4", "ema", "live", "model", "stage1", "stage2", "teacher_forcing",
                     "anyflow_forward_map", "v1_5", "roles", "weights_only", "full_resume", "/path/to/x",
                     "${UNSET_SOLAR_VAR}", "[{name: p, weights: live, solver: unipc, steps: 2}]",
                     "'quoted'", "{b: 1, b: 2}", "[", "::", "minimax-h3", "ltx-2.5", "153", "158"]),
    st.text(max_size=12),
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(CONFIG_POOL),
       edits=st.lists(st.tuples(st.sampled_from(KEY_POOL), VALUE), max_size=4))
def test_random_set_edits_never_crash(path, edits):
    argv = ["config", "resolve", "--config", str(path)]
    for item in _sets_for(path) + [f"{k}={v}" for k, v in edits]:
        argv += ["--set", item]
    with captured() as io_result:
        code = main(argv)
    assert code in (0, 2), io_result["err"]
    event("resolved" if code == 0 else "rejected")
    assert "Traceback" not in io_result["err"] and "internal error" not in io_result["err"]
    if code == 2:
        assert io_result["out"] == ""
        lines = io_result["err"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("solar: error: ")
    else:
        document = json.loads(io_result["out"])
        topo = document["topology"]
        assert topo["global_batch_size"] == (topo["logical_dp_world_size"] * topo["micro_batch_size"]
                                             * topo["gradient_accumulation"])
        assert topo["world_size"] == topo["logical_dp_world_size"] * topo["sequence_parallel_size"]
