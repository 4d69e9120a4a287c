"""``solar-operator``: runs the SolarRun operator (kopf) with its metrics endpoint.

Flags are those of contract.md §1 and §7: ``--default-backend pytorchjob|trainjob`` (env
``SOLAR_OPERATOR_DEFAULT_BACKEND``, default ``pytorchjob``: the job kind of runs without
``spec.backend``), ``--backends`` (env ``SOLAR_OPERATOR_BACKENDS``, default both: the kinds it runs
and watches, which the chart's RBAC grants), ``--storage-root`` (env ``SOLAR_OPERATOR_STORAGE_ROOT``, default
``/runs``: where the run volume is mounted), ``--metrics-port`` (8080), and kopf's ``--standalone``,
``-A``/``-n NS``, ``--liveness URL``, ``--verbose``/``--debug``/``--quiet``, ``--log-format``. Cluster credentials come from the in-cluster service account
or ``$KUBECONFIG``. ``SOLAR_OPERATOR_POLL_SECONDS`` (default 10) sets how often an active run's
stage directory is looked at; job changes are seen at once through the watch. Stage configs are
resolved from the repository at ``SOLAR_REPO`` (default: the one this package is installed from;
``/app`` in the image), which must hold the same ``configs/`` as the trainer image.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(os.environ.get("SOLAR_REPO", Path(__file__).resolve().parents[2]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="solar-operator", description="The SolarRun operator. "
                                     "`solar-operator render MANIFEST [--backend B] [--storage-root DIR]` prints the "
                                     "plan and the jobs it would create for a manifest, touching nothing.")
    parser.add_argument("--storage-root", default=os.environ.get("SOLAR_OPERATOR_STORAGE_ROOT", "/runs"),
                        help="where run storage is mounted (env SOLAR_OPERATOR_STORAGE_ROOT)")
    parser.add_argument("--default-backend", default=os.environ.get("SOLAR_OPERATOR_DEFAULT_BACKEND", "pytorchjob"),
                        metavar="pytorchjob|trainjob",
                        help="job kind of runs without spec.backend (env SOLAR_OPERATOR_DEFAULT_BACKEND)")
    parser.add_argument("--backends", default=os.environ.get("SOLAR_OPERATOR_BACKENDS", "pytorchjob,trainjob"),
                        metavar="LIST", help="job kinds this operator runs and watches, comma-separated "
                                             "(env SOLAR_OPERATOR_BACKENDS; the chart's backends value)")
    parser.add_argument("--read-nodes", action="store_true",
                        default=os.environ.get("SOLAR_OPERATOR_READ_NODES", "") in ("1", "true"),
                        help="read nodes and every pod (cluster-scope RBAC; the chart's elastic.readNodes) so that "
                             "elastic stages shrink to what the cluster holds and grow back (env "
                             "SOLAR_OPERATOR_READ_NODES=1); without it they shrink one allowed shape at a time and "
                             "never grow back")
    parser.add_argument("--node-lost-seconds", type=_seconds,
                        default=os.environ.get("SOLAR_OPERATOR_NODE_LOST_SECONDS", "60"), metavar="SECONDS",
                        help="with --read-nodes: how long a stage pod's node may be gone or not Ready (from its "
                             "kubelet's last heartbeat) before the attempt is replaced while its job still runs, "
                             "for stages without spec.topology.elastic.nodeLostSeconds (env "
                             "SOLAR_OPERATOR_NODE_LOST_SECONDS, default 60)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--standalone", action="store_true", help="kopf: no peering")
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="kopf: watch every namespace")
    parser.add_argument("-n", "--namespace", action="append", default=[], help="kopf: watch this namespace")
    parser.add_argument("--liveness", metavar="URL", help="kopf: liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--workers", type=int, default=None,
                        help="threads that run reconciles (env SOLAR_OPERATOR_WORKERS; default 8)")
    parser.add_argument("--verbose", action="store_true", help="kopf: more logging")
    parser.add_argument("--debug", action="store_true", help="kopf: debug logging")
    parser.add_argument("--quiet", action="store_true", help="kopf: warnings and errors only")
    parser.add_argument("--log-format", choices=("plain", "full", "json"), default="full", help="kopf: log format")
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["render"]:  # solar-operator render MANIFEST: print what would be created (render.py)
        from solar_operator.render import main as render

        return render(argv[1:], repo=REPO)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.all_namespaces and args.namespace:
        parser.error("use either -A/--all-namespaces or -n/--namespace")
    if not args.all_namespaces and not args.namespace:
        parser.error("say what to watch: -A/--all-namespaces or -n/--namespace NS")
    root = Path(args.storage_root)
    if not root.is_dir():
        print(f"solar-operator: error: --storage-root {root} is not a directory (mount the run volume there)",
              file=sys.stderr)
        return 2
    from solar_operator.backends import backend_name

    try:
        default = backend_name(args.default_backend)
        enabled = tuple(dict.fromkeys(backend_name(b) for b in args.backends.split(",") if b.strip()))
        if not enabled:
            raise ValueError("no backend enabled")
    except ValueError as exc:
        print(f"solar-operator: error: --default-backend/--backends: {exc}", file=sys.stderr)
        return 2
    if default not in enabled:
        print(f"solar-operator: error: --default-backend {default} is not among --backends {', '.join(enabled)}",
              file=sys.stderr)
        return 2
    poll = os.environ.get("SOLAR_OPERATOR_POLL_SECONDS", "10")
    try:
        poll_seconds = float(poll)
        if not poll_seconds > 0:
            raise ValueError
    except ValueError:
        print(f"solar-operator: error: SOLAR_OPERATOR_POLL_SECONDS={poll!r} is not a positive number of seconds",
              file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else os.environ.get("SOLAR_OPERATOR_WORKERS", "8")
    try:
        workers = int(workers)
        if workers < 1:
            raise ValueError
    except ValueError:
        print(f"solar-operator: error: --workers/SOLAR_OPERATOR_WORKERS {workers!r}: use a whole number of threads, "
              "1 or more", file=sys.stderr)
        return 2
    import kopf

    from solar_operator import handlers, metrics

    kopf.configure(debug=args.debug, verbose=args.verbose, quiet=args.quiet,
                   log_format=kopf.LogFormat[args.log_format.upper()])
    if not (args.verbose or args.debug):  # one line per transition (solar_operator), not per handler call
        for chatty in ("kopf.objects", "aiohttp.access"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    registry = kopf.OperatorRegistry()

    @kopf.on.login(id="kube-login", registry=registry)
    def login(**kwargs):  # in-cluster service account, else $KUBECONFIG
        return kopf.login_via_client(**kwargs)

    handlers.register(registry, poll_seconds=poll_seconds, workers=workers,
                      exit_seconds=handlers.EXIT_SECONDS, backends=enabled)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    asyncio.run(kopf.operator(registry=registry, memo=kopf.Memo(runs=reconciler(root, default_backend=default,
                                                                              backends=enabled,
                                                                              read_nodes=args.read_nodes,
                                                                              node_lost_seconds=args.node_lost_seconds)),
                              standalone=args.standalone, clusterwide=args.all_namespaces,
                              namespaces=args.namespace, liveness_endpoint=args.liveness))
    return 0


def reconciler(storage_root: Path, *, url: str | None = None, default_backend: str = "PyTorchJob",
               backends: tuple[str, ...] = ("PyTorchJob", "TrainJob"), read_nodes: bool = False,
               node_lost_seconds: float = 60.0):
    """The operator's reconciler over the real API (``url``: a test server instead of the cluster)."""
    from solar_operator.backends import Backends
    from solar_operator.kube import Kube, api_client
    from solar_operator.runs import Reconciler

    kube = Kube(api_client(url))
    return Reconciler(kube, Backends(kube, default=default_backend, enabled=backends), storage_root=storage_root,
                      repo=REPO, read_nodes=read_nodes, node_lost_seconds=node_lost_seconds)


if __name__ == "__main__":
    sys.exit(main())
