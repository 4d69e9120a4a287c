"""Generated PyTorchJobs: valid against the upstream CRD and the webhook rules, deterministic."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from solar.run.plan import job_name, plan_run
from solar.run.spec import SolarRun
from solar_operator import jobs
from tests.conftest import REPO
from tests.support.crd_schema import anchor, crd_validator_schema


def _run(path="examples/solarrun-tiny.yaml"):
    doc = yaml.safe_load((REPO / path).read_text())
    doc["metadata"].update(namespace="research", uid="0b5e2c8e-1111-4e8a-9b7a-5f0c6c1d2e3f")
    run = SolarRun.model_validate(doc)
    plan = plan_run(run.spec, f"{run.spec.storage.mountPath}/{run.spec.storage.path}", repo=REPO, environ={})
    return doc, run.spec, plan


def _jobs(path):
    doc, spec, plan = _run(path)
    for stage in plan.stages:
        yield jobs.manifest(doc, spec, stage, job_name(doc["metadata"]["name"], stage.name, 1), attempt=1,
                               resume_from=None)


@pytest.mark.parametrize("path", ["examples/solarrun-tiny.yaml", "examples/solarrun-wan22-ti2v-5b.yaml",
                                  "examples/solarrun-minimax-h3.yaml"])
def test_every_stage_job_validates_against_the_upstream_crd_and_webhook(path):
    schema = crd_validator_schema(anchor("kubeflow.org_pytorchjobs.yaml"), "v1")
    for job in _jobs(path):
        jsonschema.validate(job, schema)
        assert jobs.webhook_problems(job) == []


def test_job_shape_follows_the_contract():
    built = list(_jobs("examples/solarrun-wan22-ti2v-5b.yaml"))
    fm, generate = built[0], built[-1]
    assert fm["metadata"]["name"] == "wan5b-camera-fm-1"
    assert fm["metadata"]["labels"]["solarwm.io/run"] == "wan5b-camera"
    assert fm["metadata"]["labels"]["solarwm.io/stage"] == "fm"
    owner = fm["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("SolarRun", "wan5b-camera", True)
    specs = fm["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 31
    assert fm["spec"]["nprocPerNode"] == "8"
    assert set(generate["spec"]["pytorchReplicaSpecs"]) == {"Master"}  # one node: Master only
    container = specs["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["command"] == ["python", "-m", "solar.launch.torchrun"]
    args = container["args"]
    assert args[:6] == ["--nproc-per-node=8", "-m", "solar", "train", "--config",
                        "configs/solar_wm/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml"]
    assert "runtime.output_dir=/runs/wan5b-camera/fm" in args and "distributed.world_size=256" in args
    assert not any("$" in a or " " in a.split("=", 1)[0] for a in args)  # no shell, nothing for a shell to expand
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "/runs" in mounts and mounts["/data"]["readOnly"] is True
    assert {p["name"] for p in container["ports"]} == {"pytorchjob-port", "metrics"}
    # rank 0 (metrics) lives in the Master pod; workers declare no metrics port and are not selected
    worker = specs["Worker"]["template"]
    assert {p["name"] for p in worker["spec"]["containers"][0]["ports"]} == {"pytorchjob-port"}
    assert specs["Master"]["template"]["metadata"]["labels"]["solarwm.io/replica"] == "master"
    assert worker["metadata"]["labels"]["solarwm.io/replica"] == "worker"
    assert specs["Master"]["restartPolicy"] == "Never" and fm["spec"]["runPolicy"]["backoffLimit"] == 0
    dmd = built[2]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert "checkpoint.roles.student.path=/runs/wan5b-camera/anyflow/checkpoints/step_00020000" in dmd


def test_a_retry_resumes_from_its_checkpoint_and_the_manifest_is_deterministic():
    doc, spec, plan = _run()
    stage = plan.stage("anyflow")
    a = jobs.manifest(doc, spec, stage, "tiny-wan-anyflow", attempt=2,
                      resume_from="/runs/tiny-wan/anyflow/checkpoints/step_00000002")
    b = jobs.manifest(copy.deepcopy(doc), spec, stage, "tiny-wan-anyflow", attempt=2,
                      resume_from="/runs/tiny-wan/anyflow/checkpoints/step_00000002")
    assert a == b
    args = a["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert args[-4:] == ["--set", "checkpoint.mode=full_resume", "--set",
                         "checkpoint.path=/runs/tiny-wan/anyflow/checkpoints/step_00000002"]
    assert a["metadata"]["labels"]["solarwm.io/attempt"] == "2"


@pytest.mark.parametrize("edit, problem", [
    (lambda j: j["metadata"].update(name="Bad_Name"), "DNS-1035"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"]["Master"]), "Chief"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "Master.replicas must be 1"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].update(name="main"),
     "no container named pytorch"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].update(image=""),
     "without an image"),
    (lambda j: j["spec"].update(elasticPolicy={"minReplicas": 1}), "elasticPolicy needs a Worker"),
])
def test_webhook_rules_catch_what_the_schema_allows(edit, problem):
    job = copy.deepcopy(next(_jobs("examples/solarrun-tiny.yaml")))
    edit(job)
    assert any(problem in p for p in jobs.webhook_problems(job))


def test_job_state_is_the_last_true_condition():
    job = {"metadata": {"name": "j"}, "status": {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "False"},
        {"type": "Failed", "status": "True", "message": "OOMKilled"}]}}
    state = jobs.state(job)
    assert (state.phase, state.message, state.deleting) == ("Failed", "OOMKilled", False)
    assert jobs.state({"metadata": {"name": "j", "deletionTimestamp": "x"}}).phase is None
    labelled = jobs.state({"metadata": {"name": "j", "labels": {"solarwm.io/attempt": "3"},
                                        "creationTimestamp": "2027-01-15T08:00:00Z"}})
    assert labelled.attempt == 3 and labelled.created == 1800000000.0


def test_ownership_needs_the_run_label_and_a_controller_reference_to_that_run():
    doc, spec, plan = _run()
    job = next(_jobs("examples/solarrun-tiny.yaml"))
    assert jobs.owned_by(job, doc)
    other = copy.deepcopy(doc)
    other["metadata"]["uid"] = "another-uid"  # a SolarRun of the same name, deleted and created again
    assert not jobs.owned_by(job, other)
    unlabelled = copy.deepcopy(job)
    del unlabelled["metadata"]["labels"]["solarwm.io/run"]
    assert not jobs.owned_by(unlabelled, doc)


def test_a_stage_on_fewer_gpus_requests_its_own_resources():
    doc, spec, plan = _run("examples/solarrun-minimax-h3.yaml")
    built = {s.name: jobs.manifest(doc, spec, s, job_name("h3-camera", s.name, 1), attempt=1, resume_from=None)
             for s in plan.stages}

    def container(job):
        return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container(built["fm"])["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert container(built["generate"])["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert built["generate"]["spec"]["nprocPerNode"] == "4" and "annotations" not in built["generate"]["metadata"]
