"""``solar-operator render MANIFEST``: what the operator would create for a SolarRun, touching nothing.

The manifest is validated the way the operator validates a new run (the spec model, every stage's
config resolved from ``SOLAR_REPO`` with an empty environment, the fields the job kind cannot
carry), then the plan is printed as YAML comments and every stage's job as one YAML document, as
the operator would create it for a first attempt. With ``--storage-root`` a stage whose directory
already holds a verified checkpoint is shown resuming from it, and when that resume is at another
topology than the checkpoint's (the manifest's ``status``, as ``kubectl get -o yaml`` prints it,
gives the shape of earlier attempts for checkpoints without ``data/position.json``), with the old
and new shape and the stream position; a change of the global batch is refused (TopologyMismatch)
as the operator refuses it. Discovery (is the backend served,
does the runtime exist) needs a cluster and is not checked here. An invalid manifest exits 2 with
``<reason>: <message>``, the reason the run's ``Validated`` condition would carry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solar.run.plan import RunInvalid, RunPlan, job_name, plan_run
from solar.run.spec import SolarRun, first_error

UID = "<assigned by the API server>"


def render(doc: dict, *, default_backend: str, repo: Path, storage_root: Path | None = None,
           reshapes: dict | None = None) -> tuple[RunPlan, str, list[dict]]:
    """(plan, backend, one job per stage) of a SolarRun manifest, or RunInvalid. ``reshapes``, when
    given, receives stage -> Reshape for every stage that resumes at a new shape."""
    from pydantic import ValidationError

    from solar.run import resume
    from solar.run.observe import StageFiles, observe_stage
    from solar_operator import backends, jobs, trainjobs

    try:
        run = SolarRun.model_validate(doc)
    except ValidationError as exc:
        raise RunInvalid("InvalidSpec", first_error(exc)) from None
    spec = run.spec
    plan = plan_run(spec, spec.run_root, repo=repo, environ={})
    backend = backends.chosen(spec, default_backend)
    problems = backends.spec_problems(spec, backend)
    if problems:
        raise RunInvalid("InvalidSpec", problems[0])
    meta = {"name": run.metadata.name, "namespace": run.metadata.namespace or "default", "uid": UID}
    api = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta}
    build = trainjobs.manifest if backend == "TrainJob" else jobs.manifest
    out = []
    for p in plan.stages:
        files = StageFiles(exists=False)
        if storage_root is not None:
            files = observe_stage(storage_root / spec.storage.path / p.name, final_step=p.final_step,
                                  validation_step=p.validation_step, generation=p.generation)
        start = resume.planned_start(p, files, run.status)
        reshaped = resume.planned_reshape(p, files, run.status) if storage_root is not None else None
        if reshaped is not None and reshapes is not None:
            reshapes[p.name] = reshaped
        out.append(build(api, spec, p, job_name(meta["name"], p.name, 1), attempt=1, resume_from=start.resume_from))
    return plan, backend, out


def text(doc: dict, plan: RunPlan, backend: str, built: list[dict], reshapes: dict | None = None) -> str:
    import yaml

    meta = doc["metadata"]
    lines = [f"# SolarRun {meta.get('namespace') or 'default'}/{meta['name']}: {len(plan.stages)} stages as "
             f"{backend}s; world size {plan.world_size}, logical data parallel {plan.logical_dp}, "
             f"global batch {plan.global_batch}"]
    for p, job in zip(plan.stages, built):
        what = f"final checkpoint step {p.final_step}" if p.final_step is not None else "generation"
        sources = ", ".join(f"{role} <- {stage} ({weights})" for role, (stage, weights) in p.sources.items())
        lines.append(f"#   {p.name}: {p.action} {p.route} on {p.nodes}x{p.nproc}, {what}, job "
                     f"{job['metadata']['name']}" + (f"; init {sources}" if sources else ""))
        if p.name in (reshapes or {}):
            lines.append(f"#     {reshapes[p.name].summary()}")
        if p.elastic_line:
            lines.append(f"#     {p.elastic_line}")
    docs = "".join("---\n" + yaml.safe_dump(job, sort_keys=False, width=120) for job in built)
    return "\n".join(lines) + "\n" + docs


def main(argv: list[str], *, repo: Path) -> int:
    """``solar-operator render``; ``repo``: where stage configs are resolved from (the operator's own)."""
    from solar.config.loader import read_document
    from solar.errors import SolarError
    from solar_operator.backends import backend_name

    parser = argparse.ArgumentParser(prog="solar-operator render", description="print the plan and the jobs the "
                                     "operator would create for a SolarRun manifest; nothing is created")
    parser.add_argument("manifest", metavar="MANIFEST")
    parser.add_argument("--backend", default=None, metavar="pytorchjob|trainjob",
                        help="the operator's --default-backend (default: SOLAR_OPERATOR_DEFAULT_BACKEND or pytorchjob)")
    parser.add_argument("--storage-root", default=None, metavar="DIR",
                        help="where the run volume is mounted: stages with a verified checkpoint resume from it")
    args = parser.parse_args(argv)
    import os

    try:
        default = backend_name(args.backend or os.environ.get("SOLAR_OPERATOR_DEFAULT_BACKEND", "pytorchjob"))
    except ValueError as exc:
        parser.error(f"--backend: {exc}")
    root = Path(args.storage_root) if args.storage_root else None
    if root is not None and not root.is_dir():
        print(f"solar-operator render: error: --storage-root {root} is not a directory", file=sys.stderr)
        return 2
    try:
        _, doc = read_document(args.manifest, what="MANIFEST")
        if not isinstance(doc, dict):
            raise RunInvalid("InvalidSpec", "the manifest is not one SolarRun document")
        reshapes: dict = {}
        plan, backend, built = render(doc, default_backend=default, repo=repo, storage_root=root, reshapes=reshapes)
    except RunInvalid as exc:
        print(f"solar-operator render: error: {args.manifest}: {exc.reason}: {' '.join(exc.message.split())}",
              file=sys.stderr)
        return 2
    except SolarError as exc:
        print(f"solar-operator render: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text(doc, plan, backend, built, reshapes))
    return 0
