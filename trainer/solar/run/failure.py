"""A failed job: retry the stage while its failures stay within ``runPolicy.backoffLimit``.

A retry deletes the failed job (stage jobs have deterministic names) and the next attempt resumes
from the stage's newest verified checkpoint (``resume.py``). Past the limit the run fails and the
last job is kept, so its pods can be inspected until ``ttlSecondsAfterFinished``. Suspending and
resuming never counts as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    retry: bool
    failures: int          # failures of this stage so far, this one included
    detail: str            # what failed, for the condition message and the event


# A full or failing volume (run-result error_type): a retry would meet the same volume and, for a
# full one, fill it again; the stage fails at once, its retries unspent.
NOT_RETRIED = ("storage_full", "storage_error")
# The trainer's exit code for a SolarError. Exiting with it before its launch wrote anything (no new launch
# record) is a refusal of its input (a config, data or checkpoint the user gave): a retry would meet the same
# input, so the stage fails at once (InputRefused) and a spec change continues it. A launch that ran and then
# failed with it (OOM, non-finite loss, a collective) is retried as any failure.
INPUT_ERROR_EXIT = 2
# Under the operator the exit code is torchrun's (1 for any failed rank), so the trainer also leaves a
# refusal in its container's termination message with this prefix (solar.launch.session.note_refusal),
# which the operator reads from the failed attempt's pods.
REFUSED_PREFIX = "solar: refused: "


def on_job_failed(*, failures: int, backoff_limit: int, job_message: str = "",
                  result_message: str | None = None, result_error: str | None = None) -> Verdict:
    detail = "; ".join(dict.fromkeys(m for m in (job_message, result_message) if m)) or "no message"
    failures += 1
    return Verdict(failures <= backoff_limit and result_error not in NOT_RETRIED, failures, detail)
