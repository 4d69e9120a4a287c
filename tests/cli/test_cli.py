"""The CLI as users run it: subprocesses, exit codes, output files, debug mode, import hygiene."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from solar.cli import build_parser
from tests.conftest import CONFIGS, REPO

TINY_WAN = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"


def run(*args: str, env: dict[str, str] | None = None, input_text: str | None = None):
    full_env = {k: v for k, v in os.environ.items() if k != "SOLAR_DEBUG"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "solar", *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, input=input_text, timeout=120)


def test_routes_json_subprocess():
    proc = run("config", "routes", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == 9


def test_resolve_stdout_document():
    proc = run("config", "resolve", "--config", str(TINY_WAN), "--set", "data.root=/d",
               "--set", "runtime.output_dir=/o")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"schema", "source", "source_digest", "resolved_digest", "route", "topology", "config"}
    assert doc["schema"] == "solar.resolved.v1"
    assert doc["route"] == "wan22_ti2v_5b:stage0p5:bidirectional:flow_matching"
    assert doc["topology"] == {"world_size": 1, "sequence_parallel_size": 1, "logical_dp_world_size": 1,
                               "micro_batch_size": 1, "gradient_accumulation": 1, "global_batch_size": 1}
    assert doc["config"]["data"]["root"] == "/d" and doc["source"] == str(TINY_WAN)
    from solar.config.canonical import blake2s_hex, digest
    assert doc["source_digest"] == blake2s_hex(TINY_WAN.read_bytes())
    assert doc["resolved_digest"] == digest(doc["config"])


def test_env_expansion_from_the_environment():
    proc = run("config", "resolve", "--config", str(TINY_WAN), "--set", "data.root=${SOLAR_DATA}/x",
               "--set", "runtime.output_dir=/o", env={"SOLAR_DATA": "/mnt/data"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["data"]["root"] == "/mnt/data/x"


def test_output_is_atomic_and_create_only(tmp_path):
    out = tmp_path / "resolved.json"
    args = ["config", "resolve", "--config", str(TINY_WAN), "--set", "data.root=/d",
            "--set", "runtime.output_dir=/o", "--output", str(out)]
    proc = run(*args)
    assert proc.returncode == 0 and proc.stdout == ""
    assert "wan22_ti2v_5b:stage0p5" in proc.stderr
    first = out.read_bytes()
    assert json.loads(first)["route"].startswith("wan22_ti2v_5b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resolved.json"]  # no temp files left
    again = run(*args)
    assert again.returncode == 2
    assert again.stderr.strip() == f"solar: error: --output {out} already exists; choose a new path (nothing was written)"
    assert out.read_bytes() == first
    missing_dir = run(*args[:-1], str(tmp_path / "no" / "such" / "dir.json"))
    assert missing_dir.returncode == 2 and "does not exist" in missing_dir.stderr


def test_errors_are_one_line_and_debug_shows_traceback(tmp_path):
    args = ["config", "resolve", "--config", str(TINY_WAN), "--set", "train.bogus=1",
            "--set", "data.root=/d", "--set", "runtime.output_dir=/o"]
    plain = run(*args)
    assert plain.returncode == 2
    assert plain.stderr.startswith("solar: error: train.bogus: unknown key (allowed: stage, ")
    assert plain.stderr.count("\n") == 1
    debug = run(*args, env={"SOLAR_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr


def test_usage_errors_exit_2():
    for args in ([], ["config"], ["config", "resolve"], ["nosuchverb"], ["config", "routes", "--bogus"]):
        proc = run(*args)
        assert proc.returncode == 2, args
        assert proc.stderr.startswith("solar: error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_console_script_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "solar")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("solar ")


def _tree(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_tree(sub, f"{prefix} {name}".strip()))
    flags = {opt for a in parser._actions for opt in a.option_strings if opt not in ("-h", "--help")}
    if prefix and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        found[prefix] = flags
    return found


def test_cli_verbs_and_flags_are_frozen_to_the_contract():
    """New behaviour arrives as config keys, not flags; contract.md §1 lists each verb's flags."""
    assert _tree(build_parser()) == {
        "config routes": {"--json"},
        "config resolve": {"--config", "--set", "--output"},
        "config memory": {"--config", "--set", "--gpu-memory-gib", "--gpus-per-node", "--json"},  # issue 27
        "environment probe": set(),
        "data inspect": set(),
        "data plan": {"--seed", "--pixel-frames", "--world-size", "--rank", "--sequence-parallel-size",
                      "--local-world-size", "--num-workers", "--worker-id", "--epoch", "--mode", "--limit"},
        "data synth": {"--family", "--out", "--samples", "--seed", "--profile"},
        "model info": {"--family", "--profile"},
        "train": {"--config", "--set"},
        "infer": {"--config", "--set"},
        "checkpoint verify": {"--route-config"},
        "checkpoint list": set(),
        "checkpoint export": {"--out"},  # issue 38: whole files from a sharded checkpoint
        "model convert": {"--family", "--from", "--out"},
        "run": {"--workdir", "--nproc", "--dry-run"},  # --dry-run: contract.md §7
        "diagnose": {"--json"},
        "report": {"--json", "--html"},
    }


def test_environment_probe_json():
    proc = run("environment", "probe", env={"SOLAR_FOO": "bar", "SOLAR_TOKEN": "sekrit-value-123",
                                            "RANK": "0"})
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    for key in ("python", "torch", "cuda", "nccl", "devices", "gpu_processes", "env", "packages"):
        assert key in facts
    assert facts["torch"]["available"] is True and facts["torch"]["version"].startswith("2.")
    assert facts["env"]["SOLAR_FOO"] == "bar" and facts["env"]["RANK"] == "0"
    assert facts["env"]["SOLAR_TOKEN"] == "<redacted>" and "sekrit" not in proc.stdout
    assert facts["packages"]["pydantic"]
    assert "torchao" in facts["packages"]  # model.fp8_linear's library: its version, or null when absent
    assert isinstance(facts["devices"], list)


def test_environment_probe_without_torch():
    code = ("import sys; sys.modules['torch'] = None; from solar.cli import main; "
            "sys.exit(main(['environment', 'probe']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["torch"]["available"] is False and "ModuleNotFoundError" in facts["torch"]["error"]
    assert facts["cuda"]["available"] is False


@pytest.mark.parametrize("module", ["solar.cli", "solar.config.resolve", "solar.config.contracts",
                                    "solar.storage.atomic"])
def test_core_imports_without_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_resolve_does_not_import_torch():
    code = ("import sys; from solar.cli import main; "
            f"rc = main(['config', 'resolve', '--config', {str(TINY_WAN)!r}, '--set', 'data.root=/d', "
            "'--set', 'runtime.output_dir=/o']); assert 'torch' not in sys.modules; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("verb", "config", "said"), [
    ("train", CONFIGS / "tiny" / "wan22_ti2v_5b" / "infer_stage0p5_fm_81f.yaml", "infer"),
    ("infer", TINY_WAN, "train"),
])
def test_action_mismatch_is_one_line_and_writes_nothing(verb, config, said, tmp_path):
    out = tmp_path / "out"
    proc = run(verb, "--config", str(config), "--set", f"runtime.output_dir={out}",
               "--set", f"data.root={tmp_path / 'data'}", "--set", f"checkpoint.path={tmp_path / 'ckpt'}")
    assert proc.returncode == 2, proc.stderr
    article = "an" if verb == "infer" else "a"
    assert proc.stderr == (f"solar: error: action: the config says action {said!r} but the command is "
                           f"`solar {verb}`; use `solar {said}` or {article} {verb} config\n")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []
