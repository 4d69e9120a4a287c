"""A SolarRun manifest's refusals in one line (issue 53 item 7): an unknown key at any depth named with
the known key it is closest to, a value outside a fixed set (the family) with the choice it is closest
to, and a quoted number or boolean with what the CRD declares (the models are as strict as the CRD)."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from solar.run.spec import SolarRun, SolarRunSpec, first_error
from tests.conftest import REPO

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())


def _refusal(edit) -> str:
    doc = copy.deepcopy(MANIFEST)
    edit(doc["spec"])
    with pytest.raises(ValidationError) as refused:
        SolarRun.model_validate(doc)
    return first_error(refused.value)


def _rename(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


@pytest.mark.parametrize("edit, line", [
    (lambda s: _rename(s["stages"][0], "set", "sett"),
     "spec.stages.0.sett: unknown field (did you mean spec.stages.0.set?)"),
    (lambda s: _rename(s["runPolicy"], "backoffLimit", "backofLimit"),
     "spec.runPolicy.backofLimit: unknown field (did you mean spec.runPolicy.backoffLimit?)"),
    (lambda s: s["runPolicy"].update(progresDeadlineSeconds=60),
     "spec.runPolicy.progresDeadlineSeconds: unknown field (did you mean spec.runPolicy.progressDeadlineSeconds?)"),
    (lambda s: s["stages"][1].update(init={"modle": {"stage": "fm", "weights": "ema"}}),
     "spec.stages.1.init.modle: unknown field (did you mean spec.stages.1.init.model?)"),
    (lambda s: s["topology"].update(nodes=2, elastic={"minNode": 1}),
     "spec.topology.elastic.minNode: unknown field (did you mean spec.topology.elastic.minNodes?)"),
    (lambda s: s["topology"].update(nodes=2, elastic={"minNodes": 1, "growback": False}),
     "spec.topology.elastic.growback: unknown field (did you mean spec.topology.elastic.growBack?)"),
    (lambda s: s.update(family="wan22_ti2v5b"),
     "spec.family: 'wan22_ti2v5b' is not one of wan22_ti2v_5b, wan22_i2v_a14b, ltx25_video, minimax_h3 (did you mean "
     "wan22_ti2v_5b?)"),
    (lambda s: s.update(imagePullPolicy="always"), "(did you mean Always?)"),
    (lambda s: s["topology"].update(nodes=32, elastic={"minNodes": "16"}),
     "spec.topology.elastic.minNodes: '16' is a string; the SolarRun CRD declares an integer: write 16 without quotes"),
    (lambda s: s["topology"].update(nodes=2, elastic={"minNodes": 1, "growBack": "yes"}),
     "spec.topology.elastic.growBack: 'yes' is a string; the SolarRun CRD declares a boolean (true or false): write "
     "true without quotes"),
    (lambda s: s["runPolicy"].update(backoffLimit=2.5), "spec.runPolicy.backoffLimit: 2.5 is a fraction; the SolarRun "
                                                        "CRD declares an integer"),
    (lambda s: s["topology"].update(gpusPerNode=True), "spec.topology.gpusPerNode: True is a boolean; the SolarRun CRD "
                                                       "declares an integer"),
])
def test_a_refused_manifest_says_what_would_be_accepted(edit, line):
    said = _refusal(edit)
    assert line in said and "\n" not in said, said


def test_a_spec_validated_alone_is_named_from_spec_with_the_same_hint():
    """The operator validates ``spec`` alone (first_error with the prefix ``spec``)."""
    spec = copy.deepcopy(MANIFEST["spec"])
    _rename(spec["runPolicy"], "backoffLimit", "backofLimit")
    with pytest.raises(ValidationError) as refused:
        SolarRunSpec.model_validate(spec)
    assert first_error(refused.value, "spec") == ("spec.runPolicy.backofLimit: unknown field (did you mean "
                                                  "spec.runPolicy.backoffLimit?)")


def test_an_unknown_key_close_to_nothing_lists_the_known_ones():
    said = _refusal(lambda s: s["runPolicy"].update(zzz=1))
    assert said.startswith("spec.runPolicy.zzz: unknown field (known: backoffLimit, progressDeadlineSeconds, ")
