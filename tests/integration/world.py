"""A small world for operator tests: an emulated API server, the run volume, one namespace, an
operator that can be stopped and started, and the two things nobody plays here — the Kubeflow
training operator (``set_job`` patches a PyTorchJob's status) and the trainer (``write_stage``
writes a stage directory the way ``solar train``/``solar infer`` do, with real checkpoint
transactions)."""

from __future__ import annotations

import copy
import datetime as dt
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
from tests.support.crd_schema import anchor, crd_validator_schema
from tests.support.kube import Cluster, run_kopf_operator, wait_for

CRD = REPO / "crds" / "solarwm.io_solarruns.yaml"
CASES = REPO / "tests" / "data" / "solarrun"


TRAINJOB_CRDS = ("trainer.kubeflow.org_trainjobs.yaml", "trainer.kubeflow.org_clustertrainingruntimes.yaml")


def crds(*backends: str) -> list[Path]:
    """The SolarRun CRD and the upstream CRDs of the given backends (tests skip when they are absent)."""
    paths = [CRD]
    if "PyTorchJob" in backends:
        paths.append(anchor("kubeflow.org_pytorchjobs.yaml"))
    if "TrainJob" in backends:
        paths += [anchor(name) for name in TRAINJOB_CRDS]
    return paths


class World:
    def __init__(self, cluster: Cluster, storage: Path, backend: str = "PyTorchJob") -> None:
        self.cluster, self.storage, self.backend = cluster, storage, backend
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
        if self.backend == "TrainJob":
            return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{self.namespace}/trainjobs"
        return f"/apis/kubeflow.org/v1/namespaces/{self.namespace}/pytorchjobs"

    # -- Kubeflow Trainer v2: the runtime, the CRD's schema as a validating webhook ---------------------
    def install_runtime(self, name: str = "torch-distributed") -> dict:
        """The ``torch-distributed`` ClusterTrainingRuntime of Trainer v2.3.0 (under ``name``)."""
        doc = yaml.safe_load(anchor("torch_distributed.yaml").read_text())
        doc["metadata"]["name"] = name
        return self.cluster.create("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", doc)

    def validate_jobs_strictly(self) -> list[dict]:
        """Every job created from now on must validate against its upstream CRD (no unknown field); one
        that does not is refused with 422, as a stricter API server would. Returns the jobs admitted."""
        import jsonschema

        from tests.support.kube import ApiError

        schemas = {}
        if self.backend == "TrainJob":
            schemas["trainjobs"] = crd_validator_schema(anchor(TRAINJOB_CRDS[0]), "v1alpha1")
        else:
            schemas["pytorchjobs"] = crd_validator_schema(anchor("kubeflow.org_pytorchjobs.yaml"), "v1")
        validators = {plural: jsonschema.Draft7Validator(schema) for plural, schema in schemas.items()}
        admitted = []

        def webhook(res, namespace, body):
            validator = validators.get(res.plural)
            if validator is None:
                return
            error = jsonschema.exceptions.best_match(validator.iter_errors(body))
            if error is not None:
                raise ApiError(422, "Invalid", f"{res.plural} {body['metadata'].get('name')}: {error.message} "
                                               f"at {'/'.join(map(str, error.absolute_path))}")
            admitted.append(copy.deepcopy(body))
        self.cluster.emulator.webhooks.append(webhook)
        return admitted

    # -- Kueue (a LocalQueue that holds each job suspended for a while, then admits it) ----------------
    @contextmanager
    def queue(self, name: str, hold: float):
        """Kueue's part, played here: its webhook creates every job labelled with this queue suspended,
        and the queue admits it (``suspend: false``) ``hold`` seconds later. ``admissions`` lists
        (job, seconds held); ``patches`` counts the queue's own changes of ``suspend``."""
        import threading
        import time

        held: dict[str, float] = {}
        admissions: list[tuple[str, float]] = []
        stop = threading.Event()

        def suspend_path(plural):
            return ("spec", "suspend") if plural == "trainjobs" else ("spec", "runPolicy", "suspend")

        def webhook(res, namespace, body):
            if res.plural in ("trainjobs", "pytorchjobs") and \
                    (body["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name") == name:
                *parents, leaf = suspend_path(res.plural)
                node = body
                for key in parents:
                    node = node.setdefault(key, {})
                node[leaf] = True
                held[body["metadata"]["name"]] = time.monotonic()

        def admit():
            while not stop.wait(0.1):
                for job, since in list(held.items()):
                    if time.monotonic() - since >= hold:
                        del held[job]
                        patch = {"spec": {"suspend": False}} if self.backend == "TrainJob" else \
                            {"spec": {"runPolicy": {"suspend": False}}}
                        self.cluster.patch(f"{self.jobs_path}/{job}", patch)
                        admissions.append((job, time.monotonic() - since))

        self.cluster.emulator.webhooks.append(webhook)
        thread = threading.Thread(target=admit, daemon=True)
        thread.start()
        try:
            yield admissions
        finally:
            stop.set()
            thread.join(5)
            self.cluster.emulator.webhooks.remove(webhook)

    # -- the operator -----------------------------------------------------------------------------
    @contextmanager
    def operator(self, poll_seconds: float = 0.3, default_backend: str = "PyTorchJob",
                 backends: tuple[str, ...] = ("PyTorchJob", "TrainJob"), read_nodes: bool = False,
                 node_lost_seconds: float = 60.0):
        from solar_operator import handlers
        from solar_operator.main import reconciler

        self.reconciler = reconciler(self.storage, url=self.cluster.url, default_backend=default_backend,
                                     backends=backends, read_nodes=read_nodes, node_lost_seconds=node_lost_seconds)
        with run_kopf_operator(lambda registry: handlers.register(registry, poll_seconds=poll_seconds,
                                                                  backends=backends),
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
        if self.backend == "TrainJob":
            return self.set_trainjob(name, phase, message)
        conditions = [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}]
        if phase in ("Running", "Succeeded", "Failed"):
            conditions.append({"type": "Running", "status": "True" if phase == "Running" else "False",
                               "reason": "PyTorchJobRunning"})
        if phase in ("Succeeded", "Failed"):
            conditions.append({"type": phase, "status": "True", "reason": f"PyTorchJob{phase}", "message": message})
        self.cluster.patch(f"{self.jobs_path}/{name}/status", {"status": {"conditions": conditions}})

    def set_trainjob(self, name: str, phase: str, message: str = "") -> None:
        """What the Trainer controller reports: Running as an active child job, then Complete or Failed."""
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        active = 1 if phase == "Running" else 0
        status = {"jobsStatus": [{"name": "node", "active": active, "ready": active, "succeeded": int(
            phase == "Succeeded"), "failed": int(phase == "Failed"), "suspended": 0}]}
        if phase in ("Succeeded", "Failed"):
            kind, reason = ("Complete", "JobsCompleted") if phase == "Succeeded" else ("Failed", "JobsFailed")
            status["conditions"] = [{"type": kind, "status": "True", "reason": reason, "message": message,
                                     "lastTransitionTime": now}]
        self.cluster.patch(f"{self.jobs_path}/{name}/status", {"status": status})

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


def write_checkpoint(run_dir: Path, step: int, *, saved_with: dict | None = None) -> Path:
    """A real checkpoint transaction with one safetensors member, as the trainer commits it; with
    ``saved_with`` ({world_size, nproc_per_node, and optionally sequence_parallel_size,
    micro_batch_size, gradient_accumulation}) also its ``data/position.json``."""
    partial = ckpt.begin(run_dir, step)
    (partial / "model").mkdir()
    (partial / "model" / "live.safetensors").write_bytes(encode({"w": torch.full((4,), float(step))}))
    if saved_with is not None:
        shape = {"sequence_parallel_size": 1, "micro_batch_size": 1, "gradient_accumulation": 1, **saved_with}
        batch = (shape["world_size"] // shape["sequence_parallel_size"] * shape["micro_batch_size"]
                 * shape["gradient_accumulation"])
        (partial / "data").mkdir()
        (partial / "data" / "position.json").write_text(json.dumps({
            "schema": "solar.data-position.v1", "step": step, "global_batch_size": batch, "saved_with": shape,
            "epochs": [0, 0]}))
    return ckpt.commit(partial, step=step, contract={"family": "wan22_ti2v_5b"},
                       roles={"model": {"weights": ["live"], "members": ["model/live.safetensors"]}},
                       trainer_state={"step": step})


def load_case(name: str) -> dict:
    return yaml.safe_load((CASES / "input" / f"{name}.yaml").read_text())
