"""The ``error_type`` a failed launch records in run-result.json (and the diagnosis reads)."""

from __future__ import annotations

import re

from solar.launch.distributed import CollectiveFailure
from solar.storage.checkpoints import CheckpointError


def error_type_of(exc: BaseException) -> str:
    """The class a failure in the forward or backward belongs to (run-result error_type)."""
    if "OutOfMemory" in type(exc).__name__:
        return "oom"
    text = str(exc)
    if isinstance(exc, (RuntimeError, ValueError, IndexError)) and (any(k in text for k in (
            "shape", "size of tensor", "sizes of tensors", "mat1 and mat2", "dimension", "Expected size"))
            or re.search(r"\[\d+(, \d+)+\].*\bgot \[\d+(, \d+)+\]", text)):
        return "shape"
    return "error"


def error_type(exc: BaseException) -> str:
    """The class of whatever ended a launch: the agreed class of a collective failure, checkpoint,
    data, a collective timeout, or the step classes of ``error_type_of``."""
    if isinstance(exc, CollectiveFailure):
        return exc.error_type
    if isinstance(exc, CheckpointError):
        return "checkpoint"
    name, text = type(exc).__name__, str(exc)
    if name == "DataError":
        return "data"
    if ("DistBackendError" in name or "timed out" in text.lower() or "timeout" in text.lower()) and (
            "gloo" in text.lower() or "nccl" in text.lower() or "collective" in text.lower() or "DistBackend" in name):
        return "collective_timeout"
    return error_type_of(exc)


def describe(exc: BaseException) -> str:
    """``Type: message`` (once) for run-result and events."""
    name = type(exc).__name__
    return str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
