"""`solar run` and `solar-operator render` messages about a manifest (issue 44 item 7): the unknown key
named with the one it is close to, a declared global batch named in the SolarRun's own fields, the
manifest argument named as such, and a --nproc that changes the global batch said at start."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.cli.test_cli import run
from tests.conftest import REPO
from tests.e2e.helpers import env


def _manifest(tmp_path, edit):
    doc = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())
    edit(doc)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _one_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    return line


def test_a_misspelt_key_is_named_with_the_key_it_is_close_to(tmp_path):
    path = _manifest(tmp_path, lambda d: d["spec"].update(topolgy=d["spec"].pop("topology")))
    line = _one_line(run("run", str(path), "--dry-run", "--workdir", str(tmp_path / "runs")))
    assert "spec.topolgy: unknown field (did you mean spec.topology?) (InvalidSpec)" in line


def test_a_declared_global_batch_the_topology_does_not_give_names_the_manifests_fields(tmp_path):
    path = _manifest(tmp_path, lambda d: d["spec"]["topology"].update(gpusPerNode=2, globalBatchSize=4))
    line = _one_line(run("run", str(path), "--dry-run", "--workdir", str(tmp_path / "runs")))
    assert "spec.topology.globalBatchSize=4 disagrees with the topology's 2" in line
    assert "spec.topology.gradientAccumulation: 2" in line and "(TopologyMismatch)" in line
    assert "train.global_batch_size" not in line   # a key stages may not set


def test_render_names_its_manifest_argument(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "solar_operator.main", "render", str(tmp_path / "nosuch.yaml")], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"MANIFEST {tmp_path / 'nosuch.yaml'}: no such file" in proc.stderr, proc.stderr
    assert "--config" not in proc.stderr


def test_an_nproc_that_changes_the_global_batch_says_so_at_start(tmp_path):
    path = _manifest(tmp_path, lambda d: [s.update(set=["data.root=/data"]) for s in d["spec"]["stages"]])
    proc = run("run", str(path), "--dry-run", "--nproc", "3", "--workdir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == ("solar run: --nproc 3 trains at world 3 (spec.topology says 1): global "
                                           "batch 3 instead of the manifest's 1, another training recipe")
    same = run("run", str(path), "--dry-run", "--workdir", str(tmp_path / "runs"))
    assert same.returncode == 0 and "--nproc" not in same.stderr


@pytest.mark.parametrize("edit, said", [
    (lambda d: d["spec"]["stages"][0].update(sett=d["spec"]["stages"][0].pop("set")),
     "spec.stages.0.sett: unknown field (did you mean spec.stages.0.set?) (InvalidSpec)"),
    (lambda d: d["spec"]["runPolicy"].update(backofLimit=d["spec"]["runPolicy"].pop("backoffLimit")),
     "spec.runPolicy.backofLimit: unknown field (did you mean spec.runPolicy.backoffLimit?) (InvalidSpec)"),
    (lambda d: d["spec"].update(family="wan22_ti2v5b"), "spec.family: 'wan22_ti2v5b' is not one of wan22_ti2v_5b, "
                                                        "wan22_i2v_a14b, ltx25_video, minimax_h3 (did you mean "
                                                        "wan22_ti2v_5b?) (InvalidSpec)"),
])
def test_every_misspelt_manifest_key_and_family_is_named_with_the_one_it_is_close_to(edit, said, tmp_path):
    line = _one_line(run("run", str(_manifest(tmp_path, edit)), "--dry-run", "--workdir", str(tmp_path / "runs")))
    assert line.endswith(said), line
