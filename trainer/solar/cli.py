"""The ``solar`` command line (also ``python -m solar``).

Each verb parses its flags, calls one library function, and prints JSON or text. Errors a user can
cause are ``SolarError``: one line ``solar: error: ...`` on stderr, exit 2, no traceback unless
``SOLAR_DEBUG=1``. Nothing is written before the input is validated.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from solar import __version__
from solar.errors import SolarError


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's one-line error format."""

    def error(self, message: str) -> NoReturn:
        raise SolarError(f"{message} (see `{self.prog} --help`)")


def _emit_json(obj: Any) -> None:
    from solar.config.canonical import readable

    sys.stdout.write(readable(obj))
    sys.stdout.write("\n")


# --- verbs -------------------------------------------------------------------------------------

def cmd_config_routes(args: argparse.Namespace) -> int:
    from solar.config import routes

    rows = routes.table()
    if args.json:
        _emit_json(rows)
        return 0
    width = max(len(row["route"]) for row in rows)
    print(f"{'ROUTE':<{width}}  ACTIONS      DESCRIPTION")
    for info in sorted(routes.SUPPORTED, key=lambda i: i.route.key):
        print(f"{info.route.key:<{width}}  {','.join(info.actions):<11}  {info.description}")
        for path in info.configs:
            print(f"    {path}")
    return 0


def cmd_config_resolve(args: argparse.Namespace) -> int:
    from solar.config.canonical import pretty_bytes
    from solar.config.resolve import resolve_file
    from solar.storage.atomic import write_create_only

    resolved = resolve_file(args.config, args.set)
    data = pretty_bytes(resolved.document())
    if args.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    write_create_only(args.output, data, what="--output")
    print(f"solar: resolved {resolved.route.key} -> {args.output} "
          f"(resolved_digest {resolved.resolved_digest[:16]}...)", file=sys.stderr)
    return 0


def cmd_config_memory(args: argparse.Namespace) -> int:
    from solar.config import memory
    from solar.config.resolve import resolve_file
    from solar.environment import local_gpu_memory_bytes

    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise SolarError(f"--gpu-memory-gib {args.gpu_memory_gib}: give the GPU's memory in GiB, e.g. 80 or 141")
    if args.gpus_per_node < 1:
        raise SolarError(f"--gpus-per-node {args.gpus_per_node}: give the GPUs of one node, e.g. 8")
    resolved = resolve_file(args.config, args.set, placeholders=False)
    if resolved.config.action != "train":
        raise SolarError(f"--config {args.config}: `solar config memory` forecasts training configs; this one is an "
                         f"{resolved.config.action} config (action: {resolved.config.action}), which trains nothing")
    gpu = int(args.gpu_memory_gib * memory.GIB) if args.gpu_memory_gib is not None else \
        (local_gpu_memory_bytes() or 80 * memory.GIB)
    result = memory.forecast(resolved, gpu_memory_bytes=gpu, gpus_per_node=args.gpus_per_node)
    if args.json:
        _emit_json({"config": args.config, "route": resolved.route.key, **result.as_dict()})
    else:
        print(f"{args.config} ({resolved.route.key}, world {resolved.config.distributed.world_size}, "
              f"SP {resolved.config.distributed.sequence_parallel_size}, "
              f"sharding {resolved.config.distributed.sharding})")
        print(memory.table(result))
    return 0


def cmd_environment_probe(args: argparse.Namespace) -> int:
    from solar.environment import probe

    _emit_json(probe())
    return 0


def cmd_data_inspect(args: argparse.Namespace) -> int:
    from solar.data.index import inspect

    _emit_json(inspect(args.index))
    return 0


def cmd_data_plan(args: argparse.Namespace) -> int:
    from solar.data.plan import PlanParams, describe

    local = args.local_world_size
    if local is None and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    params = PlanParams(seed=args.seed, pixel_frames=args.pixel_frames, world_size=args.world_size,
                        sequence_parallel_size=args.sequence_parallel_size, local_world_size=local,
                        num_workers=args.num_workers, epoch=args.epoch, mode=args.mode)
    _emit_json(describe(args.index, params, rank=args.rank, worker_id=args.worker_id,
                        limit=args.limit))
    return 0


def cmd_data_synth(args: argparse.Namespace) -> int:
    from solar.data.synth import synthesize

    summary = synthesize(args.family, args.out, samples=args.samples, seed=args.seed,
                         profile=args.profile, progress=lambda msg: print(msg, file=sys.stderr))
    _emit_json(summary)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from solar.launch.launcher import launch, ranks_to_start

    cfg = ranks_to_start("train", args.config, args.set)   # alone with distributed.world_size > 1
    if cfg is not None:
        return launch("train", args.config, args.set, cfg)
    from solar.train.launch import train

    return train(args.config, args.set)


