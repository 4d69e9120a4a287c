"""``model.fp8_linear`` under FSDP2: a tiny Wan Stage0.5 build fully sharded over two ranks
(torchrun, gloo, CPU) converts the same 20 block linears before sharding, and one forward and
backward gives the unsharded FP8 model's loss and gradients (each rank casts the gathered weight,
so the numbers are the same up to the reduction's rounding), finite, under the same names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import env

pytestmark = pytest.mark.slow
pytest.importorskip("torchao.float8")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_sharded_fp8_build_matches_the_unsharded_one(recipe, wan_data, tmp_path):
    sets = [f"data.root={wan_data}", f"runtime.output_dir={tmp_path / 'run'}", "distributed.world_size=2",
            "distributed.sharding=full_shard", "train.global_batch_size=2", f"model.fp8_linear={recipe}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "tests.support.fp8_probe", str(CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"), *sets]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(ranks) == 2
    for r in ranks:
        assert r["sharded"] and r["converted"] == [20, 20] and r["float8_layers"] == 20
        sharded, whole = r["loss"]
        assert abs(sharded - whole) <= 1e-5 * abs(whole), r
        assert r["same_grad_names"] and r["finite"] and r["worst_grad_rel_diff"] < 1e-4, r
