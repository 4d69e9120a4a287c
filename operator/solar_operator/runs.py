"""Reconciling one SolarRun: observe -> decide (``solar.run.machine``) -> act -> write status -> events.

Every kopf handler (create, resume, spec update, the poll, a change of one of the run's
PyTorchJobs) ends in ``Reconciler.reconcile(namespace, name)``. It reads the run fresh from the
API server rather than trusting the handler's body, and reconciles of one run never overlap, so the
handlers may fire in any order and any number of times. They are coalesced rather than queued: a
trigger that arrives while the run is being reconciled only marks it, returns at once (no worker
of kopf's shared pool waits on another), and the reconcile in flight runs once more when it ends,
however many triggers arrived meanwhile. The decision is a
function of the stored status and what is observed (the run's jobs by label and owner, its stage
directories under ``--storage-root``): restarting the operator loses nothing, and a job created
just before a restart is adopted rather than created twice.

Status is written once per reconcile, only when it changed, after the jobs it records are created
(a job created just before a failed write is adopted by the next pass) and before the jobs it retries
or suspends are deleted (a failed job's count must not go with it); events go out after the write,
so an event never announces a transition the status does not show. A final verdict that deletes a
job (ProgressDeadlineExceeded) is written before the delete too, with the job in
``status.jobsToDelete``, and written again without it once the job is gone: a refused write can
never leave a deleted job and an unfinished status (which the next pass would take for a job to
start again), and a refused delete is done by the next pass over the finished run (finished runs
are otherwise not reconciled; the poll goes on while the list is not empty).

A run the operator may still create a job for carries ``FINALIZER``, added by its first pass and
removed by the first pass that finds it finished or being deleted: passes never overlap, so a delete
waits for the pass in flight, and no job is created after its run and the run's jobs are gone. The
poll (``polling.Poller``) is the operator's own, not a kopf timer, which would put kopf's finalizer
on every run and remove it with a patch of its own that, refused, nothing retried.

An Event the API server refuses (5xx, 429, a timeout) is kept and posted again by the run's next
reconciles, up to ``EVENT_ATTEMPTS`` tries, then counted as dropped
(``solar_operator_events_total{result}``); nothing is lost silently.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import kopf
from pydantic import ValidationError

from solar.diagnose import failure_summary
from solar.run import conditions as C
from solar.run import elastic, machine
from solar.run.observe import LazyStageFiles, observe_stage
from solar.run.plan import RunInvalid, RunPlan, plan_run
from solar.run.spec import SolarRunSpec, SolarRunStatus, first_error
from solar_operator import capacity, errors, metrics
from solar_operator.jobs import ATTEMPT_LABEL, RUN_LABEL, STAGE_LABEL, JobBackend, stage_resources

log = logging.getLogger("solar_operator")
STATUS_KEYS = tuple(SolarRunStatus.model_fields)


def merge_diff(old: dict, new: dict) -> dict:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new`` (nulls delete; lists replace)."""
    patch = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            inner = merge_diff(before, value)
            if inner:
                patch[key] = inner
        elif value != before:
            patch[key] = value
    return patch


NODE_LOST_SECONDS = 60.0   # --node-lost-seconds: a stage without elastic.nodeLostSeconds (same default)
FINALIZER = "solarwm.io/jobs"   # on a run the operator may still create a job for (``_keep_finalizer``)
EVENT_ATTEMPTS = 5   # tries of one Event (its first post and four later reconciles) before it counts as dropped


def _may_grow(p, previous: SolarRunStatus | None, job, room: int | None) -> bool:
    """Stage ``p`` runs shrunk and ``room`` holds a larger allowed shape (``elastic.grown``, as the state
    machine asks it): the machine may grow it back in this pass."""
    recorded = next((s for s in previous.stages if s.name == p.name), None) if previous is not None else None
    shape = recorded.elastic if recorded is not None else None
    return job is not None and job.phase in ("Running", "Restarting") and shape is not None \
        and elastic.grown(p.elastic, nodes=shape.nodes, capacity=room) is not None


