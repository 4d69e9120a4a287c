"""Write a large synthetic index (default 1.5 million rows, 100 rows per shard) for benchmarks.

    python bench/data/make_index.py OUT.jsonl.gz [--rows N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--rows-per-shard", type=int, default=100)
    args = parser.parse_args()
    rng = random.Random(0)
    with gzip.open(args.out, "wt", compresslevel=6) as handle:
        for i in range(args.rows):
            shard = i // args.rows_per_shard
            row = {"sample_id": f"clip-{i:08d}", "key": f"{i:08d}",
                   "shard": f"shards/train-{shard:06d}.tar", "num_frames": 153,
                   "fps": 16.0, "height": 480, "width": 864, "dataset": "synthetic",
                   "caption": f"a camera moves through scene {rng.randrange(10**6)}"}
            if i % 10 == 0:
                row["epoch_repeats"] = 2
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
