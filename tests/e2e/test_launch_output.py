"""A launch prints only Solar's lines (issue 40 item 5): `solar train` (with validation) and `solar
infer` on the tiny Wan configs write nothing to stderr that does not start with "solar: " — no
import-time chatter of the libraries under them (diffusers imported torchao, whose compiled kernels
and tensor types did not load, and printed about it at every launch)."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import TINY, infer, train

pytestmark = pytest.mark.slow


def _foreign(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("solar: ")]


def test_train_and_infer_print_only_solar_lines(wan_data, tmp_path):
    run = tmp_path / "run"
    proc = train(TINY["wan22_ti2v_5b"], [f"data.root={wan_data}", f"runtime.output_dir={run}", "train.max_steps=2",
                                         "runtime.log_every=1", "runtime.save_every=2", "runtime.validate_every=2",
                                         "validation.decode_latents=1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "solar: step 2/2" in proc.stderr and _foreign(proc.stderr) == [] and _foreign(proc.stdout) == []
    generated = infer(TINY["wan22_ti2v_5b"].parent / "infer_stage0p5_fm_81f.yaml",
                      [f"data.root={wan_data}", f"checkpoint.path={run / 'checkpoints' / 'step_00000002'}",
                       f"runtime.output_dir={tmp_path / 'infer'}", "validation.sample_count=1",
                       "validation.decode_latents=1"])
    assert generated.returncode == 0, generated.stderr[-2000:]
    assert "infer complete" in generated.stderr
    assert _foreign(generated.stderr) == [] and _foreign(generated.stdout) == []


def test_auto_kept_blocks_is_chosen_at_launch_logged_and_recorded(wan_data, tmp_path):
    """`activation_checkpointing_skip_blocks: auto` is the launch's choice: on the CPU (no GPU memory to
    size against) every checkpointed block is recomputed; the choice is printed, written to the
    events, and the run's resolved config keeps `auto` (a resume on other GPUs chooses again)."""
    import json

    run = tmp_path / "run"
    proc = train(TINY["wan22_ti2v_5b"], [f"data.root={wan_data}", f"runtime.output_dir={run}", "train.max_steps=1",
                                         "runtime.validate_every=0", "runtime.validation_steps=[]",
                                         "distributed.activation_checkpointing=true",
                                         "distributed.activation_checkpointing_skip_blocks=auto"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "solar: activation_checkpointing_skip_blocks auto -> 0 of 2 blocks keep their activations (no GPU (cpu)" \
        in proc.stderr and _foreign(proc.stderr) == []
    events = [json.loads(line) for line in (run / "events" / "rank-00000.jsonl").read_text().splitlines()]
    [chosen] = [e for e in events if e["event"] == "activation_checkpointing"]
    assert (chosen["skip_blocks"], chosen["blocks"]) == (0, 2)
    resolved = json.loads((run / "resolved-config.json").read_text())
    assert resolved["distributed"]["activation_checkpointing_skip_blocks"] == "auto"
