"""What ``model.pretrained_path`` names, and which weights of it a run starts from.

A base model is one of:

- a Solar weights directory (``solar model convert``: ``solar-model.json``);
- a Solar checkpoint (``checkpoints/step_N``, either layout) or an export of one (``solar checkpoint
  export``): its ``model`` role's EMA weights where it has them (laid over the live weights, as a
  checkpoint's EMA is read everywhere, and the export's default), else its live weights;
- one weight file of such a checkpoint or export (``<dir>/model/ema.safetensors`` or
  ``live.safetensors``): those weights, read through the checkpoint it belongs to; its role's folder
  (``<dir>/model``) as the directory;
- a diffusers release of the family (a folder or one file), converted on the fly.

Solar's own files hold Solar's state-dict names for the dims they were trained with, so they are read
as they are and checked against the model as configured, never converted (a conversion infers dims
from a release's shapes, which a tiny or re-dimensioned Solar model does not have). Anything else is
refused in one line that also names ``checkpoint.mode``: a base model starts a new run; a Solar run's
training state (optimizer, step, data position) is continued by ``checkpoint.mode=full_resume`` and
its weights taken into a new optimisation by ``checkpoint.mode=weights_only``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from solar.models.weights import MANIFEST as SOLAR_MODEL, WeightsError
from solar.storage.checkpoints import MANIFEST_SCHEMA, CheckpointError, not_a_checkpoint, require_valid

KEY = "model.pretrained_path"
HINT = ("to continue a Solar run's training state use checkpoint.mode=full_resume, or to start a new optimisation "
        "from its weights checkpoint.mode=weights_only, with checkpoint.path=<its checkpoint>")
WEIGHT_FILES = (".safetensors", ".pth", ".pt")
ACCEPTS = ("a base model is a Solar export or checkpoint directory or one of its model/*.safetensors files, a "
           "`solar model convert` directory or a diffusers release")


@dataclass(frozen=True)
class SolarSource:
    """A Solar checkpoint or export as a base: the directory, the role and which weights."""

    checkpoint: Path
    role: str
    weights: str            # live | ema
    step: int
    chosen: bool            # True: the directory was named and the weights chosen for it
    family: str | None      # the family its contract records


def refusal(path: str, detail: str) -> WeightsError:
    """What a base model that cannot be used is (``with_hint`` adds the way to continue a run)."""
    return WeightsError(f"{KEY} {path}: {detail}")


def with_hint(exc: Exception, path: str) -> WeightsError:
    """``exc`` (any problem of the base model ``path``: what it is, its keys or shapes) as the one
    line a run starting from it is refused with, naming the path once and ``checkpoint.mode``."""
    text = str(exc)
    prefix = f"{KEY} {path}"
    for lead in (f"{KEY}: ", f"weights {path}: "):
        text = text.removeprefix(lead)
    if not text.startswith(prefix):       # a conversion's or reader's own words
        text = f"{prefix}: {text}"
    return WeightsError(text if HINT in text else f"{text}; {HINT}")


def _checkpoint_manifest(root: Path) -> bool:
    """Whether ``root`` holds a Solar checkpoint's manifest (a checkpoint or an export)."""
    try:
        return json.loads((root / "manifest.json").read_text()).get("schema") == MANIFEST_SCHEMA
    except (OSError, ValueError, AttributeError):
        return False


