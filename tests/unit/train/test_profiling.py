"""Opt-in step profiling (``runtime.profile_steps``): only the listed steps are profiled; each writes
its tables (phases with their nesting, kernels, operators) as text and JSON under ``profile/``,
create-only (a second profile of the same step gets its own file); the phase labels cost nothing
when no profiler runs."""

from __future__ import annotations

import json

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.errors import ConfigError
from solar.train.profiling import StepProfiler, kind_of, phase
from tests.conftest import CONFIGS


def _work(model: torch.nn.Module, x: torch.Tensor) -> None:
    with phase("forward"):
        with phase("forward/inner"):
            h = model(x)
        loss = h.square().mean()
    with phase("backward"):
        loss.backward()


def test_listed_steps_write_their_tables(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64)
    profiler = StepProfiler(tmp_path, [2], rank=3, device=torch.device("cpu"))
    summaries = {}
    for step in (1, 2, 3):
        prof = profiler.start(step)
        _work(model, x)
        summaries[step] = profiler.finish(prof, step, 0.25)
    assert summaries[1] is None and summaries[3] is None
    files = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert files == ["rank-00003-step-00000002.json", "rank-00003-step-00000002.txt"]
    doc = json.loads((tmp_path / "profile" / "rank-00003-step-00000002.json").read_text())
    assert doc == summaries[2]
    assert doc["step"] == 2 and doc["step_seconds"] == 0.25
    assert set(doc["phases"]) == {"forward", "forward/inner", "backward"}
    for name in ("forward", "forward/inner", "backward"):
        assert doc["phases"][name]["count"] == 1 and doc["phases"][name]["cpu_ms"] > 0
    assert doc["phases"]["forward"]["cpu_ms"] >= doc["phases"]["forward/inner"]["cpu_ms"]
    assert doc["gpu_ms"] == 0 and doc["kernels"] == []          # no GPU on this machine: CPU tables only
    text = (tmp_path / "profile" / "rank-00003-step-00000002.txt").read_text()
    assert text.startswith("step 2: wall 0.250 s")
    assert "  inner" in text and "aten::addmm" in text         # nested phase indented; the operator table


def test_profiling_the_same_step_again_keeps_the_first(tmp_path):
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    for _ in range(2):   # a resumed launch profiling step 5 again
        profiler = StepProfiler(tmp_path, [5], rank=0, device=torch.device("cpu"))
        prof = profiler.start(5)
        _work(model, x)
        profiler.finish(prof, 5, None)
    names = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert names == ["rank-00000-step-00000005-1.json", "rank-00000-step-00000005-1.txt",
                     "rank-00000-step-00000005.json", "rank-00000-step-00000005.txt"]


def test_kernel_kinds():
    assert kind_of("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>") == "attention"
    assert kind_of("triton_tem_fused_flex_attention_0") == "attention"
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "matmul"
    assert kind_of("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT") == "matmul"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") == \
        "other"


def test_the_config_key():
    config = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
    base = ["data.root=/data", "runtime.output_dir=/out"]
    assert resolve_file(config, base).config.runtime.profile_steps == []
    assert resolve_file(config, base + ["runtime.profile_steps=[3,4]"]).config.runtime.profile_steps == [3, 4]
    with pytest.raises(ConfigError, match="runtime.profile_steps"):
        resolve_file(config, base + ["runtime.profile_steps=[0]"])
