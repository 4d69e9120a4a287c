"""``solar run`` applies ``spec.env`` to its stage processes and ignores what only a cluster uses."""

from __future__ import annotations

import sys

import yaml

from solar.local.executor import LocalJob, local_env
from solar.run.spec import SolarRun
from tests.conftest import REPO


def test_spec_env_reaches_the_stage_process_and_cluster_settings_are_ignored(tmp_path, monkeypatch):
    doc = yaml.safe_load((REPO / "examples/solarrun-tiny.yaml").read_text())
    doc["spec"].update(env=[{"name": "NCCL_DEBUG", "value": "WARN"},
                            {"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}},
                            {"name": "S3_MISSING", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "x"}}}],
                       imagePullSecrets=[{"name": "registry"}], serviceAccountName="trainer", backend="TrainJob",
                       podSecurityContext={"fsGroup": 10001}, sharedMemory="0", queueName="gpu")
    spec = SolarRun.model_validate(doc).spec
    monkeypatch.setenv("S3_KEY", "from-here")
    monkeypatch.delenv("S3_MISSING", raising=False)
    said = []
    env = local_env(spec, said.append)
    assert env == {"NCCL_DEBUG": "WARN"}
    assert len(said) == 2 and "S3_KEY" in said[0] and "taken from this environment" in said[0]
    assert "not set" in said[1]
    code = "import os; print(os.environ['NCCL_DEBUG'], os.environ['S3_KEY'], os.environ.get('S3_MISSING'))"
    job = LocalJob("j", "fm", [sys.executable, "-c", code], tmp_path / "log", lambda m: None, env)
    job.proc.wait(timeout=30)
    job.stop()
    assert job.state().phase == "Succeeded"
    assert (tmp_path / "log").read_text().strip() == "WARN from-here None"
