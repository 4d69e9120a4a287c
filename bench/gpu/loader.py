"""(f) The training data stream against the step's consumption: clips per second that one rank's
``RankStream`` (the trainer's reader: safetensors members in tar shards, validation, camera rebasing,
clip cutting) delivers for the released TI2V-5B Stage0.5 config at 81 frames, on a synthetic
dataset in the released latent layout, against the clips per second one H200 consumes
(bench/RESULTS.md (b): 1.91 s per clip at best, 2.31 s compiled, 2.73 s eager).

    PYTHONPATH=trainer:. python3 bench/gpu/loader.py [--clips 40] [--height 704 --width 1280]

It runs on the CPU (the reader is CPU work); the machine is recorded with the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

# bench/RESULTS.md (b): seconds per clip of one H200 training step at the same shape
STEP_SECONDS = {"compiled_save_attention_skip18": 1.91, "compiled": 2.31, "eager": 2.73}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", type=int, default=40)
    parser.add_argument("--height", type=int, default=704, help="the step bench's resolution (b)")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    from solar.config.resolve import resolve_file
    from solar.data.from_config import train_stream
    from solar.data import synth

    with tempfile.TemporaryDirectory(prefix="solar-loader-") as tmp:
        root = Path(tmp) / "data"
        started = time.perf_counter()
        synth.RESOLUTION["released"]["wan22_ti2v_5b"] = (args.height, args.width)
        synth.synthesize("wan22_ti2v_5b", root, samples=16, seed=1, profile="released")
        made = time.perf_counter() - started
        config = "configs/solar_wm/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml"
        resolved = resolve_file(config, [f"data.root={root}", f"runtime.output_dir={tmp}/run",
                                         "data.train_index=train-index.jsonl.gz",
                                         "data.test_index=test-index.jsonl.gz",
                                         f"data.height={args.height}", f"data.width={args.width}",
                                         "model.pretrained_path=/unused", "model.vae_path=/unused",
                                         "distributed.world_size=1", "train.global_batch_size=1"],
                                expected_action="train")
        stream = train_stream(resolved.config, rank=0)
        stream.next_clip()  # open shards, first read
        started = time.perf_counter()
        for _ in range(args.clips):
            clip = stream.next_clip()
        seconds = time.perf_counter() - started
    rate = args.clips / seconds
    print(json.dumps({"bench": "loader", "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
                      "clips": args.clips, "height": args.height, "width": args.width, "clips_per_s": rate, "latents_shape": list(clip.clip.latents.shape),
                      "synth_seconds": made,
                      "headroom_vs_step": {k: rate * v for k, v in STEP_SECONDS.items()}}))


if __name__ == "__main__":
    main()
