"""The Dockerfiles under images/, checked without a Docker engine.

A small Dockerfile parser (line continuations, comments, JSON and shell forms, stages, ARG/ENV)
reads both files; the tests hold them to the repository: the build context and .dockerignore, the
Makefile's torch pin, pyproject's extras and console scripts, the PyTorchJob the operator generates,
and the operator's imports with every trainer-only package blocked.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.conftest import REPO

TRAINER = REPO / "images" / "trainer" / "Dockerfile"
OPERATOR = REPO / "images" / "operator" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXAMPLES = sorted(REPO.glob("examples/solarrun-*.yaml"))


# -- a Dockerfile parser ---------------------------------------------------------------------------

@dataclass
class Instruction:
    cmd: str                       # upper case: FROM, RUN, COPY, ...
    flags: dict[str, str]          # --from=build, --chown=... (COPY/ADD/FROM/RUN)
    args: str                      # the rest, continuations joined
    line: int

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON (exec) form, or None for the shell form."""
        if self.args.startswith("["):
            try:
                value = json.loads(self.args)
            except json.JSONDecodeError:
                return None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        return None


@dataclass
class Stage:
    image: str
    name: str | None
    index: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def last(self, cmd: str) -> Instruction | None:
        found = self.all(cmd)
        return found[-1] if found else None

    def args(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for inst in self.all("ARG"):
            name, eq, default = inst.args.partition("=")
            out[name.strip()] = default if eq else None
        return out

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for inst in self.all("ENV"):
            out.update(parse_env(inst.args))
        return out

    def workdir(self) -> str:
        current = "/"
        for inst in self.all("WORKDIR"):
            current = str(PurePosixPath(current) / inst.args)
        return current


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Instructions as (first line number, text): comment lines dropped (also inside a continuation),
    lines ending in a backslash joined with the next."""
    out, buf, start = [], [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and buf):
            continue
        if not stripped:
            continue
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        out.append((start, " ".join(p for p in buf if p)))
        buf = []
    assert not buf, "the file ends inside a line continuation"
    return out


def parse_env(args: str) -> dict[str, str]:
    words = shlex.split(args)
    if words and "=" not in words[0]:  # legacy: ENV KEY value with spaces
        return {words[0]: args.split(None, 1)[1] if len(words) > 1 else ""}
    return dict(word.split("=", 1) for word in words)


def parse(text: str) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for number, line in logical_lines(text):
        cmd, _, rest = line.partition(" ")
        cmd, rest = cmd.upper(), rest.strip()
        flags: dict[str, str] = {}
        while cmd in ("FROM", "COPY", "ADD", "RUN") and rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            key, _, value = flag[2:].partition("=")
            flags[key] = value
            rest = rest.strip()
        inst = Instruction(cmd, flags, rest, number)
        if cmd == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"line {number}: FROM image [AS name]"
            stages.append(Stage(words[0], name, len(stages)))
        elif not stages:
            assert cmd == "ARG", f"line {number}: only ARG may come before the first FROM, not {cmd}"
            name, eq, default = rest.partition("=")
            global_args[name.strip()] = default if eq else None
        else:
            stages[-1].instructions.append(inst)
    assert stages, "no FROM"
    return Dockerfile(global_args, stages)


def substitute(value: str, variables: dict[str, str | None]) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name) or ""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, value)


def copies(stage: Stage) -> list[tuple[list[str], str, Instruction]]:
    """(sources, destination, instruction) of each COPY/ADD: the destination resolved against WORKDIR."""
    out, workdir = [], "/"
    for inst in stage.instructions:
        if inst.cmd == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / inst.args)
        elif inst.cmd in ("COPY", "ADD"):
            words = inst.exec_form or inst.args.split()
            *sources, dest = words
            out.append((sources, str(PurePosixPath(workdir) / dest), inst))
    return out


def pip_installs(stage: Stage) -> list[str]:
    """Each `pip install ...` command of the stage's RUN instructions."""
    commands = []
    for inst in stage.all("RUN"):
        for part in re.split(r"&&|;|\|\|", inst.args):
            if re.search(r"(^|[\s/])pip3?\s+install\s", part.strip() + " "):
                commands.append(part.strip())
    return commands


def project_extras(dockerfile: Dockerfile) -> set[str]:
    """Extras of this project installed by pip: `.[a,b]` (the project copied to the WORKDIR)."""
    extras: set[str] = set()
    for stage in dockerfile.stages:
        for command in pip_installs(stage):
            for match in re.finditer(r"""(?:^|\s)["']?\.\[([\w,\s-]+)\]["']?""", command):
                extras.update(e.strip() for e in match.group(1).split(","))
    return extras


# -- .dockerignore (moby/patternmatcher semantics) -----------------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if pattern[i + 1:i + 2] == "*":
                i += 1
                if pattern[i + 1:i + 2] == "/":
                    i += 1
                    out += "(.*/)?"
                else:
                    out += ".*"
            else:
                out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1:end]
            out += "[" + ("^" + body[1:] if body.startswith(("!", "^")) else body) + "]"
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(f"^{out}$")


