"""``solar-operator``: the SolarRun operator's command line.

The flags are those of contract.md §1. The reconcile handlers (kopf over ``solar.run``) are not in
this build yet, so after validating its flags the command says so and exits 2 rather than watching
nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="solar-operator", description="The SolarRun operator.")
    parser.add_argument("--storage-root", default=os.environ.get("SOLAR_OPERATOR_STORAGE_ROOT", "/runs"),
                        help="where run storage is mounted (env SOLAR_OPERATOR_STORAGE_ROOT)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port")
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
    print("solar-operator: error: the reconcile handlers are not part of this build yet; "
          "use `solar run MANIFEST` once it lands, or a build that includes the operator",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
