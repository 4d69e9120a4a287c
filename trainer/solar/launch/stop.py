"""Stopping a launch on a signal, the same for ``solar train`` and ``solar infer`` (contract.md §3).

The first SIGTERM or SIGINT asks the launch to stop at its next consistent point (training: after
the step, with a checkpoint when ``runtime.checkpoint_on_stop``; inference: after the round of
slots, each finished slot kept); every rank agrees on it in one collective, run-result.json records
``stopped`` and the process exits 130 after SIGINT (Ctrl-C), 0 after SIGTERM (what a pod eviction,
a preemption and ``solar run`` send, which the operator and ``solar run`` read from run-result.json).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass

import torch


@dataclass
class Stop:
    """A stop asked for by a signal. ``signum`` is the first signal this process received (None
    without one); ``agreed`` the signal every rank stops for (``agree``), which decides the exit
    status: SIGINT (Ctrl-C) 130, so ``solar train ... && next`` does not go on; SIGTERM (a pod
    eviction, a preemption, ``solar run`` stopping a stage) 0, as the operator expects."""
    requested: bool = False
    signals: int = 0
    signum: int | None = None
    agreed: int | None = None

    def install(self, grace_seconds: float = 120.0, finishing: str = "the step") -> None:
        """The first SIGTERM/SIGINT asks the loop to stop after the step (and save); a second one, or
        ``grace_seconds`` without the loop having ended (a rank stuck in a collective), exits at once.
        Committed checkpoints are durable either way."""
        import os
        import threading

        def handler(signum, frame):
            self.signals += 1
            if self.signals > 1:  # a second signal: leave now; committed state is already durable
                sys.stderr.write("solar: second signal, exiting immediately\n")
                os._exit(128 + signum)
            self.requested = True
            self.signum = signum
            sys.stderr.write(f"solar: {signal.Signals(signum).name} received; finishing {finishing}\n")

            def overdue():
                sys.stderr.write(f"solar: still running {grace_seconds:g}s after {signal.Signals(signum).name} "
                                 "(runtime.stop_grace_seconds); exiting now\n")
                sys.stderr.flush()
                os._exit(128 + signum)
            timer = threading.Timer(grace_seconds, overdue)
            timer.daemon = True
            timer.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler)

    def agree(self, dist, name: str = "stop-check") -> bool:
        """Whether any rank asks to stop, in one collective like ``Dist.any_flag``; every rank learns
        the same signal (SIGTERM over SIGINT when ranks received different ones: an eviction wins)."""
        return self.agree_with(dist, 0.0, name)[0]

    def agree_with(self, dist, value: float, name: str = "stop-check") -> tuple[bool, float]:
        """``agree``, and in the same collective the largest ``value`` (>= 0) any rank passes: a number
        one rank alone knows and every rank learns without another collective (training: rank 0's
        ``SaveClock`` reading, the others passing 0)."""
        mine, shared = (self.signum or signal.SIGTERM) if self.requested else 0, float(value)
        if dist.initialized:
            t = torch.tensor([float(mine), shared], dtype=torch.float64,
                             device=dist.device if dist.backend == "nccl" else "cpu")
            dist.all_reduce(t, name, op=torch.distributed.ReduceOp.MAX)
            signum, shared = t.tolist()
            mine = int(signum)
        if mine:
            self.agreed = mine
        return bool(mine), shared

    def exit_code(self) -> int:
        """The process's exit status after a stop: 130 for SIGINT, 0 otherwise."""
        return 128 + signal.SIGINT if self.agreed == signal.SIGINT else 0
