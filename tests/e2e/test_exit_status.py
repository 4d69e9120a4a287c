"""Exit statuses a script can branch on, from real `solar` processes on tiny runs: SIGINT stops
`solar train` / `solar infer` at a checkpoint (or after a round of slots) with 130, SIGTERM with 0
(the operator's contract), both recording run-result.json `stopped`; `solar train --nproc 2` carries
130 from its ranks (torchrun exits 1 with a traceback); `solar diagnose` exits 1 for a failure. And
the messages that go with them: the final line of a launch, a checkpoint command given the wrong
directory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, REPO
from tests.e2e.helpers import TINY, env, result, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CONFIG = TINY["wan22_ti2v_5b"]
INFER = CONFIGS / "tiny" / "wan22_ti2v_5b" / "infer_stage0p5_fm_81f.yaml"


def _sets(data, out, *extra):
    return [f"data.root={data}", f"runtime.output_dir={out}", "runtime.log_every=1", "runtime.validate_every=0",
            *extra]


def _solar(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "solar", *args], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def _signal_after(proc: subprocess.Popen, sig: int, marker: str) -> list[str]:
    """Read the process's stderr; send ``sig`` once a line holds ``marker``; wait for it to end."""
    lines = []
    for line in proc.stderr:
        lines.append(line.rstrip("\n"))
        if marker in line and proc.poll() is None and len([x for x in lines if marker in x]) == 1:
            proc.send_signal(sig)
    proc.wait(timeout=120)
    return lines


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_stops_training_at_a_checkpoint_with_its_exit_status(sig, status, wan_data, tmp_path):
    out = tmp_path / "run"
    proc = train(CONFIG, _sets(wan_data, out, "train.max_steps=100000", "runtime.save_every=0"), wait=False)
    lines = _signal_after(proc, sig, "solar: step 2/")
    assert proc.returncode == status, "\n".join(lines[-20:])
    doc = result(out)
    assert doc["status"] == "stopped" and doc["checkpoints"]
    step = doc["final"]["step"]
    name = signal.Signals(sig).name
    assert lines[-1] == f"solar: train stopped at step {step} of 100000 by {name} (exit status {status}) -> {out}"
    assert _solar("checkpoint", "verify", doc["checkpoints"][-1]["path"]).returncode == 0
    diagnosis = _solar("diagnose", str(out))
    assert diagnosis.returncode == 0 and diagnosis.stdout.startswith("STOPPED: stopped")
    # a script's `solar train ... && next` goes on after SIGTERM (a stop the operator resumes), not after Ctrl-C
    chained = subprocess.run(["sh", "-c", f"(exit {proc.returncode}) && echo next"], capture_output=True, text=True)
    assert (chained.stdout == "next\n") == (sig == signal.SIGTERM)


def test_solar_train_alone_starts_its_ranks_and_carries_sigint_as_130(wan_data, tmp_path):
    """`solar train` alone with distributed.world_size 2 starts both ranks (as torchrun --standalone would),
    forwards SIGINT to them, waits for their stop's checkpoint and exits 130; torchrun would exit 1 with
    a Python traceback."""
    out = tmp_path / "run"
    sets = _sets(wan_data, out, "train.max_steps=100000", "runtime.save_every=0", "distributed.world_size=2",
                 "train.global_batch_size=2")
    proc = train(CONFIG, sets, wait=False)   # no torchrun: one `python -m solar train`
    lines = _signal_after(proc, signal.SIGINT, "solar: step 2/")
    assert proc.returncode == 130, "\n".join(lines[-30:])
    assert lines[0] == ("solar: starting 2 ranks on this machine for distributed.world_size=2 (as torchrun "
                        "--standalone --nproc-per-node=2 would)")
    assert not [line for line in lines if line.startswith("Traceback")]
    doc = result(out)
    assert doc["status"] == "stopped" and doc["checkpoints"]
    for r in (0, 1):   # both ranks stopped at the same step, neither was killed
        events = [json.loads(x) for x in (out / "events" / f"rank-{r:05d}.jsonl").read_text().splitlines()]
        assert events[-1]["event"] == "stopped" and events[-1]["step"] == doc["final"]["step"]
    assert f"by SIGINT (exit status 130) -> {out}" in lines[-1]


