"""The operator under API faults (issue 26 item 2), against the emulated API server made to answer
some requests with 500 or 429 (with Retry-After): Events the server refuses are posted by a later
reconcile in their order, not dropped, and counted; a job create refused with 429 comes back after
the server's Retry-After; triggers of one run are coalesced instead of waiting in the thread pool;
the liveness probe is answered by the event loop."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import kopf
import pytest

from solar_operator import errors as operator_errors
from solar_operator import handlers, metrics
from tests.integration.test_operator_flow import _run, world  # noqa: F401 (the fixture)
from tests.support.kube import ApiError, Slow, wait_for

pytestmark = pytest.mark.timeout(180)


def _events_total(result: str) -> float:
    return metrics.REGISTRY.get_sample_value("solar_operator_events_total", {"result": result}) or 0.0


class Refuse:
    """Answer the first ``times`` requests of ``method`` to paths containing ``fragment`` with
    ``code`` (and a Retry-After when given); count every request it saw."""

    def __init__(self, method: str, fragment: str, times: int, code: int = 500, retry_after: int | None = None):
        self.method, self.fragment, self.left, self.code, self.retry_after = method, fragment, times, code, retry_after
        self.seen: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, method: str, path: str):
        if method != self.method or self.fragment not in path:
            return None
        with self.lock:
            self.seen.append(time.monotonic())
            if self.left <= 0:
                return None
            self.left -= 1
        extra = {"retry_after": self.retry_after} if self.retry_after is not None else {}
        return ApiError(self.code, "TooManyRequests" if self.code == 429 else "InternalError", "injected", **extra)


def test_events_the_server_refuses_are_posted_later_in_order(world):  # noqa: F811
    refuse = Refuse("POST", "/events", times=4)
    world.cluster.emulator.faults.append(refuse)
    retried, dropped = _events_total("retried"), _events_total("dropped")
    with world.operator():
        world.apply(_run("noisy"))
        world.wait_job("noisy-fm-1")
        reasons = wait_for(lambda: (lambda r: r if "StageStarted" in r else None)(world.event_reasons("noisy")),
                           timeout=30, message="the run's first events, posted after the refusals")
        assert reasons[:3] == ["Resolved", "MemoryForecast", "StageStarted"]  # in order, none lost
        assert world.reconciler.pending_events(world.namespace, "noisy") == 0
    assert refuse.left == 0 and _events_total("retried") - retried == 4 and _events_total("dropped") == dropped


def test_a_job_create_refused_with_429_waits_for_retry_after(world):  # noqa: F811
    refuse = Refuse("POST", "/pytorchjobs", times=2, code=429, retry_after=1)
    world.cluster.emulator.faults.append(refuse)
    with world.operator():
        world.apply(_run("busy"))
        job = world.wait_job("busy-fm-1", timeout=30)
    assert job and len(refuse.seen) >= 3
    # Every try after a refusal comes after the server's Retry-After, whichever trigger makes it (the
    # run's creation, its poll): while the run waits, no pass of it starts.
    gaps = [b - a for a, b in zip(refuse.seen, refuse.seen[1:])]
    assert all(gap >= 0.9 for gap in gaps), gaps
    assert sorted(world.jobs()) == ["busy-fm-1"]  # one job, however many tries


def test_retry_after_sets_the_retry_delay_capped():
    class Exc(Exception):
        def __init__(self, status, headers):
            self.status, self.headers, self.body, self.reason = status, headers, None, "x"

    assert operator_errors.translate(Exc(429, {"Retry-After": "7"}), "create").delay == 7.0
    assert operator_errors.translate(Exc(503, {"retry-after": "3600"}), "create").delay == 60.0
    assert operator_errors.translate(Exc(500, {}), "create").delay == 5.0
    assert operator_errors.translate(Exc(429, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}), "x").delay == 5.0
    assert isinstance(operator_errors.translate(Exc(422, {}), "create"), operator_errors.Rejected)
    # the handlers' retries: the server's Retry-After, else 1, 2, 4 ... s by kopf's retry count, capped
    busy = operator_errors.translate(Exc(429, {"Retry-After": "7"}), "x")
    down = operator_errors.translate(Exc(500, {}), "x")
    assert [operator_errors.backoff(down, retry).delay for retry in (0, 1, 3, 10)] == [1.0, 2.0, 8.0, 60.0]
    assert [operator_errors.backoff(busy, retry).delay for retry in (0, 5)] == [7.0, 7.0]


def test_triggers_of_a_busy_run_are_coalesced_not_queued(world):  # noqa: F811
    """Ten triggers while a reconcile of the run is in flight: none waits in the pool, and the
    run is reconciled once more afterwards."""
    from solar_operator.main import reconciler

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("busy"))
    inside, release, passes = threading.Event(), threading.Event(), []
    real = r._reconcile

    def slow(namespace, name):
        passes.append(time.monotonic())
        if len(passes) == 1:
            inside.set()
            release.wait(10)
        return real(namespace, name)

    r._reconcile = slow
    first = threading.Thread(target=r.reconcile, args=(world.namespace, "busy", "create"))
    first.start()
    assert inside.wait(10)
    started = time.monotonic()
    answers = [r.reconcile(world.namespace, "busy", "poll") for _ in range(10)]
    assert answers == [None] * 10 and time.monotonic() - started < 1.0  # returned at once
    release.set()
    first.join(10)
    assert len(passes) == 2  # the pass in flight, and one more for all ten triggers
    coalesced = metrics.REGISTRY.get_sample_value("solar_operator_reconcile_total",
                                                  {"handler": "poll", "result": "coalesced"})
    assert coalesced and coalesced >= 10


def test_a_trigger_that_a_later_pass_covered_runs_no_pass(world):  # noqa: F811
    """A trigger raised before a pass of the run started, which then succeeded, needs no pass of its
    own: that pass read the run and its jobs after it (after a restart a run's job events, resume and
    poll queue up behind one another). A trigger raised after that start still gets its pass, and a
    failed pass covers nothing."""
    from solar_operator.main import reconciler

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("covered"))
    passes, fail = [], []
    real = r._reconcile

    def counting(namespace, name):
        passes.append(time.monotonic())
        if fail:
            raise operator_errors.ApiUnavailable(fail.pop(), delay=1.0)
        return real(namespace, name)

    r._reconcile = counting
    before = time.monotonic()
    r.reconcile(world.namespace, "covered", "create", before)
    assert len(passes) == 1
    assert r.reconcile(world.namespace, "covered", "job", before) is None   # queued before that pass
    assert len(passes) == 1
    covered = metrics.REGISTRY.get_sample_value("solar_operator_reconcile_total",
                                                {"handler": "job", "result": "covered"})
    assert covered and covered >= 1
    r.reconcile(world.namespace, "covered", "poll", time.monotonic())   # raised after it: a pass
    assert len(passes) == 2
    queued = time.monotonic()
    fail.append("chaos: internal error")
    with pytest.raises(operator_errors.ApiUnavailable):
        r.reconcile(world.namespace, "covered", "poll", time.monotonic())
    r.reconcile(world.namespace, "covered", "job", queued)   # the pass after it failed: still runs
    assert len(passes) == 4


def test_the_liveness_probe_is_answered_by_the_event_loop():
    """kopf runs a sync probe in its handler thread pool, where it would wait behind reconciles; the
    operator's probe is a coroutine, and the pool size is the operator's setting."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry, workers=3)
    probes = registry._activities.get_all_handlers()
    (probe,) = [h for h in probes if h.id == "runs"]
    assert inspect.iscoroutinefunction(probe.fn)
    assert asyncio.run(probe.fn()) == len(metrics.RUNS)
    settings = kopf.OperatorSettings()
    (startup,) = [h for h in probes if h.id == "solar-settings"]
    asyncio.run(startup.fn(settings=settings, memo=kopf.Memo()))
    assert settings.execution.max_workers == 3 and settings.process.ultimate_exiting_timeout == 600