def dockerignore(text: str):
    """A predicate: is this context-relative path excluded? The last matching pattern wins; a pattern
    that matches a parent directory matches everything below it."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:].strip() if negate else line
        line = str(PurePosixPath(line.lstrip("/")))   # filepath.Clean, a leading / dropped
        rules.append((negate, _pattern_regex(line)))

    def excluded(path: str) -> bool:
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        result = False
        for negate, regex in rules:
            if any(regex.match(p) for p in prefixes):
                result = not negate
        return result

    return excluded


# -- shared fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trainer() -> Dockerfile:
    return parse(TRAINER.read_text())


@pytest.fixture(scope="module")
def operator() -> Dockerfile:
    return parse(OPERATOR.read_text())


@pytest.fixture(scope="module")
def context_files() -> list[str]:
    """Files a build from a fresh clone plus this work tree would see (tracked and new, not ignored)."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [p for p in out.splitlines() if (REPO / p).exists()]


@pytest.fixture(scope="module")
def stage_jobs() -> list[dict]:
    """The PyTorchJobs the operator creates for every stage of every example SolarRun."""
    from solar.run.plan import job_name, plan_run
    from solar.run.spec import SolarRun
    from solar_operator import jobs

    built = []
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        doc["metadata"].update(namespace="research", uid="0b5e2c8e-1111-4e8a-9b7a-5f0c6c1d2e3f")
        run = SolarRun.model_validate(doc)
        plan = plan_run(run.spec, f"{run.spec.storage.mountPath}/{run.spec.storage.path}", repo=REPO, environ={})
        for stage in plan.stages:
            built.append(jobs.manifest(doc, run.spec, stage, job_name(doc["metadata"]["name"], stage.name, 1),
                                       attempt=1, resume_from=None))
    assert built
    return built


def _containers(job: dict) -> list[dict]:
    return [c for replica in job["spec"]["pytorchReplicaSpecs"].values()
            for c in replica["template"]["spec"]["containers"]]


def _exposed(stage: Stage) -> set[int]:
    return {int(word.split("/")[0]) for inst in stage.all("EXPOSE") for word in inst.args.split()}


# -- the parser itself ---------------------------------------------------------------------------------

def test_the_parser_reads_continuations_comments_and_both_forms():
    parsed = parse(textwrap.dedent("""\
        # syntax=docker/dockerfile:1
        ARG BASE=python:3.11.13-slim-bookworm
        FROM ${BASE} AS build
        ENV A=1 \\
            B="two words"
        RUN apt-get update \\
        # a comment inside a continuation
         && pip install ".[operator]"

        FROM ${BASE}
        WORKDIR /app
        COPY --from=build --chown=1:1 /opt/venv /opt/venv
        COPY ["configs", "configs"]
        ENV LEGACY some value
        ENTRYPOINT ["solar-operator"]
        CMD --help
        """))
    assert parsed.global_args == {"BASE": "python:3.11.13-slim-bookworm"}
    build, final = parsed.stages
    assert (build.name, final.name, final.image) == ("build", None, "${BASE}")
    assert build.env() == {"A": "1", "B": "two words"}
    assert build.all("RUN")[0].args == 'apt-get update && pip install ".[operator]"'
    assert project_extras(parsed) == {"operator"}
    (venv, venv_dest, venv_copy), (configs, configs_dest, _) = copies(final)
    assert venv_copy.flags == {"from": "build", "chown": "1:1"} and (venv, venv_dest) == (["/opt/venv"], "/opt/venv")
    assert (configs, configs_dest) == (["configs"], "/app/configs")
    assert final.env() == {"LEGACY": "some value"}
    assert final.last("ENTRYPOINT").exec_form == ["solar-operator"]
    assert final.last("CMD").exec_form is None and final.last("CMD").args == "--help"


def test_the_dockerignore_matcher_follows_docker_semantics():
    excluded = dockerignore("/.git\n**/__pycache__\n*.md\n!README.md\nbuild\n")
    assert excluded(".git/config") and excluded("a/b/__pycache__/x.pyc") and excluded("__pycache__/x.pyc")
    assert excluded("NOTES.md") and not excluded("README.md") and not excluded("docs/a.md")  # no implicit **
    assert excluded("build/lib/x.py") and not excluded("trainer/build.py")


