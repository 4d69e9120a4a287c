"""``solar-operator``: runs the SolarRun operator (kopf) with its metrics endpoint.

Flags are those of contract.md §1: ``--storage-root`` (env ``SOLAR_OPERATOR_STORAGE_ROOT``, default
``/runs``: where the run volume is mounted), ``--metrics-port`` (8080), and kopf's ``--standalone``,
``-A``/``-n NS``, ``--liveness URL``. Cluster credentials come from the in-cluster service account
or ``$KUBECONFIG``. Equivalent to ``kopf run -m solar_operator.handlers`` plus the metrics server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="solar-operator", description="The SolarRun operator.")
    parser.add_argument("--storage-root", default=os.environ.get("SOLAR_OPERATOR_STORAGE_ROOT", "/runs"),
                        help="where run storage is mounted (env SOLAR_OPERATOR_STORAGE_ROOT)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--standalone", action="store_true", help="kopf: no peering")
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="kopf: watch every namespace")
    parser.add_argument("-n", "--namespace", action="append", default=[], help="kopf: watch this namespace")
    parser.add_argument("--liveness", metavar="URL", help="kopf: liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
    import kopf

    from solar_operator import handlers, metrics

    handlers.Context.storage_root = root
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    asyncio.run(kopf.operator(standalone=args.standalone, clusterwide=args.all_namespaces,
                              namespaces=args.namespace, liveness_endpoint=args.liveness))
    return 0


if __name__ == "__main__":
    sys.exit(main())