@pytest.mark.parametrize("code, retry_after", [(500, None), (429, 1)])
def test_job_deletes_the_server_refuses_are_retried_and_a_failure_counts_once(world, code, retry_after):  # noqa: F811
    """A retry deletes the failed job, a suspend the running one: each delete refused twice (500, or
    429 with a Retry-After) still happens, the failure is counted once (the status is written before
    the delete), and the next attempt starts."""
    refuse = Refuse("DELETE", "/pytorchjobs/", times=2, code=code, retry_after=retry_after)
    world.cluster.emulator.faults.append(refuse)
    with world.operator():
        world.apply(_run("flaky"))
        world.wait_job("flaky-fm-1")
        world.write_stage("flaky", "fm", result="failed", checkpoint=False, steps=(2,), error_type="runtime_error")
        world.set_job("flaky-fm-1", "Failed", "exit code 1")
        wait_for(lambda: (world.jobs().get("flaky-fm-2") or {}).get("metadata", {}).get("labels", {}).get(
            "solarwm.io/attempt") == "2", timeout=60, message="attempt 2 after the refused deletes")
        assert refuse.left == 0 and len(refuse.seen) >= 3
        stage = world.wait_status("flaky", lambda s: (s.get("stages") or [{}])[0].get("attempt") == 2, "attempt 2")
        assert (stage["stages"][0]["failures"], stage["stages"][0]["attempt"]) == (1, 2)
        wait_for(lambda: "StageStarted" in world.event_reasons("flaky")[3:], message="attempt 2's event")
        assert world.event_reasons("flaky").count("JobFailed") == 1

        refuse.left = 2  # and the suspend's delete of the running attempt
        world.set_job("flaky-fm-2", "Running")
        world.patch_spec("flaky", {"runPolicy": {"suspend": True}})
        world.wait_phase("flaky", "Suspended", timeout=60)
        wait_for(lambda: "flaky-fm-2" not in world.jobs(), timeout=60, message="the suspended job to be deleted")
        assert refuse.left == 0
        world.patch_spec("flaky", {"runPolicy": {"suspend": False}})
        job = world.wait_job("flaky-fm-3")
        assert job["metadata"]["labels"]["solarwm.io/attempt"] == "3"
        status = world.wait_phase("flaky", "Running")
        assert (status["stages"][0]["failures"], status["stages"][0]["attempt"]) == (1, 3)


