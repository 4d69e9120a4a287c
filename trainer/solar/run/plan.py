"""Validating a SolarRun and planning its stages (pure; shared by the operator and ``solar run``).

Every stage's config is resolved with the library ``solar config resolve`` uses, after applying,
in order, the stage's own ``set`` and the edits the run owns:

    runtime.output_dir            <run root>/<stage>          (as the trainer sees it)
    distributed.world_size        nodes * gpusPerNode
    distributed.sequence_parallel_size, train.micro_batch_size, train.gradient_accumulation,
    train.global_batch_size       from the stage's topology, else spec.topology (the batch fields on
                                  training stages only; without globalBatchSize the global batch is
                                  derived, so a config's own value never fights the run's topology)
    checkpoint.*                  the init wiring: an earlier stage's final checkpoint
                                  <run root>/<source>/checkpoints/step_<its train.max_steps>

A stage's own ``set`` may not touch keys the run owns, but for two of the ``checkpoint`` block:
``checkpoint.accept_changes`` (the recipe keys a resume of the stage may change, passed on to every
attempt) and a rewind, ``checkpoint.mode=full_resume`` with ``checkpoint.path`` naming a checkpoint
of the stage's own directory as the pods see it (``StagePlan.rewind``: ``resume.py`` decides when
an attempt starts from it; neither enters the stage's ``sets``). Failures carry the reason the
``Validated`` condition reports: UnsupportedRoute, UnresolvedPlaceholder, TopologyMismatch,
InvalidInit, InvalidSpec, InsufficientGPUMemory (a training stage whose memory forecast does not
fit a declared ``topology.gpuMemory``; every training stage's forecast is part of the plan), or
InsufficientHostMemory (a training stage whose pod, ``gpusPerNode`` ranks, needs more host memory
at its forecast peak than the container's ``resources.limits.memory``, the stage's own resources
else the run's).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from solar.config.canonical import canonical_bytes
from solar.errors import ConfigError
from solar.run.spec import SolarRunSpec

OWNED = ("runtime.output_dir", "distributed.world_size", "distributed.sequence_parallel_size",
         "train.micro_batch_size", "train.gradient_accumulation", "train.global_batch_size", "checkpoint")
ACCEPT = "checkpoint.accept_changes"      # a stage's set may give it (what a resume of the stage may change)
REWIND = ("checkpoint.mode", "checkpoint.path")   # ... and these two together: a rewind (``_rewind``)


class RunInvalid(Exception):
    def __init__(self, reason: str, message: str, stage: str | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.stage = reason, message, stage


@dataclass(frozen=True)
class StagePlan:
    name: str
    index: int
    action: str                      # train | infer
    route: str
    config: str
    sets: tuple[str, ...]            # every --set, in order (stage's own, then the run's)
    stage_dir: str                   # as the trainer sees it
    final_step: int | None           # training: the checkpoint that must verify at the end
    validation_step: int | None      # the last step whose validation COMPLETE.json must exist
    generation: bool                 # inference: generation/COMPLETE.json must exist
    sources: dict = field(default_factory=dict)   # role -> (stage, weights)
    nodes: int = 1
    nproc: int = 1                   # processes per node (torchrun --nproc-per-node)
    memory_peak: int | None = None   # training: forecast peak GPU memory per GPU (solar config memory)
    gpu_memory: int | None = None    # the declared topology.gpuMemory it fits
    host_memory: int | None = None   # training: forecast peak host memory of the pod holding rank 0
    host_limit: int | None = None    # the container's resources.limits.memory it fits
    sequence_parallel: int = 1       # the stage's topology (training stages: the batch fields too)
    micro_batch: int = 1
    accumulation: int = 1
    topology_field: str = "spec.topology"   # where the stage's topology is set (the stage's own, else the run's)
    # training: the resolved config (canonical JSON), what a resume of the stage is compared with
    resolved: dict | None = field(default=None, compare=False, hash=False, repr=False)
    # training with topology.elastic: every allowed (nodes, accumulation), the declared shape first
    elastic: tuple = ()
    elastic_line: str | None = None     # what the dry runs print about it
    # training: the step of the stage's own checkpoint its set rewinds it to (checkpoint.mode=full_resume,
    # checkpoint.path), or None
    rewind: int | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc

    def checkpoint_dir(self, step: int) -> str:
        """A checkpoint of this stage as the trainer (the pods) see it."""
        return _checkpoint_dir(self.stage_dir, step)

    def arguments(self, resume_from: str | None = None) -> list[str]:
        """``solar <action> --config ... --set ...`` as an argument list (never a shell string).
        ``resume_from``: continue a training stage from that checkpoint of its own run."""
        sets = list(self.sets)
        if resume_from is not None:   # the init wiring goes; the stage's own accept_changes stays
            sets = [s for s in sets if not s.startswith("checkpoint.") or s.startswith(ACCEPT + "=")]
            sets += ["checkpoint.mode=full_resume", f"checkpoint.path={resume_from}"]
        args = ["-m", "solar", self.action, "--config", self.config]
        for item in sets:
            args += ["--set", item]
        return args


@dataclass(frozen=True)
class RunPlan:
    stages: tuple[StagePlan, ...]
    world_size: int
    logical_dp: int
    global_batch: int | None

    def stage(self, name: str) -> StagePlan:
        return next(s for s in self.stages if s.name == name)


def _checkpoint_dir(stage_dir: str, step: int) -> str:
    return f"{stage_dir}/checkpoints/step_{step:08d}"


def plan_run(spec: SolarRunSpec, run_root: str, *, repo: str | os.PathLike[str] = ".",
             environ: dict | None = None) -> RunPlan:
    """Validate every stage and return the plan, or raise ``RunInvalid``."""
    from solar.config.resolve import resolve_tree

    names = [s.name for s in spec.stages]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise RunInvalid("InvalidSpec", f"spec.stages: the name {dup!r} appears twice; stage names are unique")
    plans: list[StagePlan] = []
    for index, stage in enumerate(spec.stages):
        where = f"spec.stages[{index}] ({stage.name})"
        t = stage.topology or spec.topology
        world = t.world_size
        stage_dir = f"{run_root}/{stage.name}"
        own, rewinding = [], {}
        for item in stage.set:
            key = item.split("=", 1)[0].strip()
            if key in REWIND:
                rewinding[key] = item.split("=", 1)[1].strip() if "=" in item else ""
                continue
            if key != ACCEPT and any(key == o or key.startswith(o + ".") for o in OWNED):
                more = "; of the checkpoint block a stage's set gives only checkpoint.accept_changes, and " \
                       "checkpoint.mode=full_resume with checkpoint.path to rewind the stage to one of its own " \
                       "checkpoints" if key.startswith("checkpoint.") else ""
                raise RunInvalid("InvalidSpec", f"{where}.set: {key} is set by the run (storage, topology, init); "
                                                f"remove it{more}", stage.name)
            own.append(item)
        config_path = Path(repo) / stage.config
        if not config_path.is_file():
            raise RunInvalid("InvalidSpec", f"{where}.config: {stage.config} does not exist in the image's repository",
                             stage.name)
        # the action decides which batch fields the run may set: read it first
        try:
            digest, document = _read_config(config_path)
        except ConfigError as exc:
            raise RunInvalid(exc.reason, f"{where}: {exc.message}", stage.name) from None
        action = document.get("action")
        train_block = document.get("train") if isinstance(document.get("train"), dict) else {}
        _check_roles(stage, action, train_block.get("stage"), where)
        rewind = _rewind(rewinding, action, stage_dir, where, stage.name) if rewinding else None
        owned = [f"runtime.output_dir={stage_dir}", f"distributed.world_size={world}",
                 f"distributed.sequence_parallel_size={t.sequenceParallelSize}"]
        if action == "train":  # the run's topology decides the batch: a given globalBatchSize must agree
            derived = world // t.sequenceParallelSize * t.microBatchSize * t.gradientAccumulation
            if t.globalBatchSize and t.globalBatchSize != derived:
                raise RunInvalid("TopologyMismatch", _batch_mismatch(
                    f"spec.stages[{index}].topology" if stage.topology else "spec.topology", t, world), stage.name)
            allowed, elastic_line = _elastic(t, derived, f"spec.stages[{index}].topology" if stage.topology else
                                             "spec.topology", stage.name)
            owned += [f"train.micro_batch_size={t.microBatchSize}", f"train.gradient_accumulation={t.gradientAccumulation}",
                      f"train.global_batch_size={t.globalBatchSize or derived}"]
        else:
            allowed, elastic_line = (), None
        wiring, sources = _wiring(stage, index, plans, action, where)
        sets = tuple(own) + tuple(owned) + tuple(wiring)
        try:
            resolved = resolve_tree(document, source=str(config_path), source_digest=digest, sets=sets,
                                    environ=environ if environ is not None else dict(os.environ))
        except ConfigError as exc:
            raise RunInvalid(exc.reason, f"{where}: {exc.message}", stage.name) from None
        cfg, route = resolved.config, resolved.route
        if cfg.model.family != spec.family:
            raise RunInvalid("InvalidSpec", f"{where}: its config trains {cfg.model.family}, spec.family is "
                                            f"{spec.family}", stage.name)
        final = cfg.train.max_steps if cfg.action == "train" else None
        validation_step = _last_validation_step(cfg) if cfg.action == "train" else None
        peak, gpu, host, limit = _memory(resolved, t, t.gpuMemory or spec.topology.gpuMemory,
                                         _memory_limit(spec, stage, index), where, stage.name) \
            if cfg.action == "train" else (None, None, None, None)
        plans.append(StagePlan(stage.name, index, cfg.action, route.key, stage.config, sets, stage_dir, final,
                               validation_step, cfg.action == "infer" and bool(cfg.validation.passes), sources,
                               nodes=t.nodes, nproc=t.gpusPerNode, memory_peak=peak, gpu_memory=gpu,
                               host_memory=host, host_limit=limit, sequence_parallel=t.sequenceParallelSize,
                               micro_batch=t.microBatchSize, accumulation=t.gradientAccumulation,
                               topology_field=f"spec.stages[{index}].topology" if stage.topology else
                               "spec.topology",
                               resolved=json.loads(canonical_bytes(resolved.config_dict)) if cfg.action == "train"
                               else None, elastic=allowed, elastic_line=elastic_line, rewind=rewind))
    t = spec.topology
    dp = t.world_size // t.sequenceParallelSize
    return RunPlan(tuple(plans), t.world_size, dp, t.globalBatchSize or dp * t.microBatchSize * t.gradientAccumulation)


def _rewind(given: dict[str, str], action: str | None, stage_dir: str, where: str, stage: str) -> int:
    """The step a stage's set rewinds it to: ``checkpoint.mode=full_resume`` and ``checkpoint.path`` naming
    ``<stage_dir>/checkpoints/step_N`` (as the pods see it), or RunInvalid (InvalidSpec)."""
    import re

    want = f"{stage_dir}/checkpoints/step_<N, 8 digits>"
    if action != "train":
        raise RunInvalid("InvalidSpec", f"{where}.set: {', '.join(sorted(given))}: only a training stage rewinds to "
                                        "one of its own checkpoints; remove it", stage)
    mode, path = given.get("checkpoint.mode"), given.get("checkpoint.path")
    if mode != "full_resume" or not path:
        raise RunInvalid("InvalidSpec", f"{where}.set: a stage's set gives checkpoint.mode and checkpoint.path only "
                                        "together, to rewind the stage: checkpoint.mode=full_resume and "
                                        f"checkpoint.path={want} (got checkpoint.mode={mode or '(none)'}, "
                                        f"checkpoint.path={path or '(none)'})", stage)
    found = re.fullmatch(r"step_(\d{8})", os.path.basename(os.path.normpath(path)))
    if found is None or os.path.dirname(os.path.normpath(path)) != os.path.normpath(f"{stage_dir}/checkpoints"):
        raise RunInvalid("InvalidSpec", f"{where}.set: checkpoint.path={path}: a stage rewinds only to a checkpoint of "
                                        f"its own directory, {want}", stage)
    return int(found.group(1))


def _elastic(t, global_batch: int, field: str, stage: str) -> tuple[tuple, str | None]:
    """A training stage's allowed elastic shapes and the dry runs' line about them; RunInvalid
    (TopologyMismatch) when the bounds are wrong or no smaller count keeps the global batch."""
    from solar.run import elastic

    if t.elastic is None:
        return (), None
    found = elastic.problem(field, t, global_batch)
    if found:
        raise RunInvalid("TopologyMismatch", found, stage)
    allowed = tuple(elastic.shapes(nodes=t.nodes, gpus_per_node=t.gpusPerNode, sp=t.sequenceParallelSize,
                                   micro=t.microBatchSize, global_batch=global_batch, lowest=t.elastic.minNodes))
    return allowed, elastic.summary(allowed, t)


def _batch_mismatch(field: str, t, world: int) -> str:
    """A declared ``globalBatchSize`` that the topology does not give: both numbers, the product, and the
    accumulation or micro-batch that would give it, in the SolarRun's own fields."""
    dp = world // t.sequenceParallelSize
    derived = dp * t.microBatchSize * t.gradientAccumulation
    want = t.globalBatchSize
    fixes = [f"{field}.globalBatchSize: {derived}"]
    if want % (dp * t.microBatchSize) == 0:
        fixes.append(f"{field}.gradientAccumulation: {want // (dp * t.microBatchSize)}")
    elif want % (dp * t.gradientAccumulation) == 0:
        fixes.append(f"{field}.microBatchSize: {want // (dp * t.gradientAccumulation)}")
    return (f"{field}.globalBatchSize={want} disagrees with the topology's {derived} (data-parallel ranks {dp} = "
            f"world {world} / sequenceParallelSize {t.sequenceParallelSize}, x microBatchSize {t.microBatchSize} x "
            f"gradientAccumulation {t.gradientAccumulation}); set {' or '.join(fixes)}, or leave globalBatchSize out "
            "(it is derived)")


