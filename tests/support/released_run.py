"""A run directory of the released Stage0.5 cadence, built by hand in seconds (no training):
configs/solar_wm/wan22_ti2v_5b/train_stage0p5_fm_81f.yaml trains 30,000 steps and validates every
500 with two passes (live-unipc, ema-unipc); each validation step keeps 4 slots' compare videos per
pass for the report. Rank 0's events hold every step (loss, grad norm, lr, step time), a checkpoint
and a validation event every 500 steps; the first launch is killed after step 12,345 and a second
resumes from step 12,000 to the end. The videos are one real H.264 file of noise frames whose
middle frame makes a thumbnail of about 100 KB as a data URI (what the issue measured: about 98 KB),
hard-linked into every slot. ``stage2`` writes a Stage2 run instead: the critic's loss about 2, the
student's (every 5th step) about 0.05-0.1."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tests.support.run_dirs import T0, Run

STEPS, EVERY, PASSES, SLOTS = 30_000, 500, ("live-unipc", "ema-unipc"), 4
KILLED_AT, RESUMED_FROM = 12_345, 12_000


def noise_video(path: Path, width: int = 320, height: int = 80, frames: int = 3) -> Path:
    import av
    import numpy as np

    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "10"}
        for _ in range(frames):
            image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _step(n: int, t: float, *, stage2: bool, ratio: int = 5) -> dict:
    lr = 1e-4 * min(1.0, n / 1000)
    loss = 0.3 + 0.5 * math.exp(-n / 5000) + 0.02 * math.sin(n / 7)
    event = {"event": "step", "step": n, "time": T0 + t, "loss": loss, "loss_mean": loss, "grad_norm": 0.5 + 0.1 *
             math.cos(n / 11), "lr": lr, "step_seconds": 1.0}
    if stage2:
        updated = n > 1 and (n - 1) % ratio == 0
        event.update(loss=2.0 + loss, loss_mean=2.0 + loss, student_updated=updated, student_step=(n - 1) // ratio)
        if updated:
            student = 0.05 + 0.05 * math.exp(-n / 8000) + 0.005 * math.sin(n / 3)
            event.update(student_loss=student, student_loss_mean=student, student_grad_norm=0.2, student_lr=lr,
                         losses={"critic": 2.0 + loss, "student": student})
    return event


def released(root: Path, *, stage2: bool = False, steps: int = STEPS, video: Path | None = None) -> Run:
    """The run directory (module docstring); ``video``: the compare video every slot links to
    (None: no validation outputs)."""
    run = Run(root, f"train.max_steps={steps}", f"runtime.save_every={EVERY}", f"runtime.validate_every={EVERY}")
    killed, back = min(KILLED_AT, steps - 1), min(RESUMED_FROM, steps - 1) // EVERY * EVERY
    lines = []

    def launch(first: int, last: int, t0: float) -> float:
        t = t0
        lines.append({"event": "start", "time": T0 + t, "rank": 0, "world": 1})
        for n in range(first, last + 1):
            t += 1.0
            lines.append(_step(n, t, stage2=stage2))
            if n % EVERY == 0:
                lines.append({"event": "checkpoint", "step": n, "time": T0 + t + 0.5, "seconds": 0.5,
                              "path": str(root / "checkpoints" / f"step_{n:08d}")})
                lines.append({"event": "validation", "step": n, "time": T0 + t + 0.6, "passes": list(PASSES),
                              "slots": SLOTS * len(PASSES), "ok_slots": SLOTS * len(PASSES), "error_slots": 0})
        return t

    run.launch()
    end = launch(1, killed, 0.0)
    run.launch(resume_from=back)
    launch(back + 1, steps, end + 120.0)
    lines.append({"event": "complete", "time": lines[-1]["time"] + 1})
    (root / "events").mkdir(exist_ok=True)
    with open(root / "events" / "rank-00000.jsonl", "w") as fh:
        fh.writelines(json.dumps({"rank": 0, **e}) + "\n" for e in lines)
    last = next(e for e in reversed(lines) if e["event"] == "step")
    run.result("complete", final={k: last.get(k) for k in ("step", "loss", "grad_norm", "step_seconds", "student_step")
                                  if k in last},
               usage={"gpu_seconds": 18_000.0, "attempts": [   # the killed launch recorded no attempt
                   {"status": "complete", "world_size": 1, "device": "cpu", "wall_seconds": 18_000.0,
                    "gpu_seconds": 18_000.0}]})
    if video is not None:
        for n in range(EVERY, steps + 1, EVERY):
            place = root / "validation" / f"step_{n:08d}"
            for name in PASSES:
                for slot in range(SLOTS):
                    folder = place / name / f"slot_{slot:06d}"
                    folder.mkdir(parents=True)
                    (folder / "manifest.json").write_text(json.dumps({"status": "ok", "sample_id": f"s{slot}"}))
                    os.link(video, folder / "compare.mp4")
                (place / name / "COMPLETE.json").write_text("{}")
            (place / "COMPLETE.json").write_text("{}")
    return run
