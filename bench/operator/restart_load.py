"""A restart with many active runs: is the operator alive, and how long until it has caught up?

The real ``solar-operator`` against the test-side API server emulator (tests/support/kube.py):
N three-stage SolarRuns are applied and reconciled until each has its first PyTorchJob (all
active), the operator is SIGKILLed and started again, and from the new process's start:

- liveness: ``/healthz`` asked every 0.2 s (5 s client timeout) until the catch-up ends; answer
  times p50/p99/max and how many were not 200 within 1 s;
- catch-up: the time until every run's first trigger has been reconciled (the operator's own
  ``solar_operator_reconcile_total{handler="resume"|"create"}``, any result: kopf resumes the runs
  whose creation it had recorded and creates the others); liveness is asked 10 s longer;
- the new process's resident memory (VmRSS, VmHWM) at the end.

Prints one JSON document.

    .venv/bin/python bench/operator/restart_load.py --runs 1000 [--base CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.operator.reconcile_load import _port, _proc_stats, _scrape, distribution, stop  # noqa: E402
from tests.integration.world import CRD, World, load_case  # noqa: E402
from tests.support.crd_schema import ANCHORS  # noqa: E402
from tests.support.kube import emulated_cluster, wait_for  # noqa: E402


def _start(storage: Path, namespace: str, env: dict, log, *, metrics_port: int, live_port: int,
           workers: int | None):
    extra = ["--workers", str(workers)] if workers else []  # an operator from before --workers: its default
    return subprocess.Popen([str(Path(sys.executable).with_name("solar-operator")), "--standalone", "-n", namespace,
                             "--storage-root", str(storage), "--metrics-port", str(metrics_port), *extra,
                             "--liveness", f"http://127.0.0.1:{live_port}/healthz"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def _say(text: str) -> None:
    print(f"restart_load: {text}", file=sys.stderr, flush=True)


def _resumed(text: str | None) -> float:
    """Runs whose first trigger in this process was reconciled: kopf's ``resume`` for a run it knows,
    ``create`` for one whose creation the killed process had not yet recorded (any result)."""
    total = 0.0
    for line in (text or "").splitlines():
        if line.startswith(('solar_operator_reconcile_total{handler="resume"',
                            'solar_operator_reconcile_total{handler="create"')):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Prober(threading.Thread):
    """GET /healthz every ``period`` seconds: (seconds since start, answer time or None on failure)."""

    def __init__(self, url: str, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.url, self.period, self.stop = url, period, threading.Event()
        self.answers: list[tuple[float, float | None]] = []
        self.began = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            asked = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    ok = resp.status == 200
            except OSError:
                ok = False
            took = time.monotonic() - asked
            self.answers.append((asked - self.began, took if ok else None))
            self.stop.wait(max(0.0, self.period - took))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--poll-seconds", type=float, default=10.0, help="SOLAR_OPERATOR_POLL_SECONDS")
    parser.add_argument("--base", type=Path, help="run the operator of this checkout instead (the peer: what a "
                        "change replaces)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="solar-operator-restart-"))
    storage = tmp / "runs"
    storage.mkdir()
    result = {"runs": args.runs, "workers": args.workers, "poll_seconds": args.poll_seconds,
              "machine": f"{os.cpu_count()} cores"}
    with emulated_cluster([CRD, ANCHORS / "kubeflow.org_pytorchjobs.yaml"], tmp) as cluster:
        world = World(cluster, storage)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
               "SOLAR_OPERATOR_POLL_SECONDS": str(args.poll_seconds)}
        if args.base is not None:
            base = args.base.resolve()
            env["PYTHONPATH"] = f"{base / 'operator'}:{base / 'trainer'}"
            env["SOLAR_REPO"] = str(base)
            result["base"] = str(base)
            args.workers = result["workers"] = None
        log = open(tmp / "operator.log", "w")  # noqa: SIM115
        metrics_port, live_port = _port(), _port()
        proc = _start(storage, world.namespace, env, log, metrics_port=metrics_port, live_port=live_port,
                      workers=args.workers)
        try:
            wait_for(lambda: _scrape(metrics_port), timeout=60, message="the first operator's metrics")
            names = [f"run-{i:04d}" for i in range(args.runs)]
            base = load_case("three-stage")
            started = time.monotonic()
            for name in names:
                doc = json.loads(json.dumps(base))
                doc["metadata"]["name"] = name
                doc["spec"]["storage"]["path"] = name
                world.apply(doc)
            _say(f"{args.runs} runs applied in {time.monotonic() - started:.1f}s")
            wait_for(lambda: len(world.jobs()) >= args.runs, timeout=1800, interval=1.0, message="every first job")
            _say("every first job exists; SIGKILL and restart")
            result["first_operator_all_active_seconds"] = round(time.monotonic() - started, 1)
            time.sleep(2)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            metrics_port, live_port = _port(), _port()
            restarted = time.monotonic()
            proc = _start(storage, world.namespace, env, log, metrics_port=metrics_port, live_port=live_port,
                          workers=args.workers)
            prober = Prober(f"http://127.0.0.1:{live_port}/healthz")
            prober.began = restarted
            prober.start()
            wait_for(lambda: _resumed(_scrape(metrics_port)) >= args.runs, timeout=1800, interval=0.25,
                     message="every run's resume reconcile")
            result["restart_to_every_run_reconciled_seconds"] = round(time.monotonic() - restarted, 1)
            _say("every run reconciled by the new process")
            time.sleep(10)  # liveness keeps being asked while the polls go on
            prober.stop.set()
            prober.join()
            up = [t for _, t in prober.answers if t is not None]
            first_ok = next((at for at, t in prober.answers if t is not None), None)
            result["liveness"] = {"asked": len(prober.answers), "first_200_after_start_seconds":
                                  None if first_ok is None else round(first_ok, 2),
                                  "failed_or_over_1s_after_first_200": sum(
                                      1 for at, t in prober.answers
                                      if first_ok is not None and at >= first_ok and (t is None or t > 1.0)),
                                  "answer": distribution(up) if up else None}
            result["operator_after_catch_up"] = _proc_stats(proc.pid)
            assert len(world.jobs()) == args.runs, "a restart must create no job twice"
            result["jobs"] = len(world.jobs())
        finally:
            stop(proc, log)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
