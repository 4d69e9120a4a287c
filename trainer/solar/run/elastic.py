"""Elastic training stages (issue 45 item 1): the node counts a stage may continue on.

``spec.topology.elastic: {minNodes: N}`` lets a training stage continue on fewer nodes than
``nodes`` (and grow back) with the same global batch: at ``n`` nodes the data-parallel ranks are
``n x gpusPerNode / sequenceParallelSize`` and the accumulation takes up the rest, keeping the
micro-batch. A count is allowed when its world divides into SP groups and its data-parallel ranks x
micro-batch divide the global batch. Shard groups stay within a node (``hybrid_shard``) or span the
world (``full_shard``), so neither narrows the list. Pure: the planner validates with it and the dry
runs print it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    nodes: int
    accumulation: int


def shapes(*, nodes: int, gpus_per_node: int, sp: int, micro: int, global_batch: int, lowest: int = 1) -> list[Shape]:
    """Every node count from ``nodes`` down to ``lowest`` that keeps ``global_batch``, with its accumulation."""
    out = []
    for n in range(nodes, lowest - 1, -1):
        world = n * gpus_per_node
        if world % sp:
            continue
        per_step = world // sp * micro
        if global_batch % per_step == 0:
            out.append(Shape(n, global_batch // per_step))
    return out


def problem(field: str, t, global_batch: int) -> str | None:
    """Why ``t.elastic`` cannot be used (the bounds, or no smaller count keeping the batch), with the bound
    that would be accepted: the largest count below ``nodes`` that keeps the batch, since a ``minNodes`` at
    or below it allows that count. None when the bounds allow a smaller shape."""
    e = t.elastic
    allowed = shapes(nodes=t.nodes, gpus_per_node=t.gpusPerNode, sp=t.sequenceParallelSize, micro=t.microBatchSize,
                     global_batch=global_batch, lowest=min(e.minNodes, t.nodes))
    if e.minNodes < t.nodes and any(s.nodes < t.nodes for s in allowed):
        return None
    would = [s.nodes for s in shapes(nodes=t.nodes - 1, gpus_per_node=t.gpusPerNode, sp=t.sequenceParallelSize,
                                     micro=t.microBatchSize, global_batch=global_batch)]
    fix = (f"set minNodes to {would[0]} or fewer (node counts below {t.nodes} that keep the global batch "
           f"{global_batch}: {', '.join(map(str, would))})" if would
           else f"no smaller count exists: an elastic stage needs {field}.nodes of 2 or more; leave elastic out"
           if t.nodes == 1
           else f"no node count below {t.nodes} keeps the global batch {global_batch} ({t.gpusPerNode} GPUs per node, "
                f"sequenceParallelSize {t.sequenceParallelSize}, microBatchSize {t.microBatchSize}): choose a global "
                "batch that fewer nodes divide (more gradientAccumulation or a smaller microBatchSize), or leave "
                "elastic out")
    if e.minNodes > t.nodes:
        return f"{field}.elastic.minNodes={e.minNodes} is more than {field}.nodes={t.nodes}; {fix}"
    if e.minNodes == t.nodes:
        return f"{field}.elastic.minNodes={e.minNodes} equals {field}.nodes: no smaller shape to continue on; {fix}"
    return (f"{field}.elastic: no node count from minNodes {e.minNodes} to {t.nodes - 1} keeps the global batch "
            f"{global_batch} ({t.gpusPerNode} GPUs per node, sequenceParallelSize {t.sequenceParallelSize}, "
            f"microBatchSize {t.microBatchSize}); {fix}")


def summary(allowed: tuple[Shape, ...], t) -> str:
    """The dry runs' line: every allowed count with its accumulation, and the bounds."""
    counts = ", ".join(f"{s.nodes} node{'s' if s.nodes > 1 else ''} x accumulation {s.accumulation}" for s in allowed)
    e = t.elastic
    return (f"elastic: {counts} (bounds minNodes {e.minNodes} .. nodes {t.nodes}; shrink after "
            f"{e.shrinkAfterSeconds} s unschedulable, grow back {'on' if e.growBack else 'off'}, at least "
            f"{e.minSecondsBetweenChanges} s between changes)")


def shape_at(allowed: tuple[Shape, ...], nodes: int) -> Shape | None:
    return next((s for s in allowed if s.nodes == nodes), None)


def largest(allowed: tuple[Shape, ...], *, at_most: int | None, below: int | None = None,
            above: int | None = None) -> Shape | None:
    """The largest allowed shape with at most ``at_most`` nodes (None: no bound known), fewer than
    ``below`` and more than ``above`` nodes when given."""
    for s in allowed:   # largest first
        if (at_most is None or s.nodes <= at_most) and (below is None or s.nodes < below) \
                and (above is None or s.nodes > above):
            return s
    return None


def grown(allowed: tuple[Shape, ...], *, nodes: int, capacity: int | None) -> Shape | None:
    """The shape a stage running at ``nodes`` grows back to: the largest allowed one above it that
    ``capacity`` nodes hold (None: none does, or the capacity is not known)."""
    return None if capacity is None else largest(allowed, at_most=capacity, above=nodes)


def shaped(p, nodes: int):
    """Stage plan ``p`` at ``nodes`` nodes of its allowed elastic shapes: the world size and the
    accumulation that keeps the global batch (in its arguments too)."""
    import dataclasses

    s = shape_at(p.elastic, nodes)
    if s is None or nodes == p.nodes:
        return p
    world = nodes * p.nproc
    sets = tuple(f"distributed.world_size={world}" if item.startswith("distributed.world_size=") else
                 f"train.gradient_accumulation={s.accumulation}" if item.startswith("train.gradient_accumulation=")
                 else item for item in p.sets)
    return dataclasses.replace(p, nodes=nodes, accumulation=s.accumulation, sets=sets)


def describe(p, nodes: int) -> str:
    """``2 nodes (world 16, accumulation 1)``."""
    s = shape_at(p.elastic, nodes)
    acc = s.accumulation if s else p.accumulation
    return f"{nodes} node{'s' if nodes != 1 else ''} (world {nodes * p.nproc}, accumulation {acc})"