def _may_shrink(p, spec, previous: SolarRunStatus | None, pods, now: float) -> bool:
    """Stage ``p``'s pods are unschedulable and have been for shrinkAfterSeconds by the status: the machine
    may shrink it in this pass."""
    recorded = next((s for s in previous.stages if s.name == p.name), None) if previous is not None else None
    since = machine.parse_iso(recorded.elastic.unschedulableSince) if recorded is not None and \
        recorded.elastic is not None else None
    settings = machine.elastic_settings(spec, p.name)
    return pods.unschedulable and since is not None and settings is not None \
        and now - since >= settings.shrinkAfterSeconds


class Reconciler:
    def __init__(self, kube, backend: JobBackend, *, storage_root: Path, repo: Path, clock=time.time,
                 read_nodes: bool = False, node_lost_seconds: float = NODE_LOST_SECONDS) -> None:
        self.kube, self.backend = kube, backend
        self.capacity = capacity.View(kube, read_nodes=read_nodes)
        self.node_lost_seconds = node_lost_seconds   # the grace of stages without elastic.nodeLostSeconds
        self.storage_root, self.repo, self.clock = Path(storage_root), Path(repo), clock
        self._guard = threading.Lock()   # held only to read or flip the flags below, never across I/O
        self._running: set[tuple[str, str]] = set()
        self._again: dict[tuple[str, str], str] = {}   # run -> the handler of its first coalesced trigger
        # Events still to post, per run: [kind, reason, message, tries]
        self._events: dict[tuple[str, str], list[list]] = {}
        self._plans: dict[str, tuple[int, RunPlan | RunInvalid]] = {}  # uid -> (generation, plan)
        # run -> {job: resourceVersion} its last successful pass saw: a job event that brings nothing
        # newer (kopf's listing after a start or a broken watch) needs no pass of its own
        self._seen: dict[tuple[str, str], dict[str, str | None]] = {}
        # run -> {job: resourceVersion} the pass in flight created; counted as seen once that pass
        # succeeds (an event of the job arriving while it runs is still coalesced into one more pass: a
        # failed pass must leave a trigger behind, kopf's own retry of it can be lost)
        self._created: dict[tuple[str, str], dict[str, str]] = {}
        # run -> time.monotonic() before which no retry or poll of it starts: the server sent Retry-After
        # to one of its passes, so every such trigger of the run (not only the one kopf retries) waits
        # as asked; a job event, which brings news the run must act on, is tried at once
        self._held: dict[tuple[str, str], float] = {}
        # run -> time.monotonic() at the start of its latest successful pass: a trigger raised before
        # that moment needs no pass of its own (that pass read the run and its jobs after it)
        self._passed: dict[tuple[str, str], float] = {}

    def forget(self, namespace: str, name: str, uid: str | None) -> None:
        """A deleted run: drop its cached plan and the Events it can no longer receive."""
        with self._guard:
            self._plans.pop(uid, None)
            self._seen.pop((namespace, name), None)
            self._created.pop((namespace, name), None)
            self._held.pop((namespace, name), None)
            self._passed.pop((namespace, name), None)
            for _ in self._events.pop((namespace, name), []):
                metrics.EVENTS.labels(result="dropped").inc()

    def job_changed(self, namespace: str, name: str, job: str, version: str | None) -> machine.Decision | None:
        """A job of the run changed: reconcile, unless the run's last successful pass already saw this
        very version of it (a failed pass records nothing, so its trigger is never skipped)."""
        if self.unchanged(namespace, name, job, version):
            return None
        return self.reconcile(namespace, name, "job")

    def unchanged(self, namespace: str, name: str, job: str, version: str | None) -> bool:
        """Whether the run's last successful pass saw this very version of the job (counted when so);
        no I/O, so the event loop may ask before handing a pass to the pool."""
        with self._guard:
            key = (namespace, name)
            unchanged = version is not None and self._seen.get(key, {}).get(job) == version
        if unchanged:
            metrics.RECONCILE.labels(handler="job", result="unchanged").inc()
        return unchanged

    def reconcile(self, namespace: str, name: str, handler: str, asked: float | None = None
                  ) -> machine.Decision | None:
        """Reconcile the run now, or, when a reconcile of it is in flight, have that one run again
        when it ends (this call returns None at once). ``asked``: the ``time.monotonic()`` the
        trigger was raised (queued); a pass of the run that started after it and succeeded has
        done its work (it read the run and its jobs later), so none runs (``covered``): at load and
        after a restart a run's job events, resume, retries and poll queue up behind each other."""
        key = (namespace, name)
        with self._guard:
            if asked is not None and self._passed.get(key, float("-inf")) > asked:
                metrics.RECONCILE.labels(handler=handler, result="covered").inc()
                return None
            wait = self._held.get(key, 0.0) - time.monotonic()
            if wait > 0 and handler != "job":
                metrics.RECONCILE.labels(handler=handler, result="held").inc()
                raise errors.ApiUnavailable(f"SolarRun {namespace}/{name}: the API server asked to wait "
                                            f"{wait:.1f} s more", delay=wait, retry_after=wait)
            if key in self._running:
                self._again.setdefault(key, handler)
                metrics.RECONCILE.labels(handler=handler, result="coalesced").inc()
                return None
            self._running.add(key)
        try:
            while True:
                started = time.monotonic()
                try:
                    with metrics.timed(handler):
                        decision = self._reconcile(namespace, name)
                except errors.ApiUnavailable as exc:
                    if exc.retry_after is not None:
                        with self._guard:
                            self._held[key] = time.monotonic() + exc.retry_after
                    raise
                with self._guard:
                    self._held.pop(key, None)
                    self._passed[key] = started
                    if key not in self._again:
                        return decision
                    handler = self._again.pop(key)  # the pass the coalesced triggers asked for
        finally:
            with self._guard:
                self._running.discard(key)
                self._again.pop(key, None)  # a failed pass is retried by kopf (or the next poll) as a whole
                self._created.pop(key, None)

    # -- one pass ---------------------------------------------------------------------------------
    def _plan(self, uid: str, generation: int, spec: SolarRunSpec) -> RunPlan | RunInvalid:
        cached = self._plans.get(uid)
        if cached is None or cached[0] != generation:
            try:
                plan = plan_run(spec, spec.run_root, repo=self.repo, environ={})
            except RunInvalid as exc:
                plan = exc
            cached = self._plans[uid] = (generation, plan)
        return cached[1]

    def _reconcile(self, namespace: str, name: str) -> machine.Decision | None:
        run = self.kube.get_run(namespace, name)
        if run is None:
            return None
        meta = run["metadata"]
        if meta.get("deletionTimestamp"):
            self._keep_finalizer(run, False)   # no pass of the run is in flight (they never overlap): let it go
            return None
        stored = {k: v for k, v in (run.get("status") or {}).items() if k in STATUS_KEYS}
        previous = _previous(stored, namespace, name)
        leftover = previous is not None and bool(previous.jobsToDelete)  # a finished run's deletes to finish
        generation = int(meta.get("generation") or 1)
        if previous is not None and previous.phase in machine.TERMINAL and not leftover \
                and not machine.reopens(previous, generation):   # a Failed run whose spec changed continues
            self._keep_finalizer(run, False)   # finished: no job will be created for it any more
            return None
        self._keep_finalizer(run, True)        # before anything that may create a job
        spec, plan, invalid = _parse(run, self._plan, meta.get("uid", ""), generation)
        jobs, files, root = {}, {}, None
        if plan is not None or leftover:
            jobs = self.backend.observe(run)
            if plan is not None and not jobs and (previous is None or
                                                  not C.is_true(previous.conditions, C.VALIDATED)):
                invalid = self.backend.check(run, spec)   # contract.md §7: before any job exists
                plan = None if invalid else plan
        if plan is not None:
            root = self.storage_root / spec.storage.path
            uid = meta.get("uid", "")
            files = LazyStageFiles([s.name for s in plan.stages], lambda stage: observe_stage(
                root / stage, final_step=plan.stage(stage).final_step,
                validation_step=plan.stage(stage).validation_step, generation=plan.stage(stage).generation,
                owner=(uid, stage) if uid else None))
        now = self.clock()
        pods, room = self._pods_view(run, spec, plan, previous, jobs, now) if plan is not None else ({}, {})
        obs = machine.Observation(name, generation, now, plan=plan, invalid=invalid, jobs=jobs, files=files,
                                  diagnose=(lambda stage: failure_summary(root / stage)) if root else
                                  (lambda stage: None), pods=pods, capacity=room)
        decision = machine.reconcile(spec, previous, obs)
        if plan is not None and decision.status.backend is None:
            decision.status.backend = self.backend.name(run)
        written = stored
        going = [a.job for a in decision.actions if a.kind in ("delete_job", "suspend_job")]
        if going:
            # why a job goes (or is suspended) is written before it goes: a retry's failure count, once
            # its failed job is deleted, is nowhere else; a final verdict lists the jobs it deletes
            # (jobsToDelete), so that a pass over the finished run deletes what a failed delete left
            final = decision.status.phase in machine.TERMINAL
            if final:
                decision.status.jobsToDelete = going
            written = self._write_status(namespace, name, written, decision)
            if final:
                decision.status.jobsToDelete = None
        try:
            acted = self._act(run, spec, plan, decision, now, generation)
            self._write_status(namespace, name, written, acted)
        except kopf.TemporaryError:
            if written is not stored:  # the status is out: so is what it announces (kopf retries the rest)
                self._announce(run, spec, plan, decision)
            raise
        decision = acted
        self._announce(run, spec, plan, decision)
        with self._guard:
            key = (namespace, name)
            self._seen[key] = {job.name: job.version for job in jobs.values()} | self._created.pop(key, {})
        return decision

    def _pods_view(self, run: dict, spec, plan: RunPlan, previous: SolarRunStatus | None, jobs: dict, now: float):
        """Stages not yet succeeded that have a job or an attempt: their pods (``capacity.stage_pods``: alive,
        unschedulable, disrupted, on the real cluster's timeline) and, for elastic ones with nodes read,
        how many nodes could hold one of their pods now (``capacity.free_nodes``). With nodes read the
        pods come from the shared cluster listing (no request of the run's own); without, a listing of
        the stage's own, made for an elastic stage every pass and for another only when its job failed
        or is gone (a failure or a disruption to tell apart, old pods to wait for), so that a running
        stage's pass costs no more requests than before."""
        pods, room = {}, {}
        recorded = {s.name: s for s in previous.stages} if previous is not None else {}
        stages = [p for p in plan.stages if (jobs.get(p.name) is not None or (
            p.name in recorded and recorded[p.name].attempt > 0)) and not (
            p.name in recorded and recorded[p.name].phase == "Succeeded")]
        if not self.capacity.read_nodes:
            stages = [p for p in stages if p.elastic or jobs.get(p.name) is None or jobs[p.name].phase == "Failed"]
        if not stages:
            return pods, room
        # a failed job is decided on now: the nodes as they are, not as a moment ago
        fresh = any(jobs.get(p.name) is not None and jobs[p.name].phase == "Failed" for p in stages)
        cluster = self.capacity.cluster(fresh=fresh)
        meta = run["metadata"]

        def own_pods(cluster) -> dict:
            listed = {}
            for p in stages:
                selector = {RUN_LABEL: meta["name"], STAGE_LABEL: p.name}
                own = [x for x in cluster[1] if x["metadata"].get("namespace") == meta["namespace"]
                       and all((x["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())] \
                    if cluster is not None else \
                    self.kube.list_pods(meta["namespace"], f"{RUN_LABEL}={meta['name']},{STAGE_LABEL}={p.name}")
                job = jobs.get(p.name)
                attempt = job.attempt if job is not None and job.attempt else (
                    recorded[p.name].attempt if p.name in recorded else None)
                listed[p.name] = own, attempt
            return listed

        def read(cluster, listed) -> dict:
            nodes = {n["metadata"]["name"]: n for n in cluster[0]} if cluster is not None else None
            out = {}
            for p in stages:
                own, attempt = listed[p.name]
                settings = machine.elastic_settings(spec, p.name)
                lost_after = settings.nodeLostSeconds if settings is not None else self.node_lost_seconds
                last = (recorded[p.name].attempts or [None])[-1] if p.name in recorded else None
                ran_on = tuple(last.nodeNames or ()) if last is not None and last.attempt == attempt else ()
                out[p.name] = capacity.stage_pods(own, attempt, nodes, ATTEMPT_LABEL, now=now,
                                                  lost_after=lost_after, ran_on=ran_on)
            return out

        listed = own_pods(cluster)
        elastic_stages = [p for p in stages if p.elastic]
        room = self._room(spec, elastic_stages, listed, cluster)
        pods = read(cluster, listed)
        if not fresh and cluster is not None and any(
                _may_grow(p, previous, jobs.get(p.name), room[p.name])
                or _may_shrink(p, spec, previous, pods[p.name], now) for p in elastic_stages):
            # so is a change of shape, which stops an attempt: a listing up to CACHE_SECONDS old may show
            # nodes that a pending job has taken since (a grown attempt then waits, and shrinks again), or
            # pods pending that were bound since (an attempt whose ranks run is stopped for nothing)
            cluster = self.capacity.cluster(fresh=True)
            listed = own_pods(cluster)
            room = self._room(spec, elastic_stages, listed, cluster)
            pods = read(cluster, listed)
        return pods, room

    @staticmethod
    def _room(spec, stages, listed: dict, cluster) -> dict[str, int]:
        """Stage -> how many nodes could hold one of its pods in ``cluster`` (its current pods would move)."""
        if cluster is None:
            return {}
        room = {}
        for p in stages:
            own, attempt = listed[p.name]
            current = {x["metadata"].get("uid") for x in own
                       if (x["metadata"].get("labels") or {}).get(ATTEMPT_LABEL) == str(attempt)}
            limits = (stage_resources(spec, p.name) or {}).get("limits") or {}
            need = capacity.quantity(limits.get(capacity.GPU, p.nproc)) or p.nproc
            room[p.name] = capacity.free_nodes(cluster[0], cluster[1], gpus=need, own=current)
        return room

    def _keep_finalizer(self, run: dict, keep: bool) -> None:
        """Add or remove ``FINALIZER`` on the run (a merge patch conditioned on the resourceVersion just
        read: a 409 retries the pass). While the run may still get a job it carries the finalizer, so
        a delete waits for the pass in flight: a pass that read the run before the delete cannot create
        a job after the run and its jobs are gone (the garbage collector would not see it)."""
        meta = run["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if (FINALIZER in finalizers) == keep:
            return
        finalizers = finalizers + [FINALIZER] if keep else [f for f in finalizers if f != FINALIZER]
        patched = self.kube.patch_run(meta["namespace"], meta["name"], {"metadata": {
            "finalizers": finalizers or None, "resourceVersion": meta.get("resourceVersion")}})
        if patched is not None:
            meta["resourceVersion"] = (patched.get("metadata") or {}).get("resourceVersion")
            meta["finalizers"] = finalizers

    def _announce(self, run: dict, spec, plan, decision: machine.Decision) -> None:
        """Once the decision's status is written: its Events, log lines and metrics (exactly once)."""
        namespace, name = run["metadata"]["namespace"], run["metadata"]["name"]
        for kind, reason, message in decision.events:
            log.log(logging.WARNING if kind == "Warning" else logging.INFO, f"{namespace}/{name}: {reason}: {message}")
        self._post_events(run, decision.events)
        for stage, phase in decision.transitions:
            metrics.STAGE_TRANSITIONS.labels(to_phase=phase).inc()
            ended = decision.status.stage(stage) if phase in ("Succeeded", "Failed") and plan is not None else None
            if ended is not None and ended.usage is not None:
                p = plan.stage(stage)
                metrics.count_stage_gpu_seconds(spec.family, p.route, p.action, ended.usage.gpuSeconds)
        for _stage, error_type in decision.job_failures:
            metrics.count_stage_failure(error_type)
        for _stage, direction in decision.shape_changes:
            metrics.SHAPE_CHANGES.labels(direction=direction).inc()
        for _stage, seconds in decision.disruption_costs:
            metrics.DISRUPTION_SECONDS.inc(max(seconds, 0.0))

    def _write_status(self, namespace: str, name: str, stored: dict, decision: machine.Decision) -> dict:
        """Write the decision's status when it differs from ``stored``; what the server now holds."""
        new = decision.status.model_dump(mode="json", exclude_none=True)
        if new == stored:
            return stored
        self.kube.patch_run_status(namespace, name, merge_diff(stored, new))
        return new

    def _post_events(self, run: dict, events: list) -> None:
        """The run's earlier unposted Events first (in order), then this reconcile's; an Event the
        server refuses stays queued for the next reconcile until its tries run out."""
        meta = run["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._guard:
            queue = self._events.pop(key, [])
        queue += [[kind, reason, message, 0] for kind, reason, message in events]
        left = []
        for i, item in enumerate(queue):
            item[3] += 1
            try:
                self.kube.post_event(run, *item[:3])
            except kopf.PermanentError as exc:  # refused as it is (400/422): another try fares no better
                metrics.EVENTS.labels(result="dropped").inc()
                log.warning(f"{key[0]}/{key[1]}: dropped event {item[1]}: {exc}")
            except kopf.TemporaryError as exc:
                if item[3] >= EVENT_ATTEMPTS:
                    metrics.EVENTS.labels(result="dropped").inc()
                    log.warning(f"{key[0]}/{key[1]}: dropped event {item[1]} after {item[3]} tries: {exc}")
                else:
                    metrics.EVENTS.labels(result="retried").inc()
                    left.append(item)
                left.extend(queue[i + 1:])  # keep the order: the rest wait for the next pass
                break
            else:
                metrics.EVENTS.labels(result="posted").inc()
        if left:
            with self._guard:
                self._events[key] = left + self._events.get(key, [])

    def pending_events(self, namespace: str, name: str) -> int:
        with self._guard:
            return len(self._events.get((namespace, name), []))

    def _act(self, run: dict, spec, plan, decision: machine.Decision, now: float, generation: int):
        for action in decision.actions:
            if action.kind in ("delete_job", "suspend_job"):
                verb = "deleted" if action.kind == "delete_job" else "suspended"
                gone = (self.backend.delete if verb == "deleted" else self.backend.suspend)(run, action.job)
                log.info(f"{run['metadata']['namespace']}/{run['metadata']['name']}: job {action.job} "
                         f"{verb if gone else 'already gone'}")
                continue
            try:
                stage = plan.stage(action.stage)
                if action.nodes:   # an elastic stage's attempt at another allowed node count
                    stage = elastic.shaped(stage, action.nodes)
                created = self.backend.create(run, spec, stage, action)
            except (errors.Rejected, errors.NotOurs) as exc:
                reason = C.JOB_NAME_TAKEN if isinstance(exc, errors.NotOurs) else C.JOB_REJECTED
                message = reason.message(stage=action.stage, job=action.job, detail=str(exc))
                failed = machine.fail_stage(spec, decision.status, stage=action.stage, reason=reason,
                                            message=message, now=now, generation=generation)
                failed.events[:0] = decision.events
                failed.transitions[:0] = decision.transitions
                return failed
            if isinstance(created, str):
                with self._guard:
                    self._created.setdefault((run["metadata"]["namespace"], run["metadata"]["name"]),
                                             {})[action.job] = created
            log.info(f"{run['metadata']['namespace']}/{run['metadata']['name']}: job {action.job} "
                     f"{'created' if created else 'already exists'}")
        return decision


def _previous(stored: dict, namespace: str, name: str) -> SolarRunStatus | None:
    if not stored.get("phase"):
        return None
    try:
        return SolarRunStatus.model_validate(stored)
    except ValidationError as exc:  # edited by hand: start from what the observations say
        log.warning(f"{namespace}/{name}: ignoring a status that does not parse: {exc.errors()[0]['msg']}")
        return None


def _parse(run: dict, plan_for, uid: str, generation: int):
    """(spec, plan, invalid): a spec that does not parse, or does not resolve, is an InvalidSpec/... run."""
    try:
        spec = SolarRunSpec.model_validate(run.get("spec") or {})
    except ValidationError as exc:
        return None, None, RunInvalid(C.INVALID_SPEC.name, first_error(exc, "spec"))
    plan = plan_for(uid, generation, spec)
    if isinstance(plan, RunInvalid):
        return spec, None, plan
    return spec, plan, None
