"""Elastic training stages (issue 45 item 1): the node counts that keep the global batch, the refusals
and what the dry runs print."""

from __future__ import annotations

import copy

import pytest
import yaml

from solar.run import elastic
from solar.run.plan import RunInvalid, plan_run
from solar.run.spec import SolarRun
from tests.conftest import REPO

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())


def _plan(**topology):
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["topology"].update(topology)
    return plan_run(SolarRun.model_validate(doc).spec, "/runs/tiny-wan", repo=REPO, environ={})


def test_every_count_that_keeps_the_batch_with_its_accumulation():
    # 4 nodes x 2 GPUs, SP 2: data parallel 4, global batch 8 (micro 1 x accumulation 2)
    found = elastic.shapes(nodes=4, gpus_per_node=2, sp=2, micro=1, global_batch=8)
    assert [(s.nodes, s.accumulation) for s in found] == [(4, 2), (2, 4), (1, 8)]   # 3 nodes: 3 ranks do not divide 8
    assert [s.nodes for s in elastic.shapes(nodes=3, gpus_per_node=1, sp=2, micro=1, global_batch=6)] == [2]


def test_a_training_stage_plans_its_allowed_shapes_and_the_dry_runs_print_them():
    plan = _plan(nodes=4, gpusPerNode=1, gradientAccumulation=1, elastic={"minNodes": 1})
    fm, generate = plan.stage("fm"), plan.stage("generate")
    assert [(s.nodes, s.accumulation) for s in fm.elastic] == [(4, 1), (2, 2), (1, 4)]
    assert fm.elastic_line == ("elastic: 4 nodes x accumulation 1, 2 nodes x accumulation 2, 1 node x accumulation 4 "
                               "(bounds minNodes 1 .. nodes 4; shrink after 300 s unschedulable, grow back on, at "
                               "least 600 s between changes)")
    assert generate.elastic == () and generate.elastic_line is None   # inference stages do not shrink


@pytest.mark.parametrize("topology, fragment", [
    (dict(nodes=2, elastic={"minNodes": 3}), "spec.topology.elastic.minNodes=3 is more than spec.topology.nodes=2"),
    (dict(nodes=2, elastic={"minNodes": 2}), "spec.topology.elastic.minNodes=2 equals spec.topology.nodes"),
    # 3 nodes, global batch 3: only 1 node keeps it, below minNodes 2
    (dict(nodes=3, elastic={"minNodes": 2}), "no node count from minNodes 2 to 2 keeps the global batch 3 (1 GPUs per "
                                             "node, sequenceParallelSize 1, microBatchSize 1); set minNodes to 1 or "
                                             "fewer (node counts below 3 that keep the global batch 3: 1)"),
])
def test_elastic_bounds_that_allow_no_smaller_shape_are_refused_before_any_job(topology, fragment):
    with pytest.raises(RunInvalid) as refused:
        _plan(**topology)
    assert refused.value.reason == "TopologyMismatch" and fragment in refused.value.message


@pytest.mark.parametrize("topology", [
    # more than nodes (issue 53: it said "32 or fewer", and 32 was then refused)
    dict(nodes=32, gpusPerNode=8, elastic={"minNodes": 40}),
    dict(nodes=32, gpusPerNode=8, elastic={"minNodes": 32}),   # equal to nodes
    dict(nodes=32, gpusPerNode=8, elastic={"minNodes": 31}),   # no count from 31 to 31 keeps 256
    dict(nodes=6, gpusPerNode=1, gradientAccumulation=2, elastic={"minNodes": 5}),   # batch 12: 4, 3, 2, 1 keep it
])
def test_the_minnodes_a_refusal_names_is_accepted(topology):
    import re

    with pytest.raises(RunInvalid) as refused:
        _plan(**topology)
    named = re.search(r"set minNodes to (\d+) or fewer", refused.value.message)
    assert named, refused.value.message
    bound = int(named.group(1))
    assert bound < topology["nodes"]
    plan = _plan(**{**topology, "elastic": {"minNodes": bound}})   # the named bound is accepted ...
    assert min(s.nodes for s in plan.stage("fm").elastic) == bound
    with pytest.raises(RunInvalid):   # ... and it is the largest that is (one more is refused)
        _plan(**{**topology, "elastic": {"minNodes": bound + 1}})


def test_a_single_node_stage_cannot_be_elastic_and_is_told_so():
    with pytest.raises(RunInvalid) as refused:
        _plan(nodes=1, elastic={"minNodes": 1})
    assert "an elastic stage needs spec.topology.nodes of 2 or more; leave elastic out" in refused.value.message
