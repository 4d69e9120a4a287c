"""``solar config memory``: the forecast of every released training config, its arithmetic, and its
state terms held to torch's own memory tracker on a real tiny training step (the activation table is
held to ``torch.cuda.max_memory_allocated`` on the GPU: bench/RESULTS.md)."""

from __future__ import annotations

import json

import pytest

from solar.config import memory
from solar.config.resolve import resolve_file
from tests.conftest import CONFIGS

RELEASED = sorted(p for p in CONFIGS.glob("*/train_*.yaml"))
GIB = memory.GIB


SKIP = "distributed.activation_checkpointing_skip_blocks"   # the released configs ship `auto`


def _forecast(path, sets=(), gib=141.0, per_node=8):
    resolved = resolve_file(path, list(sets), expected_action="train", placeholders=False)
    return memory.forecast(resolved, gpu_memory_bytes=int(gib * GIB), gpus_per_node=per_node)


@pytest.mark.parametrize("path", RELEASED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_released_training_config_fits_an_h200_at_its_topology(path, cli):
    result = cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "141", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["fits"] is True and doc["gpu_memory_bytes"] == 141 * GIB
    assert 0 < doc["peak_bytes"] <= doc["usable_bytes"] < doc["gpu_memory_bytes"]
    roles = doc["roles"]
    assert set(roles) == ({"student", "critic", "teacher"} if "stage2" in path.name else {"model"})
    # one role updates at a time: its gradients and activations beside every other state
    others = sum(v for r in roles.values() for k, v in r.items() if k not in ("gradients", "activations"))
    assert doc["peak_bytes"] == others + max(r.get("gradients", 0) + r.get("activations", 0) for r in roles.values())


def test_a_config_that_does_not_fit_exits_0_and_says_what_would(cli):
    path = CONFIGS / "minimax_h3" / "train_stage2_sgf_158f.yaml"  # three roles on one 33B base
    hybrid = ["--set", "distributed.sharding=hybrid_shard"]   # shard groups of 8 (the release ships full_shard)
    result = cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "80", *hybrid)
    assert result.code == 0, result.err
    assert "does NOT fit" in result.out and "to fit: distributed.sharding=full_shard" in result.out
    doc = json.loads(cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "80", "--json", *hybrid).out)
    assert doc["fits"] is False and doc["peak_bytes"] > doc["usable_bytes"]
    assert any(s.startswith("distributed.sharding=full_shard") for s in doc["suggestions"])


def test_bad_flags_are_one_line_errors(cli):
    path = CONFIGS / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    for flags, fragment in ((["--gpu-memory-gib", "0"], "--gpu-memory-gib 0"), (["--gpus-per-node", "0"], "--gpus-per-node 0")):
        result = cli("config", "memory", "--config", str(path), *flags)
        assert result.code == 2 and fragment in result.err and result.err.count("\n") == 1
    infer = CONFIGS / "wan22_ti2v_5b" / "infer_stage0p5_fm_81f.yaml"
    result = cli("config", "memory", "--config", str(infer))
    assert result.code == 2 and "action" in result.err


def test_sharding_divides_the_states_and_sp_the_tokens():
    path = CONFIGS / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    base = ["distributed.world_size=16", "train.global_batch_size=16", f"{SKIP}=0"]
    one = _forecast(path, base + ["distributed.sharding=none"])
    full = _forecast(path, base + ["distributed.sharding=full_shard"])
    hybrid = _forecast(path, base + ["distributed.sharding=hybrid_shard"], per_node=8)
    assert (one.shard_degree, full.shard_degree, hybrid.shard_degree) == (1, 16, 8)
    for kind in ("parameters", "gradients", "optimizer", "ema"):
        assert full.roles["model"][kind] == pytest.approx(one.roles["model"][kind] / 16, rel=1e-6)
        assert hybrid.roles["model"][kind] == pytest.approx(one.roles["model"][kind] / 8, rel=1e-6)
    a14b = CONFIGS / "wan22_i2v_a14b" / "train_stage0p5_fm_81f.yaml"
    sp1 = _forecast(a14b, ["distributed.world_size=16", "distributed.sequence_parallel_size=1", "train.global_batch_size=16",
                           f"{SKIP}=0"])
    sp2 = _forecast(a14b, ["distributed.world_size=16", "distributed.sequence_parallel_size=2", "train.global_batch_size=8",
                           f"{SKIP}=0"])
    assert sp2.tokens_per_gpu["model"] * 2 == sp1.tokens_per_gpu["model"]
    step = lambda fc: fc.roles["model"]["gradients"] + fc.roles["model"]["activations"]  # noqa: E731
    assert step(sp2) * 2 == pytest.approx(step(sp1), rel=1e-3)   # the update's bytes are per token here


