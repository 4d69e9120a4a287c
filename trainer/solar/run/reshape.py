"""Resuming a training stage at another topology (issue 39): the shape its newest checkpoint was
trained at against the shape the next attempt would train at.

A SolarRun's ``spec.topology`` (or a stage's own) may change while the run is suspended or after an
attempt failed: the next attempt continues from the newest verified checkpoint at the new shape
(nodes, gpusPerNode, sequenceParallelSize, microBatchSize, gradientAccumulation), because the
checkpoint's data position does not depend on the ranks. What may not change is the global batch,
``worldSize / sequenceParallelSize x microBatchSize x gradientAccumulation``: it is part of the
recipe. Such a change is refused before any job (``TopologyMismatch``) with the batch fields that
would keep it.

The old shape comes from the checkpoint's ``data/position.json`` (``solar.data-position.v1``); a
checkpoint written before it existed is compared with the topology the status recorded for the
stage's latest attempt; with neither, nothing is compared here (the trainer still checks). Pure:
``observe.py`` reads the file, the state machine and the dry runs ask ``verdict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from solar.run.plan import StagePlan
from solar.run.spec import AttemptTopology, StageAttempt, StageStatus

POSITION_FILE = "data/position.json"
NonNeg = Annotated[int, Field(ge=0)]
Pos = Annotated[int, Field(ge=1)]


class SavedWith(BaseModel):
    model_config = ConfigDict(extra="ignore")
    world_size: Pos
    sequence_parallel_size: Pos
    micro_batch_size: Pos
    gradient_accumulation: Pos
    nproc_per_node: Pos


class DataPosition(BaseModel):
    """A checkpoint's ``data/position.json``: where the data stream stands, without ranks."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    schema_: Literal["solar.data-position.v1"] = Field(alias="schema")
    step: NonNeg
    global_batch_size: Pos
    saved_with: SavedWith
    epochs: tuple[NonNeg, NonNeg] = Field(description="[lowest, highest] epoch of the occurrences consumed so far")


@dataclass(frozen=True)
class Shape:
    world: int
    sequence_parallel: int
    micro_batch: int
    accumulation: int
    nproc: int | None = None          # processes per node (None: not recorded)

    @property
    def data_parallel(self) -> int:
        return self.world // self.sequence_parallel

    @property
    def global_batch(self) -> int:
        return self.data_parallel * self.micro_batch * self.accumulation

    @property
    def nodes(self) -> int | None:
        return self.world // self.nproc if self.nproc else None

    def text(self) -> str:
        where = f" ({self.nodes} node{'s' if self.nodes != 1 else ''} x {self.nproc})" if self.nproc else ""
        return (f"world {self.world}{where}, SP {self.sequence_parallel}, microBatchSize {self.micro_batch}, "
                f"gradientAccumulation {self.accumulation}")

    def as_dict(self) -> dict:
        return {"worldSize": self.world, "nodes": self.nodes, "gpusPerNode": self.nproc,
                "sequenceParallelSize": self.sequence_parallel, "microBatchSize": self.micro_batch,
                "gradientAccumulation": self.accumulation, "globalBatchSize": self.global_batch}


def planned(p: StagePlan) -> Shape:
    return Shape(p.world_size, p.sequence_parallel, p.micro_batch, p.accumulation, p.nproc)


def attempt_topology(p: StagePlan) -> AttemptTopology:
    """What the status records for an attempt started from plan ``p``."""
    train = p.action == "train"
    shape = planned(p)
    return AttemptTopology(nodes=p.nodes, gpusPerNode=p.nproc, worldSize=p.world_size,
                           sequenceParallelSize=p.sequence_parallel,
                           microBatchSize=p.micro_batch if train else None,
                           gradientAccumulation=p.accumulation if train else None,
                           globalBatchSize=shape.global_batch if train else None)


