"""diffusers, imported with its torchao support switched off.

Solar uses diffusers' codecs, schedulers and checkpoint converters, never its quantizers. When
torchao is installed (the optional FP8 recipes, ``solar.train.fp8``), diffusers imports it at its own
import to register torchao's tensor types, and that import printed lines that are not Solar's at
every launch (torchao's compiled kernels that do not load on this torch, diffusers' "Unable to
import `torchao` Tensor objects", torch's note on torchao's enums). With this, torchao is imported
only by a run that asks for FP8, and quietly (``fp8._float8``).
"""

from __future__ import annotations


def prepare() -> None:
    """Call before any other import of diffusers (idempotent; the first import decides)."""
    import diffusers.utils.import_utils as available

    available._torchao_available = False
