"""The trainer's data stream: a reader's planned occurrences, epoch after epoch, resumable.

A ``ReaderStream`` is one logical reader. Its state is ``{epoch, cursor, rng_state}`` where
``rng_state`` is the reader RNG at the start of the epoch: resuming restores it, re-plans the epoch
(deterministic) and skips ``cursor`` occurrences, so a resumed stream yields exactly the remaining
sequence of an uninterrupted one. ``RankStream`` hands out a rank's clips (in training: one reader
group per global-batch position it fills, so the state is keyed by readers, not ranks, and
``merge_states`` re-deals every rank's saved state to any topology with the same global batch) and
turns occurrences into validated clips (``ClipSource``), skipping clips whose camera fails the guards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from solar.data.cameras import check_guards, rebase
from solar.data.index import IndexTable, fetch_rows
from solar.data.layout import Layout
from solar.data.plan import PlanParams, Planned, assign, check_frames, emit, reader_rng
from solar.data.rows import Row
from solar.data.sample_io import Clip, ShardReader, cut_clip, decode_sample, validate_sample
from solar.errors import DataError

STATE_SCHEMA = "solar.data-stream.v2"   # a rank's stream: readers and turns by id
READER_SCHEMA = "solar.data-stream.v1"  # one reader (a rank's whole stream before v2)


@dataclass(frozen=True)
class Occurrence:
    reader: int
    epoch: int
    position: int
    row: int
    repeat_ordinal: int
    start_frame: int


def _rng_state_to_json(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_json(data: list) -> tuple:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


class ReaderStream:
    """Occurrences of one reader, in plan order, epoch after epoch."""

    def __init__(self, table: IndexTable, params: PlanParams, reader: int,
                 state: dict | None = None) -> None:
        if not 0 <= reader < params.readers:
            raise DataError(f"reader {reader} is outside 0..{params.readers - 1}")
        check_frames(table, params)
        self.table, self.params, self.reader = table, params, reader
        self._rng = reader_rng(params.seed, reader)
        self.epoch, self.cursor = 0, 0
        if state is not None:
            if state.get("schema") != READER_SCHEMA or state.get("reader") != reader:
                raise DataError(f"data stream state is for reader {state.get('reader')}, not {reader}")
            self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
            self._rng.setstate(_rng_state_from_json(state["rng_state"]))
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._epoch_rng_state = self._rng.getstate()
        rows, reps = assign(self.table, self.params, self.epoch, only=self.reader)[self.reader]
        self._plan: Planned = emit(self.table, self.params, self.reader, rows, reps, self._rng)
        if not len(self._plan):
            raise DataError(f"reader {self.reader} has no occurrences in epoch {self.epoch}; the index "
                            f"has {self.table.virtual_occurrences} occurrences for "
                            f"{self.params.readers} readers")
        if self.cursor > len(self._plan):
            raise DataError(f"data stream cursor {self.cursor} is past the {len(self._plan)} "
                            f"occurrences of epoch {self.epoch}")

    @property
    def epoch_plan(self) -> Planned:
        return self._plan

    def state_dict(self) -> dict:
        return {"schema": READER_SCHEMA, "reader": self.reader, "epoch": self.epoch,
                "cursor": self.cursor, "rng_state": _rng_state_to_json(self._epoch_rng_state)}

    def __iter__(self) -> Iterator[Occurrence]:
        return self

    def __next__(self) -> Occurrence:
        if self.cursor >= len(self._plan):
            self.epoch += 1
            self.cursor = 0
            self._start_epoch()
        i = self.cursor
        self.cursor += 1
        p = self._plan
        return Occurrence(self.reader, self.epoch, i, p.rows[i], p.repeats[i], p.starts[i])


@dataclass(frozen=True)
class GuardSettings:
    fps: float
    seconds: float = 10.0
    max_translation: float = 20.0
    max_abs: float = 20.0


@dataclass
class StreamClip:
    """A clip ready for a training step, with its identity for events and SP checks."""

    clip: Clip
    rel_c2w: torch.Tensor
    occurrence: Occurrence
    row: Row


class ClipSource:
    """Reads, validates and cuts clips for occurrences; applies the camera guards."""

    def __init__(self, index: str, table: IndexTable, root: str | Path, layout: Layout,
                 pixel_frames: int, guards: GuardSettings) -> None:
        self.index, self.table, self.layout = index, table, layout
        self.pixel_frames, self.guards = pixel_frames, guards
        self.shards = ShardReader(root)
        self._rows: dict[int, Row] = {}

    def prefetch_rows(self, rows: set[int]) -> None:
        missing = rows - self._rows.keys()
        if missing:
            self._rows.update(fetch_rows(self.index, missing))

    def row(self, index: int) -> Row:
        if index not in self._rows:
            self.prefetch_rows({index})
        return self._rows[index]

    def read(self, occ: Occurrence, pixel_frames: int | None = None) -> StreamClip | str:
        """The clip (``pixel_frames`` long, default the source's), or why it is skipped (camera guard)."""
        row = self.row(occ.row)
        where = f"sample {row.sample_id!r} (shard {row.shard})"
        sample = decode_sample(self.shards.read(row), where)
        validate_sample(sample, self.layout, where)
        if sample.metadata.get("sample_id") != row.sample_id:
            raise DataError(f"{where}: the blob holds sample {sample.metadata.get('sample_id')!r}")
        clip = cut_clip(sample, self.layout, start_frame=occ.start_frame,
                        pixel_frames=pixel_frames or self.pixel_frames, where=where)
        rel = rebase(clip.c2w)
        fps = clip.fps or self.guards.fps
        verdict = check_guards(rel, fps=fps, seconds=self.guards.seconds,
                               max_translation=self.guards.max_translation, max_abs=self.guards.max_abs)
        if not verdict.ok:
            return f"{where}: camera guard: {verdict.reason}"
        return StreamClip(clip, rel, occ, row)


class RankStream:
    """A rank's clips, resumable through ``state_dict``; guard failures skipped (and counted).

    ``positions`` (training): the global-batch positions this rank reads, in the order it consumes
    them (``solar.data.from_config``); position j reads from readers ``j * num_workers + w`` of a plan
    whose readers are the run's global-batch positions, so which clip fills position j of a step does
    not depend on the topology. Without ``positions`` the rank reads its logical dp rank's readers
    (``params.reader_of``), as ``solar data plan`` shows them. Within a position the readers take
    turns round-robin; the rank cycles through its positions in order."""

    def __init__(self, source: ClipSource, params: PlanParams, rank: int,
                 state: dict | None = None, *, positions: list[int] | None = None,
                 global_batch_size: int | None = None, plan_nodes: int | None = None) -> None:
        self.source, self.params = source, params
        w = params.num_workers
        if positions is None:
            groups = [[params.reader_of(rank, k) for k in range(w)]]
        else:
            groups = [[j * w + k for k in range(w)] for j in positions]
        state = upgrade_state(state) if state is not None else None
        saved = (state or {}).get("readers", {})
        turns = (state or {}).get("turns", {})
        self.groups = groups
        self.readers: dict[int, ReaderStream] = {}
        for group in groups:
            for g in group:
                if state is not None and str(g) not in saved:
                    raise DataError(f"the data stream state has no reader {g} (it holds "
                                    f"{_span(sorted(int(k) for k in saved))}); was it saved with another "
                                    "global batch or data.num_workers?")
                self.readers[g] = ReaderStream(source.table, params, g, saved.get(str(g)))
        self.turns = [int(turns.get(str(group[0]), 0)) for group in groups]
        self.at = int((state or {}).get("at", 0)) % len(groups)
        self.skipped: list[str] = []
        self.global_batch_size = global_batch_size   # recorded in the state when set (training)
        self.plan_nodes = plan_nodes
        for reader in self.readers.values():
            self.source.prefetch_rows(set(reader.epoch_plan.rows))

    def state_dict(self) -> dict:
        state = {"schema": STATE_SCHEMA, "at": self.at,
                 "turns": {str(group[0]): t for group, t in zip(self.groups, self.turns)},
                 "readers": {str(g): r.state_dict() for g, r in self.readers.items()}}
        if self.global_batch_size is not None:
            state.update(global_batch_size=self.global_batch_size, plan_nodes=self.plan_nodes)
        return state

    def epochs(self) -> tuple[int, int]:
        """The lowest and highest epoch this rank's readers are in."""
        epochs = [r.epoch for r in self.readers.values()]
        return min(epochs), max(epochs)

    def next_clip(self, max_skips: int = 1000) -> StreamClip:
        k = self.at
        self.at = (k + 1) % len(self.groups)
        group = self.groups[k]
        for _ in range(max_skips):
            reader = self.readers[group[self.turns[k] % len(group)]]
            self.turns[k] += 1
            epoch = reader.epoch
            occ = next(reader)
            if reader.epoch != epoch:
                self.source.prefetch_rows(set(reader.epoch_plan.rows))
            result = self.source.read(occ)
            if isinstance(result, StreamClip):
                return result
            self.skipped.append(result)
        raise DataError(f"{max_skips} clips in a row failed the camera guards; last: {self.skipped[-1]}")


def upgrade_state(state: dict) -> dict:
    """A rank's stream state in this version's form: readers and turns keyed by reader id. A state of
    ``solar.data-stream.v1`` (readers as a list, one turn) is read as one group of its readers."""
    if state.get("schema") == STATE_SCHEMA and isinstance(state.get("readers"), dict):
        return state
    if state.get("schema") == READER_SCHEMA and isinstance(state.get("readers"), list):
        readers = {str(r["reader"]): r for r in state.get("readers", [])}
        first = min((int(k) for k in readers), default=0)
        return {"schema": STATE_SCHEMA, "at": 0, "turns": {str(first): int(state.get("turn", 0))},
                "readers": readers}
    raise DataError(f"data stream state of schema {state.get('schema')!r} is not one this version reads")


def merge_states(states: list[dict]) -> dict:
    """Every rank's saved stream state as one topology-free state: each reader's position and each
    global-batch position's turn, whichever rank held them (SP peers hold the same ones)."""
    readers: dict[str, dict] = {}
    turns: dict[str, int] = {}
    shape: dict[str, int] = {}
    for state in states:
        state = upgrade_state(state)
        if state.get("at", 0):
            raise DataError("a data stream state saved inside a step cannot be re-dealt to another topology")
        for key, value in state["readers"].items():
            if readers.setdefault(key, value) != value:
                raise DataError(f"two ranks saved different states for reader {key}")
        turns.update(state.get("turns", {}))
        for key in ("global_batch_size", "plan_nodes"):
            if key in state and shape.setdefault(key, state[key]) != state[key]:
                raise DataError(f"two ranks saved different data stream {key}s")
    return {"schema": STATE_SCHEMA, "at": 0, "turns": turns, "readers": readers, **shape}


def _span(ids: list[int]) -> str:
    if not ids:
        return "no readers"
    return f"readers {ids[0]}..{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else f"readers {ids}"


__all__ = ["ClipSource", "GuardSettings", "Occurrence", "RankStream", "ReaderStream", "StreamClip",
           "merge_states", "upgrade_state"]
