"""Data objects from a resolved run config (what the trainer and validation build)."""

from __future__ import annotations

import os
from pathlib import Path

from solar.config.contracts import effective_dims
from solar.config.schema import RunConfig
from solar.data.index import IndexTable, data_root_for, load_table, shard_problems
from solar.data.layout import Layout, layout_for
from solar.data.plan import PlanParams
from solar.data.stream import ClipSource, GuardSettings, RankStream
from solar.errors import DataError


def index_path(cfg: RunConfig, which: str) -> Path:
    value = getattr(cfg.data, which)
    path = Path(value)
    return path if path.is_absolute() else Path(cfg.data.root) / path


def layout_of(cfg: RunConfig) -> Layout:
    return layout_for(cfg.model.family, height=cfg.data.height, width=cfg.data.width,
                      text_dim=effective_dims(cfg).text_dim)


def plan_params(cfg: RunConfig, plan_nodes: int | None = None) -> PlanParams:
    """The training plan: its readers are the run's global-batch positions (times ``data.num_workers``),
    not its ranks, so the plan — and which clip fills position j of every step — is the same at any
    topology with the same global batch (issue 39). With one clip per dp rank and step and one worker
    this is semantics.md §3's plan of logical dp ranks. ``plan_nodes`` (``node_shard``): the node count
    the plan spreads shard groups over, fixed at the run's first launch (its data state records it)."""
    d = cfg.data
    batch = cfg.train.global_batch_size   # resolved for every train config (solar.config.topology)
    nodes = plan_nodes or launch_nodes(cfg)
    if batch % nodes:
        nodes = 1
    return PlanParams(seed=d.seed, pixel_frames=d.pixel_frames, world_size=batch, sequence_parallel_size=1,
                      local_world_size=batch // nodes, num_workers=d.num_workers, mode=d.sampling,
                      shuffle_buffer=d.shuffle_buffer, random_start=d.random_start)


def launch_nodes(cfg: RunConfig) -> int:
    local = os.environ.get("LOCAL_WORLD_SIZE")
    world = cfg.distributed.world_size
    per_node = int(local) if local and local.isdigit() and int(local) > 0 else world
    return max(1, world // per_node)


def rank_positions(cfg: RunConfig, rank: int) -> list[int]:
    """The global-batch positions ``rank`` fills each step, in the order it consumes clips: micro-batch
    m of dp rank d holds positions ``(m * dp_world + d) * micro_batch_size + i`` (``fm.first_position``;
    SP peers: the same)."""
    t, dist = cfg.train, cfg.distributed
    dp_world = dist.world_size // dist.sequence_parallel_size
    dp = rank // dist.sequence_parallel_size
    m = t.micro_batch_size
    return [(micro * dp_world + dp) * m + i for micro in range(t.gradient_accumulation) for i in range(m)]


_TABLES: dict[tuple, IndexTable] = {}   # the training index, loaded once per process (checks, then build)


def train_table(cfg: RunConfig) -> tuple[Path, IndexTable]:
    """The training index and its table (kept while the file is unchanged: the launch's checks load it
    before anything is written and the build uses the same table)."""
    index = index_path(cfg, "train_index")
    try:
        st = index.stat()
    except FileNotFoundError:
        raise DataError(f"data.train_index {index} does not exist (data.root {cfg.data.root}); point data.root / "
                        "data.train_index at the training set") from None
    key = (str(index), st.st_mtime_ns, st.st_size)
    if key not in _TABLES:
        _TABLES.clear()
        _TABLES[key] = load_table(index)
    return index, _TABLES[key]


def preflight_train_data(cfg: RunConfig) -> None:
    """Before a launch writes anything: the training index loads and every shard it names is under the
    data root with its declared size (one stat per shard), so a wrong path is refused with nothing
    written, not at the first step."""
    index, table = train_table(cfg)
    problems = shard_problems(table, data_root_for(index, cfg.data.root))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DataError(f"data.root: {problems[0]}{more}; point data.root at the shards of {index} "
                        "(solar data inspect lists every problem)")


def guard_settings(cfg: RunConfig) -> GuardSettings:
    d = cfg.data
    return GuardSettings(fps=d.fps or 16.0, seconds=d.camera_guard_seconds,
                         max_translation=d.max_relative_translation, max_abs=d.max_camera_abs)


def train_stream(cfg: RunConfig, rank: int, state: dict | None = None) -> RankStream:
    """This rank's training stream; ``state``: a full resume's (``stream.merge_states`` of every rank's
    saved state, at any topology with the same global batch)."""
    batch = cfg.train.global_batch_size
    if state is not None and state.get("global_batch_size") not in (None, batch):
        raise DataError(f"the checkpoint's data stream was saved with global batch {state['global_batch_size']}, "
                        f"this run's is {batch}: a full resume keeps the global batch (world / sequence parallel "
                        "x train.micro_batch_size x train.gradient_accumulation)")
    index, table = train_table(cfg)
    source = ClipSource(str(index), table, cfg.data.root, layout_of(cfg),
                        cfg.data.pixel_frames, guard_settings(cfg))
    params = plan_params(cfg, (state or {}).get("plan_nodes"))
    return RankStream(source, params, rank, state, positions=rank_positions(cfg, rank),
                      global_batch_size=batch, plan_nodes=params.nodes)
