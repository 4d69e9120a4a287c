"""``solar train`` / ``solar infer`` alone with ``distributed.world_size`` N > 1: start the N ranks on
this machine and exit with their outcome.

Under a launcher (``torchrun``, a PyTorchJob's pods, ``solar run``: ``WORLD_SIZE``/``RANK`` set) the
process is one rank, as always. Alone, instead of refusing a world it is not part of, it starts the
ranks through torch's elastic agent exactly as ``torchrun --standalone --nproc-per-node=N -m solar
train|infer ...`` would (the same environment, rendezvous and signal forwarding), one rank per GPU
(or, without one, per CPU core at most). What differs is the exit status: torchrun exits 1, with a
Python traceback, whenever a rank fails or it receives a signal, so a script cannot tell Ctrl-C from a
crash. Here it carries what the ranks did, as one ``solar train`` would:

    0    complete, or stopped by SIGTERM (run-result.json ``stopped``)
    130  stopped by SIGINT (Ctrl-C): every rank finished its step and saved (run-result.json ``stopped``)
    2    refused or failed (``solar: error:`` lines; ``solar diagnose`` says why a launch failed)
    3    a stale attempt: a newer attempt of the stage (``SOLAR_ATTEMPT``, ``solar.storage.fence``) took
         over the output directory; nothing more was written
    128+N  a rank killed by signal N

A signal to the launcher is forwarded to every rank, and the launcher waits for them up to
``runtime.stop_grace_seconds`` plus a margin (torchrun waits 30 s, then kills them) so a stop's
checkpoint is written before they are killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from solar.errors import SolarError

SHUTDOWN_MARGIN_SECONDS = 30


def exit_status(codes: Sequence[int]) -> int:
    """The launcher's exit status from the failed ranks' exit codes, in rank order. A negative code is a
    rank killed by that signal (the agent ends the other ranks with SIGTERM once one has failed), so the
    first code a rank exited with itself decides; only when every failed rank was killed does the
    first signal (as 128 + signal, a shell's convention)."""
    own = [c for c in codes if c > 0]
    if own:
        return own[0]
    killed = [128 - c for c in codes if c < 0]
    return killed[0] if killed else 0


def after_signal(signum: int, result: Path, started: float) -> int:
    """The exit status after the launcher itself received ``signum`` (forwarded to the ranks, which
    then ended): what this launch's run-result.json records (130 / 0 for a stop by SIGINT / another
    signal, 2 for a failure, as the ranks exit), else 128 + ``signum`` (no outcome was recorded)."""
    try:
        if result.stat().st_mtime >= started:
            status = json.loads(result.read_text()).get("status")
            if status == "stopped":
                return 128 + signal.SIGINT if signum == signal.SIGINT else 0
            if status == "complete":
                return 0
            if status == "failed":
                return 2
    except (OSError, ValueError, AttributeError):
        pass
    return 128 + signum


LAUNCHER_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")


def ranks_to_start(verb: str, config: str, sets: Sequence[str]):
    """The resolved config when this process should start its ranks (``distributed.world_size`` > 1),
    or None when it is the run's only process or already one rank under a launcher. A world this
    machine cannot hold (more ranks than GPUs; without GPUs, than CPU cores) is refused, naming
    torchrun for more nodes."""
    if any(key in os.environ for key in LAUNCHER_ENV):
        return None
    from solar.config.resolve import resolve_file

    cfg = resolve_file(config, sets, expected_action=verb).config   # a refusal here starts nothing
    world = cfg.distributed.world_size
    if world == 1:
        return None
    import torch

    cuda = torch.cuda.is_available() and cfg.runtime.device in ("auto", "cuda")
    capacity, what = (torch.cuda.device_count(), "GPUs") if cuda else (os.cpu_count() or 1, "CPU cores")
    if world > capacity:
        raise SolarError(f"distributed.world_size={world} but this machine has {capacity} {what}; start each node's "
                         f"ranks with torchrun (--nnodes, --nproc-per-node) -m solar {verb}, or set "
                         f"distributed.world_size={capacity} or fewer (with the train.global_batch_size it implies)")
    return cfg


def launch(verb: str, config: str, sets: Sequence[str], cfg) -> int:
    """Run ``solar <verb>`` as ``cfg``'s ``distributed.world_size`` ranks on this machine (``cfg``: the
    config ``ranks_to_start`` resolved); returns the exit status (module doc)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nproc = cfg.distributed.world_size
    print(f"solar: starting {nproc} ranks on this machine for distributed.world_size={nproc} (as torchrun "
          f"--standalone --nproc-per-node={nproc} would)", file=sys.stderr, flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # as torchrun does for more than one rank per machine
    import logging

    # the ranks say what happened in their own lines; the agent's per-process log lines would repeat it
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
        rdzv_endpoint="localhost:0", max_restarts=0,
        shutdown_timeout=int(cfg.runtime.stop_grace_seconds) + SHUTDOWN_MARGIN_SECONDS)
    args = ["-u", "-m", "solar", verb, "--config", config]
    for item in sets:
        args += ["--set", item]
    started = time.time() - 1.0   # run-result.json written by this launch is newer (coarse mtimes included)
    try:
        elastic_launch(launch_config, entrypoint=sys.executable)(*args)
    except ChildFailedError as exc:
        return exit_status([f.exitcode for _, f in sorted(exc.failures.items())])
    except SignalException as exc:
        return after_signal(int(exc.sigval), Path(cfg.runtime.output_dir) / "run-result.json", started)
    return 0