def test_a_retry_whose_status_write_is_refused_deletes_nothing_and_counts_the_failure(world):  # noqa: F811
    """The status write that records a failed attempt comes before the failed job's delete: when the
    server refuses it, the job is still there for the next pass, and the failure is counted (it used to
    be deleted first, and the failure forgotten with it)."""
    with world.operator():
        world.apply(_run("lost"))
        world.wait_job("lost-fm-1")
        world.write_stage("lost", "fm", result="failed", checkpoint=False, steps=(2,), error_type="runtime_error")
        world.wait_status("lost", lambda s: s.get("step") == 2, "the checkpoint seen")
        refuse = Refuse("PATCH", "/solarruns/lost/status", times=1, code=409)
        world.cluster.emulator.faults.append(refuse)
        deletes = Refuse("DELETE", "/pytorchjobs/lost-fm-1", times=0)
        world.cluster.emulator.faults.append(deletes)
        world.set_job("lost-fm-1", "Failed", "exit code 1")
        wait_for(lambda: (world.jobs().get("lost-fm-2") or {}).get("metadata", {}).get("labels", {}).get(
            "solarwm.io/attempt") == "2", timeout=60, message="attempt 2")
        assert refuse.left == 0 and refuse.seen[0] < deletes.seen[0]  # refused before anything was deleted
        status = world.wait_status("lost", lambda s: s["stages"][0].get("attempt") == 2, "attempt 2 recorded")
        assert status["stages"][0]["failures"] == 1


def test_an_api_call_the_server_does_not_answer_in_time_is_retried_later(world):  # noqa: F811
    """A server that takes the request and does not answer: the call ends at its deadline as a
    temporary error (kopf re-runs the handler), instead of holding a worker and the run for ever."""
    from solar_operator.kube import REQUEST_TIMEOUT, Kube, api_client

    assert REQUEST_TIMEOUT[1] <= 60  # the shipped deadline is finite
    world.cluster.emulator.faults.append(lambda method, path: Slow(2) if "/solarruns/hung" in path else None)
    kube = Kube(api_client(world.cluster.url), timeout=(1.0, 0.5))
    started = time.monotonic()
    with pytest.raises(operator_errors.ApiUnavailable, match="get solarrun .*/hung"):
        kube.get_run(world.namespace, "hung")
    assert time.monotonic() - started < 1.5


