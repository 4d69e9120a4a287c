"""Stage2's ``student_loss_mean`` at world 2 (two ranks under torchrun, gloo on CPU): each rank's
events file records its own student loss, and rank 0's ``student_loss_mean`` (what the progress
line, the report and the metrics show) is the mean of the two, not rank 0's own value. The ranks
train on different clips, so their losses differ and rank 0's value alone would not pass."""

from __future__ import annotations

import re

import pytest

from tests.conftest import CONFIGS
from tests.e2e.helpers import steps, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WAN = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml"


def test_student_loss_mean_is_the_mean_of_the_ranks_own_losses(wan_data, tmp_path):
    out = tmp_path / "run"
    # the student updates at steps 2 and 3 (one critic update per student update); log_every 1
    proc = train(WAN, [f"data.root={wan_data}", f"runtime.output_dir={out}", "distributed.world_size=2",
                       "train.global_batch_size=2", "train.max_steps=3", "train.sgf.critic_updates_per_student=1", "runtime.log_every=1",
                       "runtime.save_every=0", "runtime.validate_every=0", "runtime.validation_steps=[]"], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = steps(out, 0), steps(out, 1)
    assert [e["step"] for e in rank0] == [e["step"] for e in rank1] == [1, 2, 3]
    updated = [(a, b) for a, b in zip(rank0, rank1) if a["student_updated"]]
    assert [a["step"] for a, _ in updated] == [2, 3] and all(b["student_updated"] for _, b in updated)
    for a, b in updated:
        assert a["student_loss"] != pytest.approx(b["student_loss"], rel=1e-3), (a, b)   # the ranks' own values differ
        mean = (a["student_loss"] + b["student_loss"]) / 2
        assert a["student_loss_mean"] == pytest.approx(mean, rel=1e-6) == b["student_loss_mean"]
        assert a["losses"]["student"] == a["student_loss"]          # the rank's own value, beside the mean
        assert a["loss_mean"] == pytest.approx((a["loss"] + b["loss"]) / 2, rel=1e-6)   # the critic's, too
    # the progress line prints the mean, with the update it came from
    lines = [line for line in proc.stderr.splitlines() if line.startswith("solar: step ")]
    for a, _ in updated:
        line = next(line for line in lines if line.startswith(f"solar: step {a['step']}/3 "))
        assert re.search(rf" student loss {a['student_loss_mean']:.4f} grad \S+ lr \S+ \(update {a['student_step']}\) ",
                         line), line
