"""``solar infer``'s wall time per slot through the product (issue 25 item 3): the released TI2V-5B
Stage2 infer config (self-forcing 4 steps, ``validation.rollout_latents`` 60 at 480x864, VAE decode
and the sample's files included) on ``solar data synth --profile released`` test rows.

No trained 5B Stage2 checkpoint exists on the device (one with its optimizer state does not fit its
disk), so the bench writes one the way a Stage2 save lays it out for inference: the student's live
weights (the model as ``solar infer`` builds it, random from seed 0, fp32) in
``student/live.safetensors``, committed with ``storage.checkpoints.commit`` and the route's contract,
so ``solar infer`` verifies and loads it like any other. Then ``python -m solar infer`` runs as a
user runs it; its own per-slot lines (``solar: <pass> slot i/n (<sample>) <s>s``: generation,
decode, files) and the process's wall time are the figures. The checkpoint is removed at the end.

    PYTHONPATH=trainer:. python3 bench/gpu/infer_product.py

``BENCH_SAMPLES`` (default 2) slots; ``BENCH_SETS`` (space-separated ``KEY=VALUE``) adds ``--set``
values, ``BENCH_SETS_JSON`` (a JSON list of ``KEY=VALUE``) values with spaces in them (e.g.
``validation.passes``); ``BENCH_CONFIG`` another infer config (any route: a Stage0.5 or Stage1 infer
config gets its ``model`` role written, Stage2 its ``student``) and ``BENCH_DATA`` its data root (a CPU
smoke run: the tiny config on ``solar data synth --profile tiny`` data).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.memory_runs import released_data

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/solar-infer"))
CONFIG = (REPO / os.environ.get("BENCH_CONFIG", "configs/solar_wm/wan22_ti2v_5b/infer_stage2_sgf_81f.yaml")).resolve()
SAMPLES = int(os.environ.get("BENCH_SAMPLES", "2"))


def _sets(data: Path, checkpoint: Path, out: Path) -> list[str]:
    return ["distributed.world_size=1", "model.pretrained_path=", "model.vae_path=", f"data.root={data}",
            "data.test_index=test-index.jsonl.gz", f"validation.sample_count={SAMPLES}",
            f"checkpoint.path={checkpoint}", "checkpoint.weights=live", f"runtime.output_dir={out}",
            *os.environ.get("BENCH_SETS", "").split(), *json.loads(os.environ.get("BENCH_SETS_JSON", "[]"))]


def write_checkpoint(sets: list[str], root: Path) -> Path:
    """The model's live weights as a committed checkpoint of this route (Stage2: the student's role;
    every other route: ``model``, the role ``solar infer`` reads from a single-model checkpoint)."""
    import torch

    from solar.config.contracts import checkpoint_contract
    from solar.config.resolve import resolve_file
    from solar.models.registry import model_from_config
    from solar.storage import checkpoints as ckpt
    from solar.train.checkpoint_io import full, write_tensors

    resolved = resolve_file(CONFIG, sets, expected_action="infer", placeholders=False)
    cfg = resolved.config
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    state = model_from_config(cfg, device=device).state_dict()
    role = "student" if resolved.route.stage == "stage2" else "model"
    partial = ckpt.begin(root, 1)
    write_tensors(partial / role / "live.safetensors", full(state))   # as a save writes a role's member
    del state
    roles = {role: {"weights": ["live"], "members": [f"{role}/live.safetensors"]}}
    if torch.cuda.is_available():
        torch.cuda.empty_cache()   # the weights' 20 GB go back to the GPU before `solar infer` starts
    return ckpt.commit(partial, step=1, contract=checkpoint_contract(cfg, resolved.route), roles=roles,
                       trainer_state={})


def main() -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    data = Path(os.environ["BENCH_DATA"]) if "BENCH_DATA" in os.environ else \
        released_data(480, 864, samples=16)   # 4 test rows: BENCH_SAMPLES up to 4
    out, final = WORK / "out", WORK / "run" / "checkpoints" / "step_00000001"
    started = time.time()
    checkpoint = write_checkpoint(_sets(data, final, out), WORK / "run")
    written = time.time() - started
    args = [sys.executable, "-m", "solar", "infer", "--config", str(CONFIG)]
    for s in _sets(data, checkpoint, out):
        args += ["--set", s]
    started = time.time()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - started
    lines = [ln.split("solar: ", 1)[1] for ln in proc.stderr.splitlines() if "solar: " in ln]
    slots = [ln for ln in lines if " slot " in ln]
    result = {"bench": "infer_product", "config": str(CONFIG.relative_to(REPO)), "samples": SAMPLES,
              "checkpoint_write_seconds": round(written, 1), "infer_wall_seconds": round(wall, 1),
              "returncode": proc.returncode, "slot_lines": slots, "last_lines": lines[-3:]}
    summary = out / "generation" / "COMPLETE.json"
    if summary.exists():
        result["complete"] = json.loads(summary.read_text())
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-2000:]
    print(json.dumps(result), flush=True)
    shutil.rmtree(WORK / "run", ignore_errors=True)   # 20 GB of random weights


if __name__ == "__main__":
    main()