def _memory_limit(spec: SolarRunSpec, stage, index: int) -> tuple[str, str] | None:
    """(where, quantity) of the trainer container's memory limit: the stage's own ``resources`` when it
    gives them (as the jobs use them), else ``spec.resources``; None without a limit."""
    own = stage.resources is not None
    resources = stage.resources if own else spec.resources
    limits = resources.get("limits") if isinstance(resources, dict) else None
    value = limits.get("memory") if isinstance(limits, dict) else None
    if value is None:
        return None
    where = f"spec.stages[{index}].resources" if own else "spec.resources"
    return f"{where}.limits.memory", str(value)


def _memory(resolved, topology, declared: str | None, limit: tuple[str, str] | None, where: str,
            stage: str) -> tuple[int, int | None, int, int | None]:
    """The stage's forecast peak per GPU and its pod's peak host memory, refused when a declared
    ``topology.gpuMemory`` (the stage's, else the run's) is too small, or when the pod's ranks need
    more host memory than the container's memory limit."""
    from solar.config import memory
    from solar.run.spec import quantity_bytes

    gpu = quantity_bytes(declared) if declared else None
    forecast = memory.forecast(resolved, gpu_memory_bytes=gpu or 80 * memory.GIB, gpus_per_node=topology.gpusPerNode,
                               look_faster=False)
    gib = memory.GIB
    if gpu is not None and not forecast.fits:
        raise RunInvalid("InsufficientGPUMemory", f"{where}: forecast {memory.size_text(forecast.peak_bytes)} per GPU "
                         f"does not fit topology.gpuMemory {declared} ({memory.size_text(forecast.usable_bytes)} "
                         f"usable); to fit: {'; '.join(forecast.suggestions)} (solar config memory shows each role)",
                         stage)
    host = forecast.host
    need = host.pod_bytes(topology.gpusPerNode)
    try:   # a quantity this parser does not read (e.g. 1e9, Pi) is left to the API server
        limit_bytes = quantity_bytes(limit[1]) if limit else None
    except ValueError:
        limit_bytes = None
    if limit_bytes is not None and need > limit_bytes:
        key, text = limit
        ranks = topology.gpusPerNode
        rank0 = host.used["rank0"]
        when = "a checkpoint save" if rank0.peak == rank0.save else "a load" if rank0.peak == rank0.load else \
            "between saves"
        fix = "use sharded checkpoints (distributed.sharding full_shard or hybrid_shard over several GPUs) or more " \
              "nodes" if host.path == "whole-file" else "use more nodes (fewer GPUs per pod)"
        raise RunInvalid("InsufficientHostMemory", f"{where}: forecast host memory {need / gib:.1f} GiB per pod "
                         f"({ranks} rank{'s' if ranks > 1 else ''}; rank 0 {host.peak / gib:.1f} GiB during {when}, "
                         f"{host.path} checkpoints) exceeds {key} {text} ({limit_bytes / gib:.1f} GiB); raise the "
                         f"limit to at least {math.ceil(need / gib)}Gi, or {fix} (solar config memory shows the host "
                         "line)", stage)
    return forecast.peak_bytes, gpu, need, limit_bytes