# -- both images ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [TRAINER, OPERATOR], ids=["trainer", "operator"])
def test_base_images_are_pinned_and_stage_references_resolve(path):
    dockerfile = parse(path.read_text())
    names: list[str] = []
    for stage in dockerfile.stages:
        image = substitute(stage.image, dockerfile.global_args)
        if image not in names:
            repo, _, tag = image.rpartition(":") if "@" not in image else (image, "@", "digest")
            assert repo and tag and tag != "latest" and "/" not in tag, f"{path.name}: FROM {image} is not pinned"
        for sources, _, inst in copies(stage):
            if "from" in inst.flags:
                assert inst.flags["from"] in names, f"line {inst.line}: --from={inst.flags['from']} is no earlier stage"
        if stage.name:
            names.append(stage.name)


@pytest.mark.parametrize("path", [TRAINER, OPERATOR], ids=["trainer", "operator"])
def test_build_args_are_declared_in_the_stage_that_uses_them(path):
    """An ARG declared before FROM is only visible to FROM lines: a stage must declare it again."""
    dockerfile = parse(path.read_text())
    declared_anywhere = set(dockerfile.global_args) | {a for s in dockerfile.stages for a in s.args()}
    for stage in dockerfile.stages:
        in_scope = set(stage.args()) | set(stage.env())
        for inst in stage.instructions:
            for name in re.findall(r"\$\{(\w+)\}|\$(\w+)", inst.args):
                name = name[0] or name[1]
                if name in declared_anywhere:
                    assert name in in_scope, f"{path.name} line {inst.line}: ${name} is not declared in this stage"


@pytest.mark.parametrize("path", [TRAINER, OPERATOR], ids=["trainer", "operator"])
def test_every_copied_source_is_in_the_build_context(path, context_files):
    """Build context = repository root: what a COPY names exists and .dockerignore keeps all of it."""
    excluded = dockerignore((REPO / ".dockerignore").read_text())
    for stage in parse(path.read_text()).stages:
        for sources, _, inst in copies(stage):
            if "from" in inst.flags:
                continue
            for source in sources:
                assert "*" not in source and not source.startswith(("/", "..")), source
                target = (REPO / source).resolve()
                assert target.exists() and target.is_relative_to(REPO), f"{path.name}: COPY {source}: not in the repo"
                rel = target.relative_to(REPO).as_posix()
                assert not excluded(rel), f"{path.name} line {inst.line}: {source} is excluded by .dockerignore"
                under = [f for f in context_files if f == rel or f.startswith(rel + "/")]
                assert under, f"{source}: no files"
                dropped = [f for f in under if excluded(f)]
                assert not dropped, f"{path.name}: .dockerignore drops {dropped[:5]} from COPY {source}"


def test_dockerignore_keeps_environments_caches_and_outputs_out(context_files):
    excluded = dockerignore((REPO / ".dockerignore").read_text())
    for path in (".venv/bin/python", ".git/HEAD", "trainer/solar/__pycache__/cli.cpython-311.pyc",
                 "solar_wm_ops.egg-info/PKG-INFO", ".pytest_cache/README.md", ".hypothesis/examples/x",
                 "demo-out/runs/tiny-wan/fm/run-result.json", "build/lib/solar/cli.py", "tests/unit/__init__.py"):
        assert excluded(path), path
    # What is left of the work tree stays small: no file over 1 MiB goes into the context.
    big = [f for f in context_files if not excluded(f) and (REPO / f).stat().st_size > 1 << 20]
    assert not big, big


@pytest.mark.parametrize("path", [TRAINER, OPERATOR], ids=["trainer", "operator"])
def test_the_final_stage_runs_as_a_non_root_numeric_user(path):
    final = parse(path.read_text()).final
    user = final.last("USER")
    assert user is not None, f"{path.name}: no USER in the final stage"
    assert re.fullmatch(r"\d+(:\d+)?", user.args), f"USER {user.args}: use a numeric uid[:gid] (runAsNonRoot)"
    assert all(int(i) != 0 for i in user.args.split(":")), "USER is root"
    runs = [i for i, inst in enumerate(final.instructions) if inst.cmd == "RUN"]
    assert not runs or final.instructions.index(user) > runs[-1], "USER comes after the last RUN (no RUN as that user)"


