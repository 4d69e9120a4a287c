"""One run, any topology (issue 39 item 1) for Stage1 TF-AnyFlow and Stage2 SGF, end to end on the CPU
under torchrun (gloo, fp32): the same global batch of 4 at world 4 x gradient accumulation 1, world
2 x 2 and world 1 x 4 reads the same clips per step (reader j reads position j of every step) and
draws the same values for each (every draw of a clip comes from its generator keyed by (seed, step,
position)), so the per-step losses and grad norms agree up to reduction order (rel 1e-5): Stage1's
loss with AnyFlow's adaptive rescale (positions 0-1 diffusion, 2 consistency, 3 flow-map: at world
1 x 4 the later clips' reference is the earlier micro-batches' diffusion loss, kept for the step by
``objective.objective_for``'s gather), Stage2's critic at every step and student from step 2 (one
critic update per student update; a 6-latent rollout keeps it cheap). A world-4 run stopped after
step 2 resumes at world 2 x accumulation 2 and takes step 3 as the uninterrupted world-1 x 4 run
does (which took steps 1-2 as world 4 did). MiniMax-H3 Stage1 with SP 2 is stopped at world 4 and
resumed at world 2 x accumulation 2. (Stage0.5 at world 1 x 4 / 2 x 2 / 4 x 1 and a resume at
another topology: test_topology.py.)"""

from __future__ import annotations

import pytest

from tests.conftest import CONFIGS
from tests.e2e.helpers import steps, train

pytestmark = pytest.mark.slow

TINY = CONFIGS / "tiny" / "wan22_ti2v_5b"
GLOBAL = 4
KEYS = ("loss_mean", "grad_norm", "student_loss", "student_grad_norm")
ROUTES = {
    "stage1_anyflow": (TINY / "train_stage1_tf_anyflow_81f.yaml", 3, []),
    "stage2_sgf": (TINY / "train_stage2_sgf_81f.yaml", 3,
                   ["train.sgf.critic_updates_per_student=1", "train.sgf.rollout_latents=6",
                    "train.sgf.supervised_latents=6"]),
}


def _run(config, data, out, world: int, max_steps: int, extra: list[str]) -> list[dict]:
    proc = train(config, [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=100",
                          f"distributed.world_size={world}", f"train.gradient_accumulation={GLOBAL // world}",
                          f"train.global_batch_size={GLOBAL}", "train.micro_batch_size=1",
                          f"train.max_steps={max_steps}", "runtime.save_every=0", "runtime.save_steps=[]",
                          "runtime.checkpoint_on_stop=false", "runtime.validate_every=0",
                          "runtime.validation_steps=[]", *extra], nproc=world, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [steps(out, rank) for rank in range(world)]
    out_steps = []
    for events in zip(*ranks):   # one step's event of every rank
        e = events[0]
        clips = sorted((s.get("role", ""), s["sample_id"], s["start_frame"]) for r in events for s in r["samples"])
        row = {"step": e["step"], "clips": clips, **{k: e[k] for k in KEYS if k in e}}
        if "student_loss" in e:   # a rank's own micro-batches' mean (the critic's is all-reduced: loss_mean)
            row["student_loss"] = sum(r["student_loss"] for r in events) / world
        out_steps.append(row)
    return out_steps


def _same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    assert a["clips"] == b["clips"], a["step"]   # the same clips, each at the same start frame
    assert a.keys() == b.keys()
    for key in a.keys() - {"step", "clips"}:
        assert abs(a[key] - b[key]) <= 1e-5 * max(abs(a[key]), abs(b[key]), 1e-12), (a["step"], key, a, b)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_same_steps_at_world_4x1_2x2_and_1x4_stopped_and_resumed_at_another(route, wan_data, tmp_path):
    """World 4 x 1 for steps 1-2, stopped (its checkpoint: every role, the four positions' readers),
    resumed at world 2 x 2 for step 3; world 1 x 4 uninterrupted for steps 1-3."""
    config, max_steps, extra = ROUTES[route]
    one = _run(config, wan_data, tmp_path / "w1", 1, max_steps, extra)
    assert [e["step"] for e in one] == list(range(1, max_steps + 1))
    if route == "stage2_sgf":
        assert [("student_loss" in e) for e in one] == [False] + [True] * (max_steps - 1)
    split = tmp_path / "split"
    four = _run(config, wan_data, split, 4, max_steps,
                [*extra, "runtime.exit_after_step=2", "runtime.checkpoint_on_stop=true"])
    assert [e["step"] for e in four] == [1, 2]
    for a, b in zip(four, one):
        _same(a, b)
    resumed = _run(config, wan_data, split, 2, max_steps,
                   [*extra, "runtime.checkpoint_on_stop=true", "checkpoint.mode=full_resume",
                    f"checkpoint.path={split}/checkpoints/step_00000002"])
    assert resumed[-1]["step"] == max_steps
    _same(resumed[-1], one[-1])


def test_h3_stage1_at_sp2_world_4_resumed_at_world_2(tmp_path):
    """MiniMax-H3 Stage1 TF-AnyFlow with its SP 2: a world-4 run (dp 2 x 1) takes step 1 as world 2 (dp 1
    x accumulation 2) does, and stopped after it and resumed at world 2 it takes step 2 as the
    uninterrupted world-2 run did; SP peers draw the same values for their clip (one dp rank, the same
    positions)."""
    from solar.data.synth import synthesize

    data = tmp_path / "data"
    synthesize("minimax_h3", data, samples=4, seed=5)
    config = CONFIGS / "tiny" / "minimax_h3" / "train_stage1_tf_anyflow_158f.yaml"
    sp = ["distributed.sequence_parallel_size=2", "train.global_batch_size=2"]
    two = _run(config, data, tmp_path / "w2", 2, 2, [*sp, "train.gradient_accumulation=2"])
    # world 4 (SP 2, dp 2 x 1) for step 1, stopped, resumed at world 2 (SP 2, dp 1 x accumulation 2): step 1
    # at world 4 and the resumed step 2 are the uninterrupted world-2 run's (each clip twice: its two SP
    # peers' records)
    split = tmp_path / "split"
    first = _run(config, data, split, 4, 2, [*sp, "train.gradient_accumulation=1", "runtime.exit_after_step=1",
                                            "runtime.checkpoint_on_stop=true"])
    _same(first[0], two[0])
    resumed = _run(config, data, split, 2, 2, [*sp, "train.gradient_accumulation=2", "runtime.checkpoint_on_stop=true",
                                              "checkpoint.mode=full_resume",
                                              f"checkpoint.path={split}/checkpoints/step_00000001"])
    _same(resumed[-1], two[-1])
