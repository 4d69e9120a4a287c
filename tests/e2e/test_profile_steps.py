"""`solar train` with ``runtime.profile_steps``: a tiny Wan Stage1 TF-AnyFlow run profiles only the
listed step and writes its tables in the run directory, with the step's phases (Stage1's forwards
nested in the objective's) and the step's own wall time."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFIGS
from tests.e2e.helpers import result, steps, train

pytestmark = pytest.mark.slow


def test_a_listed_step_writes_its_profile(wan_data, tmp_path):
    run = tmp_path / "run"
    proc = train(CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml",
                 [f"data.root={wan_data}", f"runtime.output_dir={run}", "checkpoint.path=null",
                  "checkpoint.weights=null", "train.max_steps=3", "runtime.profile_steps=[2]",
                  "runtime.validate_every=0", "runtime.validation_steps=[]", "runtime.save_every=0"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert result(run)["status"] == "complete"
    files = sorted(p.name for p in (run / "profile").iterdir())
    assert files == ["rank-00000-step-00000002.json", "rank-00000-step-00000002.txt"]
    doc = json.loads((run / "profile" / "rank-00000-step-00000002.json").read_text())
    assert doc["step"] == 2 and doc["step_seconds"] == steps(run)[1]["step_seconds"]
    phases = doc["phases"]
    # the guided AnyFlow step: 2 clean contexts, 4 noisy halves without grad, 1 forward with grad
    assert {name: phases[name]["count"] for name in ("forward", "forward/clean-context",
                                                      "forward/without-grad-noisy-half", "forward/with-grad",
                                                      "backward", "clip", "optimizer", "ema")} == \
        {"forward": 1, "forward/clean-context": 2, "forward/without-grad-noisy-half": 4, "forward/with-grad": 1,
         "backward": 1, "clip": 1, "optimizer": 1, "ema": 1}
    assert phases["forward"]["cpu_ms"] > phases["forward/with-grad"]["cpu_ms"] > 0
    assert "with-grad" in (run / "profile" / "rank-00000-step-00000002.txt").read_text()
