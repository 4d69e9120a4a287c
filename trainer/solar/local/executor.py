"""``solar run MANIFEST``: a SolarRun on this machine, without a cluster (contract.md §5).

The same validation, planner and state machine as the operator; each stage is a local
``torchrun --standalone`` process group (``python -m solar.launch.torchrun``: one that exits as its ranks did) instead of a PyTorchJob. The run lives in
``<workdir>/<metadata.name>/``: one directory per stage, ``logs/<stage>-<attempt>.log`` and
``status.json`` (the resource's ``status``), replaced atomically after every transition. Each launch
carries its attempt number as its fencing token (``SOLAR_ATTEMPT``, ``solar.storage.fence``) and, as an
operator's pod does, the run and stage it belongs to (``SOLAR_RUN_UID``: ``local_uid``, the run's
directory; ``SOLAR_RUN_STAGE``), so a stage that committed no checkpoint starts over with the manifest
as it is now (the trainer takes any change of a SolarRun stage's config then). Running
the same command again continues an unfinished run (a training stage resumes from its newest
verified checkpoint) with the manifest as it is now: an edit that a full resume allows (a longer
``train.max_steps``, execution keys, recipe keys listed in ``checkpoint.accept_changes``) applies,
any other is refused before anything runs, naming each key; a Failed run continues the same way
(re-validated, its failures counted anew); a Succeeded run is left as it is. Ctrl-C stops only the
process groups this command started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from solar.config.canonical import pretty_bytes
from solar.diagnose import failure_summary
from solar.errors import SolarError
from solar.processes import parent_death_signal
from solar.run.failure import INPUT_ERROR_EXIT
from solar.run.machine import JobState, Observation, recipe_problem, reconcile
from solar.run.observe import LazyStageFiles, observe_stage
from solar.run.plan import RunInvalid, RunPlan, StagePlan, plan_run
from solar.run.spec import SolarRun, SolarRunStatus, first_error
from solar.storage.atomic import write_replace
from solar.storage.fence import ENV as ATTEMPT_ENV
from solar.storage.run_dir import launch_records

POLL_SECONDS = 1.0


def load_manifest(path: str) -> SolarRun:
    from pydantic import ValidationError

    from solar.config.loader import read_document

    _, tree = read_document(path, what="MANIFEST")
    try:
        return SolarRun.model_validate(tree)
    except ValidationError as exc:
        raise SolarError(f"{path}: {first_error(exc)} (InvalidSpec)") from None


class LocalJob:
    """One stage attempt as a process group, its output copied to a log and to stderr."""

    def __init__(self, name: str, stage: str, argv: list[str], log: Path, echo, env: dict | None = None,
                 stage_dir: str | None = None) -> None:
        self.name, self.stage, self.created = name, stage, time.time()
        self.stage_dir = Path(stage_dir) if stage_dir else None
        self.launches = self._launch_records()
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                                     preexec_fn=parent_death_signal)   # never outlives this command
        self.tail: list[str] = []
        self.own_error: str | None = None
        self.pump = threading.Thread(target=self._pump, args=(echo,), daemon=True)
        self.pump.start()

    def _pump(self, echo) -> None:
        for raw in self.proc.stdout:
            self.log.write(raw)
            self.log.flush()
            line = raw.decode(errors="replace").rstrip()
            self.tail = (self.tail + [line])[-20:]
            if line.strip().startswith("solar: error:"):   # the trainer's own line, before torchrun's summary
                self.own_error = line.strip()[len("solar: error:"):].strip()
            if line.startswith("solar:"):
                echo(f"  [{self.stage}] {line[len('solar:'):].strip()}")

    def state(self) -> JobState:
        code = self.proc.poll()
        if code is None:
            return JobState(self.name, "Running", created=self.created)
        self.pump.join(timeout=5)
        if code == 0:
            return JobState(self.name, "Succeeded", created=self.created)
        refused = self.rank_exit_code(code) == INPUT_ERROR_EXIT and self._launch_records() == self.launches
        cause = self.cause()
        # a refusal is said as the trainer said it (InputRefused names its exit code, 2); torchrun's own exit
        # code (1 for any failed rank) would name a second one
        message = (cause or "no message") if refused else f"exit code {code}" + (f": {cause}" if cause else "")
        return JobState(self.name, "Failed", message, created=self.created, refused=refused)

    def rank_exit_code(self, code: int) -> int:
        """The ranks' own exit code: torchrun exits 1 for any failed rank and names the rank's code in its
        summary (``exitcode  : 2 (pid: ...)``)."""
        import re

        found = [int(m.group(1)) for line in self.tail if (m := re.search(r"exitcode\s*:\s*(-?\d+)", line))]
        return found[0] if found else code

    def _launch_records(self) -> int:
        """How many launches the stage directory records (a refused launch adds none)."""
        if self.stage_dir is None:
            return 0
        return len(launch_records(self.stage_dir))

    def cause(self) -> str | None:
        """The trainer's own error line (``solar: error: ...``, a rank's refusal or failure), else the
        last other line that speaks of an error (torchrun's summary)."""
        if self.own_error:
            return self.own_error
        errors = [line for line in self.tail if "error" in line.lower() and "traceback" not in line.lower()]
        return errors[-1].strip() if errors else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# --set keys whose relative values are files or directories the manifest names: ``solar run`` resolves
# them against the manifest's own directory (data.train_index and the other data files are relative
# to data.root by the data contract and stay so).
PATH_KEYS = ("data.root", "model.pretrained_path", "model.vae_path", "checkpoint.path")


def package_repo() -> Path:
    """The repository the running ``solar`` package belongs to (its ``configs/`` are the stage configs'
    home, as the image's repository is on a cluster); the working directory when it has none."""
    import solar

    repo = Path(solar.__file__).resolve().parents[2]
    return repo if (repo / "configs").is_dir() else Path.cwd()


def _resolve_paths(path: str, spec, repo: Path):
    """The manifest's relative paths made absolute, as ``solar run`` uses them from any working
    directory: a stage's ``config`` beside the manifest when it is there, else in the repository
    (``package_repo``); a relative path value of ``PATH_KEYS`` (and ``checkpoint.roles.<role>.path``)
    in a stage's ``set:`` against the manifest's directory."""
    here = Path(path).resolve().parent
    stages = []
    for index, stage in enumerate(spec.stages):
        config = Path(stage.config)
        if not config.is_absolute():
            beside, shipped = here / config, repo / config
            if not beside.is_file() and not shipped.is_file():
                raise SolarError(f"{path}: spec.stages[{index}].config: {stage.config} is neither beside the manifest "
                                 f"({here}) nor in the repository {repo}")
            config = beside if beside.is_file() else shipped
        sets = []
        for item in stage.set:
            key, sep, value = item.partition("=")
            is_path = key in PATH_KEYS or (key.startswith("checkpoint.roles.") and key.endswith(".path"))
            if sep and is_path and value and value != "null" and "${" not in value and not Path(value).is_absolute():
                item = f"{key}={os.path.normpath(here / value)}"
            sets.append(item)
        stages.append(stage.model_copy(update={"config": str(config), "set": sets}))
    return spec.model_copy(update={"stages": stages})


def _global_batch(t) -> int:
    return t.globalBatchSize or t.world_size // t.sequenceParallelSize * t.microBatchSize * t.gradientAccumulation


def multi_node(spec) -> list[str]:
    """``<field>.nodes=N`` of every topology with more than one node: what ``solar run`` cannot run on one
    machine (its dry run still plans and prints them)."""
    return [f"{where}.nodes={t.nodes}" for where, t in
            [("spec.topology", spec.topology)] + [(f"spec.stages[{i}].topology", s.topology)
                                                  for i, s in enumerate(spec.stages) if s.topology]
            if t.nodes != 1]


def _prepare(path: str, workdir: str, nproc: int | None, echo=lambda m: None, *, dry: bool = False):
    """(spec, name, run root, plan): the manifest validated and planned as ``solar run`` runs it, its
    relative paths resolved (``_resolve_paths``). A manifest with more than one node is refused unless
    ``dry`` (a dry run plans it and says it cannot run here)."""
    manifest = load_manifest(path)
    spec, name = manifest.spec, manifest.metadata.name
    repo = package_repo()
    spec = _resolve_paths(path, spec, repo)
    wide = multi_node(spec)
    if wide and not dry:
        raise SolarError(f"{path}: {wide[0]}; solar run executes single-node runs only: apply the manifest to a "
                         "cluster running the operator (`solar run --dry-run` prints each stage's plan and elastic "
                         "shapes, `solar-operator render` its jobs)")
    if nproc is not None:
        if nproc < 1:
            raise SolarError(f"--nproc must be >= 1, got {nproc}")
        override = lambda t: t.model_copy(update={"gpusPerNode": nproc})  # noqa: E731
        before, after = _global_batch(spec.topology), _global_batch(override(spec.topology))
        fresh = not (Path(workdir).resolve() / name).exists()  # a continued run is refused instead
        if before != after and fresh:
            echo(f"solar run: --nproc {nproc} trains at world {override(spec.topology).world_size} (spec.topology "
                 f"says {spec.topology.world_size}): global batch {after} instead of the manifest's {before}, "
                 "another training recipe")
        spec = spec.model_copy(update={
            "topology": override(spec.topology),
            "stages": [s.model_copy(update={"topology": override(s.topology)}) if s.topology else s
                       for s in spec.stages]})
    root = Path(workdir).resolve() / name
    try:
        plan = plan_run(spec, str(root), repo=repo)
    except RunInvalid as exc:
        raise SolarError(f"{path}: {exc.message} ({exc.reason})") from None
    return spec, name, root, plan


def dry_run(path: str, *, workdir: str = "solar-runs", nproc: int | None = None, out=None,
            echo=lambda m: print(m, file=sys.stderr, flush=True)) -> int:
    """``solar run --dry-run``: validate and plan exactly as ``solar run`` does, then print the plan
    (YAML comments) and, per stage, the launch it would start (one YAML document each: the command,
    the environment it adds, the stage directory); nothing is written and nothing is started. A stage
    whose directory already holds a verified checkpoint is shown resuming from it. A manifest with more
    than one node is planned and printed as the operator would run it (each stage's nodes, processes
    per node and elastic shapes, the trainer's arguments on every pod), saying that ``solar run``
    cannot run it here; a run whose status says it succeeded is said to have succeeded, with nothing
    to do."""
    import yaml

    from solar.run import resume

    out = out or sys.stdout
    spec, name, root, plan = _prepare(path, workdir, nproc, echo, dry=True)
    previous = _previous(root / "status.json")
    if previous is not None and previous.phase == "Succeeded":
        out.write(_succeeded_text(name, root, previous))
        return 0
    wide = multi_node(spec)
    env = local_env(spec, echo)
    lines = [f"# solar run {name}: {len(plan.stages)} stages in {root}; world size {plan.world_size}, "
             f"global batch {plan.global_batch}"]
    if wide:
        lines.append(f"# not runnable here: {', '.join(wide)}; solar run executes single-node runs only, so this "
                     "plan is what the operator would run (apply the manifest to a cluster running it; "
                     "`solar-operator render` prints its jobs)")
    docs = []
    for p in plan.stages:
        files = observe_stage(p.stage_dir, final_step=p.final_step, validation_step=p.validation_step,
                              generation=p.generation)
        try:
            start = resume.planned_start(p, files, previous)
            reshaped = resume.planned_reshape(p, files, previous)
        except RunInvalid as exc:
            raise SolarError(f"{path}: {exc.message} ({exc.reason})") from None
        what = f"final checkpoint step {p.final_step}" if p.final_step is not None else "generation"
        shape = f"with {p.nproc} process(es)" if p.nodes == 1 else \
            f"on {p.nodes} nodes x {p.nproc} processes (world {p.world_size})"
        lines.append(f"#   {p.name}: {p.action} {p.route} {shape}, {what} ({start.how})")
        doc = {"stage": p.name, "action": p.action, "route": p.route, "stageDir": p.stage_dir}
        if p.nodes == 1:
            doc.update(command=_argv(p, start.resume_from), env=env, log=str(root / "logs" / f"{p.name}-1.log"))
        else:   # what every pod of the operator's job runs (torchrun with the job's rendezvous, then this)
            doc.update(nodes=p.nodes, nprocPerNode=p.nproc, worldSize=p.world_size,
                       arguments=p.arguments(start.resume_from), env=env,
                       runsHere=False)
        if reshaped is not None:
            lines.append(f"#     {reshaped.summary()}")
            doc["reshape"] = reshaped.as_dict()
        if p.elastic_line:
            lines.append(f"#     {p.elastic_line}")
            doc["elastic"] = [{"nodes": e.nodes, "gradientAccumulation": e.accumulation} for e in p.elastic]
        done = previous is not None and previous.stage(p.name) is not None and \
            previous.stage(p.name).phase == "Succeeded"
        problem = None if done or not start.resume_from else recipe_problem(p, files, _rewound(previous, p.name))
        if problem:
            raise SolarError(f"{path}: stage {p.name}: {problem} (RecipeChanged); edit the stage's set: in the "
                             "manifest")
        docs.append(doc)
    out.write("\n".join(lines) + "\n" + "".join("---\n" + yaml.safe_dump(d, sort_keys=False, width=120)
                                                for d in docs))
    return 0


def _succeeded_text(name: str, root: Path, status: SolarRunStatus) -> str:
    """What a dry run of a run that already succeeded prints: that running it does nothing, and each stage's
    outcome as its status records it."""
    lines = [f"# solar run {name}: already succeeded ({root / 'status.json'}); solar run would do nothing "
             "(no stage starts, nothing is written)"]
    for st in status.stages:
        bits = [f"#   {st.name}: {st.phase}, attempt {st.attempt}"]
        if st.checkpoint:
            bits.append(f"checkpoint step {st.checkpoint.step} ({st.checkpoint.path})")
        if st.validation:
            bits.append(f"validation {'complete' if st.validation.complete else 'partial'}")
        lines.append(", ".join(bits))
    return "\n".join(lines) + "\n"


def run_manifest(path: str, *, workdir: str = "solar-runs", nproc: int | None = None,
                 echo=lambda m: print(m, file=sys.stderr, flush=True)) -> int:
    spec, name, root, plan = _prepare(path, workdir, nproc, echo)
    status_path = root / "status.json"
    previous = _previous(status_path)
    if previous is not None and previous.phase == "Succeeded":
        echo(f"solar run: {name} already succeeded; see {status_path}")
        return 0
    # running a failed run again is a new generation of its spec: re-validated, it continues (machine.reopens)
    generation = (previous.observedGeneration or 1) + 1 if previous is not None and previous.phase == "Failed" \
        else (previous.observedGeneration or 1) if previous is not None else 1
    _refuse_reshape(path, plan, previous)
    env = local_env(spec, echo)
    root.mkdir(parents=True, exist_ok=True)
    echo(f"solar run: {name}: {len(plan.stages)} stages ({', '.join(s.name for s in plan.stages)}) in {root}")
    jobs: dict[str, LocalJob] = {}
    interrupted = []
    handler = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        status = _loop(spec, name, plan, previous, jobs, status_path, root, echo, interrupted, env, generation,
                       gpus=has_gpu() and any((p.resolved or {}).get("runtime", {}).get("device") != "cpu"
                                              for p in plan.stages if p.resolved is not None))
    finally:
        for job in jobs.values():
            job.stop()
        signal.signal(signal.SIGINT, handler)
    if interrupted:
        echo(f"solar run: interrupted; run the same command again to continue ({status_path})")
        return 130
    _summary(status, root, echo, plan)
    return 0 if status.phase == "Succeeded" else 1


def _previous(status_path: Path) -> SolarRunStatus | None:
    """The run's status.json from an earlier ``solar run`` of it, when there is one."""
    if not status_path.is_file():
        return None
    from pydantic import ValidationError

    try:
        return SolarRunStatus.model_validate(json.loads(status_path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise SolarError(f"{status_path} is not a SolarRun status ({exc}); move it away to start the run over") \
            from None


def _refuse_reshape(path: str, plan: RunPlan, previous: SolarRunStatus | None) -> None:
    """A continued run whose current stage would resume its checkpoint at another global batch
    (another --nproc or manifest topology), or with another recipe than its checkpoints were trained
    with, is refused before anything runs or is written."""
    from solar.run import resume

    current = next((p for p in plan.stages if previous is None or previous.stage(p.name) is None
                    or previous.stage(p.name).phase != "Succeeded"), None)
    if current is None:
        return
    files = observe_stage(current.stage_dir, final_step=current.final_step, validation_step=current.validation_step,
                          generation=current.generation)
    try:
        resume.planned_reshape(current, files, previous)
    except RunInvalid as exc:
        raise SolarError(f"{path}: {exc.message} ({exc.reason}); --nproc sets gpusPerNode") from None
    problem = recipe_problem(current, files, _rewound(previous, current.name))
    if problem:
        raise SolarError(f"{path}: stage {current.name}: {problem} (RecipeChanged); edit the stage's set: in the "
                         "manifest")


def _rewound(previous: SolarRunStatus | None, stage: str) -> int | None:
    """The step the run's status records the stage's set rewind settled at (StageStatus.rewoundTo)."""
    st = previous.stage(stage) if previous is not None else None
    return st.rewoundTo if st is not None else None


def local_uid(root: Path) -> str:
    """The run's identity in its stages' ``SOLAR_RUN_UID`` (``run_dir.owner``: run-result.json's owner, the
    fence's): the run's directory, which is what a local run is."""
    return f"solar-run:{root}"


def local_env(spec, echo) -> dict[str, str]:
    """``spec.env`` for local stages: plain values are set; a ``valueFrom`` (a Secret or ConfigMap
    only a cluster has) is left to this process's own environment. Every other pod setting
    (pull secrets, service account, security context, /dev/shm, queue, backend) is a cluster's
    and is ignored here, never refused."""
    out = {}
    for item in spec.env:
        if item.valueFrom is None:
            out[item.name] = item.value or ""
        else:
            how = "taken from this environment" if item.name in os.environ else "not set (no such variable here)"
            echo(f"solar run: spec.env {item.name} comes from a cluster object ({', '.join(item.valueFrom)}); "
                 f"{how}")
    return out


def has_gpu(environ=os.environ) -> bool:
    """Whether this machine's stages would run on a GPU: ``nvidia-smi`` lists one (no torch import) and
    ``CUDA_VISIBLE_DEVICES`` does not hide them all."""
    from solar.environment import local_gpu_memory_bytes

    if environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return local_gpu_memory_bytes() is not None


def _loop(spec, name: str, plan: RunPlan, status, jobs, status_path: Path, root: Path, echo, interrupted,
          env: dict | None = None, generation: int = 1, gpus: bool = True):
    while not interrupted:
        files = LazyStageFiles([p.name for p in plan.stages], lambda stage: observe_stage(
            plan.stage(stage).stage_dir, final_step=plan.stage(stage).final_step,
            validation_step=plan.stage(stage).validation_step, generation=plan.stage(stage).generation))
        obs = Observation(name, generation, time.time(), plan=plan,
                          jobs={s: j.state() for s, j in jobs.items()}, files=files,
                          diagnose=lambda stage: failure_summary(plan.stage(stage).stage_dir), gpus=gpus)
        decision = reconcile(spec, status, obs)
        for action in decision.actions:
            if action.kind in ("delete_job", "suspend_job"):
                jobs.pop(action.stage).stop()
            elif action.kind == "create_job":
                p = plan.stage(action.stage)
                # the attempt is the launch's fencing token (solar.storage.fence), and the run and stage its
                # owner, as in the operator's pods
                jobs[action.stage] = LocalJob(action.job, action.stage, _argv(p, action.resume_from),
                                              root / "logs" / f"{action.stage}-{action.attempt}.log", echo,
                                              {**(env or {}), ATTEMPT_ENV: str(action.attempt),
                                               "SOLAR_RUN_UID": local_uid(root), "SOLAR_RUN_STAGE": action.stage,
                                               "SOLAR_RUN_NAME": name},   # docs/tracking.md
                                              p.stage_dir)
        for kind, reason, message in decision.events:
            echo(f"solar run: {reason}: {message}")
        changed = status is None or decision.status != status
        status = decision.status
        if changed:
            write_replace(status_path, pretty_bytes(status.model_dump(mode="json", exclude_none=True)))
        if status.phase in ("Succeeded", "Failed"):
            return status
        held = next((st for st in status.stages if st.reason in ("TopologyMismatch", "RecipeChanged")), None)
        if held is not None and not jobs:   # nothing changes the manifest of a local run while it waits
            hint = "; --nproc sets gpusPerNode" if held.reason == "TopologyMismatch" else \
                "; edit the stage's set: in the manifest (checkpoint.accept_changes lists recipe keys to change)"
            raise SolarError(f"{held.message} ({held.reason}){hint}")
        time.sleep(POLL_SECONDS)
    return status


def _argv(p: StagePlan, resume_from: str | None) -> list[str]:
    return [sys.executable, "-m", "solar.launch.torchrun", "--standalone", f"--nproc-per-node={p.nproc}",
            *p.arguments(resume_from)]


def _summary(status: SolarRunStatus, root: Path, echo, plan: RunPlan | None = None) -> None:
    echo(f"\nsolar run: {status.phase}")
    for st in status.stages:
        bits = [f"{st.name:<12} {st.phase:<10} attempt {st.attempt}"]
        if st.checkpoint:
            bits.append(f"checkpoint step {st.checkpoint.step}")
        if st.validation:
            infer = plan is not None and plan.stage(st.name).action == "infer"
            bits.append(f"{'generation' if infer else 'validation'} "
                        f"{'complete' if st.validation.complete else 'partial'}")
        if st.usage:
            bits.append(f"{st.usage.gpuSeconds / 3600:.4f} GPU-hours in {len(st.usage.attempts)} launch(es)")
        if st.message:
            bits.append(st.message)
        echo("  " + " | ".join(bits))
    if status.gpuHours is not None:
        echo(f"  GPU-hours: {status.gpuHours:.4f} (world size x wall time of every launch; CPU processes count "
             "as GPUs on a machine without one)")
    echo(f"  status: {root / 'status.json'}")
