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
    # strings and booleans where the CRD declares integers and booleans (issue 53: the models took them)
    lambda s: s["topology"].update(nodes=2, elastic={"minNodes": "1"}),
    lambda s: s["topology"].update(nodes=2, elastic={"minNodes": 1, "growBack": "yes"}),
    lambda s: s["topology"].update(nodes="1"),
    lambda s: s["topology"].update(gradientAccumulation=True),
    lambda s: s["runPolicy"].update(backoffLimit="3"),
    lambda s: s["runPolicy"].update(suspend="false"),
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


def _typed_fields(node, loc=()):
    """(path to the owning mapping, field, type) of every integer and boolean the CRD's spec declares."""
    for name, child in node.get("properties", {}).items():
        if child["type"] in ("integer", "boolean"):
            yield loc, name, child["type"]
        yield from _typed_fields(child, (*loc, name))
    if "items" in node:
        yield from _typed_fields(node["items"], (*loc, 0))


def test_every_integer_and_boolean_the_crd_declares_is_as_strict_in_the_models():
    """The models refuse what the API server refuses for each field the CRD types integer or boolean: a
    quoted number or boolean, a boolean for an integer, a fraction, a number for a boolean."""
    from pydantic import ValidationError

    from solar.config.messages import model_at
    from solar.run.spec import SolarRunSpec

    spec = crd.crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    typed = list(_typed_fields(spec))
    names = {name for _, name, _ in typed}
    assert {"nodes", "minNodes", "growBack", "backoffLimit", "suspend", "readOnly"} <= names, names
    for loc, name, kind in typed:
        model = model_at(SolarRunSpec, loc)
        assert model is not None and name in model.model_fields, (loc, name)
        good, bad = (16, ["16", True, 16.5]) if kind == "integer" else (True, ["true", "yes", 1])
        model.__pydantic_validator__.validate_assignment(model.model_construct(), name, good)
        for value in bad:
            with pytest.raises(ValidationError):
                model.__pydantic_validator__.validate_assignment(model.model_construct(), name, value)
            with pytest.raises(jsonschema.ValidationError):   # the CRD refuses it too
                jsonschema.validate(value, spec_node(spec, loc, name))


def spec_node(spec: dict, loc: tuple, name: str) -> dict:
    node = spec
    for part in loc:
        node = node["items"] if isinstance(part, int) else node["properties"][part]
    return node["properties"][name]
