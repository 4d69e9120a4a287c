"""The command that continues a run (issue 52 item 5): a full resume into the same directory from a
checkpoint, with the latest launch's resolved config as ``--config`` (``launches/NNNN-resolved-config.json``,
else ``resolved-config.json``). ``solar train`` reads a resolved config as its config and a resolved
config resolves to itself, so the command is exact whatever ``--set`` edits and ``${VAR}`` values the
launch had; only the three keys of a resume are set.

The same from the run's source config (the launch record's ``source_config.path``) is offered when
that file still has the recorded digest: its edits are the keys where the source resolves otherwise
than the launch's resolved config, and the command is kept only when it resolves back to it (checked
here, with this machine's environment). Reads files; no torch.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from solar.config import changes, loader
from solar.config.canonical import blake2s_hex, canonical_bytes
from solar.errors import SolarError

def _canonical(config: dict) -> dict:
    return json.loads(canonical_bytes(config))


def _output_dir(root: Path, config: dict) -> str:
    """The run directory as the launch spelled it when it is this directory, else its absolute path."""
    recorded = (config.get("runtime") or {}).get("output_dir")
    try:
        if recorded and os.path.samefile(recorded, root):
            return str(recorded)
    except OSError:
        pass
    return os.path.abspath(root)


def set_value(value) -> str:
    """A value as ``--set`` reads it back (YAML): a string as itself when YAML keeps it a string,
    else JSON (a YAML flow value); ``$`` doubled, since ``${VAR}`` is expanded after the edits."""
    if isinstance(value, str):
        value = value.replace("$", "$$")
        try:
            if loader.parse_set(f"k={value}")[1] == value and value.strip() == value:
                return value
        except SolarError:
            pass
    return json.dumps(value)


def train_command(config: str | os.PathLike, sets: list[str]) -> str:
    return shlex.join(["solar", "train", "--config", str(config), *(a for s in sets for a in ("--set", s))])


def resume_keys(out_dir: str, checkpoint: str | None) -> dict:
    """The keys a continuation sets: the directory, and a full resume from ``checkpoint`` (its name
    under ``checkpoints/``) when there is one."""
    keys = {"runtime.output_dir": out_dir}
    if checkpoint is not None:
        keys["checkpoint.mode"] = "full_resume"
        keys["checkpoint.path"] = str(Path(out_dir) / "checkpoints" / checkpoint)
    return keys


def _with(config: dict, keys: dict) -> dict:
    out = json.loads(json.dumps(config))
    for dotted, value in keys.items():
        block, key = dotted.split(".")
        out.setdefault(block, {})[key] = value
    return out


def continuation(root: Path, config_path: Path, launch: dict, checkpoint: str | None) -> dict | None:
    """{command, from_source, checkpoint, step, note}: continue the run from ``checkpoint`` (a name under
    ``checkpoints/``), or start it over (None: its config as it was, into the same directory). None
    when the latest launch's resolved config cannot be read."""
    try:
        config = _canonical(json.loads(config_path.read_text()))
    except (OSError, ValueError):
        return None
    out_dir = _output_dir(root, config)
    keys = resume_keys(out_dir, checkpoint)
    if checkpoint is None and (config.get("checkpoint") or {}).get("mode") == "full_resume":
        keys.update({"checkpoint.mode": "none", "checkpoint.path": None})  # nothing of its own to resume
    sets = [f"{key}={set_value(value)}" for key, value in keys.items()]
    expected = _with(config, keys)
    own = Path(out_dir) / config_path.relative_to(root)
    from_source, note = _from_source(launch.get("source_config") or {}, expected, keys)
    return {"command": train_command(own, sets), "from_source": from_source,
            "checkpoint": str(Path(out_dir) / "checkpoints" / checkpoint) if checkpoint else None,
            "step": int(checkpoint[len("step_"):]) if checkpoint else None,
            "note": f"{note}; the resolved config is the launch's exact config" if note else None}


def _from_source(source: dict, expected: dict, keys: dict) -> tuple[str | None, str | None]:
    """(the command from the source config, None) or (None, why there is none): its edits, then
    ``keys`` (the continuation's own), checked to resolve to ``expected``."""
    from solar.config.resolve import resolve_file

    path = source.get("path")
    if not path:
        return None, "the launch recorded no source config"
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None, f"its source config {path} is not readable here"
    if blake2s_hex(raw) != source.get("digest"):
        return None, f"its source config {path} has changed since the launch (another digest)"
    try:
        base = _canonical(resolve_file(path, placeholders=False).config_dict)
        edits = [f"{c.key}={set_value(c.new)}" for c in changes.diff(base, expected) if c.key not in keys]
        sets = [*edits, *(f"{key}={set_value(value)}" for key, value in keys.items())]
        again = _canonical(resolve_file(path, sets, placeholders=False).config_dict)
    except (SolarError, OSError, ValueError) as exc:
        return None, f"its source config {path} does not resolve here ({exc})"
    if again != expected:
        return None, f"--set edits on its source config {path} do not give the launch's config"
    return train_command(path, sets), None