def cmd_infer(args: argparse.Namespace) -> int:
    from solar.launch.launcher import launch, ranks_to_start

    cfg = ranks_to_start("infer", args.config, args.set)
    if cfg is not None:
        return launch("infer", args.config, args.set, cfg)
    from solar.infer.launch import infer

    return infer(args.config, args.set)


def cmd_run(args: argparse.Namespace) -> int:
    from solar.local.executor import dry_run, run_manifest

    _require_file(args.manifest, "MANIFEST", "a SolarRun YAML or JSON file")
    if args.dry_run:
        return dry_run(args.manifest, workdir=args.workdir, nproc=args.nproc)
    return run_manifest(args.manifest, workdir=args.workdir, nproc=args.nproc)


def cmd_checkpoint_verify(args: argparse.Namespace) -> int:
    from solar.storage.checkpoints import verify

    contract = None
    if args.route_config:
        from solar.config.contracts import checkpoint_contract
        from solar.config.loader import read_document
        from solar.config.resolve import resolve_tree

        _require_file(args.route_config, "--route-config", "a run config or resolved-config.json")
        _, tree = read_document(args.route_config)
        if tree.get("schema") == "solar.resolved.v1":
            tree = tree["config"]
        resolved = resolve_tree(tree, source=args.route_config, source_digest="")
        contract = checkpoint_contract(resolved.config, resolved.route)
        contract.pop("sequence_parallel_size")
    report = verify(args.dir, contract)
    _emit_json(report)
    _say_superseded(args.dir)
    return 0 if report["valid"] else 2


def _say_superseded(path: str) -> None:
    """One line on stderr when ``path`` is a checkpoint a rewind moved aside (it still verifies)."""
    import json
    from pathlib import Path

    from solar.storage.supersede import superseded_of

    found = superseded_of(path)
    if found is None:
        return
    run, record = found
    try:
        rewind = json.loads((run / "launches" / f"{record}-launch-manifest.json").read_text()).get("rewind") or {}
    except (OSError, ValueError, AttributeError):
        rewind = {}
    to = f" to step {rewind['step']}" if isinstance(rewind.get("step"), int) else ""
    print(f"solar: {path} is superseded: launch record {record} rewound {run}{to} and kept it aside; "
          f"`solar checkpoint list {run}` lists the run's checkpoints", file=sys.stderr)


def cmd_checkpoint_list(args: argparse.Namespace) -> int:
    from pathlib import Path

    from solar.storage.checkpoints import PARTIAL_DIR, STEP_DIR, list_checkpoints

    path = Path(args.run_dir)
    if not path.is_dir():
        raise SolarError(f"{args.run_dir}: no such run directory")
    if (path / "COMPLETE.json").exists() or (path / "manifest.json").exists() or STEP_DIR.match(path.name) \
            or PARTIAL_DIR.match(path.name):
        raise SolarError(f"{args.run_dir} is a checkpoint directory, not a run directory; `solar checkpoint verify "
                         f"{args.run_dir}` checks it, `solar checkpoint list {path.parent.parent}` lists its run's "
                         "checkpoints")
    if not (path / "checkpoints").is_dir() and any(STEP_DIR.match(e.name) or PARTIAL_DIR.match(e.name)
                                                   for e in path.iterdir()):
        raise SolarError(f"{args.run_dir} is a run's checkpoints folder; give the run directory: "
                         f"`solar checkpoint list {path.parent}`")
    _emit_json(list_checkpoints(args.run_dir))
    line = _superseded_line(path)
    if line:
        print(line, file=sys.stderr)
    return 0


def _superseded_line(run_dir) -> str | None:
    """How many checkpoints rewinds moved aside and where (``checkpoints/superseded/NNNN/``), in one line."""
    from pathlib import Path

    from solar.storage.supersede import superseded_checkpoints

    aside = superseded_checkpoints(run_dir)
    if not aside:
        return None
    by_launch: dict[str, list[str]] = {}
    for c in aside:
        by_launch.setdefault(c["launch"], []).append(Path(c["path"]).name)
    kept = "; ".join(f"{launch}: " + (", ".join(names) if len(names) <= 3 else
                                      f"{names[0]} .. {names[-1]} ({len(names)})")
                     for launch, names in by_launch.items())
    return (f"solar: {len(aside)} superseded checkpoint{'s are' if len(aside) > 1 else ' is'} kept under "
            f"{Path(run_dir) / 'checkpoints' / 'superseded'}/ ({kept}; moved aside by rewinds, not listed)")


