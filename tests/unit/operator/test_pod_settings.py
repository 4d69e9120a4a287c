"""Pod settings (contract.md §7) on both job kinds: each lands where its kind wants it, every job
still validates strictly against its upstream CRD, and what a kind cannot carry is refused."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from solar.run.plan import job_name, plan_run
from solar.run.spec import SolarRun, first_error
from solar_operator import backends, jobs, trainjobs
from tests.conftest import REPO
from tests.support.crd_schema import anchor, crd_validator_schema

SETTINGS = {
    "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}}],
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "solar-trainer",
    "podSecurityContext": {"fsGroup": 10001, "runAsNonRoot": True},
    "sharedMemory": "32Gi",
    "nodeSelector": {"gpu": "h200"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "queueName": "gpu-queue",
}


def _doc(**spec):
    doc = yaml.safe_load((REPO / "examples/solarrun-wan22-ti2v-5b.yaml").read_text())
    doc["metadata"].update(namespace="research", uid="0b5e2c8e-1111-4e8a-9b7a-5f0c6c1d2e3f")
    doc["spec"].update(spec)
    return doc


def _built(kind, **spec):
    doc = _doc(**spec)
    run = SolarRun.model_validate(doc)
    plan = plan_run(run.spec, run.spec.run_root, repo=REPO, environ={})
    module = jobs if kind == "PyTorchJob" else trainjobs
    return [module.manifest(doc, run.spec, p, job_name(doc["metadata"]["name"], p.name, 1), attempt=1, resume_from=None)
            for p in plan.stages]


def _pod(kind, job):
    """(pod spec, trainer container, the container's environment) of a job of either kind."""
    if kind == "PyTorchJob":
        pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        return pod, pod["containers"][0], pod["containers"][0]["env"]
    patch = job["spec"]["runtimePatches"][0]
    assert patch["manager"] == "solarwm.io/operator"
    node = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["name"] == "node"
    pod = node["template"]["spec"]["template"]["spec"]
    return pod, pod["containers"][0], job["spec"]["trainer"]["env"]


def _schema(kind):
    if kind == "PyTorchJob":
        return crd_validator_schema(anchor("kubeflow.org_pytorchjobs.yaml"), "v1")
    return crd_validator_schema(anchor("trainer.kubeflow.org_trainjobs.yaml"), "v1alpha1")


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_every_pod_setting_reaches_the_pods_and_the_job_validates_strictly(kind):
    validator = jsonschema.Draft7Validator(_schema(kind))
    for job in _built(kind, **SETTINGS):
        validator.validate(job)
        pod, container, env = _pod(kind, job)
        names = [e["name"] for e in env]
        assert names[:8] == ["SOLAR_METRICS_PORT", "PYTHONUNBUFFERED", "SOLAR_RUN_UID", "SOLAR_RUN_STAGE",
                             "SOLAR_RUN_NAME", "SOLAR_ATTEMPT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"]
        assert env[5] == {"name": "SOLAR_ATTEMPT", "value": "1"}   # the attempt's fencing token
        assert env[8:] == SETTINGS["env"]  # the secret reference travels as it is
        assert pod["imagePullSecrets"] == [{"name": "registry"}] and pod["serviceAccountName"] == "solar-trainer"
        assert pod["securityContext"] == {"fsGroup": 10001, "runAsNonRoot": True}
        assert pod["nodeSelector"] == {"gpu": "h200"} and pod["tolerations"] == SETTINGS["tolerations"]
        shm = next(v for v in pod["volumes"] if v["name"] == "solar-shm")
        assert shm == {"name": "solar-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}
        assert {"name": "solar-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert {"name": "solar-runs", "mountPath": "/runs"} in container["volumeMounts"]
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_compile_caches_are_on_the_run_volume_unless_the_spec_places_them(kind):
    """Every stage's pods share torch.compile's caches below the run root (a relaunch at another shape
    loads what an earlier pod compiled); a spec.env entry of the same name replaces the operator's."""
    root = _doc()["spec"]["storage"]
    root = f"{root['mountPath']}/{root['path']}"
    for job in _built(kind):
        env = {e["name"]: e.get("value") for e in _pod(kind, job)[2]}
        assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/.cache/torchinductor"
        assert env["TRITON_CACHE_DIR"] == f"{root}/.cache/triton"
    mine = [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/scratch/inductor"}]
    env = _pod(kind, _built(kind, env=mine)[0])[2]
    assert [e for e in env if e["name"] == "TORCHINDUCTOR_CACHE_DIR"] == mine
    assert [e["value"] for e in env if e["name"] == "TRITON_CACHE_DIR"] == [f"{root}/.cache/triton"]


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_shared_memory_defaults_to_16gi_and_zero_turns_it_off(kind):
    own = [{"name": "shm", "volume": {"emptyDir": {"medium": "Memory"}}, "mountPath": "/dev/shm"}]
    pod, container, _ = _pod(kind, _built(kind, sharedMemory="0", volumes=own)[0])  # bring your own: allowed
    assert {"name": "shm", "mountPath": "/dev/shm", "readOnly": False} in container["volumeMounts"]
    pod, container, _ = _pod(kind, _built(kind)[0])
    assert {"name": "solar-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    pod, container, _ = _pod(kind, _built(kind, sharedMemory="0")[0])
    assert not [v for v in pod["volumes"] if v["name"] == "solar-shm"]
    assert not [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert "kueue.x-k8s.io/queue-name" not in _built(kind)[0]["metadata"]["labels"]  # no queue: no label


def test_the_trainjob_carries_the_pytorchjobs_command_name_labels_and_owner():
    py, tj = _built("PyTorchJob")[0], _built("TrainJob")[0]
    assert tj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and tj["kind"] == "TrainJob"
    for key in ("name", "namespace", "labels", "ownerReferences"):
        assert tj["metadata"][key] == py["metadata"][key]
    container = py["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    trainer = tj["spec"]["trainer"]
    assert trainer["command"] == container["command"] == ["python", "-m", "solar.launch.torchrun"] and trainer["args"] == container["args"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (32, 8)
    assert trainer["resourcesPerNode"] == container["resources"] and trainer["image"] == container["image"]
    assert tj["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                        "name": "torch-distributed"}
    assert "suspend" not in tj["spec"]  # never set at creation: a queue's webhook may set it
    assert _built("TrainJob", trainingRuntime="torch-h200")[0]["spec"]["runtimeRef"]["name"] == "torch-h200"


@pytest.mark.parametrize("name", ["SOLAR_RUN_UID", "PET_NNODES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
                                  "LOCAL_RANK", "SOLAR_ANYTHING"])
def test_env_names_the_operator_sets_are_refused(name):
    with pytest.raises(ValidationError) as caught:
        SolarRun.model_validate(_doc(env=[{"name": name, "value": "1"}]))
    message = first_error(caught.value)
    assert message.startswith("spec.env:") and name in message and "remove it" in message


@pytest.mark.parametrize("edit, problem", [
    ({"env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}, "not both"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "appears twice"),
    ({"sharedMemory": "lots"}, "spec.sharedMemory"),
    ({"volumes": [{"name": "solar-shm", "volume": {"emptyDir": {}}, "mountPath": "/x"}]}, "operator's"),
    ({"volumes": [{"name": "shm", "volume": {"emptyDir": {"medium": "Memory"}}, "mountPath": "/dev/shm"}]},
     'volumes[0].mountPath is /dev/shm, which sharedMemory (16Gi) mounts; set sharedMemory: "0"'),
])
def test_bad_pod_settings_are_refused_naming_the_field(edit, problem):
    with pytest.raises(ValidationError) as caught:
        SolarRun.model_validate(_doc(**edit))
    assert problem in first_error(caught.value)


@pytest.mark.parametrize("edit, field", [({"priorityClassName": "high"}, "spec.priorityClassName"),
                                         ({"schedulerName": "volcano"}, "spec.schedulerName"),
                                         ({"imagePullPolicy": "Always"}, "spec.imagePullPolicy")])
def test_what_a_trainjob_cannot_carry_is_refused_and_the_pytorchjob_carries_it(edit, field):
    spec = SolarRun.model_validate(_doc(**edit)).spec
    problems = backends.spec_problems(spec, "TrainJob")
    assert len(problems) == 1 and problems[0].startswith(field) and "ClusterTrainingRuntime" in problems[0]
    assert backends.spec_problems(spec, "PyTorchJob") == []


def test_trainjob_state_follows_its_conditions_and_suspend():
    job = _built("TrainJob")[0]
    job["metadata"]["creationTimestamp"] = "2026-12-04T10:00:00Z"
    assert trainjobs.state(job).phase == "Created" and not trainjobs.state(job).suspended
    job["status"] = {"jobsStatus": [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0,
                                     "suspended": 0}]}
    assert trainjobs.state(job).phase == "Running"
    job["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                    "message": "too slow", "lastTransitionTime": "2026-12-04T11:00:00Z"}]
    assert (trainjobs.state(job).phase, trainjobs.state(job).message) == ("Failed", "DeadlineExceeded: too slow")
    job["status"]["conditions"] = [{"type": "Complete", "status": "True", "reason": "JobsCompleted", "message": "",
                                    "lastTransitionTime": "2026-12-04T11:00:00Z"}]
    assert trainjobs.state(job).phase == "Succeeded"
    queued = _built("TrainJob")[0]
    queued["spec"]["suspend"] = True  # Kueue's webhook
    s = trainjobs.state(queued)
    assert s.suspended and not s.suspended_by_operator
    queued["metadata"]["annotations"] = {"solarwm.io/suspended": "true"}
    assert trainjobs.state(queued).suspended_by_operator
    queued["spec"]["suspend"] = False
    queued["status"] = {"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed", "message": "",
                                        "lastTransitionTime": "2026-12-04T12:00:00Z"}]}
    s = trainjobs.state(queued)
    assert not s.suspended and not s.suspended_by_operator and s.resumed is not None


def test_the_trainjob_kueue_example_plans_and_every_job_validates():
    doc = yaml.safe_load((REPO / "examples/solarrun-wan22-ti2v-5b-trainjob-kueue.yaml").read_text())
    doc["metadata"].update(namespace="research", uid="0b5e2c8e-1111-4e8a-9b7a-5f0c6c1d2e3f")
    run = SolarRun.model_validate(doc)
    assert run.spec.backend == "TrainJob" and run.spec.queueName and backends.spec_problems(run.spec, "TrainJob") == []
    plan = plan_run(run.spec, run.spec.run_root, repo=REPO, environ={})
    validator = jsonschema.Draft7Validator(_schema("TrainJob"))
    for p in plan.stages:
        job = trainjobs.manifest(doc, run.spec, p, job_name("wan5b-camera-tj", p.name, 1), attempt=1, resume_from=None)
        validator.validate(job)
        assert trainjobs.admission_problems(job) == []
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"


def test_a_run_keeps_the_backend_it_started_with():
    spec = {"backend": "TrainJob"}
    assert backends.of_run({"spec": spec}, "PyTorchJob") == "TrainJob"
    assert backends.of_run({"spec": {}}, "TrainJob") == "TrainJob"
    # recorded at the first reconcile: a later spec edit or another operator default changes nothing
    assert backends.of_run({"spec": spec, "status": {"backend": "PyTorchJob", "phase": "Running"}}, "TrainJob") \
        == "PyTorchJob"
    # a run started before status.backend existed ran PyTorchJobs
    old = {"spec": {}, "status": {"phase": "Running", "stages": [{"name": "fm", "job": "r-fm"}]}}
    assert backends.of_run(old, "TrainJob") == "PyTorchJob"
    assert backends.backend_name("TrainJob") == backends.backend_name(" trainjob") == "TrainJob"
    with pytest.raises(ValueError, match="mpijob"):
        backends.backend_name("mpijob")


def test_check_finds_a_backend_once_and_asks_again_while_it_is_missing():
    from types import SimpleNamespace

    from solar_operator.backends import Backends

    table = SimpleNamespace(served=set(), runtimes=set(), asked=0)

    class FakeKube:  # the two questions Backends.check asks the API server, answered from a table
        def served(self, res):
            table.asked += 1
            return res in table.served

        def get_cluster_object(self, res, name):
            return {"metadata": {"name": name}} if name in table.runtimes else None

    now = [0.0]
    chosen = Backends(FakeKube(), default="TrainJob", clock=lambda: now[0])
    spec = SolarRun.model_validate(_doc()).spec
    run = {"spec": {}}
    assert chosen.check(run, spec).reason == "BackendUnavailable"
    table.served |= {trainjobs.RES, trainjobs.RUNTIME_RES}
    assert "torch-distributed does not exist" in chosen.check(run, spec).message  # asked again, not remembered
    table.runtimes.add("torch-distributed")
    asked = table.asked
    assert chosen.check(run, spec) is None and chosen.check(run, spec) is None
    assert table.asked == asked + 2  # found once (two discovery questions), then remembered
    now[0] += 31
    assert chosen.check(run, spec) is None and table.asked == asked + 4
