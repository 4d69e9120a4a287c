"""What a launch moves aside before its first step (no torch): a run directory is never stuck and
nothing in it is deleted.

- **Restart.** A fresh launch into a directory whose run committed no checkpoint (its launches
  failed, were refused, killed or disrupted before their first save) starts the run over from its
  initialisation. What the earlier launches left that a new launch would collide with or mistake for
  its own (``checkpoints/``: partial saves only; ``validation/``: slots and the frozen plan) moves to
  ``superseded/NNNN/``; their launch records, events and logs stay where they are, as history.
- **Rewind.** A full resume from an older checkpoint of its own directory moves every newer one
  (``checkpoints/step_N``, partial saves of such steps included) to ``checkpoints/superseded/NNNN/``
  and its validations (``validation/step_N``) to ``validation/superseded/NNNN/``, so that the steps
  trained again save and validate where the first ones did. ``checkpoints/superseded`` is not a
  checkpoint name: listing, verification and the newest-verified rule never see what is there.

``NNNN`` is the number of the launch that moved them (its ``launches/NNNN-launch-manifest.json``
records what moved). Each move is one ``rename`` (a directory moves whole or not at all) into a
folder no earlier launch used, and both directories are fsynced. A launch that dies between its
moves and its record leaves the moved files under its number; a later launch's decision reads only
what is still in place.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from solar.storage import fence
from solar.storage.atomic import fsync_dir
from solar.storage.checkpoints import STEP_DIR

SUPERSEDED = "superseded"
STEP = re.compile(r"^\.?step_(\d{8})(\..*\.partial)?$")
_RECORD = re.compile(r"^\d{4}$")


@dataclass(frozen=True)
class Supersede:
    """A restart or a rewind as decided before anything is written; ``apply`` does it."""

    kind: str                                  # "restart" | "rewind"
    moves: list[str] = field(default_factory=list)   # paths relative to the run directory
    step: int | None = None                    # rewind: the checkpoint's step
    checkpoint: str | None = None              # rewind: checkpoint.path as given
    earlier_launches: int = 0                  # restart: the launches it starts over after

    def line(self, out: Path) -> str:
        """What the launch prints before it trains."""
        if self.kind == "restart":
            launches = f"{self.earlier_launches} earlier launch{'es' if self.earlier_launches != 1 else ''}"
            kept = f"; their partial outputs moved to {SUPERSEDED}/ (kept)" if self.moves else ""
            return (f"{out} holds no committed checkpoint: the run starts over from step 0 ({launches} kept as "
                    f"history{kept})")
        names = [Path(m).name for m in self.moves if m.startswith("checkpoints/")]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        validations = sum(m.startswith("validation/") for m in self.moves)
        also = f" and {validations} validation{'s' if validations != 1 else ''} after it" if validations else ""
        return (f"rewinding {out} to step {self.step}: the newer checkpoints ({shown}){also} move to "
                f"{SUPERSEDED}/ folders beside them (kept; never read as the run's again)")


def committed_steps(out: Path) -> list[int]:
    """The steps of the directory's committed checkpoints (``checkpoints/step_N`` with COMPLETE.json)."""
    folder = out / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for e in folder.iterdir()
                  if (m := STEP.match(e.name)) and not m.group(2) and (e / "COMPLETE.json").is_file())


def restart(out: Path, earlier_launches: int) -> Supersede:
    """Starting over a directory that committed nothing: its ``checkpoints/`` and ``validation/``."""
    moves = [name for name in ("checkpoints", "validation") if (out / name).exists() and any((out / name).iterdir())]
    return Supersede("restart", moves=moves, earlier_launches=earlier_launches)


def rewind(out: Path, checkpoint: str, step: int) -> Supersede | None:
    """A full resume from ``step`` of ``out``'s own checkpoints: every checkpoint and validation after
    it (None when there is none: an ordinary resume of the newest)."""
    moves = []
    for where in ("checkpoints", "validation"):
        folder = out / where
        if folder.is_dir():
            moves += sorted(f"{where}/{e.name}" for e in folder.iterdir()
                            if (m := STEP.match(e.name)) and int(m.group(1)) > step)
    if not any(m.startswith("checkpoints/") for m in moves):
        return None
    return Supersede("rewind", moves=moves, step=step, checkpoint=checkpoint)


def destination(out: Path, relative: str, number: int) -> Path:
    """Where ``relative`` moves for launch ``number``."""
    parts = Path(relative).parts
    if len(parts) == 1:          # restart: a whole folder
        return out / SUPERSEDED / f"{number:04d}" / parts[0]
    return out / parts[0] / SUPERSEDED / f"{number:04d}" / Path(*parts[1:])


def apply(plan: Supersede, out: Path, number: int) -> dict:
    """Move everything ``plan`` names for launch ``number``; returns the launch record's entry."""
    moved = []
    for relative in plan.moves:
        source, target = out / relative, destination(out, relative, number)
        if not source.exists():
            continue
        fence.check()
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            raise FileExistsError(f"{target} already exists; nothing there is replaced")
        os.rename(source, target)
        fsync_dir(target.parent)
        fsync_dir(source.parent)
        moved.append(str(target.relative_to(out)))
    record: dict = {"moved": moved}
    if plan.kind == "restart":
        record.update(earlier_launches=plan.earlier_launches,
                      superseded_dir=f"{SUPERSEDED}/{number:04d}" if moved else None)
    else:
        record.update(checkpoint=plan.checkpoint, step=plan.step,
                      superseded=[Path(m).name for m in plan.moves if m.startswith("checkpoints/")],
                      superseded_dir=f"checkpoints/{SUPERSEDED}/{number:04d}")
    return record


def superseded_checkpoints(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The checkpoints rewinds moved aside, ``checkpoints/superseded/NNNN/step_N`` (NNNN: the rewinding
    launch's record number), as {launch, step, path}, by launch and step. They are kept, never the
    run's: ``solar checkpoint list`` and the newest-checkpoint rule read ``checkpoints/step_N`` only."""
    root = Path(run_dir) / "checkpoints" / SUPERSEDED
    try:
        launches = sorted(p for p in root.iterdir() if _RECORD.match(p.name) and p.is_dir())
    except OSError:
        return []
    return [{"launch": launch.name, "step": int(m.group(1)), "path": str(entry)}
            for launch in launches for entry in sorted(launch.iterdir())
            if (m := STEP_DIR.match(entry.name)) and entry.is_dir()]


def superseded_of(path: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """(run directory, record number) when ``path`` is a checkpoint a rewind moved aside; else None."""
    p = Path(path)
    if STEP_DIR.match(p.name) and _RECORD.match(p.parent.name) and p.parent.parent.name == SUPERSEDED \
            and p.parent.parent.parent.name == "checkpoints":
        return p.parent.parent.parent.parent, p.parent.name
    return None
