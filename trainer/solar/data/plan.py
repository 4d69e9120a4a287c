"""Sampling plans: which logical data-parallel reader reads which occurrence, in which order, from
which start frame — and a fingerprint that proves two ranks or two runs planned the same.

Readers are logical DP ranks, never raw ranks (semantics.md §3)::

    dp_rank = raw_rank // sp     global_reader = dp_rank * num_workers + worker_id
    reader RNG = Random(seed + global_reader * 100003)   (continues across epochs)

``global_occurrence``: occurrence v (rows in order, repeats in order) goes to reader v % readers (an
index with fewer occurrences than readers is passed over as often as it takes within the epoch).
``node_shard``: consecutive rows of one shard form a group; a group goes to node
sha256(f"{seed}|{epoch}|{shard}") % nodes; a node RNG orders its groups; the node's occurrences are
striped over its local readers. Each reader then passes its occurrences through a shuffle buffer
and draws start frames with its own RNG. SP peers share a dp rank, hence the identical plan.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
from array import array
from dataclasses import asdict, dataclass

from solar.data.index import IndexTable
from solar.errors import DataError

MODES = ("global_occurrence", "node_shard")


@dataclass(frozen=True)
class PlanParams:
    seed: int
    pixel_frames: int
    world_size: int
    sequence_parallel_size: int = 1
    local_world_size: int | None = None  # ranks per node (node_shard); default: the whole world
    num_workers: int = 1
    epoch: int = 0
    mode: str = "global_occurrence"
    shuffle_buffer: int = 64
    random_start: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
            (self.pixel_frames >= 1, f"--pixel-frames must be >= 1, got {self.pixel_frames}"),
            (self.world_size >= 1, f"--world-size must be >= 1, got {self.world_size}"),
            (self.sequence_parallel_size >= 1, "--sequence-parallel-size must be >= 1"),
            (self.num_workers >= 1, f"--num-workers must be >= 1, got {self.num_workers}"),
            (self.epoch >= 0, f"--epoch must be >= 0, got {self.epoch}"),
            (self.shuffle_buffer >= 0, "shuffle_buffer must be >= 0"),
            (self.mode in MODES, f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise DataError(message)
        if self.world_size % self.sequence_parallel_size:
            raise DataError(f"--world-size {self.world_size} is not divisible by "
                            f"--sequence-parallel-size {self.sequence_parallel_size}")
        local = self.ranks_per_node
        if local < 1 or self.world_size % local:
            raise DataError(f"--local-world-size {local} must divide --world-size {self.world_size}")
        if local % self.sequence_parallel_size:
            raise DataError(f"--local-world-size {local} must be a multiple of "
                            f"--sequence-parallel-size {self.sequence_parallel_size} (SP groups "
                            "stay within a node)")

    @property
    def ranks_per_node(self) -> int:
        return self.local_world_size or self.world_size

    @property
    def dp_world(self) -> int:
        return self.world_size // self.sequence_parallel_size

    @property
    def readers(self) -> int:
        return self.dp_world * self.num_workers

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def dp_rank(self, rank: int) -> int:
        return rank // self.sequence_parallel_size

    def reader_of(self, rank: int, worker_id: int = 0) -> int:
        if not 0 <= rank < self.world_size:
            raise DataError(f"--rank {rank} is outside 0..{self.world_size - 1}")
        if not 0 <= worker_id < self.num_workers:
            raise DataError(f"--worker-id {worker_id} is outside 0..{self.num_workers - 1}")
        return self.dp_rank(rank) * self.num_workers + worker_id


@dataclass(frozen=True)
class Planned:
    """One reader's plan for one epoch: rows, repeat ordinals and start frames, in read order."""

    reader: int
    rows: array
    repeats: array
    starts: array

    def __len__(self) -> int:
        return len(self.rows)


def reader_rng(seed: int, reader: int) -> random.Random:
    return random.Random(seed + reader * 100003)


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def check_frames(table: IndexTable, params: PlanParams) -> None:
    """Every row must hold a clip of ``pixel_frames`` from its start."""
    frames = params.pixel_frames
    for row, (declared, start) in enumerate(zip(table.num_frames, table.start_frame)):
        if declared == -1:
            continue
        first = 0 if start == -1 or params.random_start else start
        if first + frames > declared:
            raise DataError(
                f"{table.path}:{table.lines[row]}: row {row} has num_frames {declared}, too few for "
                f"{frames} pixel frames from start frame {first}")


