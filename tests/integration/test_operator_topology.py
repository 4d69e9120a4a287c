"""The real operator against the emulated API server: a SolarRun whose topology changes between
attempts (issue 39). The test plays the training operator and the trainer (stage directories with
real checkpoint transactions, one with ``data/position.json``)."""

from __future__ import annotations

import time

import pytest

from tests.integration.world import CRD, World, load_case, write_checkpoint
from tests.support.crd_schema import anchor
from tests.support.kube import emulated_cluster, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def world(tmp_path):
    with emulated_cluster([CRD, anchor("kubeflow.org_pytorchjobs.yaml")], tmp_path) as cluster:
        yield World(cluster, tmp_path / "storage")


def _args(job):
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]


def _stage(status, name):
    return next(s for s in status["stages"] if s["name"] == name)


def _condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_a_topology_change_resumes_at_the_new_shape_and_a_batch_change_is_refused_before_any_job(world):
    doc = load_case("three-stage")   # 2 nodes x 4 GPUs, accumulation 1: global batch 8
    doc["metadata"]["name"] = "shape"
    doc["spec"]["storage"]["path"] = "team-a/shape"
    with world.operator():
        world.apply(doc)
        world.wait_job("shape-fm-1")
        world.set_job("shape-fm-1", "Running")
        world.write_stage("shape", "fm", result=None, checkpoint=False, steps=(2,))   # no position file
        world.wait_status("shape", lambda s: s.get("step") == 2, "step 2")
        world.patch_spec("shape", {"runPolicy": {"suspend": True}})
        world.wait_phase("shape", "Suspended")
        wait_for(lambda: "shape-fm-1" not in world.jobs(), message="the job to be deleted")

        # one node lost: half the data-parallel ranks, the same accumulation -> global batch 4, refused
        world.patch_spec("shape", {"topology": {"nodes": 1}})
        status = world.wait_status("shape", lambda s: _condition(s, "Validated")["status"] == "False",
                                   "the mismatch reported while suspended")
        message = _condition(status, "Validated")["message"]
        assert _condition(status, "Validated")["reason"] == "TopologyMismatch" and status["phase"] == "Suspended"
        assert "from 8 to 4" in message and "{gradientAccumulation: 2, microBatchSize: 1}" in message
        world.patch_spec("shape", {"runPolicy": {"suspend": False}})
        world.wait_status("shape", lambda s: _stage(s, "fm").get("reason") == "TopologyMismatch", "fm held")
        wait_for(lambda: "TopologyMismatch" in world.event_reasons("shape"), message="the mismatch event")
        time.sleep(1.5)   # several polls: still no job, and no second event (kopf posts events asynchronously)
        assert world.jobs() == {} and world.status("shape")["phase"] == "Pending"
        assert world.event_reasons("shape").count("TopologyMismatch") == 1

        # fixed as the message says: attempt 2 resumes step 2 on one node with twice the accumulation
        world.patch_spec("shape", {"topology": {"gradientAccumulation": 2}})
        job = world.wait_job("shape-fm-2")
        args = _args(job)
        assert "checkpoint.path=/runs/team-a/shape/fm/checkpoints/step_00000002" in args
        assert "distributed.world_size=4" in args and "train.gradient_accumulation=2" in args
        assert job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
        assert "Worker" not in job["spec"]["pytorchReplicaSpecs"]
        status = world.wait_phase("shape", "Running")
        assert _condition(status, "Validated")["status"] == "True"
        assert [(a["attempt"], a["topology"]["worldSize"], a["topology"]["gradientAccumulation"],
                 a["topology"]["globalBatchSize"], a.get("resumedFrom")) for a in _stage(status, "fm")["attempts"]] \
            == [(1, 8, 1, 8, None), (2, 4, 2, 8, 2)]
        wait_for(lambda: "TopologyChanged" in world.event_reasons("shape"),   # posted asynchronously by kopf
                 message="the TopologyChanged event")

        # attempt 2 saves step 3 (with its data position) and fails; the retry's topology is checked
        # against that checkpoint's position file
        world.set_job("shape-fm-2", "Running")
        write_checkpoint(world.stage_dir("shape", "fm"), 3,
                         saved_with={"world_size": 4, "gradient_accumulation": 2, "nproc_per_node": 4})
        world.patch_spec("shape", {"topology": {"nodes": 2}})   # the node is back, accumulation still 2: 16
        world.set_job("shape-fm-2", "Failed", "a rank died")
        status = world.wait_status("shape", lambda s: _stage(s, "fm").get("reason") == "TopologyMismatch",
                                   "the retry held")
        assert "from 8 to 16" in _condition(status, "Validated")["message"]
        assert "its data/position.json" in _condition(status, "Validated")["message"]
        assert world.jobs() == {} and _stage(status, "fm")["failures"] == 1
        world.patch_spec("shape", {"topology": {"gradientAccumulation": 1}})
        job = world.wait_job("shape-fm-3")
        assert "checkpoint.path=/runs/team-a/shape/fm/checkpoints/step_00000003" in _args(job)
        assert "distributed.world_size=8" in _args(job)
        status = world.wait_status("shape", lambda s: len(_stage(s, "fm").get("attempts", [])) == 3, "attempt 3")
        assert _stage(status, "fm")["attempts"][-1]["topology"]["worldSize"] == 8