def test_checkpointing_policies_order_the_activations():
    path = CONFIGS / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    act = {name: _forecast(path, sets).roles["model"]["activations"] for name, sets in (
        ("full", ["distributed.activation_checkpointing_policy=full", f"{SKIP}=0"]),
        ("save_attention", ["distributed.activation_checkpointing_policy=save_attention", f"{SKIP}=0"]),
        ("skip10", ["distributed.activation_checkpointing_skip_blocks=10"]),
        ("none", ["distributed.activation_checkpointing=false"]))}
    assert act["full"] < act["save_attention"] < act["skip10"] < act["none"]


@pytest.mark.parametrize("config", ["wan22_ti2v_5b/train_stage0p5_fm_81f.yaml", "minimax_h3/train_stage0p5_fm_158f.yaml"])
def test_state_terms_equal_torchs_memory_tracker_on_a_real_step(config, tmp_path):
    """The product builds the tiny run (model, LoRA, AdamW, EMA) and takes one step; the tensors it
    holds are counted (and, for the fully trained Wan, torch's MemTracker counts the same), the EMA
    is its shadow's bytes."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from solar.data.synth import synthesize
    from solar.launch.batch import collate
    from solar.train.setup import build_parts

    family = config.split("/")[0]
    synthesize(family, tmp_path / "data", samples=4, seed=0)
    path = CONFIGS / "tiny" / config
    sets = [f"data.root={tmp_path / 'data'}", f"runtime.output_dir={tmp_path / 'run'}",
            "distributed.world_size=1", "distributed.sequence_parallel_size=1", "train.global_batch_size=1",
            "model.dtype=float32"]
    if family == "minimax_h3":  # its training route asks SP 2: the forecast is per GPU at the same size either way
        sets = [s for s in sets if "sequence_parallel" not in s and "world_size" not in s and "global" not in s]
        sets += ["distributed.world_size=2", "distributed.sequence_parallel_size=2", "train.global_batch_size=1"]
    resolved = resolve_file(path, sets, expected_action="train")
    expected = memory.forecast(resolved, gpu_memory_bytes=80 * GIB).roles["model"]
    parts = build_parts(resolved, 0, torch.device("cpu"))
    from solar.train.objective import objective_for

    class One:  # the objective wants a dist with a DP rank and a gather
        dp_rank, dp_world = 0, 1

        @staticmethod
        def all_gather_object(obj, name):
            return [obj]

    silence = torch.randn(2, 12, 32) * 0.05 if family == "minimax_h3" else None
    objective, _ = objective_for(resolved, One, silence)
    # MemTracker hooks every parameter's gradient, which a frozen (LoRA base) parameter refuses
    tracker = MemTracker() if family != "minimax_h3" else None
    if tracker is not None:
        tracker.track_external(parts.model, parts.optimizer)
        tracker.__enter__()
    parts.optimizer.zero_grad(set_to_none=True)
    loss, _ = objective(parts.model, collate([parts.stream.next_clip()]), 1, 0)
    loss.backward()
    parts.optimizer.step()
    parts.ema.update(1)
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    params = list(parts.model.parameters())
    counted = {"PARAM": nbytes(params), "GRAD": nbytes(p.grad for p in params if p.grad is not None),
               "OPT": nbytes(t for st in parts.optimizer.state.values() for t in st.values() if torch.is_tensor(t))}
    if tracker is not None:
        snapshot = tracker.get_tracker_snapshot()
        tracker.__exit__(None, None, None)
        tracked = {str(k).split(".")[-1]: v for k, v in snapshot[torch.device("cpu")].items()}
        assert {k: tracked[k] for k in counted} == counted
    frozen = nbytes(p for p in params if not p.requires_grad)
    assert counted["PARAM"] - frozen == expected["parameters"] and frozen == expected.get("frozen", 0)
    assert counted["GRAD"] == expected["gradients"]
    steps = 4 * len(parts.params)  # AdamW's per-parameter step counters
    assert counted["OPT"] == expected["optimizer"] + steps
    assert nbytes(parts.ema.shadow.values()) == expected["ema"]


def test_a_config_that_fits_with_room_says_how_many_fewer_blocks_it_could_recompute(cli):
    """``faster, still fits``: the most blocks whose activations could be kept instead of recomputed
    with the forecast still under the GPU; one more would not fit. Stage0.5 81f at its topology keeps
    them all (checkpointing off); Stage1 (twice the tokens) part of them."""
    s05 = CONFIGS / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    result = cli("config", "memory", "--config", str(s05), "--gpu-memory-gib", "80", "--set", f"{SKIP}=0")
    assert result.code == 0 and "faster, still fits: distributed.activation_checkpointing=false" in result.out
    assert _forecast(s05, ["distributed.activation_checkpointing=false"], gib=80).fits

    s1 = CONFIGS / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
    doc = json.loads(cli("config", "memory", "--config", str(s1), "--gpu-memory-gib", "80", "--json",
                         "--set", f"{SKIP}=6").out)
    skip = int(doc["faster"].split("skip_blocks=")[1].split()[0])
    assert 6 < skip < 30   # the config already keeps 6
    key = "distributed.activation_checkpointing_skip_blocks"
    assert _forecast(s1, [f"{key}={skip}"], gib=80).fits and not _forecast(s1, [f"{key}={skip + 1}"], gib=80).fits
    assert f"{skip - 6} fewer of 30 blocks recomputed" in doc["faster"]


def test_no_faster_hint_without_recomputation_or_room():
    s05 = CONFIGS / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    assert _forecast(s05, ["distributed.activation_checkpointing=false"], gib=80).faster is None
    s1 = CONFIGS / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
    tight = _forecast(s1, ["distributed.world_size=1", "distributed.sharding=none", "train.global_batch_size=1",
                           f"{SKIP}=0"], gib=141)
    assert tight.fits and tight.faster is not None   # unsharded on 141 GiB: some blocks, not all
    assert "activation_checkpointing=false" not in tight.faster
    h3 = CONFIGS / "minimax_h3" / "train_stage2_sgf_158f.yaml"
    hybrid = _forecast(h3, [f"{SKIP}=0", "distributed.sharding=hybrid_shard"], gib=80)
    assert not hybrid.fits and hybrid.faster is None   # does not fit at all: to fit, not faster


# --- distributed.activation_checkpointing_skip_blocks: auto (issue 40 item 2) ---------------------

@pytest.mark.parametrize("config, gib", [("wan22_ti2v_5b/train_stage1_tf_anyflow_81f.yaml", 80),
                                         ("wan22_ti2v_5b/train_stage2_sgf_81f.yaml", 80),
                                         ("wan22_ti2v_5b/train_stage1_tf_anyflow_81f.yaml", 141),
                                         ("wan22_i2v_a14b/train_stage0p5_fm_81f.yaml", 80)])
def test_auto_keeps_the_most_blocks_that_fit_with_the_margin(config, gib):
    """The choice fits with AUTO_MARGIN of the GPU left beyond the usable limit; one more kept block
    would not; the forecast of the `auto` config is the forecast of its choice."""
    from solar.config.memory import AUTO_MARGIN, auto_kept_blocks

    path = CONFIGS / config
    resolved = resolve_file(path, [], expected_action="train", placeholders=False)
    gpu = int(gib * GIB)
    skip, fc = auto_kept_blocks(resolved, gpu_memory_bytes=gpu, gpus_per_node=8)
    layers = 30 if "5b" in config else 40
    assert 0 <= skip <= layers
    margin = AUTO_MARGIN * gpu
    assert fc.peak_bytes + margin <= fc.usable_bytes
    if skip < layers:
        more = _forecast(path, [f"{SKIP}={skip + 1}"], gib=gib)
        assert more.peak_bytes + margin > more.usable_bytes
    assert fc.peak_bytes == _forecast(path, [f"{SKIP}={skip}"] if skip < layers else
                                      ["distributed.activation_checkpointing=false"], gib=gib).peak_bytes
    shipped = _forecast(path, gib=gib)
    assert shipped.auto == skip and shipped.peak_bytes == fc.peak_bytes and shipped.fits


def test_auto_chooses_more_with_more_memory_and_fewer_with_fewer_gpus():
    from solar.config.memory import auto_kept_blocks

    path = CONFIGS / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
    resolved = resolve_file(path, [], expected_action="train", placeholders=False)
    h100 = auto_kept_blocks(resolved, gpu_memory_bytes=80 * GIB, gpus_per_node=8)[0]
    h200 = auto_kept_blocks(resolved, gpu_memory_bytes=141 * GIB, gpus_per_node=8)[0]
    four = auto_kept_blocks(resolve_file(path, ["distributed.world_size=4", "train.global_batch_size=4",
                                                "distributed.sharding=full_shard"], expected_action="train",
                                         placeholders=False), gpu_memory_bytes=80 * GIB, gpus_per_node=4)[0]
    assert four < h100 < h200


def test_auto_refuses_what_cannot_fit_even_recomputing_every_block(cli):
    """Stage1 TF-AnyFlow unsharded on one 80 GB GPU: the forecast is over the GPU at every choice, so
    `auto` names the need and the fixes in one line, and `solar config memory` says it does not fit."""
    from solar.config.memory import auto_kept_blocks
    from solar.errors import ConfigError

    path = CONFIGS / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
    one = ["distributed.world_size=1", "distributed.sharding=none", "train.global_batch_size=1"]
    resolved = resolve_file(path, one, expected_action="train", placeholders=False)
    with pytest.raises(ConfigError) as refused:
        auto_kept_blocks(resolved, gpu_memory_bytes=80 * GIB, gpus_per_node=1)
    message = str(refused.value)
    assert "\n" not in message and "skip_blocks=auto" in message and "GiB per GPU" in message and "try " in message
    result = cli("config", "memory", "--config", str(path), "--gpu-memory-gib", "80", "--gpus-per-node", "1",
                 *[a for s in one for a in ("--set", s)])
    assert result.code == 0 and "does NOT fit" in result.out and "auto: 0 blocks" in result.out


def test_the_schema_takes_auto_or_a_count_only():
    path = CONFIGS / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
    from solar.errors import ConfigError

    assert resolve_file(path, [], expected_action="train", placeholders=False).config.distributed \
        .activation_checkpointing_skip_blocks == "auto"
    with pytest.raises(ConfigError, match="activation_checkpointing_skip_blocks"):
        resolve_file(path, [f"{SKIP}=most"], expected_action="train", placeholders=False)


def test_docs_released_table_is_what_the_forecast_gives():
    """docs/memory.md's table of the released configs at 80 and 141 GB, row by row."""
    from solar.config.contracts import effective_dims
    from tests.conftest import REPO

    text = (REPO / "docs" / "memory.md").read_text()
    table = text[text.index("## The released training configs"):text.index("## Host memory per rank")]
    for path in RELEASED:
        cells = []
        for gib in (80, 141):
            fc = _forecast(path, gib=gib)
            layers = effective_dims(resolve_file(path, [], expected_action="train", placeholders=False).config).num_layers
            assert fc.fits, (path, gib)   # every released config fits an 80 GB card at its topology
            cells.append(f"{fc.auto} of {layers}, {fc.peak_bytes / GIB:.1f}")
        assert f"| `{path.parent.name}/{path.name}` |" in table
        row = next(line for line in table.splitlines() if line.startswith(f"| `{path.parent.name}/{path.name}` |"))
        assert row.endswith(f"| {cells[0]} | {cells[1]} |"), (row, cells)
