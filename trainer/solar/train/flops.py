"""Model FLOPs of a DiT training step and the peak they are measured against (performance.md).

Per clip: linear ``6 * N_tok * s`` (N_tok: matmul parameters every token touches — self-attention
QKVO 4d², cross-attention Q,O 2d², FFN 2·d·ffn per layer) plus self-attention ``14 * L * d * s²``
(forward 4·L·d·s², backward 2.5x). ``s`` counts video tokens only; text, audio and context rows are
left out, so MFU is a slight underestimate for packed or teacher-forcing sequences. TI2V-5B at 81
frames 704x1280 (s = 18,480) is about 0.92 PFLOP per clip.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Dense bf16 tensor-core peaks (FLOP/s) by a substring of the CUDA device name.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "H20": 148e12, "B200": 2250e12, "GB200": 2500e12,
             "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L4": 121e12}


def train_flops_per_clip(*, layers: int, hidden: int, ffn: int, tokens: int) -> float:
    per_token_params = layers * (4 * hidden * hidden + 2 * hidden * hidden + 2 * hidden * ffn)
    return 6.0 * per_token_params * tokens + 14.0 * layers * hidden * float(tokens) ** 2


def peak_flops(device_name: str | None, environ: Mapping[str, str] = os.environ) -> float | None:
    """``SOLAR_PEAK_FLOPS`` (FLOP/s) when set, else the table's entry for the device; None on CPU
    or an unknown device (no MFU is reported rather than a wrong one)."""
    given = environ.get("SOLAR_PEAK_FLOPS")
    if given:
        return float(given)
    if not device_name:
        return None
    for key in sorted(PEAK_BF16, key=len, reverse=True):  # "GB200" before "B200", "H200" before "H20"
        if key in device_name:
            return PEAK_BF16[key]
    return None