def _expand(table: IndexTable) -> tuple[array, array]:
    """Occurrence -> (row, repeat ordinal), rows in order and repeats in order."""
    occ_rows, occ_reps = array("I"), array("I")
    if all(r == 1 for r in table.repeats):
        occ_rows.extend(range(table.rows))
        return occ_rows, array("I", [0]) * table.rows
    for row, count in enumerate(table.repeats):
        occ_rows.extend([row] * count)
        occ_reps.extend(range(count))
    return occ_rows, occ_reps


def _groups(table: IndexTable) -> list[tuple[int, int]]:
    """Runs of consecutive rows in one shard, as (first row, end row)."""
    groups: list[tuple[int, int]] = []
    shard_of = table.shard_of
    start = 0
    for row in range(1, table.rows):
        if shard_of[row] != shard_of[row - 1]:
            groups.append((start, row))
            start = row
    groups.append((start, table.rows))
    return groups


def assign(table: IndexTable, params: PlanParams, epoch: int,
           only: int | None = None) -> dict[int, tuple[array, array]]:
    """Arrival order of occurrences per reader (before shuffle); ``only`` limits to one reader."""
    readers = params.readers
    wanted = range(readers) if only is None else (only,)
    if params.mode == "global_occurrence":
        occ_rows, occ_reps = _expand(table)
        if 0 < len(occ_rows) < readers:
            # fewer occurrences than readers (a small index, a large global batch): the epoch passes over
            # the index as often as it takes to give every reader one
            passes = -(-readers // len(occ_rows))
            occ_rows, occ_reps = occ_rows * passes, occ_reps * passes
        return {g: (occ_rows[g::readers], occ_reps[g::readers]) for g in wanted}
    # node_shard
    per_node = params.ranks_per_node // params.sequence_parallel_size * params.num_workers
    nodes = params.nodes
    wanted_nodes = {g // per_node for g in wanted}
    node_groups: dict[int, list[tuple[int, int]]] = {n: [] for n in wanted_nodes}
    for first, end in _groups(table):
        shard = table.shards[table.shard_of[first]]
        node = _stable_int(f"{params.seed}|{epoch}|{shard}") % nodes
        if node in node_groups:
            node_groups[node].append((first, end))
    result: dict[int, tuple[array, array]] = {}
    for node, groups in node_groups.items():
        random.Random(_stable_int(f"node|{params.seed}|{epoch}|{node}")).shuffle(groups)
        local = {g: (array("I"), array("I")) for g in range(node * per_node, (node + 1) * per_node)}
        j = 0
        base = node * per_node
        for first, end in groups:
            for row in range(first, end):
                for rep in range(table.repeats[row]):
                    rows, reps = local[base + j % per_node]
                    rows.append(row)
                    reps.append(rep)
                    j += 1
        result.update({g: local[g] for g in wanted if g in local})
    return result


def emit(table: IndexTable, params: PlanParams, reader: int, rows: array, reps: array,
         rng: random.Random) -> Planned:
    """Shuffle-buffer order and start frames for one reader's arrivals, using its RNG."""
    out_rows, out_reps, out_starts = array("I"), array("I"), array("i")
    frames, random_start = params.pixel_frames, params.random_start
    num_frames, start_frame, stride = table.num_frames, table.start_frame, table.stride

    def put(row: int, rep: int) -> None:
        if random_start:
            declared = num_frames[row]
            choices = ((declared if declared != -1 else frames) - frames) // stride[row] + 1
            start = stride[row] * rng.randrange(choices) if choices > 1 else 0
        else:
            start = start_frame[row] if start_frame[row] != -1 else 0
        out_rows.append(row)
        out_reps.append(rep)
        out_starts.append(start)

    size = params.shuffle_buffer
    if size <= 1:
        for row, rep in zip(rows, reps):
            put(row, rep)
    else:
        buffer: list[tuple[int, int]] = []
        randrange = rng.randrange
        for item in zip(rows, reps):
            if len(buffer) < size:
                buffer.append(item)
                continue
            i = randrange(size)
            put(*buffer[i])
            buffer[i] = item
        rng.shuffle(buffer)
        for item in buffer:
            put(*item)
    return Planned(reader, out_rows, out_reps, out_starts)


def plan_readers(table: IndexTable, params: PlanParams, only: int | None = None) -> dict[int, Planned]:
    """The epoch ``params.epoch`` plan of every reader (or of ``only``), RNGs advanced through the
    earlier epochs exactly as a stream that ran them would."""
    check_frames(table, params)
    wanted = range(params.readers) if only is None else (only,)
    rngs = {g: reader_rng(params.seed, g) for g in wanted}
    plans: dict[int, Planned] = {}
    for epoch in range(params.epoch + 1):
        arrivals = assign(table, params, epoch, only)
        plans = {g: emit(table, params, g, *arrivals[g], rngs[g]) for g in wanted}
    return plans


def fingerprint(table: IndexTable, params: PlanParams, plans: dict[int, Planned]) -> str:
    """BLAKE2s over the parameters, the index content and every planned occurrence of every reader."""
    header = {**asdict(params), "local_world_size": params.ranks_per_node,
              "index_content_digest": table.content_digest, "readers": params.readers}
    h = hashlib.blake2s(digest_size=32)
    h.update(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    for g in range(params.readers):
        planned = plans[g]
        h.update(struct.pack("<II", g, len(planned)))
        for column in (planned.rows, planned.repeats, planned.starts):
            h.update(_little_endian(column))
    return h.hexdigest()


def _little_endian(column: array) -> bytes:
    if sys.byteorder == "little":
        return column.tobytes()
    swapped = array(column.typecode, column)
    swapped.byteswap()
    return swapped.tobytes()


def describe(index: str, params: PlanParams, *, rank: int, worker_id: int = 0,
             limit: int = 16) -> dict:
    """``solar data plan``: the full-plan fingerprint and count (``full_plan_count``: occurrences of every
    reader this epoch), this rank's reader (``reader`` of ``readers``) with its own count
    (``reader_plan_count``), and that reader's first ``limit`` occurrences (``shown``)."""
    from solar.data.index import fetch_rows, load_table  # noqa: PLC0415

    if limit < 0:
        raise DataError(f"--limit must be >= 0, got {limit}")
    reader = params.reader_of(rank, worker_id)
    keep = None
    if params.mode == "global_occurrence":
        readers, horizon = params.readers, params.shuffle_buffer + limit

        def keep(row: int, first: int, count: int, shard: str) -> bool:
            # Occurrences of this reader among first..first+count-1 that can be shown this epoch.
            v = first + (reader - first) % readers
            return v < first + count and v // readers < horizon
    elif params.nodes > 1:
        per_node = params.ranks_per_node // params.sequence_parallel_size * params.num_workers
        node, nodes, seed, epoch = reader // per_node, params.nodes, params.seed, params.epoch
        node_of: dict[str, int] = {}

        def keep(row: int, first: int, count: int, shard: str) -> bool:
            # Rows of this rank's node in this epoch (its groups are all it can read).
            owner = node_of.get(shard)
            if owner is None:
                owner = node_of[shard] = _stable_int(f"{seed}|{epoch}|{shard}") % nodes
            return owner == node
    table = load_table(index, keep=keep)
    plans = plan_readers(table, params)
    mine = plans[reader]
    shown_rows = {mine.rows[i] for i in range(min(limit, len(mine)))}
    rows = {r: table.kept[r] for r in shown_rows if r in table.kept}
    missing = shown_rows - rows.keys()
    if missing:
        rows.update(fetch_rows(index, missing))
    shown = []
    for i in range(min(limit, len(mine))):
        row = rows[mine.rows[i]]
        start = mine.starts[i]
        shown.append({"sample_id": row.sample_id, "key": row.key, "shard": row.shard,
                      "repeat_ordinal": mine.repeats[i], "start_frame": start,
                      "source_frame_indices": list(range(start, start + params.pixel_frames))})
    return {
        "full_plan_fingerprint": fingerprint(table, params, plans),
        "full_plan_count": sum(len(p) for p in plans.values()),
        "logical_dp_rank": params.dp_rank(rank),
        "logical_dp_world_size": params.dp_world,
        "reader": reader,
        "readers": params.readers,
        "reader_plan_count": len(mine),
        "shown": shown,
    }