def cmd_checkpoint_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from solar.train.checkpoint_export import export

    final = export(Path(args.checkpoint), Path(args.out), log=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"solar: exported {args.checkpoint} -> {final}", file=sys.stderr)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from solar.diagnose import diagnose_dir

    found = diagnose_dir(args.run_dir)
    if args.json:
        _emit_json(found.as_dict())
    else:
        print(found.text())
    return 1 if found.status in DIAGNOSED_FAILURE else 0


# `solar diagnose` exits 1 for these statuses (a failure, or slots that ended in errors), 0 otherwise
DIAGNOSED_FAILURE = ("failed", "degraded")


def _require_file(path: str, what: str, expected: str) -> None:
    """A missing or unreadable input file named by the argument that gave it."""
    if os.path.isdir(path):
        raise SolarError(f"{what} {path}: is a directory, expected {expected}")
    if not os.path.isfile(path):
        raise SolarError(f"{what} {path}: no such file")


def cmd_report(args: argparse.Namespace) -> int:
    from solar.report import build, render_html, render_text

    report = build(args.run_dir)
    if args.html:
        render_html(report, args.html)
    if args.json:
        _emit_json(report)
    else:
        print(render_text(report))
    if args.html:
        print(f"solar: report written to {args.html}", file=sys.stderr)
    return 0


def cmd_model_info(args: argparse.Namespace) -> int:
    from solar.models.registry import info

    _emit_json(info(args.family, args.profile))
    return 0


def cmd_model_convert(args: argparse.Namespace) -> int:
    from solar.models.convert import convert

    document = convert(args.family, args.source_format, args.src, args.out,
                       progress=lambda msg: print(msg, file=sys.stderr))
    _emit_json({"out": args.out, **{k: document[k] for k in ("family", "parameters", "files", "source")}})
    return 0


# --- parser ------------------------------------------------------------------------------------

