"""One rank of a fully sharded (FSDP2) training build with ``model.fp8_linear``: build the run's
parts (``train.setup.build_parts``: meta model, FP8 conversion, FSDP2, materialised shards), then
the same build unsharded in this process, run one forward and backward of each on the same inputs
and print JSON with the converted counts, both losses and whether the gathered gradients are
finite and how far they are from the unsharded ones. Run under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m tests.support.fp8_probe \\
        CONFIG KEY=VALUE ...
"""

from __future__ import annotations

import json
import os
import sys


def _step(model, inputs, cams, target):
    model.zero_grad(set_to_none=True)
    loss = (model(*inputs, cameras=cams) - target).square().mean()
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = grad.detach()
    return float(loss.detach()), grads


def main() -> None:
    config, sets = sys.argv[1], sys.argv[2:]
    import torch

    from solar.config.resolve import resolve_file
    from solar.launch import distributed
    from solar.train import fp8
    from solar.train.setup import build_parts

    resolved = resolve_file(config, sets, expected_action="train")
    cfg = resolved.config
    d = distributed.from_environment(expected_world=cfg.distributed.world_size, sp=1, backend="auto",
                                     device="cpu", timeout_seconds=300)
    sharded = build_parts(resolved, d.rank, d.device, world=d.world, local_world=d.local_world)
    whole = build_parts(resolved, d.rank, d.device)  # world 1: the same seeded model, unsharded
    dims = whole.model.cfg.dims
    g = torch.Generator().manual_seed(5)
    inputs = (torch.randn(1, dims.in_channels, 3, 8, 8, generator=g), torch.rand(1, 3, generator=g) * 1000,
              torch.randn(1, 7, dims.text_dim, generator=g))
    cams, target = torch.eye(4).repeat(1, 3, 1, 1), torch.randn(1, dims.out_channels, 3, 8, 8, generator=g)
    loss_s, grads_s = _step(sharded.model, inputs, cams, target)
    loss_w, grads_w = _step(whole.model, inputs, cams, target)
    worst = max(float((grads_s[n] - grads_w[n]).norm() / grads_w[n].norm().clamp_min(1e-12)) for n in grads_w)
    line = json.dumps({"rank": d.rank, "sharded": sharded.sharded,
                       "converted": [sharded.fp8_linears, whole.fp8_linears],
                       "float8_layers": len(fp8.converted(sharded.model)), "loss": [loss_s, loss_w],
                       "same_grad_names": sorted(grads_s) == sorted(grads_w),
                       "finite": all(bool(torch.isfinite(v).all()) for v in grads_s.values()),
                       "worst_grad_rel_diff": worst})
    os.write(1, (line + "\n").encode())   # one write: two ranks' lines never interleave on the shared pipe
    d.close()


if __name__ == "__main__":
    main()