def test_a_job_event_bringing_nothing_new_needs_no_pass_and_a_failed_pass_skips_nothing(world):  # noqa: F811
    """kopf lists every job again after a start or a broken watch: a job event whose version the run's
    last successful pass already saw is not reconciled again; any newer version is, and so is every
    event after a pass that failed."""
    from solar_operator.main import reconciler

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("quiet"))
    assert r.reconcile(world.namespace, "quiet", "create") is not None
    job = world.jobs()["quiet-fm-1"]
    version = job["metadata"]["resourceVersion"]
    gets = Refuse("GET", "/solarruns/quiet", times=0)
    world.cluster.emulator.faults.append(gets)
    assert r.reconcile(world.namespace, "quiet", "poll") is not None  # this pass saw the job it created
    before = len(gets.seen)
    assert r.job_changed(world.namespace, "quiet", "quiet-fm-1", version) is None and len(gets.seen) == before
    world.set_job("quiet-fm-1", "Running")
    newer = world.jobs()["quiet-fm-1"]["metadata"]["resourceVersion"]
    assert r.job_changed(world.namespace, "quiet", "quiet-fm-1", newer) is not None  # a real change: a pass
    gets.left = 1  # the next pass fails: nothing it saw counts as seen
    world.set_job("quiet-fm-1", "Succeeded")
    latest = world.jobs()["quiet-fm-1"]["metadata"]["resourceVersion"]
    with pytest.raises(operator_errors.ApiUnavailable):
        r.job_changed(world.namespace, "quiet", "quiet-fm-1", latest)
    seen = len(gets.seen)
    r.job_changed(world.namespace, "quiet", "quiet-fm-1", latest)
    assert len(gets.seen) == seen + 1


def test_the_job_a_pass_created_needs_no_pass_of_its_own(world):  # noqa: F811
    """The new job's first event, handled after the pass that created it succeeded, brings nothing
    that pass did not decide with: no pass. (One arriving while that pass runs is still coalesced
    into one more pass: if the creating pass fails, a trigger must be left.)"""
    from solar_operator.main import reconciler

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("fresh"))
    gets = Refuse("GET", "/solarruns/fresh", times=0)
    world.cluster.emulator.faults.append(gets)
    assert r.reconcile(world.namespace, "fresh", "create") is not None
    assert len(gets.seen) == 1
    version = world.jobs()["fresh-fm-1"]["metadata"]["resourceVersion"]
    assert r.job_changed(world.namespace, "fresh", "fresh-fm-1", version) is None and len(gets.seen) == 1
    world.set_job("fresh-fm-1", "Running")
    newer = world.jobs()["fresh-fm-1"]["metadata"]["resourceVersion"]
    assert r.job_changed(world.namespace, "fresh", "fresh-fm-1", newer) is not None and len(gets.seen) == 2


def test_a_final_verdict_is_written_before_its_job_goes_and_a_refused_write_never_retries(world):  # noqa: F811
    """ProgressDeadlineExceeded deletes the silent job: the verdict is written first, listing the job
    in ``status.jobsToDelete``. Its write refused: nothing is deleted. Its delete refused: the
    finished run is polled and the next pass deletes the job. The write clearing the list refused
    after the delete: the next pass clears it. At no point is a second attempt started (the final
    status used to be written after the delete; refused, the next pass took the deleted job for an
    attempt to start again)."""
    from solar_operator.main import reconciler

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("silent", progressDeadlineSeconds=60))
    r.reconcile(world.namespace, "silent", "create")
    world.set_job("silent-fm-1", "Running")
    r.reconcile(world.namespace, "silent", "job")
    r.clock = lambda: time.time() + 3600   # an hour without a sign of life
    writes = Refuse("PATCH", "/solarruns/silent/status", times=1)
    deletes = Refuse("DELETE", "/pytorchjobs/silent-fm-1", times=0)
    world.cluster.emulator.faults += [writes, deletes]

    def active() -> bool:
        return handlers._active(status=world.status("silent"), namespace=world.namespace, name="silent",
                                memo=kopf.Memo(runs=r))

    with pytest.raises(operator_errors.ApiUnavailable, match="patch solarrun .*/silent status"):
        r.reconcile(world.namespace, "silent", "poll")
    assert "silent-fm-1" in world.jobs() and not deletes.seen and world.status("silent")["phase"] == "Running"

    deletes.left = 1
    with pytest.raises(operator_errors.ApiUnavailable, match="delete pytorchjob .*/silent-fm-1"):
        r.reconcile(world.namespace, "silent", "poll")
    status = world.status("silent")
    assert status["phase"] == "Failed" and status["jobsToDelete"] == ["silent-fm-1"] and "silent-fm-1" in world.jobs()
    assert status["stages"][0]["reason"] == "ProgressDeadlineExceeded" and active()
    assert world.event_reasons("silent").count("ProgressDeadlineExceeded") == 1

    writes.left = 1  # the delete goes through, the write clearing the list does not
    with pytest.raises(operator_errors.ApiUnavailable, match="patch solarrun .*/silent status"):
        r.reconcile(world.namespace, "silent", "poll")
    assert "silent-fm-1" not in world.jobs() and world.status("silent")["jobsToDelete"] == ["silent-fm-1"]
    r.reconcile(world.namespace, "silent", "poll")
    status = world.status("silent")
    assert "jobsToDelete" not in status and status["phase"] == "Failed" and not active()
    assert r.reconcile(world.namespace, "silent", "poll") is None and not world.jobs()
    assert (status["stages"][0]["attempt"], status["stages"][0]["phase"]) == (1, "Failed")
    assert world.event_reasons("silent").count("ProgressDeadlineExceeded") == 1 and \
        world.event_reasons("silent").count("StageStarted") == 1