def test_a_world_larger_than_the_machine_is_refused_naming_torchrun(wan_data, tmp_path):
    import os

    world = (os.cpu_count() or 1) + 1
    proc = _solar("train", "--config", str(CONFIG), "--set", f"data.root={wan_data}", "--set",
                  f"runtime.output_dir={tmp_path / 'run'}", "--set", "runtime.device=cpu", "--set",
                  f"distributed.world_size={world}", "--set", f"train.global_batch_size={world}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"distributed.world_size={world} but this machine has {world - 1} CPU cores; start each node's ranks " \
           "with torchrun" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_sigint_stops_inference_after_a_round_of_slots_and_it_resumes(wan_data, wan_stage0p5, tmp_path):
    out = tmp_path / "gen"
    args = ["infer", "--config", str(INFER), "--set", f"data.root={wan_data}", "--set", f"runtime.output_dir={out}",
            "--set", f"checkpoint.path={wan_stage0p5}/checkpoints/step_00000004", "--set", "checkpoint.weights=ema",
            "--set", "validation.passes=[{name: a, weights: model, solver: unipc, steps: 2}, "
                     "{name: b, weights: model, solver: unipc, steps: 2}]"]
    proc = subprocess.Popen([sys.executable, "-m", "solar", *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = _signal_after(proc, signal.SIGINT, "solar: a slot 1/")
    assert proc.returncode == 130, "\n".join(lines[-20:])
    assert result(out)["status"] == "stopped"
    assert not (out / "generation" / "COMPLETE.json").exists()
    written = sorted(p.name for p in (out / "generation").glob("*/slot_*"))
    assert written and len(written) < 4
    assert lines[-1].startswith(f"solar: infer stopped by SIGINT with {len(written)} slot")
    diagnosis = _solar("diagnose", str(out))
    assert diagnosis.returncode == 0 and diagnosis.stdout.startswith("STOPPED: stopped"), diagnosis.stdout
    assert "None" not in diagnosis.stdout and "generated slot" in diagnosis.stdout
    again = _solar(*args, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert result(out)["status"] == "complete" and (out / "generation" / "COMPLETE.json").is_file()
    healthy = _solar("diagnose", str(out))
    assert healthy.returncode == 0 and "None" not in healthy.stdout
    assert "the run completed with 4 generated slots in generation/ (an inference run)" in healthy.stdout


def test_diagnose_exits_1_for_a_failure_and_0_for_a_healthy_run(wan_data, wan_stage0p5, tmp_path):
    healthy = _solar("diagnose", str(wan_stage0p5))
    assert healthy.returncode == 0 and healthy.stdout.startswith("HEALTHY")
    out = tmp_path / "run"
    failed = train(CONFIG, _sets(wan_data, out, "train.max_steps=3"), extra_env={"SOLAR_INJECT_FAULT": "raise:step=2"})
    assert failed.returncode == 2 and result(out)["status"] == "failed"
    for extra in ([], ["--json"]):
        found = _solar("diagnose", str(out), *extra)
        assert found.returncode == 1, found.stdout
    assert _solar("diagnose", str(out)).stdout.startswith("FAILED: ")
    assert json.loads(_solar("diagnose", str(out), "--json").stdout)["status"] == "failed"
    missing = _solar("diagnose", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stderr.startswith("solar: error:")
    assert "  0  the run is healthy (complete), stopped or still running\n  1  it diagnoses a failure" in \
        _solar("diagnose", "--help").stdout


def test_a_resume_at_max_steps_names_its_step(wan_data, tmp_path):
    """A launch that trains no step (resumed at train.max_steps, as a retried `solar run` stage is) ends
    with its checkpoint's step, not `at step -`."""
    out = tmp_path / "run"
    sets = _sets(wan_data, out, "train.max_steps=2", "runtime.save_every=2")
    assert train(CONFIG, sets).returncode == 0
    proc = train(CONFIG, [*sets, "checkpoint.mode=full_resume", f"checkpoint.path={out}/checkpoints/step_00000002"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == f"solar: train complete at step 2 of 2 -> {out}"


def test_checkpoint_commands_say_which_directory_they_were_given(wan_stage0p5, tmp_path):
    run, newest = wan_stage0p5, wan_stage0p5 / "checkpoints" / "step_00000004"
    verify = _solar("checkpoint", "verify", str(run))
    assert verify.returncode == 2
    (problem,) = json.loads(verify.stdout)["problems"]
    assert problem.startswith("it is a run directory, not a checkpoint; give one of its 2 checkpoints, e.g. the "
                              f"newest {newest} (`solar checkpoint list {run}` lists them)")
    assert "did not finish" not in verify.stdout
    export = _solar("checkpoint", "export", str(run), "--out", str(tmp_path / "x"))
    assert export.returncode == 2 and export.stderr.count("\n") == 1
    assert f"CHECKPOINT {run} is not usable: it is a run directory, not a checkpoint" in export.stderr
    assert str(newest) in export.stderr and not (tmp_path / "x").exists()
    folder = _solar("checkpoint", "verify", str(run / "checkpoints"))
    assert "it is a run's checkpoints folder, not a checkpoint" in folder.stdout
    listed = _solar("checkpoint", "list", str(newest))
    assert listed.returncode == 2 and listed.stdout == "" and listed.stderr.count("\n") == 1
    assert f"{newest} is a checkpoint directory, not a run directory; `solar checkpoint verify {newest}` checks it, " \
           f"`solar checkpoint list {run}` lists its run's checkpoints" in listed.stderr
    listed = _solar("checkpoint", "list", str(run / "checkpoints"))
    assert listed.returncode == 2 and f"give the run directory: `solar checkpoint list {run}`" in listed.stderr
    ok = _solar("checkpoint", "list", str(run))
    assert ok.returncode == 0 and [c["step"] for c in json.loads(ok.stdout)] == [2, 4]


def test_a_path_that_is_not_a_checkpoint_as_checkpoint_path_is_named(wan_data, wan_stage0p5, tmp_path):
    """The same words where a run takes a checkpoint: `checkpoint.path` given the run directory."""
    out = tmp_path / "child"
    proc = train(CONFIG, [f"data.root={wan_data}", f"runtime.output_dir={out}", "train.max_steps=2",
                          "checkpoint.mode=weights_only", f"checkpoint.path={wan_stage0p5}", "checkpoint.weights=ema"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"checkpoint.path {wan_stage0p5} is not usable: it is a run directory, not a checkpoint" in proc.stderr
    assert Path(str(wan_stage0p5)).is_dir()