@pytest.mark.parametrize("path", [TRAINER, OPERATOR], ids=["trainer", "operator"])
def test_the_project_is_built_from_the_sources_it_needs(path):
    """pip builds this project in the build stage's WORKDIR: pyproject, its readme and its package roots
    must be copied there under their own names."""
    dockerfile = parse(path.read_text())
    build = next(s for s in dockerfile.stages if project_extras(Dockerfile({}, [s])))
    placed = {}
    for sources, dest, inst in copies(build):
        if "from" in inst.flags:
            continue
        into_dir = inst.args.rstrip().endswith("/") or len(sources) > 1
        for source in sources:
            target = dest if (REPO / source).is_dir() or not into_dir else f"{dest}/{PurePosixPath(source).name}"
            placed[target] = source
    workdir = build.workdir()
    needed = ["pyproject.toml", PYPROJECT["project"]["readme"],
              *PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]]
    for name in needed:
        assert placed.get(f"{workdir}/{name}") == name, f"{path.name}: {name} is not copied to {workdir}/{name}"


# -- the trainer image ---------------------------------------------------------------------------------

def _makefile_torch() -> str:
    match = re.search(r"^TORCH\s*:=\s*torch==(\S+)\s*$", (REPO / "Makefile").read_text(), re.M)
    assert match, "the Makefile has no `TORCH := torch==X` pin"
    return match.group(1)


def test_the_trainer_pins_the_makefiles_torch_within_pyprojects_range(trainer):
    pinned = _makefile_torch()
    stage = next((s for s in trainer.stages if "TORCH_VERSION" in s.args()), None)
    assert stage is not None, "no stage declares ARG TORCH_VERSION"
    assert stage.args()["TORCH_VERSION"] == pinned
    torch_installs = [c for c in pip_installs(stage) if "torch==${TORCH_VERSION}" in c]
    assert torch_installs, "no `pip install torch==${TORCH_VERSION}`"
    # The project install is constrained to that torch, so the resolver cannot replace it.
    project = [c for c in pip_installs(stage) if ".[trainer" in c]
    assert project and all("--constraint" in c or "-c " in c for c in project)
    assert 'echo "torch==${TORCH_VERSION}"' in " ".join(i.args for i in stage.all("RUN"))
    ranges = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["trainer"]]
    torch_range = next(r.specifier for r in ranges if r.name == "torch")
    assert pinned in SpecifierSet(str(torch_range)), f"torch {pinned} is outside pyproject's {torch_range}"


def test_each_image_installs_its_own_extra(trainer, operator):
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert project_extras(trainer) == {"trainer", "tracking"} <= set(extras)   # tracking: TensorBoard, MLflow
    assert project_extras(operator) == {"operator"} <= set(extras)
    assert "torch" not in OPERATOR.read_text().lower(), "the operator image never installs torch"
    assert all("cuda" not in s.image.lower() for s in operator.stages)


def test_the_trainer_runs_what_the_operators_pytorchjob_launches(trainer, stage_jobs):
    final = trainer.final
    assert final.last("ENTRYPOINT") is None, "an ENTRYPOINT would wrap the job's command (python -m ...)"
    env = final.env()
    assert env.get("PYTHONUNBUFFERED") == "1"
    # python (the venv's), torchrun and solar come from the venv that the build stage fills and PATH leads to.
    venv = [dest for sources, dest, inst in copies(final) if inst.flags.get("from")]
    assert venv and all(f"{d}/bin" in env["PATH"].split(":") for d in venv)
    venv_bin = Path(sys.executable).parent
    assert shutil.which("torchrun", path=str(venv_bin)), "torch provides the torchrun console script"
    assert shutil.which("python", path=str(venv_bin)), "a venv has python, which the jobs' command runs"
    cmd = final.last("CMD").exec_form
    assert cmd and cmd[0] in PYPROJECT["project"]["scripts"]
    ports = set()
    for job in stage_jobs:
        for container in _containers(job):
            assert container["command"] == ["python", "-m", "solar.launch.torchrun"]
            args = container["args"]
            assert args[0].startswith("--nproc-per-node=")
            at = args.index("-m")
            assert args[at + 1] == "solar" and args[at + 2] in ("train", "infer")
            ports |= {p["containerPort"] for p in container["ports"]}
    assert ports <= _exposed(final), f"ports the jobs declare but the image does not EXPOSE: {ports - _exposed(final)}"


def test_the_trainer_works_in_the_directory_that_holds_configs(trainer, stage_jobs):
    final = trainer.final
    workdir = final.workdir()
    assert [d for s, d, _ in copies(final) if s == ["configs"]] == [f"{workdir}/configs"]
    for path in EXAMPLES:
        for stage in yaml.safe_load(path.read_text())["spec"]["stages"]:
            config = PurePosixPath(stage["config"])
            assert not config.is_absolute() and config.parts[0] == "configs", f"{path.name}: {config}"
            assert (REPO / config).is_file(), f"{path.name}: {config} is not in the repo (nor the image)"
    for job in stage_jobs:
        for container in _containers(job):
            args = container["args"]
            config = args[args.index("--config") + 1]
            assert (REPO / config).is_file() and config.startswith("configs/"), config


