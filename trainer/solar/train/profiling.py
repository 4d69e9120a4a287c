"""Opt-in step profiling (``runtime.profile_steps``), like torchtitan's profiling option.

Each listed optimizer step runs under ``torch.profiler`` (CPU and, on CUDA, GPU activity), and the
rank writes ``profile/rank-NNNNN-step-NNNNNNNN.txt`` (readable tables) and ``.json`` (the same
figures) in the run directory, create-only (a resumed launch that profiles the step again adds
``-1``, ``-2``, ...). The tables: the trainer's phases (``phase`` labels:
device and CPU time of the work each one launched), the GPU kernels grouped by name and by kind
(attention, matmul, other), and the profiler's operator table sorted by GPU time. A phase's GPU
time is its span on the GPU timeline. The backward pass (and the recomputation of checkpointed
blocks inside it) runs on autograd's own thread, so it shows as the kernel time outside every
top-level phase. Steps not listed pay nothing but the labels
(``torch.profiler.record_function``, microseconds per call).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

PREFIX = "solar/"
TOP_KERNELS = 25


def phase(name: str):
    """A labelled span of the step (``solar/<name>``; ``a/b`` nests ``b`` inside ``a``)."""
    return torch.profiler.record_function(PREFIX + name)


def kind_of(kernel: str) -> str:
    """A GPU kernel's kind by its name: attention, matmul or other."""
    k = kernel.lower()
    if any(s in k for s in ("flash", "attention", "attn", "flex", "fmha", "sdpa")):
        return "attention"
    if any(s in k for s in ("gemm", "xmma", "cutlass", "nvjet", "wgmma", "cublas", "matmul", "_mm_")):
        return "matmul"
    return "other"


def summarize(prof, step: int, step_seconds: float | None) -> dict:
    """The figures of one profiled step (milliseconds). A phase's GPU time is its span on the GPU
    timeline (kineto's annotation, first to last kernel it launched); kernels launched from another
    thread (autograd's backward) fall outside every phase."""
    from torch.autograd import DeviceType

    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    phases: dict[str, dict] = defaultdict(lambda: {"gpu_ms": 0.0, "cpu_ms": 0.0, "count": 0})
    for e in prof.events():
        on_gpu = e.device_type != DeviceType.CPU
        if e.name.startswith(PREFIX):
            entry = phases[e.name[len(PREFIX):]]
            if on_gpu:
                entry["gpu_ms"] += e.device_time_total / 1e3
            else:
                entry["cpu_ms"] += e.cpu_time_total / 1e3
                entry["count"] += 1
        elif on_gpu and not getattr(e, "is_user_annotation", False):
            kernel = kernels[e.name]
            kernel[0] += e.device_time_total / 1e3
            kernel[1] += 1
    gpu_ms = sum(v[0] for v in kernels.values())
    kinds: dict[str, float] = defaultdict(float)
    for name, (ms, _) in kernels.items():
        kinds[kind_of(name)] += ms
    phases = {k: {"gpu_ms": round(v["gpu_ms"], 3), "cpu_ms": round(v["cpu_ms"], 3), "count": v["count"]}
              for k, v in sorted(phases.items())}
    labelled = sum(v["gpu_ms"] for k, v in phases.items() if "/" not in k)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
    return {"step": step, "step_seconds": step_seconds, "gpu_ms": round(gpu_ms, 3),
            "gpu_ms_outside_phases": round(gpu_ms - labelled, 3), "phases": phases,
            "kinds": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "kernels": [{"name": n[:160], "gpu_ms": round(ms, 3), "calls": calls, "kind": kind_of(n)}
                        for n, (ms, calls) in top]}


def render(summary: dict, operator_table: str) -> str:
    s = summary
    pct = (lambda ms: f"{100 * ms / s['gpu_ms']:5.1f}%") if s["gpu_ms"] else (lambda ms: "    -")
    wall = f"{s['step_seconds']:.3f} s" if s["step_seconds"] is not None else "-"
    lines = [f"step {s['step']}: wall {wall}, GPU kernel time {s['gpu_ms'] / 1e3:.3f} s", "",
             "phase (nested phases indented)               GPU span ms    share   CPU ms  calls"]
    for name, v in s["phases"].items():
        label = "  " * name.count("/") + name.rsplit("/", 1)[-1]
        lines.append(f"{label:<48} {v['gpu_ms']:>9.1f}  {pct(v['gpu_ms'])} {v['cpu_ms']:>8.1f} {v['count']:>6}")
    if s["gpu_ms_outside_phases"] >= 0:
        lines.append(f"{'(kernels outside every phase: backward, ...)':<48} {s['gpu_ms_outside_phases']:>9.1f}  "
                     f"{pct(s['gpu_ms_outside_phases'])}")
    else:   # spans count the GPU's idle time inside them: the step waits on the host
        lines.append("(the phases' spans exceed the kernel time: the GPU idles inside them, waiting on the host)")
    lines += ["", "kernel kind      GPU ms    share"]
    lines += [f"{k:<14} {ms:>9.1f}  {pct(ms)}" for k, ms in s["kinds"].items()]
    lines += ["", f"top {TOP_KERNELS} kernels                                                         GPU ms    share  "
                  "calls  kind"]
    lines += [f"{k['name'][:72]:<72} {k['gpu_ms']:>9.1f}  {pct(k['gpu_ms'])} {k['calls']:>6}  {k['kind']}"
              for k in s["kernels"]]
    title = "operators by self GPU time (CPU time without a GPU), torch.profiler"
    return "\n".join(lines) + f"\n\n{title}\n{operator_table}\n"


class StepProfiler:
    """Profiles the listed steps of one launch and writes their tables under ``profile/``."""

    def __init__(self, out: Path, steps, rank: int, device: torch.device) -> None:
        self.folder, self.steps, self.rank, self.device = Path(out) / "profile", set(steps or ()), rank, device
        self.written: list[Path] = []

    def start(self, step: int):
        """The running profiler for ``step``, or None when the step is not listed."""
        if step not in self.steps:
            return None
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities)
        prof.start()
        return prof

    def finish(self, prof, step: int, step_seconds: float | None) -> dict | None:
        """Stop ``prof`` (from ``start``) and write the step's tables; the summary, or None if None."""
        if prof is None:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof.stop()
        summary = summarize(prof, step, step_seconds)
        sort = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=70)
        from solar.storage.atomic import write_create_only

        self.folder.mkdir(parents=True, exist_ok=True)
        stem, n = self.folder / f"rank-{self.rank:05d}-step-{step:08d}", 1
        while stem.with_suffix(".json").exists() or stem.with_suffix(".txt").exists():  # a resumed launch
            stem, n = self.folder / f"rank-{self.rank:05d}-step-{step:08d}-{n}", n + 1
        write_create_only(stem.with_suffix(".json"), json.dumps(summary, indent=1).encode(), what="step profile")
        write_create_only(stem.with_suffix(".txt"), render(summary, table).encode(), what="step profile")
        self.written.append(stem.with_suffix(".txt"))
        return summary
