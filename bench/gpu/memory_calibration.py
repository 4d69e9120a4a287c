"""The memory forecast against ``solar train`` at the points ``auto`` chooses between (issue 46 item 1):
the released TI2V-5B configs at world 1, unsharded, blocks cut by ``model.dims.num_layers`` (an 80 GB
card holds no whole 5B state unsharded), with 0, some and every block keeping its activations,
compiled as shipped and eager. Each case runs through ``bench/gpu/stages_product.py`` (the product's
own ``python -m solar train``) with a probe (``bench/gpu/probe/sitecustomize.py``) that records the
allocated bytes and the peak of every forward, backward and optimizer phase, and prints one JSON line:
the measured peak, ``solar config memory``'s forecast of the same config and card, their ratio and
the phases of the last step.

    PYTHONPATH=trainer:. python3 bench/gpu/memory_calibration.py [CASE ...]
    PYTHONPATH=trainer:. python3 bench/gpu/memory_calibration.py --table   # docs/memory.md's rows, no GPU
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bench.gpu import stages_product
from bench.gpu.memory_runs import COMMON, WAN

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
S1 = stages_product.S1 + ["model.dims.num_layers=15"] + stages_product.SAVE_ATTENTION
S05 = ["model.dims.num_layers=15"]
S2 = stages_product.S2 + ["model.dims.num_layers=5"]
C, E = stages_product.COMPILE, stages_product.EAGER


def _keep(n: int | str) -> list[str]:
    return ["distributed.activation_checkpointing=false", "distributed.activation_checkpointing_skip_blocks=0"] \
        if n == "all" else \
        [f"distributed.activation_checkpointing_skip_blocks={n}"]


STAGE1, STAGE05, STAGE2 = (f"{WAN}/train_stage1_tf_anyflow_81f.yaml", f"{WAN}/train_stage0p5_fm_81f.yaml",
                           f"{WAN}/train_stage2_sgf_81f.yaml")
CASES = {
    **{f"cal_s1_l15_c_k{k}": (STAGE1, S1 + C + _keep(k), 3) for k in (0, 6, 10)},
    **{f"cal_s1_l15_e_k{k}": (STAGE1, S1 + E + _keep(k), 3) for k in (0, 6)},
    **{f"cal_s05_l15_c_k{k}": (STAGE05, S05 + C + _keep(k), 3) for k in (0, 8)},
    **{f"cal_s2_l5_c_k{k}": (STAGE2, S2 + C + _keep(k), 12) for k in (0, "all")},
    # as shipped: `auto` chooses from the forecast on this card (the trainer's activation_checkpointing event)
    "cal_s1_l15_c_auto": (STAGE1, S1 + C + ["distributed.activation_checkpointing_skip_blocks=auto"], 4),
    "cal_s05_l15_c_auto": (STAGE05, S05 + C + ["distributed.activation_checkpointing_skip_blocks=auto"], 4),
}


def forecast(config: str, extra: list[str], gpu_bytes: int) -> dict:
    from solar.config import memory
    from solar.config.resolve import resolve_file

    resolved = resolve_file(REPO / config, stages_product_sets(extra), expected_action="train")
    fc = memory.forecast(resolved, gpu_memory_bytes=gpu_bytes, gpus_per_node=8)
    return {"forecast_peak_bytes": fc.peak_bytes, "forecast_roles": fc.roles, "tokens": fc.tokens_per_gpu,
            "forecast_auto": fc.auto}


def compared(record: dict) -> tuple[int, int]:
    """(measured, forecast) peak bytes of one recorded case, forecast by today's tree. Stage2's cases
    end before the student's first update (the compile takes the case's time), so theirs is the
    critic's update with the student's AdamW moments and EMA not yet allocated."""
    config, extra, _ = CASES[record["case"]]
    fc = forecast(config, extra, record["gpu_memory_bytes"])
    peak = fc["forecast_peak_bytes"]
    if record["case"].startswith("cal_s2"):
        roles = fc["forecast_roles"]
        others = sum(v for r in roles.values() for k, v in r.items() if k not in ("gradients", "activations"))
        peak = others - roles["student"]["optimizer"] - roles["student"]["ema"] + roles["critic"]["gradients"] + \
            roles["critic"].get("activations", 0)
    return record["measured_peak_bytes"], peak


RESULTS = sorted((REPO / "bench" / "gpu" / "results").glob("*-memory-calibration-*.jsonl"))
NAMES = {"s1": "Stage1 TF-AnyFlow 81f, 15 blocks, save_attention", "s05": "Stage0.5 FM 81f, 15 blocks, full",
         "s2": "Stage2 SGF 81f, 5 blocks, full: the critic's update before the student's first"}


def records() -> list[dict]:
    return [json.loads(line) for path in RESULTS for line in path.read_text().splitlines() if line.strip()]


def table_rows() -> list[str]:
    """docs/memory.md's "forecast against measured" rows from the recorded cases."""
    rows = []
    for rec in records():
        if "auto" in rec["case"]:
            continue
        _, stage, _, compiled, keep = rec["case"].split("_")
        measured, fc = compared(rec)
        before = f"{rec['forecast_peak_bytes'] / GIB:.2f} " + (f"({rec['ratio']:.3f})" if stage != "s2" else
                                                              "for a step with a student update")
        kept = "all (checkpointing off)" if keep == "kall" else keep[1:]
        rows.append(f"| {NAMES[stage]} | {kept} | {'yes' if compiled == 'c' else 'no'} | {measured / GIB:.2f} | "
                    f"{fc / GIB:.2f} | {fc / measured:.3f} | {before} |")
    return sorted(rows, key=lambda r: ("Stage0.5" not in r, "Stage2" in r, "| no |" in r))


def stages_product_sets(extra: list[str]) -> list[str]:
    return COMMON + extra + ["data.root=/tmp/unused", "runtime.output_dir=/tmp/unused"]


def main() -> None:
    if sys.argv[1:] == ["--table"]:
        print("\n".join(table_rows()))
        return
    import torch

    gpu = torch.cuda.get_device_properties(0)
    probe_dir = REPO / "bench" / "gpu" / "probe"
    work = stages_product.WORK
    work.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = f"{probe_dir}:{os.environ.get('PYTHONPATH', '')}"
    for name in sys.argv[1:] or list(CASES):
        config, extra, want = CASES[name]
        probe = work / f"{name}.probe"
        for old in work.glob(f"{name}.probe.*"):
            old.unlink()
        os.environ["BENCH_PROBE"] = str(probe)
        stages_product.CASES[name] = (config, extra, want)
        result = stages_product.run(name)
        phases = []
        for f in work.glob(f"{name}.probe.*"):
            phases += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        measured = max((p["peak_so_far"] for p in phases), default=0)
        fc = forecast(config, extra, gpu.total_memory)
        logs = [work / f"{name}.log", work / "runs" / name / "logs" / "rank-00000.log"]
        fc["auto_lines"] = sorted({ln.strip() for p in logs if p.exists() for ln in p.read_text(errors="replace")
                                   .splitlines() if "skip_blocks auto ->" in ln})
        result.pop("peak_bytes", None)   # the trainer's figure is the peak since the probe's last reset
        out = {**result, "device": gpu.name, "gpu_memory_bytes": gpu.total_memory, "torch": torch.__version__,
               "measured_peak_bytes": measured, **fc,
               "ratio": round(fc["forecast_peak_bytes"] / measured, 3) if measured else None,
               "phases": phases[-8:] if not name.startswith("cal_s2") else phases[-24:]}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
