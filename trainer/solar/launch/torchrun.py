"""``python -m solar.launch.torchrun [torchrun's arguments]``: torchrun, exiting as its ranks did.

torchrun (torch's elastic agent) turns a SIGTERM into an exception: it passes the signal on to the
ranks, waits for them (30 s by default, then SIGKILL) and exits 1 with a Python traceback, whatever
they did. A rank stopped by SIGTERM saves a checkpoint and exits 0, but the process a pod's container
runs is the agent, so the pod of a stage the operator stopped, or a node drain evicted, reads as
failed. This is the same agent with the same arguments (``torch.distributed.run``'s parser: PET_*
variables, rendezvous, ``--nnodes``, ``--standalone``...), except for SIGTERM: the agent passes it to
each rank's process group itself and goes on watching them, so it ends as they end. Its exit status:

    0    every rank exited 0 (complete, or stopped by SIGTERM at a checkpoint: run-result.json ``stopped``)
    N    the first exit status a failed rank gave itself (``solar train``'s: 2 refused or failed, 3 stale
         attempt, 130 stopped by SIGINT, 128+N ended by signal N), in rank order
    128+N  every failed rank was killed by signal N; or the agent itself ended by signal N (SIGINT,
         SIGHUP, SIGQUIT stay torchrun's: passed on, waited for, then this status)

The same statuses as ``solar train`` alone with world_size N > 1 (``solar.launch.launcher``), which
starts its ranks through the same agent. The operator's pods (``solar_operator.jobs.LAUNCHER``) and
``solar run`` start this module: a PyTorchJob whose Master container exits 0 after a stop reads
Succeeded (a TrainJob Complete), and the state machine resumes a stage whose job reads Succeeded while
its run-result.json says ``stopped`` after a new checkpoint (``StageStopped``, not counted).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from solar.launch.launcher import exit_status

HANDLED_BY_TORCH = "SIGINT,SIGHUP,SIGQUIT"   # torchrun's default list without SIGTERM


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the agent's ranks: each leads its own session)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.append(int(name))
    return sorted(found)


def forward(signum: int, _frame) -> None:
    """SIGTERM to every rank's process group; the agent keeps watching them. Before the ranks exist
    (rendezvous) there is nothing to stop: the agent ends as torchrun would."""
    ranks = children(os.getpid())
    if not ranks:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
    for pid in ranks:
        try:
            os.killpg(pid, signum)
        except OSError:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
    os.write(2, f"solar: {signal.Signals(signum).name} passed to {len(ranks)} rank(s); waiting for them to "
                f"stop\n".encode())


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(list(sys.argv[1:] if argv is None else argv))
    wanted = [s.strip() for s in args.signals_to_handle.split(",") if s.strip() and s.strip() != "SIGTERM"]
    args.signals_to_handle = ",".join(wanted) or HANDLED_BY_TORCH
    signal.signal(signal.SIGTERM, forward)
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        failures = sorted(exc.failures.items())
        code = exit_status([f.exitcode for _, f in failures])
        ranks = ", ".join(f"rank {rank} {f.exitcode}" for rank, f in failures)
        print(f"solar: ranks ended: {ranks} (exit status {code})", file=sys.stderr, flush=True)
        return code
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
