"""One rank of ``solar train``'s start-up, measured: join the process group, build the run's parts
(``train.setup.build_parts``: meta model, parallelism, materialised shards filled from the sources),
and print JSON with the host memory before and after, the bytes of this rank's parameters, and
whether named parameters gathered whole equal the source file. Run under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node=N -m tests.support.build_probe \\
        CONFIG SOURCE_FILE NAME [NAME ...] -- KEY=VALUE ...
"""

from __future__ import annotations

import json
import resource
import sys


def _rss() -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:"))


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    config, source, names, sets = args[0], args[1], args[2:split], args[split + 1:]
    import torch
    from safetensors import safe_open

    from solar.config.resolve import resolve_file
    from solar.launch import distributed
    from solar.train.setup import build_parts

    resolved = resolve_file(config, sets, expected_action="train")
    cfg = resolved.config
    d = distributed.from_environment(expected_world=cfg.distributed.world_size, sp=1, backend="auto",
                                     device="cpu", timeout_seconds=300)
    before = _rss()
    parts = build_parts(resolved, d.rank, d.device, world=d.world, local_world=d.local_world)
    after = _rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    local = sum(p.to_local().numel() * 4 if hasattr(p, "to_local") else p.numel() * 4 for p in parts.model.parameters())
    state = parts.model.state_dict()
    equal = {}
    with safe_open(source, framework="pt") as handle:
        for name in names:
            value = state[name]
            whole = value.full_tensor() if hasattr(value, "full_tensor") else value
            equal[name] = bool(torch.equal(whole, handle.get_tensor(name).to(whole.dtype)))
    print(json.dumps({"rank": d.rank, "rss_before": before, "rss_after": after, "peak": peak,
                      "local_parameter_bytes": local, "equal": equal}), flush=True)
    d.close()


if __name__ == "__main__":
    main()
