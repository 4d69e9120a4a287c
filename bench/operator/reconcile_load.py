"""Operator under load: N concurrent SolarRuns on the emulated API server, the real ``solar-operator``.

Measures, for the shipped operator process (kopf + solar_operator) talking HTTP to the test-side
API server emulator (tests/support/kube.py), with every run's stage directory on local disk:

- first job: SolarRun created -> its first PyTorchJob created (all N applied at once);
- next job:  the stage's files written (run-result, verified checkpoint, validation marker) and the
  job marked Succeeded (what a finishing trainer and the training operator do) -> the next
  stage's PyTorchJob created; once as a burst (all N together) and once paced (one run every
  ``--pace`` seconds, the steady state of a busy cluster);
- the operator's resident memory (VmRSS, VmHWM) and CPU seconds, idle with N active runs and
  after the bursts;
- peer: the API calls one "next job" reconcile needs (GET the run, LIST its jobs, POST the job,
  PATCH the status), made back to back by one client in this process against the same server,
  so the operator's latency reads as a ratio to the floor this server sets.

Job creation times are taken from a watch on PyTorchJobs (arrival time here), so they include the
emulator and the watch. Prints one JSON document.

    .venv/bin/python bench/operator/reconcile_load.py --runs 200
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.integration.world import CRD, World, load_case  # noqa: E402
from tests.support.crd_schema import ANCHORS  # noqa: E402
from tests.support.kube import emulated_cluster, wait_for  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Vm")}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"rss_mib": int(fields["VmRSS"]) / 1024, "hwm_mib": int(fields["VmHWM"]) / 1024,
            "cpu_seconds": (int(stat[11]) + int(stat[12])) / ticks}


class JobWatch(threading.Thread):
    """Arrival time of every PyTorchJob ADDED event (one long watch)."""

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(daemon=True)
        self.url = f"{url}/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs?watch=true&timeoutSeconds=3600"
        self.added: dict[str, float] = {}

    def run(self) -> None:
        with urllib.request.urlopen(self.url, timeout=3700) as resp:
            for line in resp:
                event = json.loads(line)
                if event["type"] == "ADDED":
                    self.added.setdefault(event["object"]["metadata"]["name"], time.monotonic())


def distribution(values: list[float], *, unit: str = "ms", quantiles=(0.5, 0.9, 0.99)) -> dict:
    """n, the quantiles, max and mean of ``values`` (seconds), in ``unit``: ms (0.1 ms) or s (0.01 s)."""
    ordered = sorted(values)
    scale, digits = (1000, 1) if unit == "ms" else (1, 2)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
    return {"n": len(ordered), **{f"p{round(q * 100)}_{unit}": round(pick(q) * scale, digits) for q in quantiles},
            f"max_{unit}": round(ordered[-1] * scale, digits),
            f"mean_{unit}": round(statistics.fmean(ordered) * scale, digits)}


def _advance(world: World, names: list[str], stage: str, nxt: str, watch: JobWatch, pace: float) -> list[float]:
    started = {}
    for name in names:
        world.write_stage(name, stage)
        started[name] = time.monotonic()
        world.set_job(f"{name}-{stage}", "Succeeded")
        if pace:
            time.sleep(pace)
    wait_for(lambda: all(f"{n}-{nxt}" in watch.added for n in names), timeout=600, interval=0.05,
             message=f"every {nxt} job")
    return [watch.added[f"{n}-{nxt}"] - started[n] for n in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--poll-seconds", type=float, default=10.0, help="SOLAR_OPERATOR_POLL_SECONDS")
    parser.add_argument("--pace", type=float, default=0.05, help="seconds between runs in the paced phase")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="solar-operator-bench-"))
    storage = tmp / "runs"
    storage.mkdir()
    result = {"runs": args.runs, "poll_seconds": args.poll_seconds, "machine": f"{os.cpu_count()} cores"}
    with emulated_cluster([CRD, ANCHORS / "kubeflow.org_pytorchjobs.yaml"], tmp) as cluster:
        world = World(cluster, storage)
        metrics_port = _port()
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
               "SOLAR_OPERATOR_POLL_SECONDS": str(args.poll_seconds)}
        log = open(tmp / "operator.log", "w")  # noqa: SIM115
        proc = subprocess.Popen([str(Path(sys.executable).with_name("solar-operator")), "--standalone", "-n",
                                 world.namespace, "--storage-root", str(storage), "--metrics-port",
                                 str(metrics_port)], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: _scrape(metrics_port), timeout=60, message="the operator's metrics endpoint")
            result["operator_started"] = _proc_stats(proc.pid)
            watch = JobWatch(cluster.url, world.namespace)
            watch.start()
            time.sleep(0.5)
            names, created = [f"run-{i:03d}" for i in range(args.runs)], {}
            base = load_case("three-stage")
            for name in names:
                doc = json.loads(json.dumps(base))
                doc["metadata"]["name"] = name
                doc["spec"]["storage"]["path"] = name
                created[name] = time.monotonic()
                world.apply(doc)
            wait_for(lambda: all(f"{n}-fm" in watch.added for n in names), timeout=600, interval=0.05,
                     message="every first job")
            result["first_job_after_create"] = distribution([watch.added[f"{n}-fm"] - created[n] for n in names])
            time.sleep(2)
            before = _proc_stats(proc.pid)
            time.sleep(args.idle)
            after = _proc_stats(proc.pid)
            result["idle_with_active_runs"] = {**after, "seconds": args.idle,
                                               "cpu_fraction": round((after["cpu_seconds"] - before["cpu_seconds"])
                                                                     / args.idle, 3)}
            result["next_job_burst"] = distribution(_advance(world, names, "fm", "anyflow", watch, 0.0))
            result["next_job_paced"] = distribution(_advance(world, names, "anyflow", "generate", watch, args.pace))
            result["pace_seconds"] = args.pace
            result["operator_end"] = _proc_stats(proc.pid)
            result["peer_api_calls"] = distribution(_peer(world, names[0]))
            result["ratio_paced_p50_to_peer_p50"] = round(result["next_job_paced"]["p50_ms"]
                                                          / result["peer_api_calls"]["p50_ms"], 2)
            text = _scrape(metrics_port)
            result["reconcile_duration"] = _histogram(text, "solar_operator_reconcile_duration_seconds")
        finally:
            stop(proc, log)
    print(json.dumps(result, indent=2))


def stop(proc: subprocess.Popen, log) -> None:
    """SIGTERM the operator, SIGKILL it if it is still there 30 s later, close its log."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _peer(world: World, name: str, repeat: int = 50) -> list[float]:
    """The floor: the four API calls of a next-job reconcile, made directly and back to back."""
    job = world.jobs()[f"{name}-generate"]
    times = []
    for i in range(repeat):
        body = json.loads(json.dumps(job))
        body["metadata"] = {"name": f"peer-{i}", "namespace": world.namespace,
                            "labels": {"solarwm.io/run": "peer"}}
        started = time.monotonic()
        world.cluster.get(f"{world.runs_path}/{name}")
        world.cluster.list(world.jobs_path, labelSelector="solarwm.io/run=peer")
        world.cluster.create(world.jobs_path, body)
        world.cluster.patch(f"{world.runs_path}/{name}/status", {"status": {"step": i}})
        times.append(time.monotonic() - started)
    return times


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return None


def _histogram(text: str, name: str) -> dict:
    """Per handler: count and mean seconds of the operator's own reconcile histogram."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        for suffix in ("_count", "_sum"):
            if line.startswith(name + suffix + "{"):
                handler = line.split('handler="')[1].split('"')[0]
                out.setdefault(handler, {})[suffix[1:]] = float(line.rsplit(" ", 1)[1])
    return {h: {"count": int(v["count"]), "mean_ms": round(1000 * v["sum"] / max(v["count"], 1), 1)}
            for h, v in out.items()}


if __name__ == "__main__":
    main()
