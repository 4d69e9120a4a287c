"""``solar config memory``'s host forecast: each rank's CPU memory between saves, during a save on
today's whole-file path and on the sharded path, and during a load, from the GPU forecast's own
parameter counts."""

from __future__ import annotations

import json

import pytest

from solar.config import memory
from solar.config.contracts import effective_dims
from solar.config.parameters import layout, lora_pattern
from solar.config.resolve import resolve_file
from tests.conftest import CONFIGS

RELEASED = sorted(p for p in CONFIGS.glob("*/train_*.yaml"))
GIB = memory.GIB
WAN5B = CONFIGS / "wan22_ti2v_5b"


def _resolved(path, sets=()):
    return resolve_file(path, list(sets), expected_action="train", placeholders=False)


def _host(path, sets=(), per_node=8) -> memory.HostForecast:
    return memory.forecast(_resolved(path, sets), gpu_memory_bytes=141 * GIB, gpus_per_node=per_node).host


def _params(path, sets=()) -> int:
    cfg = _resolved(path, sets).config
    return layout(cfg.model.family, effective_dims(cfg), anyflow=cfg.train.objective == "anyflow_forward_map").total


@pytest.mark.parametrize("path", RELEASED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_released_config_saves_a_shard_per_rank_of_what_rank_0_holds_with_whole_files(path, cli):
    result = cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "141", "--json")
    assert result.code == 0, result.err
    host = json.loads(result.out)["host"]
    degree = host["shard_degree"]
    assert host["path"] == "sharded" and degree in (8, 256)   # FSDP2 over 256 GPUs: hybrid (8) or full shards
    base = host["baseline_bytes"] + host["prefetch_bytes"]
    assert host["baseline_bytes"] == memory.HOST_BASELINE and 0 < host["prefetch_bytes"] < GIB
    whole = sum(v for parts in host["saved"].values() for v in parts.values())
    assert set(host["saved"]) == ({"student", "critic"} if "stage2" in path.name else {"model"})
    rank0, other = host["whole_file"]["rank0"], host["whole_file"]["other"]
    assert rank0["save_bytes"] == base + whole                       # rank 0 receives every role's whole state
    ema = sum(parts.get("ema", 0) for parts in host["saved"].values())
    assert ema > 0 and other["save_bytes"] == base + ema             # every other rank gathers the whole EMA
    for rank in ("rank0", "other"):
        sharded = host["sharded"][rank]
        assert sharded["save_bytes"] - base == pytest.approx(whole / degree, rel=1e-6)
        assert sharded["steady_bytes"] == base                       # no async_checkpoint: no staging kept
    assert host["load_bytes"] == base + host["largest_tensor_bytes"]
    assert host["peak_bytes"] == max(host["steady_bytes"], host["save_bytes"], host["load_bytes"])
    assert host["pod_bytes"] == 8 * host["peak_bytes"] and host["gpus_per_node"] == 8
    assert host["gib"]["whole_file_rank0_save"] == round(rank0["save_bytes"] / GIB, 2)
    assert host["gib"]["peak"] == round(host["peak_bytes"] / GIB, 2)


@pytest.mark.parametrize("config", ["train_stage0p5_fm_81f.yaml", "train_stage1_tf_fm_81f.yaml",
                                    "train_stage1_tf_anyflow_81f.yaml"])