def test_a_run_carries_the_operators_finalizer_until_a_pass_lets_it_go_refusals_retried(world):  # noqa: F811
    """While the operator may create a job for a run, the run carries ``solarwm.io/jobs``, so a delete
    waits for the pass in flight (a pass that read the run before the delete cannot create a job
    after the run's jobs were collected). The pass that sees the delete removes it, and refusals of
    that patch are retried by the operator's poll (kopf gave up its own finalizer's removal after a
    409: the chaos bench's run that stayed deleting for good). No kopf finalizer: the one older
    versions added goes at the run's next event."""
    from solar_operator.runs import FINALIZER

    refused = Refuse("PATCH", "/solarruns/brief", times=3, code=409)
    with world.operator():
        world.apply(_run("brief"))
        world.wait_job("brief-fm-1")
        assert world.run("brief")["metadata"]["finalizers"] == [FINALIZER]
        world.cluster.emulator.faults.append(refused)
        world.cluster.delete(f"{world.runs_path}/brief")
        wait_for(lambda: not world.cluster.list(world.runs_path)["items"], timeout=30,
                 message="the run released after the refused patches")
        assert refused.left == 0 and len(refused.seen) >= 4   # three refused, then the one that went through

        legacy = _run("legacy")
        legacy["metadata"]["finalizers"] = ["solarwm.io/operator"]
        world.apply(legacy)
        world.wait_job("legacy-fm-1")
        wait_for(lambda: world.run("legacy")["metadata"].get("finalizers") == [FINALIZER], timeout=30,
                 message="kopf drops its finalizer, which no handler needs")


def test_a_pass_over_a_deleted_run_lets_it_go_and_creates_nothing(world):  # noqa: F811
    from solar_operator.main import reconciler
    from solar_operator.runs import FINALIZER

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("going"))
    r.reconcile(world.namespace, "going", "create")
    assert world.run("going")["metadata"]["finalizers"] == [FINALIZER] and list(world.jobs()) == ["going-fm-1"]
    world.cluster.delete(f"{world.jobs_path}/going-fm-1")    # the user deletes the run, the collector its
    world.cluster.delete(f"{world.runs_path}/going")         # job; the run waits for the operator
    assert world.run("going")["metadata"].get("deletionTimestamp")
    assert r.reconcile(world.namespace, "going", "poll") is None
    assert world.cluster.list(world.runs_path)["items"] == [] and world.jobs() == {}   # gone, no new job


def test_after_a_retry_after_polls_and_retries_wait_but_a_job_event_is_tried_at_once(world):  # noqa: F811
    from solar_operator.main import reconciler

    r = reconciler(world.storage, url=world.cluster.url)
    world.apply(_run("held"))
    r.reconcile(world.namespace, "held", "create")
    busy = Refuse("GET", "/solarruns/held", times=1, code=429, retry_after=30)
    world.cluster.emulator.faults.append(busy)
    with pytest.raises(operator_errors.ApiUnavailable):
        r.reconcile(world.namespace, "held", "poll")          # refused: the run waits 30 s for retries
    with pytest.raises(operator_errors.ApiUnavailable, match="asked to wait"):
        r.reconcile(world.namespace, "held", "poll")          # no request made
    assert len(busy.seen) == 1
    world.set_job("held-fm-1", "Running")                     # news: tried at once, and it goes through
    version = world.jobs()["held-fm-1"]["metadata"]["resourceVersion"]
    assert r.job_changed(world.namespace, "held", "held-fm-1", version) is not None and len(busy.seen) == 2
    assert r.reconcile(world.namespace, "held", "poll") is not None   # a pass that went through ends the wait
