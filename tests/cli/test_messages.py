"""Messages that say what is true, from the CLI as users run it: one line naming the argument or field
and the fix, exit 2, no traceback (tests/e2e/test_exit_status.py covers the ones that need a run)."""

from __future__ import annotations

import json

from solar.config import memory
from solar.config.resolve import resolve_file
from tests.cli.test_cli import run
from tests.conftest import CONFIGS

TINY = CONFIGS / "tiny" / "wan22_ti2v_5b"


def _one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("solar: error: ")
    return line


def test_config_memory_of_an_infer_config_says_it_forecasts_training():
    line = _one_line_error(run("config", "memory", "--config", str(TINY / "infer_stage0p5_fm_81f.yaml")))
    assert "`solar config memory` forecasts training configs; this one is an infer config" in line
    assert "the command is" not in line


def test_solar_run_names_its_manifest_argument(tmp_path):
    line = _one_line_error(run("run", "nosuch.yaml", "--workdir", str(tmp_path)))
    assert line == "solar: error: MANIFEST nosuch.yaml: no such file"
    line = _one_line_error(run("run", str(tmp_path), "--dry-run"))
    assert line == f"solar: error: MANIFEST {tmp_path}: is a directory, expected a SolarRun YAML or JSON file"
    assert not any(tmp_path.iterdir())


def test_checkpoint_verify_names_its_route_config_argument(tmp_path):
    (tmp_path / "step_00000001").mkdir()
    line = _one_line_error(run("checkpoint", "verify", str(tmp_path / "step_00000001"), "--route-config", "nosuch.yaml"))
    assert line == "solar: error: --route-config nosuch.yaml: no such file"


def test_a_quoted_number_is_named_as_a_string_with_the_unquoted_form():
    proc = run("config", "resolve", "--config", str(TINY / "train_stage0p5_fm_81f.yaml"), "--set", "data.root=/d",
               "--set", "runtime.output_dir=/o", "--set", 'train.max_steps="4"')
    line = _one_line_error(proc)
    assert line == ("solar: error: train.max_steps: input should be a valid integer; got the string '4' (it was "
                    "quoted); write the number without quotes, e.g. --set train.max_steps=4")


def test_data_plan_names_its_counts_consistently(tmp_path):
    from solar.data.synth import synthesize

    synthesize("wan22_ti2v_5b", tmp_path / "d", samples=4, seed=0)
    proc = run("data", "plan", str(tmp_path / "d" / "train-index.jsonl.gz"), "--seed", "1", "--pixel-frames", "81",
               "--world-size", "2", "--rank", "1", "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["reader"], doc["readers"]) == (1, 2) and "reader_count" not in doc
    other = json.loads(run("data", "plan", str(tmp_path / "d" / "train-index.jsonl.gz"), "--seed", "1",
                           "--pixel-frames", "81", "--world-size", "2", "--rank", "0", "--limit", "1").stdout)
    assert doc["reader_plan_count"] + other["reader_plan_count"] == doc["full_plan_count"] == 4


def test_one_block_kept_is_singular():
    """`auto` keeping one block says `1 block keeps its activations` (found by sizing the GPU)."""
    resolved = resolve_file(CONFIGS / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml", [], placeholders=False)
    for gib in range(30, 60):
        fc = memory.forecast(resolved, gpu_memory_bytes=gib * memory.GIB)
        if fc.auto == 1:
            break
    assert fc.auto == 1
    assert "activation_checkpointing_skip_blocks auto: 1 block keeps its activations (" in memory.table(fc)
    assert memory.blocks_keep(2) == "2 blocks keep their activations"
