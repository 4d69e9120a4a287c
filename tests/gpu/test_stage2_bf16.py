"""On a CUDA device: Stage2's critic and student updates compute in bf16 through the product's entry
point (``solar.launch.precision``: autocast over fp32 master weights when unsharded). Every linear
layer of the run records its output dtype through a global forward hook. Skipped without CUDA."""

from __future__ import annotations

import collections

import pytest
import torch

from solar.data.synth import synthesize
from solar.train.launch import train
from tests.conftest import CONFIGS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_stage2_updates_compute_in_bf16_with_fp32_master_weights(tmp_path):
    synthesize("wan22_ti2v_5b", tmp_path / "data", samples=4, seed=1)
    seen = collections.Counter()

    def hook(module, args, output):
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen[(output.dtype, module.weight.dtype)] += 1

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        assert train(str(CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml"),
                     [f"data.root={tmp_path / 'data'}", f"runtime.output_dir={tmp_path / 'run'}",
                      "train.max_steps=6", "runtime.validate_every=0", "runtime.validation_steps=[]",
                      "runtime.device=cuda"]) == 0
    finally:
        handle.remove()
    # every linear of both updates computes in bf16: student and critic over fp32 master weights, the
    # frozen teacher stored in bf16
    assert set(seen) == {(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)}, seen