_CONFIGS: dict[tuple[str, int, int], tuple[str, dict]] = {}


def _read_config(path: Path) -> tuple[str, dict]:
    """(source digest, parsed tree) of a stage config, parsed once per file version: the operator
    plans every new or changed run, and the configs in its image do not change."""
    from solar.config.canonical import blake2s_hex
    from solar.config.loader import read_document

    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _CONFIGS:
        if len(_CONFIGS) > 256:
            _CONFIGS.clear()
        raw, tree = read_document(path)
        _CONFIGS[key] = (blake2s_hex(raw), tree)
    return _CONFIGS[key]


def _wiring(stage, index: int, earlier: list[StagePlan], action: str, where: str) -> tuple[list[str], dict]:
    if stage.init is None:
        return [], {}
    roles = stage.init.roles()
    by_name = {p.name: p for p in earlier}
    sets, sources = [], {}
    for role, source in roles.items():
        src = by_name.get(source.stage)
        if src is None:
            raise RunInvalid("InvalidInit", f"{where}.init.{role}.stage: {source.stage!r} is not an earlier stage "
                                            f"(earlier: {', '.join(by_name) or 'none'})", stage.name)
        if src.action != "train" or src.final_step is None:
            raise RunInvalid("InvalidInit", f"{where}.init.{role}.stage: {source.stage!r} is an inference stage and "
                                            "writes no checkpoint", stage.name)
        sources[role] = (source.stage, source.weights)
        path = _checkpoint_dir(src.stage_dir, src.final_step)
        if role == "model":
            if action == "train":
                sets += ["checkpoint.mode=weights_only", f"checkpoint.path={path}", f"checkpoint.weights={source.weights}"]
            else:
                sets += [f"checkpoint.path={path}", f"checkpoint.weights={source.weights}"]
        else:
            sets.append(f"checkpoint.roles.{role}.path={path}")
            sets.append(f"checkpoint.roles.{role}.weights={source.weights}")
    if any(r != "model" for r in roles):
        sets.insert(0, "checkpoint.mode=roles")
    return sets, sources


