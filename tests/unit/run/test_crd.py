"""The SolarRun CRD is generated from the models, structural, and accepts what the models accept."""

from __future__ import annotations


import jsonschema
import pytest
import yaml

from solar.run import crd
from solar.run.spec import SolarRun, SolarRunStatus
from tests.conftest import REPO
from tests.support.crd_schema import crd_validator_schema


def _schema():
    return crd_validator_schema(crd.CRD_PATH)


@pytest.mark.parametrize("path", [crd.CRD_PATH, crd.CHART_CRD_PATH], ids=["crds", "chart"])
def test_the_committed_crd_is_the_generated_one(path):
    assert path.read_text() == crd.render(), "run `python -m solar.run.crd` and commit the result"


def test_every_node_is_structural():
    version = crd.crd_document()["spec"]["versions"][0]

    def walk(node, where):
        assert "type" in node, where
        assert "$ref" not in node and "anyOf" not in node, where
        for name, child in node.get("properties", {}).items():
            walk(child, f"{where}.{name}")
        if "items" in node:
            walk(node["items"], f"{where}[]")

    walk(version["schema"]["openAPIV3Schema"], "")
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Stage", "Step", "GPU-Hours", "Age"]


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("solarrun-*.yaml")), ids=lambda p: p.name)
def test_example_manifests_satisfy_both_the_crd_and_the_models(path):
    doc = yaml.safe_load(path.read_text())
    jsonschema.validate(doc, _schema())
    SolarRun.model_validate(doc)


@pytest.mark.parametrize("edit", [
    lambda s: s["topology"].update(nodes=0),
    lambda s: s.update(family="wan3"),
    lambda s: s["stages"][0].update(name="Not_A_Label"),
    lambda s: s.update(stages=[]),
    lambda s: s["runPolicy"].update(cleanPodPolicy="Sometimes"),
    lambda s: s["topology"].update(gpus=8),
])
def test_bad_specs_fail_both(edit):
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    edit(doc["spec"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _schema())
    with pytest.raises(ValueError):
        SolarRun.model_validate(doc)


def test_a_status_the_state_machine_writes_fits_the_crd():
    from tests.unit.run.test_machine import Sim

    sim = Sim()
    sim.step()
    sim.succeed("fm")
    sim.step()
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    doc["status"] = sim.status.model_dump(mode="json", exclude_none=True)
    jsonschema.validate(doc, _schema())
    assert SolarRunStatus.model_validate(doc["status"]) == sim.status
