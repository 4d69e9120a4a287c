"""Start-up at released widths without a whole copy per rank: a Wan TI2V-5B-wide model (two
blocks, 1.5 GB in fp32) built from released weights at world 1 and, fully sharded, at world 2 under
torchrun (gloo). Each rank of world 2 holds and reads half: its host memory grows by about half of
world 1's, plus at most one block; the parameters gathered whole equal the file. Also: the seeded
random init is the one the model always had."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from solar.config import families
from solar.config.parameters import layout
from solar.models.registry import build
from solar.models.weights import write_solar
from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import env

pytestmark = pytest.mark.slow

CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
DIMS = {"num_layers": 2, **{k: getattr(families.spec("wan22_ti2v_5b").dims("released"), k)
                            for k in ("hidden_size", "num_heads", "head_dim", "ffn_dim", "text_dim", "freq_dim")}}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Released-width weights in Solar's layout, written tensor by tensor (never whole in memory)."""
    from solar.config.families import Dims

    dims = Dims(**{**families.spec("wan22_ti2v_5b").dims("released").__dict__, **DIMS})
    shapes = {k: (v.dtype, tuple(v.shape)) for k, v in build("wan22_ti2v_5b", dims, device="meta").state_dict().items()}
    out = tmp_path_factory.mktemp("released") / "wan-5b-2-blocks"
    gen = torch.Generator().manual_seed(0)
    doc = write_solar(out, shapes, lambda n: torch.randn(shapes[n][1], generator=gen) * 0.02,
                      {"family": "wan22_ti2v_5b", "dims": {}})
    return out, doc, dims


def _probe(nproc: int, weights, names, sets):
    out, doc, _ = weights
    source = str(out / doc["files"][0]["path"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m",
           "tests.support.build_probe", str(CONFIG), source, *names, "--", *sets]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"])


def test_each_rank_materialises_and_reads_only_its_shard(released, wan_data, tmp_path):
    out, doc, dims = released
    assert len(doc["files"]) == 1  # one shard file: the probe compares against it
    names = ["blocks.0.ffn.net.0.proj.weight", "blocks.1.attn1.to_q.weight", "proj_out.bias",
             "condition_embedder.time_proj.weight"]
    sets = [f"data.root={wan_data}", f"runtime.output_dir={tmp_path / 'run'}", f"model.pretrained_path={out}",
            *(f"model.dims.{k}={v}" for k, v in DIMS.items()), "train.global_batch_size={world}"]
    one = _probe(1, released, names, [s.format(world=1) for s in sets] + ["distributed.world_size=1"])
    two = _probe(2, released, names, [s.format(world=2) for s in sets] + [
        "distributed.world_size=2", "distributed.sharding=full_shard"])
    total = layout("wan22_ti2v_5b", dims).total * 4
    block = layout("wan22_ti2v_5b", dims).per_block * 4
    assert one[0]["local_parameter_bytes"] == total
    assert all(r["local_parameter_bytes"] <= total / 2 + 4 * 2**20 for r in two)  # FSDP pads each tensor to 2 rows
    assert all(all(r["equal"].values()) for r in one + two), [r["equal"] for r in one + two]
    grew_one = one[0]["peak"] - one[0]["rss_before"]
    assert grew_one >= 0.9 * total, grew_one  # world 1 holds the whole model
    for r in two:
        grew = r["peak"] - r["rss_before"]
        assert grew <= total / 2 + block + 256 * 2**20, (grew / 2**20, total / 2**20, block / 2**20)


def test_the_seeded_random_init_is_the_models_own(wan_data, tmp_path):
    from solar.config.resolve import resolve_file
    from solar.models.registry import model_from_config
    from solar.train.setup import build_parts

    resolved = resolve_file(CONFIG, [f"data.root={wan_data}", f"runtime.output_dir={tmp_path}"], expected_action="train")
    parts = build_parts(resolved, 0, torch.device("cpu"))
    torch.manual_seed(resolved.config.train.seed)
    reference = model_from_config(resolved.config, device="cpu").state_dict()
    built = parts.model.state_dict()
    assert built.keys() == reference.keys() and all(torch.equal(built[k], reference[k]) for k in built)