# -- the operator image --------------------------------------------------------------------------------

def test_the_operator_entrypoint_is_its_console_script_with_arguments_it_accepts(operator):
    from solar_operator import main

    final = operator.final
    entrypoint = final.last("ENTRYPOINT").exec_form
    cmd = final.last("CMD").exec_form
    assert entrypoint and cmd is not None, "ENTRYPOINT and CMD in exec form (signals reach the operator)"
    script = entrypoint[0]
    assert PYPROJECT["project"]["scripts"].get(script) == "solar_operator.main:main"
    assert shutil.which(script, path=str(Path(sys.executable).parent)), f"{script} is not installed in the venv"
    args = main.build_parser().parse_args([*entrypoint[1:], *cmd])
    assert args.standalone and (args.all_namespaces or args.namespace)
    ports = {args.metrics_port}
    if args.liveness:
        ports.add(int(re.match(r"https?://[^/:]+:(\d+)/", args.liveness).group(1)))
    assert ports <= _exposed(final)


def test_the_operator_finds_the_configs_and_writes_no_bytecode(operator):
    final = operator.final
    env = final.env()
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("HOME", "").startswith("/tmp")
    assert [d for s, d, _ in copies(final) if s == ["configs"]] == [f"{env['SOLAR_REPO']}/configs"]


OPERATOR_WITHOUT_TRAINER_DEPS = r"""
import json, os, sys
from pathlib import Path
blocked, examples, image_cmd = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
for name in blocked:
    sys.modules[name] = None          # `import name` now raises ImportError
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch was not blocked")

import kopf, yaml
import solar_operator.errors, solar_operator.handlers, solar_operator.jobs, solar_operator.kube
import solar_operator.main as main, solar_operator.metrics, solar_operator.runs
from solar.run.plan import plan_run
from solar.run.spec import SolarRun

main.build_parser().parse_args(image_cmd)
solar_operator.handlers.register(kopf.OperatorRegistry(), poll_seconds=10)
reconciler = main.reconciler(Path("/nonexistent-storage"), url="http://127.0.0.1:9")  # builds clients, no I/O
assert reconciler.repo == Path(os.environ["SOLAR_REPO"]), reconciler.repo
for path in examples:                 # what a reconcile plans, from the configs at SOLAR_REPO
    spec = SolarRun.model_validate(yaml.safe_load(Path(path).read_text())).spec
    plan_run(spec, "/runs/x", repo=reconciler.repo, environ={})
try:
    main.main(["--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
else:
    raise SystemExit("--help did not exit")
leaked = sorted(n for n in blocked if sys.modules.get(n) is not None)
assert not leaked, leaked
"""


def _operator_image_distributions() -> set[str]:
    """This project with the `operator` extra and everything it requires, as the operator image has it."""
    seen: dict[str, set[str]] = {}
    todo = [("solar-wm-ops", {"operator"})]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in seen and extras <= seen[key]:
            continue
        seen.setdefault(key, set()).update(extras)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((req.name, set(req.extras)))
    return set(seen) | {"pip", "setuptools", "wheel"}  # a venv's own


def test_the_operator_loads_with_every_trainer_only_package_blocked():
    """The operator image has only the `operator` extra: block every module of a distribution outside
    it (torch, numpy, safetensors, diffusers, av, the dev tools...) and load, wire and plan as it does."""
    keep = _operator_image_distributions()
    blocked = sorted(module for module, dists in metadata.packages_distributions().items()
                     if module.isidentifier() and not any(canonicalize_name(d) in keep for d in dists))
    assert {"torch", "numpy", "safetensors", "pytest"} <= set(blocked)
    assert not {"kopf", "kubernetes", "pydantic", "yaml", "prometheus_client"} & set(blocked)
    cmd = [*parse(OPERATOR.read_text()).final.last("ENTRYPOINT").exec_form[1:],
           *parse(OPERATOR.read_text()).final.last("CMD").exec_form]
    proc = subprocess.run(
        [sys.executable, "-c", OPERATOR_WITHOUT_TRAINER_DEPS, json.dumps(blocked),
         json.dumps([str(p) for p in EXAMPLES]), json.dumps(cmd)],
        capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin", "SOLAR_REPO": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: solar-operator" in proc.stdout