def _check_roles(stage, action: str, train_stage: str | None, where: str) -> None:
    """init names ``model``, or all three Stage2 roles for Stage2 training."""
    roles = set(stage.init.roles()) if stage.init else set()
    stage2_train = action == "train" and train_stage == "stage2"
    if not roles:
        return
    if roles not in ({"model"}, {"student", "teacher", "critic"}):
        raise RunInvalid("InvalidInit", f"{where}.init: give either model, or student, teacher and critic "
                                        f"(got {', '.join(sorted(roles))})", stage.name)
    if stage2_train and roles == {"model"}:
        raise RunInvalid("InvalidInit", f"{where}.init: Stage2 training initialises three roles; give init.student, "
                                        "init.teacher and init.critic", stage.name)
    if not stage2_train and roles != {"model"}:
        raise RunInvalid("InvalidInit", f"{where}.init: student/teacher/critic initialise Stage2 training only; "
                                        "this stage takes init.model", stage.name)


def _last_validation_step(cfg) -> int | None:
    if not cfg.validation.passes:
        return None
    run, last = cfg.runtime, cfg.train.max_steps
    steps = [s for s in run.validation_steps if s <= last]
    if run.validate_every:
        steps.append(last // run.validate_every * run.validate_every)
    steps = [s for s in steps if s > 0]
    return max(steps) if steps else None


def job_name(run: str, stage: str, attempt: int, limit: int = 51) -> str:
    """``<run>-<stage>-<attempt>``: every attempt's job has a name of its own, so its pods' names
    (``<job>-worker-<i>``) never meet a pod of an earlier attempt that stays Terminating on a node
    that does not answer. Shortened with a stable hash suffix so pod host names (up to 4-digit i) stay
    within 63 characters; always a DNS-1035 label. The attempt comes last and after the stage's own
    name, so two stages' names never collide (``fm-2`` attempt 1 is ``...-fm-2-1``, ``fm`` attempt 21
    ``...-fm-21``)."""
    suffix = f"-{attempt}"
    name = f"{run}-{stage}"
    room = limit - len(suffix)
    if len(name) <= room and name[0].isalpha():
        return name + suffix
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head = name[: room - 9].rstrip("-")
    if not head or not head[0].isalpha():
        head = "r" + head[: room - 10]
    return f"{head}-{digest}{suffix}"