def solar_source(path: str | Path) -> SolarSource | None:
    """The Solar checkpoint or export ``path`` names (the directory, a role's folder or one of its
    weight files), or None when it names neither; a WeightsError when it names one that cannot be a
    base model."""
    named = Path(path)
    if named.is_dir() and _checkpoint_manifest(named):
        root, role, weights = named, "model", None
    elif named.is_dir() and _checkpoint_manifest(named.parent):     # a role's folder: DIR/model
        root, role, weights = named.parent, named.name, None
    elif named.is_file() and named.suffix == ".safetensors" and _checkpoint_manifest(named.parent.parent):
        root, role, weights = named.parent.parent, named.parent.name, named.stem
        if weights not in ("live", "ema"):
            raise refusal(str(path), f"{named.name} of the Solar checkpoint {root} holds {weights} state, not weights "
                                     f"(name {named.with_name('ema.safetensors')} or the directory {root})")
    else:
        return None
    try:
        manifest = require_valid(root, "the Solar checkpoint")
    except CheckpointError as exc:
        raise refusal(str(path), str(exc)) from None
    roles = manifest.get("roles") or {}
    if role not in roles:
        files = sorted(root.glob("*/ema.safetensors")) or sorted(root.glob("*/live.safetensors"))
        name = f"; name one role's weight file, e.g. {files[0]}" if files else ""
        raise refusal(str(path), f"the Solar checkpoint {root} has no {role} weights (its roles: "
                                 f"{', '.join(sorted(roles)) or 'none'}{name})")
    state = manifest.get("trainer_state") or {}
    if state.get("adapter_only"):
        raise refusal(str(path), f"the Solar checkpoint {root} holds LoRA adapters only (trained on the base "
                                 f"{state.get('base')}): that base is the model.pretrained_path, the adapters come "
                                 "from checkpoint.path")
    saved = roles[role].get("weights", [])
    chosen = weights is None
    if chosen:
        weights = "ema" if "ema" in saved else "live"
    elif weights not in saved:
        raise refusal(str(path), f"the Solar checkpoint {root} has no {weights} weights for {role}")
    family = (manifest.get("contract") or {}).get("family")
    return SolarSource(root, role, weights, int(manifest["step"]), chosen, family)


def family_problem(source: SolarSource, family: str) -> str | None:
    if source.family and source.family != family:
        return f"a Solar {source.family} checkpoint ({source.checkpoint}); this run's model.family is {family}"
    return None


def plain_problem(path: str) -> str | None:
    """What a path that is neither Solar's layout nor weight files is, or None when it may be a
    release (its weight files are then checked by the conversion)."""
    root = Path(path)
    if not root.exists():
        return "no such file or directory"
    if root.is_file():
        if root.suffix in WEIGHT_FILES:
            return None
        return f"a file that is not weights (not {', '.join(WEIGHT_FILES)}); {ACCEPTS}"
    if (root / SOLAR_MODEL).is_file():
        return None
    run = not_a_checkpoint(root)
    if run:
        return run
    entries = sorted(p.name for p in root.iterdir())
    if not entries:
        return f"an empty directory; {ACCEPTS}"
    source = root / "transformer" if (root / "transformer").is_dir() else root
    if any(p.suffix in WEIGHT_FILES and p.is_file() for p in source.iterdir()):
        return None
    shown = ", ".join(entries[:3]) + (f" (+{len(entries) - 3} more)" if len(entries) > 3 else "")
    return f"a directory with no weights (it holds {shown}); {ACCEPTS}"


def record(path: str, role: str = "model") -> dict:
    """A launch record's entry for the base model ``path``: which weights of which Solar checkpoint
    or export (and its step), else ``released``."""
    try:
        source = solar_source(path)
    except WeightsError:   # the launch's check refused it already; a record never fails a launch
        source = None
    if source is None:
        return {"role": role, "path": path, "weights": "released"}
    return {"role": role, "path": path, "weights": source.weights, "step": source.step,
            "checkpoint": str(source.checkpoint)}


def note(path: str, source: SolarSource) -> str:
    """The launch's line saying which weights of a Solar checkpoint or export the run starts from."""
    what = f"the {'EMA' if source.weights == 'ema' else 'live'} weights of step {source.step}"
    if not source.chosen:
        return f"solar: {KEY} {path}: {what} ({source.checkpoint})"
    if source.weights == "ema":
        live = source.checkpoint / source.role / "live.safetensors"
        other = (f"{live} names the live weights" if live.is_file()
                 else "`solar checkpoint export` it and name its model/live.safetensors for the live weights")
        return f"solar: {KEY} {path}: {what} (a Solar checkpoint's EMA where it has one; {other})"
    return f"solar: {KEY} {path}: {what} (it has no EMA)"
