"""A small world for operator tests: an emulated API server, the run volume, one namespace, an
operator that can be stopped and started, and the two things nobody plays here — the Kubeflow
training operator (``set_job`` patches a PyTorchJob's status) and the trainer (``write_stage``
writes a stage directory the way ``solar train``/``solar infer`` do, with real checkpoint
transactions)."""

from __future__ import annotations

import copy
import json
import secrets
from contextlib import contextmanager
from pathlib import Path

import kopf
import torch
import yaml

from solar.run.plan import RunPlan, plan_run
from solar.run.spec import SolarRun
from solar.safetensors_io import encode
from solar.storage import checkpoints as ckpt
from solar.storage.run_dir import usage, write_result
from tests.conftest import REPO
from tests.support.kube import Cluster, run_kopf_operator, wait_for

CRD = REPO / "crds" / "solarwm.io_solarruns.yaml"
CASES = REPO / "tests" / "data" / "solarrun"


class World:
    def __init__(self, cluster: Cluster, storage: Path) -> None:
        self.cluster, self.storage = cluster, storage
        self.namespace = f"t-{secrets.token_hex(3)}"
        cluster.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": self.namespace}})
        self.reconciler = None

    # -- paths ------------------------------------------------------------------------------------
    @property
    def runs_path(self) -> str:
        return f"/apis/solarwm.io/v1alpha1/namespaces/{self.namespace}/solarruns"

    @property
    def jobs_path(self) -> str:
        return f"/apis/kubeflow.org/v1/namespaces/{self.namespace}/pytorchjobs"

    # -- the operator -----------------------------------------------------------------------------
    @contextmanager
    def operator(self, poll_seconds: float = 0.3):
        from solar_operator import handlers
        from solar_operator.main import reconciler

        self.reconciler = reconciler(self.storage, url=self.cluster.url)
        with run_kopf_operator(lambda registry: handlers.register(registry, poll_seconds=poll_seconds),
                               self.cluster, memo=kopf.Memo(runs=self.reconciler)) as running:
            yield running

    # -- SolarRuns --------------------------------------------------------------------------------
    def apply(self, doc: dict) -> dict:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = self.namespace
        return self.cluster.create(self.runs_path, doc)

    def run(self, name: str) -> dict:
        return self.cluster.get(f"{self.runs_path}/{name}")

    def status(self, name: str) -> dict:
        return self.run(name).get("status") or {}

    def patch_spec(self, name: str, spec: dict) -> dict:
        return self.cluster.patch(f"{self.runs_path}/{name}", {"spec": spec})

    def wait_status(self, name: str, predicate, what: str, timeout: float = 30) -> dict:
        return wait_for(lambda: (lambda s: s if predicate(s) else None)(self.status(name)), timeout=timeout,
                        message=f"{name}: {what}")

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict:
        return self.wait_status(name, lambda s: s.get("phase") == phase, f"phase {phase}", timeout)

    def plan(self, name: str) -> RunPlan:
        run = SolarRun.model_validate(self.run(name))
        return plan_run(run.spec, f"{run.spec.storage.mountPath}/{run.spec.storage.path}", repo=REPO, environ={})

    # -- PyTorchJobs (playing the training operator) ------------------------------------------------
    def jobs(self) -> dict[str, dict]:
        return {j["metadata"]["name"]: j for j in self.cluster.list(self.jobs_path)["items"]}

    def wait_job(self, name: str, timeout: float = 30) -> dict:
        return wait_for(lambda: self.jobs().get(name), timeout=timeout, message=f"job {name}")

    def set_job(self, name: str, phase: str, message: str = "") -> None:
        conditions = [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}]
        if phase in ("Running", "Succeeded", "Failed"):
            conditions.append({"type": "Running", "status": "True" if phase == "Running" else "False",
                               "reason": "PyTorchJobRunning"})
        if phase in ("Succeeded", "Failed"):
            conditions.append({"type": phase, "status": "True", "reason": f"PyTorchJob{phase}", "message": message})
        self.cluster.patch(f"{self.jobs_path}/{name}/status", {"status": {"conditions": conditions}})

    # -- stage directories (playing the trainer) -----------------------------------------------------
    def stage_dir(self, run: str, stage: str) -> Path:
        spec = self.run(run)["spec"]
        return self.storage / spec["storage"]["path"] / stage

    def write_stage(self, run: str, stage: str, *, result: str = "complete", checkpoint: bool = True,
                    validation: bool = True, steps: tuple[int, ...] | None = None,
                    error_type: str | None = None, events: dict[int, list[dict]] | None = None) -> Path:
        p = self.plan(run).stage(stage)
        root = self.stage_dir(run, stage)
        root.mkdir(parents=True, exist_ok=True)
        (root / "launch-manifest.json").write_text(json.dumps({"schema": "solar.launch.v1", "name": run}))
        (root / "heartbeat").mkdir(exist_ok=True)
        (root / "heartbeat" / "rank-00000.json").write_text(json.dumps({"phase": "step", "step": 1}))
        for step in steps if steps is not None else ((p.final_step,) if checkpoint and p.final_step else ()):
            if not (root / "checkpoints" / ckpt.step_name(step)).exists():
                write_checkpoint(root, step)
        if validation and p.validation_step is not None:
            marker = root / "validation" / f"step_{p.validation_step:08d}" / "COMPLETE.json"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"schema": "solar.validation-complete.v1", "status": "complete"}))
        if validation and p.generation:
            (root / "generation").mkdir(exist_ok=True)
            (root / "generation" / "COMPLETE.json").write_text(json.dumps({"status": "complete"}))
        for rank, records in (events or {}).items():  # what the trainer's ranks logged
            (root / "events").mkdir(exist_ok=True)
            with open(root / "events" / f"rank-{rank:05d}.jsonl", "a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in records)
        if result:  # the launch took an hour of every rank's time
            import time

            now = time.time()
            write_result(root, result, error_type=error_type, usage=usage(
                root, world=p.nodes * p.nproc, device="cuda", started=now - 3600, ended=now, status=result))
        return root

    def events(self) -> list[dict]:
        return self.cluster.list(f"/api/v1/namespaces/{self.namespace}/events")["items"]

    def event_reasons(self, run: str) -> list[str]:
        mine = [e for e in self.events() if e["involvedObject"]["name"] == run]
        return [e["reason"] for e in sorted(mine, key=lambda e: int(e["metadata"]["resourceVersion"]))]


def write_checkpoint(run_dir: Path, step: int) -> Path:
    """A real checkpoint transaction with one safetensors member, as the trainer commits it."""
    partial = ckpt.begin(run_dir, step)
    (partial / "model").mkdir()
    (partial / "model" / "live.safetensors").write_bytes(encode({"w": torch.full((4,), float(step))}))
    return ckpt.commit(partial, step=step, contract={"family": "wan22_ti2v_5b"},
                       roles={"model": {"weights": ["live"], "members": ["model/live.safetensors"]}},
                       trainer_state={"step": step})


def load_case(name: str) -> dict:
    return yaml.safe_load((CASES / "input" / f"{name}.yaml").read_text())
