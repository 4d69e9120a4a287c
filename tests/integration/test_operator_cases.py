"""Data-driven: each ``tests/data/solarrun/input/<case>.yaml`` applied to the emulated API server with
the real operator running must end in ``output/<case>.yaml`` — the status (with its conditions and
messages), the PyTorchJobs it created (in full) and the events it posted. Invalid runs end Failed
with their reason and no job. ``SOLAR_UPDATE_GOLDEN=1`` rewrites the outputs (review the diff)."""

from __future__ import annotations

import os

import jsonschema
import pytest
import yaml

from solar_operator import jobs as pytorchjobs
from tests.integration.world import CASES, CRD, World, load_case
from tests.support.crd_schema import anchor, crd_validator_schema
from tests.support.kube import emulated_cluster, wait_for

pytestmark = pytest.mark.timeout(120)
NAMES = sorted(p.stem for p in (CASES / "input").glob("*.yaml"))
TIMES = ("lastTransitionTime", "startTime", "completionTime", "verifiedAt")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cases")
    with emulated_cluster([CRD, anchor("kubeflow.org_pytorchjobs.yaml")], tmp) as cluster:
        w = World(cluster, tmp / "storage")
        with w.operator():
            yield w


def _normalize(node, namespace: str, uid: str = "<none>"):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
                continue
            out[key] = "<time>" if key in TIMES else _normalize(value, namespace, uid)
        return out
    if isinstance(node, list):
        return [_normalize(v, namespace, uid) for v in node]
    return "<namespace>" if node == namespace else "<run-uid>" if node == uid else node


def _settled(world: World, name: str):
    def ready():
        status = world.status(name)
        if status.get("phase") == "Failed":
            return status
        if status.get("phase") == "Running" and world.jobs():
            return status
        return None
    return wait_for(ready, timeout=60, message=f"{name} to be Failed or Running with a job")


@pytest.mark.parametrize("case", NAMES)
def test_case(case, world):
    doc = load_case(case)
    name = doc["metadata"]["name"]
    before = set(world.jobs())
    world.apply(doc)
    status = _settled(world, name)
    mine = {k: v for k, v in world.jobs().items() if k not in before and v["metadata"]["labels"]
            ["solarwm.io/run"] == name}
    schema = crd_validator_schema(anchor("kubeflow.org_pytorchjobs.yaml"), "v1")
    for job in mine.values():
        jsonschema.validate(job, schema)
        assert pytorchjobs.webhook_problems(job) == []
    # the operator's last word on it: events come after the status write
    events = wait_for(lambda: world.event_reasons(name) or None, message=f"{name} events")
    got = _normalize({"status": status, "jobs": [mine[k] for k in sorted(mine)], "events": events}, world.namespace,
                     world.run(name)["metadata"]["uid"])
    path = CASES / "output" / f"{case}.yaml"
    if os.environ.get("SOLAR_UPDATE_GOLDEN") == "1":
        path.write_text(f"# Expected outcome of input/{case}.yaml (SOLAR_UPDATE_GOLDEN=1 rewrites it).\n"
                        + yaml.safe_dump(got, sort_keys=True, width=110))
    expected = yaml.safe_load(path.read_text())
    assert got == expected


def test_every_input_has_an_output():
    assert NAMES and sorted(p.stem for p in (CASES / "output").glob("*.yaml")) == NAMES
