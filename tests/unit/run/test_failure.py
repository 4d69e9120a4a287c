"""failure.py: retry within backoffLimit, then give up (table-driven, pure)."""

from __future__ import annotations

import pytest

from solar.run.failure import on_job_failed


@pytest.mark.parametrize("failures, limit, retry", [(0, 3, True), (2, 3, True), (3, 3, False), (0, 0, False),
                                                    (0, 1, True), (1, 1, False)])
def test_retries_while_failures_stay_within_the_limit(failures, limit, retry):
    verdict = on_job_failed(failures=failures, backoff_limit=limit)
    assert (verdict.retry, verdict.failures) == (retry, failures + 1)


@pytest.mark.parametrize("job, result, detail", [
    ("", None, "no message"),
    ("exit code 1", None, "exit code 1"),
    ("exit code 1", "data error: shard x", "exit code 1; data error: shard x"),
    ("same", "same", "same"),
    ("", "oom", "oom"),
])
def test_the_detail_joins_what_the_job_and_the_run_result_say(job, result, detail):
    assert on_job_failed(failures=0, backoff_limit=1, job_message=job, result_message=result).detail == detail
