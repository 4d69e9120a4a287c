"""The trainer's data stream: a reader's planned occurrences, epoch after epoch, resumable.

A ``ReaderStream`` is one logical reader (dp rank x worker). Its state is ``{epoch, cursor,
rng_state}`` where ``rng_state`` is the reader RNG at the start of the epoch: resuming restores it,
re-plans the epoch (deterministic) and skips ``cursor`` occurrences, so a resumed stream yields
exactly the remaining sequence of an uninterrupted one. ``RankStream`` interleaves a rank's
workers round-robin and turns occurrences into validated clips (``ClipSource``), skipping clips
whose camera fails the guards.
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

STATE_SCHEMA = "solar.data-stream.v1"


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
            if state.get("schema") != STATE_SCHEMA or state.get("reader") != reader:
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
        return {"schema": STATE_SCHEMA, "reader": self.reader, "epoch": self.epoch,
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
    """A rank's clips: its workers' reader streams interleaved round-robin, guard failures skipped
    (and counted), resumable through ``state_dict``."""

    def __init__(self, source: ClipSource, params: PlanParams, rank: int,
                 state: dict | None = None) -> None:
        self.source, self.params = source, params
        workers = [params.reader_of(rank, w) for w in range(params.num_workers)]
        states = (state or {}).get("readers") or [None] * len(workers)
        if len(states) != len(workers):
            raise DataError(f"data stream state has {len(states)} readers, this rank has {len(workers)}")
        self.readers = [ReaderStream(source.table, params, g, s) for g, s in zip(workers, states)]
        self.turn = int((state or {}).get("turn", 0))
        self.skipped: list[str] = []
        for reader in self.readers:
            self.source.prefetch_rows(set(reader.epoch_plan.rows))

    def state_dict(self) -> dict:
        return {"schema": STATE_SCHEMA, "turn": self.turn,
                "readers": [r.state_dict() for r in self.readers]}

    def next_clip(self, max_skips: int = 1000) -> StreamClip:
        for _ in range(max_skips):
            reader = self.readers[self.turn % len(self.readers)]
            self.turn += 1
            epoch = reader.epoch
            occ = next(reader)
            if reader.epoch != epoch:
                self.source.prefetch_rows(set(reader.epoch_plan.rows))
            result = self.source.read(occ)
            if isinstance(result, StreamClip):
                return result
            self.skipped.append(result)
        raise DataError(f"{max_skips} clips in a row failed the camera guards; last: {self.skipped[-1]}")


__all__ = ["ClipSource", "GuardSettings", "Occurrence", "RankStream", "ReaderStream", "StreamClip"]
