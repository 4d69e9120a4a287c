"""A rank never outlives its launcher (issue 45 item 6).

A rank started by a launcher (torchrun's agent, ``solar train``'s own, a pod's torchrun) asks the
kernel for SIGKILL when that parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``): a launcher killed with
SIGKILL, or dead by any other means, takes its ranks with it instead of leaving them training and
committing checkpoints that nobody watches. A launcher that stops normally still stops its ranks
itself (SIGTERM: the step finishes and a checkpoint is saved); the parent-death signal only acts
when it cannot. Committed checkpoints are durable; a save in flight is left partial and never taken
for a checkpoint. ``solar run`` starts each stage's torchrun agent the same way
(``parent_death_signal`` before its exec), so SIGKILL of ``solar run`` takes the agents, and they
their ranks. No torch import.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def launched_by_agent(environ=os.environ) -> bool:
    """Whether this process is a rank its launcher started (torchrun and solar's launcher set these)."""
    return "LOCAL_RANK" in environ and "TORCHELASTIC_RUN_ID" in environ


def parent_death_signal(sig: int = int(signal.SIGKILL)) -> bool:
    """Ask the kernel for ``sig`` when this process's parent dies (Linux); False where it cannot. Also a
    ``subprocess.Popen(preexec_fn=...)`` for a child that must not outlive the process starting it (the
    setting survives the exec)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(environ=os.environ) -> bool:
    """On Linux, for a rank started by a launcher: SIGKILL this process when its parent dies, and at once
    when the parent is already gone. Returns whether the request was made."""
    if not launched_by_agent(environ):
        return False
    parent = os.getppid()
    if not parent_death_signal():
        return False
    if os.getppid() != parent:   # the launcher died between this process's start and the request
        os.kill(os.getpid(), signal.SIGKILL)
    return True