EXIT_STATUS = """Exit status:
  0    complete; or stopped by SIGTERM at a checkpoint (a pod eviction, a preemption,
       `solar run` stopping a stage; run-result.json status stopped, which the operator reads)
  130  stopped by SIGINT (Ctrl-C) at a checkpoint (run-result.json status stopped), so that
       `solar train ... && solar infer ...` does not go on; resume from the newest checkpoint
  2    refused before anything ran, or failed (one line `solar: error: ...`; once the launch
       began, run-result.json status failed and `solar diagnose RUN_DIR` says why)
  3    a stale attempt (with SOLAR_ATTEMPT, which the operator and `solar run` set): a newer
       attempt of the stage took over its output directory, so it refused to start, or it left
       at its next write, writing nothing (one line naming both attempts); without
       SOLAR_ATTEMPT a launch neither records nor checks a fence (the writer lock still applies)
  128+N  ended by signal N without stopping (a second signal, or runtime.stop_grace_seconds
       passed after the first)
Alone with distributed.world_size N > 1, solar starts the N ranks and exits with their
status; torchrun itself exits 1 (with a traceback) for any failed rank or signal, whatever
the ranks did (`python -m solar.launch.torchrun`, with torchrun's arguments, exits with theirs)."""

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="solar", description="Training and inference operations for video world "
                                               "models (Wan 2.2, LTX-2.5, MiniMax-H3).")
    parser.add_argument("--version", action="version", version=f"solar {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    verbs.required = True

    config = verbs.add_parser("config", help="list routes, resolve a run config")
    config_verbs = config.add_subparsers(dest="config_verb", metavar="ACTION", parser_class=_Parser)
    config_verbs.required = True
    routes_p = config_verbs.add_parser("routes", help="the supported training/inference routes")
    routes_p.add_argument("--json", action="store_true", help="print a sorted JSON list")
    routes_p.set_defaults(func=cmd_config_routes)
    resolve_p = config_verbs.add_parser(
        "resolve", help="resolve and check a run config (nothing is allocated or launched)")
    resolve_p.add_argument("--config", required=True, metavar="PATH", help="YAML or JSON run config")
    resolve_p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                           help="override a dotted key; the value is YAML (repeatable)")
    resolve_p.add_argument("--output", metavar="PATH",
                           help="write the resolved document here (create-only, atomic) "
                                "instead of stdout")
    resolve_p.set_defaults(func=cmd_config_resolve)
    memory_p = config_verbs.add_parser(
        "memory", help="forecast a training config's GPU memory per GPU (nothing is allocated)")
    memory_p.add_argument("--config", required=True, metavar="PATH", help="YAML or JSON training config")
    memory_p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="override a dotted key; the value is YAML (repeatable)")
    memory_p.add_argument("--gpu-memory-gib", type=float, metavar="N",
                          help="memory of one GPU (default: this machine's GPU, else 80)")
    memory_p.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                          help="GPUs per node: hybrid_shard's shard group (default 8)")
    memory_p.add_argument("--json", action="store_true",
                          help="JSON {gpu_memory_bytes, peak_bytes, fits, roles: {role: {kind: bytes}}, ...}")
    memory_p.set_defaults(func=cmd_config_memory)

    data = verbs.add_parser("data", help="inspect and plan indexes, synthesize a dataset")
    data_verbs = data.add_subparsers(dest="data_verb", metavar="ACTION", parser_class=_Parser)
    data_verbs.required = True
    inspect_p = data_verbs.add_parser(
        "inspect", help="check an index (shards resolve under $SOLAR_DATA_ROOT or the index's folder)")
    inspect_p.add_argument("index", metavar="INDEX", help="index.jsonl or index.jsonl.gz")
    inspect_p.set_defaults(func=cmd_data_inspect)
    plan_p = data_verbs.add_parser("plan", help="the sampling plan of one rank (and the full-plan fingerprint)")
    plan_p.add_argument("index", metavar="INDEX")
    plan_p.add_argument("--seed", type=int, required=True)
    plan_p.add_argument("--pixel-frames", type=int, required=True)
    plan_p.add_argument("--world-size", type=int, required=True)
    plan_p.add_argument("--rank", type=int, required=True, help="raw rank; ownership follows dp rank")
    plan_p.add_argument("--sequence-parallel-size", type=int, default=1)
    plan_p.add_argument("--local-world-size", type=int, help="ranks per node (node_shard)")
    plan_p.add_argument("--num-workers", type=int, default=1)
    plan_p.add_argument("--worker-id", type=int, default=0)
    plan_p.add_argument("--epoch", type=int, default=0)
    plan_p.add_argument("--mode", default="global_occurrence", choices=["global_occurrence", "node_shard"])
    plan_p.add_argument("--limit", type=int, default=16, help="occurrences shown")
    plan_p.set_defaults(func=cmd_data_plan)
    synth_p = data_verbs.add_parser("synth", help="write a small synthetic pre-encoded dataset")
    synth_p.add_argument("--family", required=True, help="wan22_ti2v_5b, wan22_i2v_a14b, ltx25_video, "
                                                         "minimax_h3 (or an alias)")
    synth_p.add_argument("--out", required=True, metavar="DIR", help="new or empty directory")
    synth_p.add_argument("--samples", type=int, default=8, help="training samples (test: a quarter, >= 2)")
    synth_p.add_argument("--seed", type=int, default=0)
    synth_p.add_argument("--profile", default="tiny", choices=["tiny", "released"])
    synth_p.set_defaults(func=cmd_data_synth)

    for verb, helptext, func in (
            ("train", "run one training route (single process, one rank under torchrun, or, alone with "
                      "distributed.world_size N > 1, its N ranks on this machine)", cmd_train),
            ("infer", "standalone generation through the validation path (ranks as for train)", cmd_infer)):
        verb_p = verbs.add_parser(verb, help=helptext, description=textwrap.fill(helptext[0].upper() + helptext[1:] + ".", 96)
                                  + "\n\n" + EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
        verb_p.add_argument("--config", required=True, metavar="PATH")
        verb_p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        verb_p.set_defaults(func=func)

    run_p = verbs.add_parser("run", help="run a SolarRun manifest on this machine (no cluster)")
    run_p.add_argument("manifest", metavar="MANIFEST")
    run_p.add_argument("--workdir", default="solar-runs", metavar="DIR",
                       help="where runs live: DIR/<metadata.name>/ (default: solar-runs)")
    run_p.add_argument("--nproc", type=int, default=None, metavar="N",
                       help="processes per stage, overriding spec.topology.gpusPerNode")
    run_p.add_argument("--dry-run", action="store_true",
                       help="validate and print the plan and each stage's launch (of a multi-node manifest, what "
                            "the operator would run); write and start nothing")
    run_p.set_defaults(func=cmd_run)

    ck = verbs.add_parser("checkpoint", help="verify, list and export checkpoints")
    ck_verbs = ck.add_subparsers(dest="checkpoint_verb", metavar="ACTION", parser_class=_Parser)
    ck_verbs.required = True
    verify_p = ck_verbs.add_parser("verify", help="check a checkpoint's transaction and members (exit 2 if invalid)")
    verify_p.add_argument("dir", metavar="DIR")
    verify_p.add_argument("--route-config", metavar="RESOLVED_OR_CONFIG",
                          help="also check the checkpoint's contract against this route")
    verify_p.set_defaults(func=cmd_checkpoint_verify)
    list_p = ck_verbs.add_parser("list", help="every checkpoint of a run (partials as incomplete)")
    list_p.add_argument("run_dir", metavar="RUN_DIR")
    list_p.set_defaults(func=cmd_checkpoint_list)
    export_p = ck_verbs.add_parser("export", help="a checkpoint as whole files, one per role and kind "
                                   "(from a sharded one), with release-manifest.json; DIR must not exist")
    export_p.add_argument("checkpoint", metavar="CHECKPOINT")
    export_p.add_argument("--out", required=True, metavar="DIR")
    export_p.set_defaults(func=cmd_checkpoint_export)

    diagnose_p = verbs.add_parser(
        "diagnose", help="what went wrong in a run, from the evidence it left",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""What went wrong in a run, from the evidence it left.

Exit status:
  0  the run is healthy (complete), stopped or still running
  1  it diagnoses a failure (FAILED: ...) or a degraded run (DEGRADED: validation
     slots that ended in errors)
  2  RUN_DIR cannot be read as a run""")
    diagnose_p.add_argument("run_dir", metavar="RUN_DIR", help="a run's runtime.output_dir")
    diagnose_p.add_argument("--json", action="store_true", help="solar.diagnosis.v1 JSON instead of text")
    diagnose_p.set_defaults(func=cmd_diagnose)

    report_p = verbs.add_parser("report", help="the completion report of a run (text, JSON, HTML)")
    report_p.add_argument("run_dir", metavar="RUN_DIR", help="a run's runtime.output_dir, or a SolarRun's root "
                          "(where solar run puts its stages): each stage reported")
    report_p.add_argument("--json", action="store_true", help="solar.report.v1 JSON instead of text")
    report_p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML page (create-only)")
    report_p.set_defaults(func=cmd_report)

    model = verbs.add_parser("model", help="model dimensions and weight conversion")
    model_verbs = model.add_subparsers(dest="model_verb", metavar="ACTION", parser_class=_Parser)
    model_verbs.required = True
    info_p = model_verbs.add_parser("info", help="dims and parameter count (meta device, nothing allocated)")
    info_p.add_argument("--family", required=True)
    info_p.add_argument("--profile", default="released", choices=["released", "tiny"])
    info_p.set_defaults(func=cmd_model_info)
    convert_p = model_verbs.add_parser("convert", help="released weights -> Solar's safetensors layout")
    convert_p.add_argument("--family", required=True)
    convert_p.add_argument("--from", dest="source_format", required=True, choices=["diffusers", "official"])
    convert_p.add_argument("src", metavar="SRC", help="checkpoint directory (or file)")
    convert_p.add_argument("--out", required=True, metavar="DIR", help="new or empty directory")
    convert_p.set_defaults(func=cmd_model_convert)

    env = verbs.add_parser("environment", help="what this machine offers a run")
    env_verbs = env.add_subparsers(dest="env_verb", metavar="ACTION", parser_class=_Parser)
    env_verbs.required = True
    probe_p = env_verbs.add_parser("probe", help="Python, torch, CUDA/NCCL, GPUs, env, packages")
    probe_p.set_defaults(func=cmd_environment_probe)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    debug = os.environ.get("SOLAR_DEBUG") == "1"
    try:
        args = build_parser().parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except SolarError as exc:
        if debug:
            raise
        print(f"solar: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("solar: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug: say so in one line unless debugging
        if debug:
            raise
        print(f"solar: error: internal error ({type(exc).__name__}: {exc}); rerun with "
              "SOLAR_DEBUG=1 for a traceback and report it", file=sys.stderr)
        return 1


def run() -> NoReturn:
    """The ``solar`` program: :func:`main`, then exit with its code. Whatever the command left is garbage
    to the interpreter's exit only; freezing it first spares that exit a collection over torch's module
    graph, about half a second per process (every torchrun rank)."""
    from solar.processes import die_with_parent

    die_with_parent()   # a rank never outlives its launcher
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