@dataclass(frozen=True)
class Reshape:
    """A training stage's next attempt resuming from checkpoint ``step``: its old and new shape."""

    stage: str
    step: int
    old: Shape
    new: Shape
    source: str                        # where the old shape comes from (for messages)
    field: str                         # where the new shape is set (spec.topology or the stage's own)
    position: DataPosition | None = None
    recorded_batch: int | None = None  # the global batch the checkpoint records (else the old shape's)

    @property
    def old_batch(self) -> int:
        return self.recorded_batch if self.recorded_batch is not None else self.old.global_batch

    @property
    def changed(self) -> bool:
        old, new = self.old, self.new
        return (old.world, old.sequence_parallel, old.micro_batch, old.accumulation) != (
            new.world, new.sequence_parallel, new.micro_batch, new.accumulation) or (
            old.nproc is not None and old.nproc != new.nproc)

    @property
    def refused(self) -> bool:
        return self.old_batch != self.new.global_batch

    def stream(self) -> str:
        """Where the data stream stands at the checkpoint."""
        if self.position is None:
            return f"step {self.step} (position not recorded: the checkpoint predates {POSITION_FILE})"
        lo, hi = self.position.epochs
        epochs = f"epoch {lo}" if lo == hi else f"epochs {lo}-{hi}"
        return (f"step {self.position.step}, {self.position.step * self.position.global_batch_size} clips of the "
                f"global order consumed ({epochs})")

    def summary(self) -> str:
        """One line for events and the dry runs."""
        return (f"stage {self.stage} resumes checkpoint step {self.step} at a new shape: {self.old.text()} -> "
                f"{self.new.text()} (global batch {self.old_batch} kept); stream position {self.stream()}")

    def as_dict(self) -> dict:
        """For the dry runs' YAML: the checkpoint, both shapes and the stream position."""
        out = {"checkpointStep": self.step, "old": {**self.old.as_dict(), "globalBatchSize": self.old_batch},
               "oldFrom": self.source, "new": self.new.as_dict()}
        if self.position is not None:
            p = self.position
            out["streamPosition"] = {"step": p.step, "clipsConsumed": p.step * p.global_batch_size,
                                     "epochs": list(p.epochs)}
        return out

    def mismatch(self) -> str:
        """Why a refused change is refused, and what would keep the global batch."""
        old, new = self.old, self.new
        return (f"stage {self.stage}: {self.field} would change the global batch from {self.old_batch} to "
                f"{new.global_batch} ({new.text()}; data parallel {new.data_parallel}); its checkpoint step "
                f"{self.step} was trained at {old.text()} (from {self.source}), and a full resume keeps the global "
                f"batch: {keeping(self.old_batch, new, self.field)}")


def keeping(global_batch: int, new: Shape, field: str = "topology") -> str:
    """What keeps ``global_batch`` at ``new``'s data-parallel size: the microBatchSize and
    gradientAccumulation to set in ``field`` (keeping one of them where possible)."""
    dp = new.data_parallel
    if global_batch % dp:
        return (f"no microBatchSize x gradientAccumulation gives {global_batch} over data parallel {dp} (world / SP); "
                f"choose a world size whose data-parallel size divides {global_batch}, or go back to the old shape")
    per = global_batch // dp
    options = []
    if per % new.micro_batch == 0:
        options.append((new.micro_batch, per // new.micro_batch))
    if per % new.accumulation == 0:
        options.append((per // new.accumulation, new.accumulation))
    if not options:
        options.append((1, per))
    text = " or ".join(dict.fromkeys(f"{{gradientAccumulation: {a}, microBatchSize: {m}}}" for m, a in options))
    return f"set {field} {text}, or go back to the old shape"


def _recorded(attempts: Sequence[StageAttempt] | None) -> tuple[Shape, int] | None:
    """The newest attempt whose training shape the status recorded: (shape, attempt)."""
    for item in reversed(attempts or []):
        t = item.topology
        if t.microBatchSize is not None and t.gradientAccumulation is not None:
            return Shape(t.worldSize, t.sequenceParallelSize, t.microBatchSize, t.gradientAccumulation,
                         t.gpusPerNode), item.attempt
    return None


def verdict(p: StagePlan, latest: int | None, position: DataPosition | None,
            attempts: Sequence[StageAttempt] | None) -> Reshape | None:
    """The next attempt of stage ``p`` resuming from checkpoint ``latest`` (None: it starts fresh):
    its old and new shape, or None when nothing is resumed or the old shape is unknown."""
    if p.action != "train" or latest is None:
        return None
    new = planned(p)
    if position is not None and position.step == latest:
        s = position.saved_with
        old = Shape(s.world_size, s.sequence_parallel_size, s.micro_batch_size, s.gradient_accumulation,
                    s.nproc_per_node)
        # the recorded global batch is what the trainer compares
        return Reshape(p.name, latest, old, new, f"its {POSITION_FILE}", p.topology_field, position,
                       position.global_batch_size)
    recorded = _recorded(attempts)
    if recorded is None:
        return None
    old, attempt = recorded
    return Reshape(p.name, latest, old, new, f"the status of attempt {attempt}", p.topology_field)


def of_stage(p: StagePlan, latest: int | None, position: DataPosition | None,
             stage: StageStatus | None) -> Reshape | None:
    return verdict(p, latest, position, stage.attempts if stage else None)
