"""Dry runs (contract.md §7): ``solar run --dry-run`` and ``solar-operator render`` validate a manifest
as the runner would, print the plan and what would be started or created, and touch nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import REPO
from tests.support.crd_schema import anchor, crd_validator_schema
from tests.support.files import snapshot

TINY = REPO / "examples" / "solarrun-tiny.yaml"


def _run(*args, cwd=REPO, env=None):
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _operator(*args, **kw):
    return _run(str(Path(sys.executable).with_name("solar-operator")), "render", *args, **kw)


def _manifest(tmp_path, **spec):
    doc = yaml.safe_load(TINY.read_text())
    doc["spec"].update(spec)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_solar_run_dry_run_prints_each_stage_launch_and_writes_nothing(tmp_path):
    manifest = _manifest(tmp_path, env=[{"name": "NCCL_DEBUG", "value": "WARN"}], backend="TrainJob",
                         imagePullSecrets=[{"name": "registry"}])
    before = snapshot(tmp_path)
    proc = _run(sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert [d["stage"] for d in docs] == ["fm", "anyflow", "dmd", "generate"]
    assert proc.stdout.startswith("# solar run tiny-wan: 4 stages")
    fm = docs[0]
    assert fm["command"][1:5] == ["-m", "solar.launch.torchrun", "--standalone", "--nproc-per-node=1"]
    assert f"runtime.output_dir={tmp_path / 'runs' / 'tiny-wan' / 'fm'}" in fm["command"]
    assert fm["env"] == {"NCCL_DEBUG": "WARN"}
    assert snapshot(tmp_path) == before  # not even the work directory, and no file rewritten


def test_solar_run_dry_run_refuses_an_invalid_manifest_with_the_operators_reason(tmp_path):
    proc = _run(sys.executable, "-m", "solar", "run", "--dry-run",
                str(_manifest(tmp_path, env=[{"name": "PET_NNODES", "value": "2"}])))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "spec.env" in proc.stderr and "PET_NNODES" in proc.stderr and "(InvalidSpec)" in proc.stderr


@pytest.mark.parametrize("backend, crd, version", [
    ("pytorchjob", "kubeflow.org_pytorchjobs.yaml", "v1"),
    ("trainjob", "trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")])
def test_render_prints_the_jobs_the_operator_would_create(backend, crd, version, tmp_path):
    validator = jsonschema.Draft7Validator(crd_validator_schema(anchor(crd), version))
    manifest = _manifest(tmp_path, queueName="gpu", serviceAccountName="trainer")
    before = snapshot(tmp_path)
    proc = _operator(str(manifest), "--backend", backend,
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    jobs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert [j["metadata"]["name"] for j in jobs] == ["tiny-wan-fm-1", "tiny-wan-anyflow-1", "tiny-wan-dmd-1",
                                                    "tiny-wan-generate-1"]
    for job in jobs:
        validator.validate(job)
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert "4 stages as " + {"pytorchjob": "PyTorchJobs", "trainjob": "TrainJobs"}[backend] in proc.stdout
    assert snapshot(tmp_path) == before  # nothing written: no file, no directory


def test_render_follows_spec_backend_and_shows_a_resume_from_the_storage_root(tmp_path):
    from tests.integration.world import write_checkpoint

    root = tmp_path / "storage"
    write_checkpoint((root / "tiny-wan" / "fm").resolve(), 2)
    proc = _operator(str(_manifest(tmp_path, backend="TrainJob")), "--backend", "pytorchjob",
                     "--storage-root", str(root))
    assert proc.returncode == 0, proc.stderr
    fm = next(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert fm["kind"] == "TrainJob"  # spec.backend wins over the operator's default
    assert "checkpoint.path=/runs/tiny-wan/fm/checkpoints/step_00000002" in fm["spec"]["trainer"]["args"]
    assert "checkpoint.mode=full_resume" in fm["spec"]["trainer"]["args"]


@pytest.mark.parametrize("edit, reason", [
    ({"backend": "TrainJob", "priorityClassName": "high"}, "InvalidSpec: spec.priorityClassName"),
    ({"env": [{"name": "RANK", "value": "0"}]}, "InvalidSpec: spec.env"),
    ({"topology": {"nodes": 1, "gpusPerNode": 1, "globalBatchSize": 7}}, "TopologyMismatch"),
])
def test_render_refuses_an_invalid_manifest_with_the_reason_the_run_would_carry(edit, reason, tmp_path):
    proc = _operator(str(_manifest(tmp_path, **edit)))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and reason in proc.stderr, proc.stderr
    assert proc.stdout == ""


def _resumable(root, *, saved_with=None):
    """A tiny-wan fm stage directory holding checkpoint step 2 (with a data position when
    ``saved_with`` is given) and the launch that wrote it."""
    from tests.integration.world import write_checkpoint

    stage = (root / "tiny-wan" / "fm").resolve()
    write_checkpoint(stage, 2, saved_with=saved_with)
    (stage / "launch-manifest.json").write_text('{"schema": "solar.launch.v1", "name": "tiny-wan"}')
    return stage


WORLD_2 = {"world_size": 2, "nproc_per_node": 2}   # saved at world 2, accumulation 1: global batch 2


def test_render_shows_a_resume_at_a_new_shape_and_refuses_a_new_global_batch(tmp_path):
    root = tmp_path / "storage"
    _resumable(root, saved_with=WORLD_2)
    topology = {"nodes": 1, "gpusPerNode": 1, "gradientAccumulation": 2}
    proc = _operator(str(_manifest(tmp_path, topology=topology)), "--storage-root", str(root))
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "resumes checkpoint step 2" in x)
    assert "world 2 (1 node x 2), SP 1, microBatchSize 1, gradientAccumulation 1 -> world 1 (1 node x 1)" in line
    assert "gradientAccumulation 2 (global batch 2 kept)" in line
    assert "stream position step 2, 4 clips of the global order consumed (epoch 0)" in line
    fm = next(d for d in yaml.safe_load_all(proc.stdout) if d)
    args = fm["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert "checkpoint.path=/runs/tiny-wan/fm/checkpoints/step_00000002" in args
    assert "distributed.world_size=1" in args and "train.gradient_accumulation=2" in args

    proc = _operator(str(_manifest(tmp_path, topology={"nodes": 1, "gpusPerNode": 1})), "--storage-root", str(root))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == ""
    assert "TopologyMismatch: stage fm: spec.topology would change the global batch from 2 to 1" in proc.stderr
    assert "{gradientAccumulation: 2, microBatchSize: 1}" in proc.stderr


def test_render_takes_the_old_shape_of_a_checkpoint_without_position_from_the_manifests_status(tmp_path):
    root = tmp_path / "storage"
    _resumable(root)
    doc = yaml.safe_load(_manifest(tmp_path, topology={"nodes": 1, "gpusPerNode": 1, "gradientAccumulation": 2})
                         .read_text())
    doc["status"] = {"phase": "Suspended", "stages": [{"name": "fm", "phase": "Suspended", "attempt": 1, "attempts": [
        {"attempt": 1, "topology": {"nodes": 1, "gpusPerNode": 2, "worldSize": 2, "sequenceParallelSize": 1,
                                    "microBatchSize": 1, "gradientAccumulation": 1, "globalBatchSize": 2}}]}]}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    proc = _operator(str(tmp_path / "run.yaml"), "--storage-root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "position not recorded: the checkpoint predates data/position.json" in proc.stdout
    assert "world 2 (1 node x 2)" in proc.stdout
    doc["spec"]["topology"]["gradientAccumulation"] = 4
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    proc = _operator(str(tmp_path / "run.yaml"), "--storage-root", str(root))
    assert proc.returncode == 2 and "from 2 to 4" in proc.stderr and "the status of attempt 1" in proc.stderr


def test_solar_run_dry_run_shows_a_resume_at_another_nproc_and_refuses_a_new_global_batch(tmp_path):
    workdir = tmp_path / "runs"
    stage = _resumable(workdir, saved_with=WORLD_2)
    manifest = _manifest(tmp_path, topology={"nodes": 1, "gpusPerNode": 2, "gradientAccumulation": 2})
    before = snapshot(tmp_path)
    proc = _run(sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(workdir),
                "--nproc", "1")
    assert proc.returncode == 0, proc.stderr
    assert "#     stage fm resumes checkpoint step 2 at a new shape: world 2 (1 node x 2)" in proc.stdout
    fm = next(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert fm["command"][4] == "--nproc-per-node=1" and f"checkpoint.path={stage}/checkpoints/step_00000002" in \
        fm["command"]
    assert fm["reshape"]["old"]["worldSize"] == 2 and fm["reshape"]["new"]["worldSize"] == 1
    assert fm["reshape"]["new"]["gradientAccumulation"] == 2 and fm["reshape"]["new"]["globalBatchSize"] == 2
    assert fm["reshape"]["streamPosition"] == {"step": 2, "clipsConsumed": 4, "epochs": [0, 0]}
    proc = _run(sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(workdir),
                "--nproc", "4")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "global batch from 2 to 8" in proc.stderr and "(TopologyMismatch)" in proc.stderr
    assert "{gradientAccumulation: 1, microBatchSize: 1}" not in proc.stderr   # data parallel 4 cannot give 2
    assert snapshot(tmp_path) == before   # nothing written, byte for byte


def test_render_lists_an_elastic_stages_node_counts_and_refuses_bounds_that_keep_no_batch(tmp_path):
    manifest = _manifest(tmp_path, topology={"nodes": 4, "gpusPerNode": 2, "elastic": {"minNodes": 1}})
    proc = _operator(str(manifest))
    assert proc.returncode == 0, proc.stderr
    assert ("#     elastic: 4 nodes x accumulation 1, 2 nodes x accumulation 2, 1 node x accumulation 4 (bounds "
            "minNodes 1 .. nodes 4;") in proc.stdout
    manifest = _manifest(tmp_path, topology={"nodes": 3, "gpusPerNode": 1, "elastic": {"minNodes": 2}})
    proc = _operator(str(manifest))
    assert proc.returncode == 2 and "set minNodes to 1 or fewer (node counts below 3 that keep the global batch 3: " \
                                    "1)" in proc.stderr


ELASTIC = {"nodes": 4, "gpusPerNode": 2, "elastic": {"minNodes": 1}}


def test_solar_run_dry_run_of_a_multi_node_manifest_prints_each_stages_plan_and_says_it_cannot_run_it(tmp_path):
    manifest = _manifest(tmp_path, topology=ELASTIC)
    before = snapshot(tmp_path)
    proc = _run(sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    comments = [line for line in proc.stdout.splitlines() if line.startswith("#")]
    assert comments[1].startswith("# not runnable here: spec.topology.nodes=4; solar run executes single-node runs "
                                  "only, so this plan is what the operator would run")
    elastic = ("#     elastic: 4 nodes x accumulation 1, 2 nodes x accumulation 2, 1 node x accumulation 4 (bounds "
               "minNodes 1 .. nodes 4;")
    for stage in ("fm", "anyflow", "dmd"):   # every training stage, with its shape and its allowed shapes
        at = next(i for i, line in enumerate(comments) if line.startswith(f"#   {stage}: train "))
        assert "on 4 nodes x 2 processes (world 8)" in comments[at] and comments[at + 1].startswith(elastic)
    assert any(line.startswith("#   generate: infer ") and "on 4 nodes x 2 processes" in line for line in comments)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert [d["stage"] for d in docs] == ["fm", "anyflow", "dmd", "generate"]
    fm = docs[0]
    assert (fm["nodes"], fm["nprocPerNode"], fm["worldSize"], fm["runsHere"]) == (4, 2, 8, False)
    assert fm["elastic"] == [{"nodes": 4, "gradientAccumulation": 1}, {"nodes": 2, "gradientAccumulation": 2},
                             {"nodes": 1, "gradientAccumulation": 4}]
    assert "distributed.world_size=8" in fm["arguments"] and "command" not in fm   # no local launch to show
    assert "elastic" not in docs[3]   # inference stages do not shrink
    assert snapshot(tmp_path) == before   # nothing written: no work directory, no file

    run = _run(sys.executable, "-m", "solar", "run", str(manifest), "--workdir", str(tmp_path / "runs"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert ("spec.topology.nodes=4; solar run executes single-node runs only: apply the manifest to a cluster running "
            "the operator") in run.stderr
    assert snapshot(tmp_path) == before


def test_solar_run_dry_run_of_a_run_that_succeeded_says_so_and_that_it_would_do_nothing(tmp_path):
    from tests.unit.run.test_machine import Sim

    sim = Sim()
    sim.step()
    for stage in ("fm", "anyflow", "dmd", "generate"):   # the state machine's own status of a whole run
        sim.succeed(stage)
        sim.step()
    assert sim.status.phase == "Succeeded"
    run = tmp_path / "runs" / "tiny-wan"
    run.mkdir(parents=True)
    (run / "status.json").write_text(sim.status.model_dump_json(exclude_none=True))
    manifest = _manifest(tmp_path)
    before = snapshot(tmp_path)
    proc = _run(sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"# solar run tiny-wan: already succeeded ({run / 'status.json'}); solar run would do nothing "
                        "(no stage starts, nothing is written)")
    assert lines[1] == ("#   fm: Succeeded, attempt 1, checkpoint step 4 (/runs/tiny-wan/fm/checkpoints/"
                        "step_00000004), validation complete")
    assert [line.split(":")[0] for line in lines[1:]] == ["#   fm", "#   anyflow", "#   dmd", "#   generate"]
    assert [d for d in yaml.safe_load_all(proc.stdout) if d] == []   # no launch
    assert snapshot(tmp_path) == before


def test_render_refuses_a_quoted_integer_or_boolean_as_the_api_server_would(tmp_path):
    for elastic, field, said in [
        ({"minNodes": "1"}, "spec.topology.elastic.minNodes", "'1' is a string; the SolarRun CRD declares an integer: "
                                                             "write 1 without quotes"),
        ({"minNodes": 1, "growBack": "yes"}, "spec.topology.elastic.growBack",
         "'yes' is a string; the SolarRun CRD declares a boolean (true or false): write true without quotes")]:
        manifest = _manifest(tmp_path, topology={**ELASTIC, "elastic": elastic})
        proc = _operator(str(manifest))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stderr
        assert f"InvalidSpec: {field}: {said}" in proc.stderr
        dry = _run(sys.executable, "-m", "solar", "run", "--dry-run", str(manifest), "--workdir", str(tmp_path / "r"))
        assert dry.returncode == 2 and f"{field}: {said} (InvalidSpec)" in dry.stderr and dry.stderr.count("\n") == 1