def test_wan_5b_rank_0_receives_16_bytes_per_parameter_with_whole_files(config):
    """Issue 38: ~80 GB on rank 0 = 20 GB fp32 weights + 40 GB AdamW moments + 20 GB EMA."""
    path = WAN5B / config
    n = _params(path)
    host = _host(path)
    assert host.saved == {"model": {"weights": 4 * n, "optimizer": 8 * n, "ema": 4 * n}}
    rank0 = host.whole_file["rank0"]
    assert rank0.save - host.baseline - host.prefetch == 16 * n == pytest.approx(80e9, rel=0.05)
    assert host.sharded["rank0"].save - host.baseline - host.prefetch == -(-4 * n // 8) * 2 + -(-8 * n // 8)


def test_wan_5b_stage2_saves_student_and_critic_not_the_teacher():
    """Issue 38: ~140 GB on rank 0 = the student's 80 GB + the critic's 60 GB (no EMA); the frozen
    teacher is not saved."""
    path = WAN5B / "train_stage2_sgf_81f.yaml"
    n = _params(path)
    host = _host(path)
    assert host.saved == {"student": {"weights": 4 * n, "optimizer": 8 * n, "ema": 4 * n},
                          "critic": {"weights": 4 * n, "optimizer": 8 * n}}
    assert host.whole_file["rank0"].save - host.baseline - host.prefetch == 28 * n == pytest.approx(140e9, rel=0.05)
    assert host.whole_file["other"].save - host.baseline - host.prefetch == 4 * n   # the student's EMA


def test_lora_on_a_released_base_saves_the_adapters_and_a_seeded_run_the_whole_model():
    path = CONFIGS / "minimax_h3" / "train_stage0p5_fm_158f.yaml"
    cfg = _resolved(path).config
    lay = layout(cfg.model.family, effective_dims(cfg))
    adapter = lay.lora(lora_pattern(list(cfg.model.lora.targets)), cfg.model.lora.rank)
    host = _host(path)
    assert host.saved["model"] == {"weights": 4 * adapter, "optimizer": 8 * adapter, "ema": 4 * adapter}
    assert not host.seeded
    seeded = _host(path, ["model.pretrained_path=null"])   # checkpoint.mode none and no base: built on every rank
    assert seeded.seeded and seeded.saved["model"]["weights"] == 4 * (lay.total + adapter)
    assert seeded.used["rank0"].load == seeded.baseline + seeded.prefetch + 4 * (lay.total + adapter)


def test_hybrid_shards_divide_over_a_node_full_shards_over_the_world_and_unsharded_runs_keep_it_on_rank_0():
    path = WAN5B / "train_stage0p5_fm_81f.yaml"
    base = ["distributed.world_size=16", "train.global_batch_size=16"]
    hybrid = _host(path, base + ["distributed.sharding=hybrid_shard"], per_node=8)
    full = _host(path, base + ["distributed.sharding=full_shard"])
    whole = sum(hybrid.saved["model"].values())
    assert (hybrid.shard_degree, full.shard_degree) == (8, 16)
    floor = hybrid.baseline + hybrid.prefetch
    assert hybrid.sharded["rank0"].save - floor == pytest.approx(whole / 8, rel=1e-6)
    assert full.sharded["other"].save - floor == pytest.approx(whole / 16, rel=1e-6)
    assert hybrid.whole_file["rank0"].save == full.whole_file["rank0"].save == floor + whole

    one = _host(path, base + ["distributed.sharding=none"])
    assert one.path == "whole-file" and one.sharded == one.whole_file
    assert one.whole_file["rank0"].save == floor + whole and one.whole_file["other"].save == floor
    assert one.pod_bytes(8) == one.peak + 7 * one.used["other"].peak
    single = _host(path, ["distributed.world_size=1", "train.global_batch_size=1"])
    assert single.path == "whole-file" and single.peak == floor + whole


def test_async_checkpoints_keep_their_staging_buffers_between_saves():
    path = WAN5B / "train_stage0p5_fm_81f.yaml"
    plain, staged = _host(path), _host(path, ["runtime.async_checkpoint=true"])
    floor = plain.baseline + plain.prefetch
    saved = plain.saved["model"]
    whole, share = sum(saved.values()), plain.sharded["rank0"].save - floor
    assert staged.sharded["rank0"].steady == staged.sharded["rank0"].save == floor + share
    assert staged.whole_file["rank0"].steady == floor + whole
    # the capture gathers the weights and moments beside rank 0's buffers
    assert staged.whole_file["rank0"].save == floor + whole + saved["weights"] + saved["optimizer"]
    assert staged.whole_file["other"].steady == floor + saved["ema"]
    assert staged.used["rank0"].load == plain.used["rank0"].load   # a load comes before the first save


def test_a_load_reads_one_tensor_at_a_time():
    path = WAN5B / "train_stage1_tf_fm_81f.yaml"    # checkpoint.mode weights_only
    host = _host(path)
    cfg = _resolved(path).config
    dims = effective_dims(cfg)
    width = dims.num_heads * dims.head_dim
    assert host.largest_tensor == 4 * 6 * width * width    # Wan's timestep projection, 6D x D in fp32
    assert host.used["rank0"].load == host.baseline + host.prefetch + host.largest_tensor < host.peak


def test_on_the_cpu_the_states_live_on_the_host():
    path = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    fc = memory.forecast(_resolved(path, ["runtime.device=cpu"]), gpu_memory_bytes=80 * GIB)
    assert fc.host.baseline == memory.HOST_BASELINE_CPU + fc.peak_bytes
    gpu = memory.forecast(_resolved(path, ["runtime.device=cuda"]), gpu_memory_bytes=80 * GIB)
    assert gpu.host.baseline == memory.HOST_BASELINE


def test_the_text_adds_the_host_lines_after_the_gpu_ones(cli):
    path = WAN5B / "train_stage0p5_fm_81f.yaml"
    out = cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "80").out
    lines = out.strip().splitlines()
    assert lines[1].startswith("role ") and lines[2].startswith("model ") and lines[3].startswith("peak ")
    assert lines[4].startswith("activation_checkpointing_skip_blocks auto: 30 blocks keep their activations")
    host = _host(path, per_node=8)
    rank0 = host.whole_file["rank0"]
    g = lambda n: f"{n / GIB:.1f}"  # noqa: E731
    assert lines[-2] == (f"host memory per rank (sharded checkpoints, 1/8 of the state each): steady "
                         f"{g(host.used['rank0'].steady)} GiB, save {g(host.used['rank0'].save)} GiB (rank 0 "
                         f"{g(rank0.save)} GiB with whole files, today's path), load {g(host.used['rank0'].load)} "
                         f"GiB; peak {g(host.peak)} GiB, {g(host.pod_bytes())} GiB per 8-GPU pod")
    assert lines[-1].startswith("checkpoint state on the host (whole, fp32): model ")
    assert "AdamW moments" in lines[-1] and "EMA" in lines[-1]
    one = cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "80", "--set", "distributed.world_size=1",
              "--set", "train.global_batch_size=1").out
    assert "host memory per rank (whole-file checkpoints: rank 0 holds the state)" in one


def test_docs_host_table_is_what_the_forecast_gives():
    """docs/memory.md's host table, row by row, as its jq command prints the JSON (GiB, one decimal)."""
    import math

    from tests.conftest import REPO

    def g(n: int) -> str:
        r = math.floor(n / GIB * 10 + 0.5) / 10
        return str(int(r)) if r == int(r) else str(r)

    text = (REPO / "docs" / "memory.md").read_text()
    table = text[text.index("### The released training configs"):]
    for path in RELEASED:
        host = _host(path)
        w, s = host.whole_file, host.sharded["rank0"]
        state = ", ".join(f"{role} {g(sum(parts.values()))}" for role, parts in sorted(host.saved.items()))
        row = (f"| `{path.parent.name}/{path.name}` | {host.shard_degree} | {state} | {g(w['rank0'].save)} | "
               f"{g(w['other'].save)} | {g(host.pod_bytes(whole_file=True))} | {g(s.steady)} / {g(s.save)} / "
               f"{g(s.load)} | {g(host.pod_bytes())} |")
        assert row in table, row
