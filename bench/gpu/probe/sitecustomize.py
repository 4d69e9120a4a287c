"""A memory probe for ``bench/gpu/memory_calibration.py``: with ``BENCH_PROBE=PATH`` set, every
process that runs a backward or an optimizer step appends one JSON line per phase to
``PATH.<pid>``: the phase (``forward``: from the previous phase's end to a backward's start;
``backward``; ``between``: a backward's end to the optimizer; ``optimizer``), the bytes allocated
at its start and its peak (``torch.cuda.max_memory_allocated`` since the phase began). The peak
counter is reset at each phase, so ``peak_so_far`` carries the process's own maximum (what the
trainer's ``memory.cuda_peak_bytes`` reports without the probe)."""

import json
import os

_PATH = os.environ.get("BENCH_PROBE")
if _PATH:
    import torch
    import torch.autograd
    import torch.optim.optimizer as _opt

    _state = {"phase": "forward", "start": 0, "index": 0, "peak_so_far": 0}
    _out = open(f"{_PATH}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115

    def _close(next_phase: str) -> None:
        if not torch.cuda.is_initialized():
            return
        peak = torch.cuda.max_memory_allocated()
        _state["peak_so_far"] = max(_state["peak_so_far"], peak)
        _out.write(json.dumps({"i": _state["index"], "phase": _state["phase"], "start_bytes": _state["start"],
                               "peak_bytes": peak, "end_bytes": torch.cuda.memory_allocated(),
                               "peak_so_far": _state["peak_so_far"]}) + "\n")
        _state["index"] += 1
        torch.cuda.reset_peak_memory_stats()
        _state["phase"], _state["start"] = next_phase, torch.cuda.memory_allocated()

    _backward = torch.autograd.backward

    def backward(*args, **kwargs):
        _close("backward")
        try:
            return _backward(*args, **kwargs)
        finally:
            _close("between")

    torch.autograd.backward = backward
    _opt.register_optimizer_step_pre_hook(lambda *a: _close("optimizer"))
    _opt.register_optimizer_step_post_hook(lambda *a: _close("forward"))
