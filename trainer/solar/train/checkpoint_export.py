"""``solar checkpoint export CHECKPOINT --out DIR``: a checkpoint in whole files, one per role and
kind (``<role>/live.safetensors``, ``ema``, ``optimizer``), as an unsharded run saves it, from either
layout. Each tensor is assembled from its shards and written on its own (``write_streaming``), so the
export's memory is bounded by its largest tensor, not the model. ``DIR`` is a new directory, built as
a hidden partial beside it and committed like a save (manifest, COMPLETE.json, fsync, rename), with a
``release-manifest.json`` naming its default weights (the EMA where it exists), so ``solar infer``
and ``checkpoint.path`` take it, and ``model.pretrained_path`` takes it (or its ``model/*.safetensors``)
as the base model of a new run (``solar.launch.base_weights``); an incomplete source is refused
before anything is written.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from solar.errors import SolarError
from solar.storage import checkpoints as ckpt


def export(source: Path, out: Path, log=lambda _: None) -> Path:
    from solar.config.canonical import pretty_bytes
    from solar.launch.materialize import role_tensors
    from solar.safetensors_io import dtype_of, write_streaming

    manifest = ckpt.require_valid(source, "CHECKPOINT")
    out = Path(out)
    if out.exists():
        raise SolarError(f"--out {out} exists; an export is never written over anything")
    if not out.parent.is_dir():
        raise SolarError(f"--out {out}: its parent directory {out.parent} does not exist")
    partial = out.parent / f".{out.name}.{secrets.token_hex(4)}.partial"
    partial.mkdir()
    try:
        roles = {}
        for role, spec in manifest["roles"].items():
            members = []
            for kind in ("live", "ema", "optimizer"):
                tensors = role_tensors(source, role, kind)
                if not tensors:
                    continue
                rel = f"{role}/{kind}.safetensors"
                (partial / role).mkdir(parents=True, exist_ok=True)
                with open(partial / rel, "xb") as handle:
                    write_streaming(handle, {k: (dtype_of(v.dtype), v.shape) for k, v in tensors.items()},
                                    lambda k, t=tensors: t[k].read())
                members.append(rel)
                log(f"solar: export {rel} ({len(tensors)} tensors)")
            shutil.copyfile(source / role / "optimizer.json", partial / role / "optimizer.json")
            members.append(f"{role}/optimizer.json")
            roles[role] = {"weights": spec["weights"], "members": members}
        for entry in manifest["files"]:   # trainer.json, every rank's RNG and data-stream state
            rel = entry["path"]
            if rel.startswith(("rng/", "data/")) or rel == "trainer.json":
                (partial / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / rel, partial / rel)
        default = "ema" if any("ema" in s["weights"] for s in roles.values()) else "live"
        release = {"schema": "solar.release.v1", "source": str(source), "step": manifest["step"],
                   "load": {"default_weights": default}}
        with open(partial / "release-manifest.json", "xb") as handle:
            handle.write(pretty_bytes(release))
        final = ckpt.commit(partial, step=manifest["step"], contract=manifest["contract"], roles=roles,
                            trainer_state=manifest["trainer_state"], final=out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final
