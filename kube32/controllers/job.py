"""The Job controller: runs a Job's pods to completion, as Kubernetes' ``job_controller.go``.

A Job runs command pods (they end: Succeeded or Failed).  Level-triggered: handlers
only enqueue ``namespace/name`` of Jobs (and record pod events against
:class:`~.podutil.Expectations`); ``sync`` reads the caches and converges:

1. a finished Job (condition Complete or Failed True) only loses its leftover active
   pods and, with ``ttlSecondsAfterFinished``, is deleted that long after it finished
   (its pods go with it: the garbage collector follows their ownerReferences);
2. otherwise its pods are those it controls (ownerReference with its uid), and each
   Failed one is read against ``podFailurePolicy`` (kube32.controllers.jobpolicy:
   FailJob, Ignore, Count, FailIndex).  Its fate, first that applies, as Kubernetes
   1.32 decides it: a FailJob rule matched (reason PodFailurePolicy); its counted
   failures (Failed pods not ignored, and container restarts under ``restartPolicy:
   OnFailure``) exceed ``backoffLimit`` (BackoffLimitExceeded); it ran longer than
   ``activeDeadlineSeconds`` (DeadlineExceeded); with ``backoffLimitPerIndex``, more
   indexes failed than ``maxFailedIndexes`` (MaxFailedIndexesExceeded) or every index
   succeeded or failed with some failed (FailedIndexes); a ``successPolicy`` rule is met
   (SuccessPolicy); ``completions`` pods succeeded (NonIndexed), every index succeeded
   (Indexed), or, without ``completions``, one pod succeeded and none is active
   (CompletionsReached).  The interim condition (FailureTarget or SuccessCriteriaMet)
   is written and the active pods are deleted; once none is left running or
   terminating, Failed or Complete follows with the same reason and message (and
   ``completionTime``, and an event);
3. else, when the expectations are satisfied, it creates pods up to ``parallelism``
   (never more than the completions still to make, each Indexed index once, a failed
   index never again), after a back-off since the last counted failure
   (:data:`~kube32.timing.JOB_BACKOFF_SECONDS`, doubling; per index with
   ``backoffLimitPerIndex``, from the index's last failed pod, whose failure counts the
   replacement carries in its annotations), or deletes the extra ones and those of
   failed indexes; a suspended Job has none;
4. it writes ``status`` (startTime, active, ready, terminating, succeeded, failed,
   completedIndexes, failedIndexes) when it changed.

Counting is finalizer-free: a Job counts the finished pods it sees, and its counts never
go down (a finished pod deleted by someone else stays counted; one deleted before this
controller saw it finish is not counted).  Pods are counted by ``namespace/name``.  A
pod that is deleted (evicted, drained, on a lost node) is stopped and removed without
ending Failed, so it is never counted and carries no DisruptionTarget condition to match.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

from .. import objects, timing
from ..client import JOBS, PODS, ApiError
from ..terms import Condition, JobAnnotation, JobReason, Label, PodPhase
from . import podutil as pu
from .base import Controller
from .jobpolicy import (FAIL_JOB, NO_RULE, Match, absolute_failure_count, format_indexes, index_failed,
                        match_pod_failure_policy, match_success_policy, next_failure_counts, parse_indexes)

log = logging.getLogger("kube32.controllers.job")
Obj = dict[str, Any]

API = "batch/v1"
BURST = 500   # as Kubernetes: at most this many creates or deletes per sync
FINISHED = (Condition.JOB_COMPLETE, Condition.JOB_FAILED)
# The interim condition and the finishing one it turns into once no pod is left.
TERMINAL = {Condition.JOB_FAILURE_TARGET: Condition.JOB_FAILED,
            Condition.JOB_SUCCESS_CRITERIA_MET: Condition.JOB_COMPLETE}
DEFAULT_BACKOFF_LIMIT = 6
MAX_WAIT = 3600.0   # a deadline or TTL further away is looked at again after this


# --- pure helpers (tests/unit/test_job_controller.py) -----------------------------------
def finished(job: Obj) -> str | None:
    """The finishing condition type that is True (Complete or Failed), or None."""
    for ctype in FINISHED:
        if objects.is_true(job, ctype):
            return ctype
    return None


def pod_index(pod: Obj) -> int | None:
    """An Indexed Job pod's completion index (its annotation), or None."""
    text = objects.annotations(pod).get(JobAnnotation.COMPLETION_INDEX)
    return int(text) if isinstance(text, str) and text.isdigit() else None


def new_condition(ctype: str, reason: str, message: str, status: str = "True") -> Obj:
    now = objects.rfc3339()
    return {"type": ctype, "status": status, "lastProbeTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message}


def with_condition(conditions: list[Obj], cond: Obj) -> list[Obj]:
    """``conditions`` with ``cond`` set: a condition of its type with the same status is kept
    as it was (its transition time stays)."""
    out = [c for c in conditions if c.get("type") != cond["type"]]
    old = next((c for c in conditions if c.get("type") == cond["type"]), None)
    if old is not None and old.get("status") == cond["status"] and old.get("reason") == cond.get("reason"):
        return conditions
    return out + [cond]


def backoff_delay(failures: int, base: float) -> float:
    """How long after the last failure the next pod may start (0 for none yet)."""
    if failures <= 0:
        return 0.0
    return min(base * 2 ** (failures - 1), timing.JOB_BACKOFF_MAX_SECONDS)


def finished_at(pod: Obj) -> str:
    """When the pod's last container ended (RFC 3339, "" when none did): orders failures."""
    st = objects.status(pod)
    times = [t.get("finishedAt") or "" for cs in st.get("containerStatuses") or []
             if isinstance(cs, dict) and isinstance(t := (cs.get("state") or {}).get("terminated"), dict)]
    return max((x for x in times if isinstance(x, str)), default="")


def index_backoff_left(pod: Obj | None, base: float, now: float) -> float:
    """Seconds until the index whose last Failed pod is ``pod`` may have a new one
    (Kubernetes' per-index back-off: ``base`` doubling with the index's failures)."""
    if pod is None:
        return 0.0
    at = objects.parse_time(finished_at(pod) or objects.meta(pod).get("creationTimestamp"))
    delay = backoff_delay(absolute_failure_count(pod) + 1, base)
    return max(at.timestamp() + delay - now, 0.0) if at is not None else 0.0


class Counts:
    """What a Job's pods show: active and terminating ones, finished ones counted with the
    status's, each Failed one's pod failure policy match, and per index what failed."""

    def __init__(self, job: Obj, pods: list[Obj]) -> None:
        st = objects.status(job)
        spec = objects.spec(job)
        policy = spec.get("podFailurePolicy")
        self.active = [p for p in pods if pu.is_active(p)]
        self.terminating = [p for p in pods if pu.is_terminating(p) and not pu.is_terminal(p)]
        done = [p for p in pods if objects.phase(p) == PodPhase.SUCCEEDED]
        failed = sorted((p for p in pods if objects.phase(p) == PodPhase.FAILED and not pu.awaits_replacement(p)),
                        key=finished_at)
        self.matches = {pu.pod_key(p): match_pod_failure_policy(policy, p) for p in failed}
        self.fail_job = next((m.message for p in failed if (m := self.match(p)).action == FAIL_JOB), None)
        self.indexed = spec.get("completionMode") == "Indexed"
        self.per_index = self.indexed and isinstance(spec.get("backoffLimitPerIndex"), int)
        limit = int(spec.get("completions") or 0)
        self.completed = parse_indexes(st.get("completedIndexes"), limit) if self.indexed else set()
        if self.indexed:
            self.completed |= {i for p in done if (i := pod_index(p)) is not None and i < limit}
            self.succeeded = max(int(st.get("succeeded") or 0), len(self.completed))
        else:
            self.succeeded = max(int(st.get("succeeded") or 0), len(done))
        self.failed = max(int(st.get("failed") or 0), sum(1 for p in failed if self.match(p).counted))
        self.failed_indexes: set[int] = set()
        self.last_failed: dict[int, Obj] = {}   # index -> its latest Failed pod (per index)
        if self.per_index:
            self._per_index(job, failed, limit)
        restarts = 0
        if objects.spec(spec.get("template")).get("restartPolicy") == "OnFailure":
            restarts = sum(int(cs.get("restartCount") or 0) for p in self.active
                           for cs in objects.status(p).get("containerStatuses") or [])
        self.failures = self.failed + restarts
        self.ready = sum(1 for p in self.active if pu.is_ready(p))

    def match(self, pod: Obj) -> Match:
        return self.matches.get(pu.pod_key(pod), NO_RULE)

    def _per_index(self, job: Obj, failed: list[Obj], limit: int) -> None:
        self.failed_indexes = parse_indexes(objects.status(job).get("failedIndexes"), limit)
        for p in failed:   # oldest first: the last one kept per index is the latest
            i = pod_index(p)
            if i is None or i >= limit:
                continue
            if index_failed(job, p, self.match(p)):
                self.failed_indexes.add(i)
            last = self.last_failed.get(i)
            if last is None or absolute_failure_count(p) >= absolute_failure_count(last):
                self.last_failed[i] = p
        self.failed_indexes -= self.completed


def interim(job: Obj) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Job's interim condition that is True, else None."""
    for ctype in TERMINAL:
        c = objects.condition(job, ctype)
        if c is not None and c.get("status") == "True":
            return ctype, str(c.get("reason") or ""), str(c.get("message") or "")
    return None


def verdict(job: Obj, counts: Counts, now: float) -> tuple[str, str, str] | None:
    """(interim condition, reason, message) when the Job's fate is decided, else None."""
    return _failure(job, counts, now) or _success(job, counts)


def _failure(job: Obj, counts: Counts, now: float) -> tuple[str, str, str] | None:
    spec, st = objects.spec(job), objects.status(job)
    target = Condition.JOB_FAILURE_TARGET
    if counts.fail_job is not None:
        return target, JobReason.POD_FAILURE_POLICY, counts.fail_job
    limit = spec.get("backoffLimit")   # the API server defaults it; one stored before may lack it
    if counts.failures > (limit if isinstance(limit, int) else DEFAULT_BACKOFF_LIMIT):
        return target, JobReason.BACKOFF_LIMIT_EXCEEDED, "Job has reached the specified backoff limit"
    start = objects.parse_time(st.get("startTime"))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and start is not None and now - start.timestamp() >= deadline:
        return target, JobReason.DEADLINE_EXCEEDED, "Job was active longer than specified deadline"
    if counts.per_index:
        most = spec.get("maxFailedIndexes")
        if isinstance(most, int) and len(counts.failed_indexes) > most:
            return target, JobReason.MAX_FAILED_INDEXES_EXCEEDED, \
                "Job has exceeded the specified maximal number of failed indexes"
        if counts.failed_indexes and \
                len(counts.failed_indexes) + len(counts.completed) >= int(spec.get("completions") or 0):
            return target, JobReason.FAILED_INDEXES, "Job has failed indexes"
    return None


def _success(job: Obj, counts: Counts) -> tuple[str, str, str] | None:
    spec = objects.spec(job)
    completions = spec.get("completions")
    met = Condition.JOB_SUCCESS_CRITERIA_MET
    if counts.indexed:
        message = match_success_policy(spec.get("successPolicy"), int(completions or 0), counts.completed)
        if message is not None:
            return met, JobReason.SUCCESS_POLICY, message
        done = completions is not None and counts.completed >= set(range(int(completions)))
    elif completions is not None:
        done = counts.succeeded >= int(completions)
    else:
        done = counts.succeeded > 0 and not counts.active
    if done:
        return met, JobReason.COMPLETIONS_REACHED, "Reached expected number of succeeded pods"
    return None


def wanted_active(job: Obj, counts: Counts) -> int:
    """How many pods should be active now (0 when suspended)."""
    spec = objects.spec(job)
    if spec.get("suspend"):
        return 0
    parallelism = int(spec.get("parallelism", 1) or 0)
    completions = spec.get("completions")
    if completions is None:
        return 0 if counts.succeeded > 0 else parallelism
    left = int(completions) - (len(counts.completed) + len(counts.failed_indexes) if counts.indexed
                               else counts.succeeded)
    return max(min(parallelism, left), 0)


def missing_indexes(job: Obj, counts: Counts, n: int) -> list[int]:
    """The lowest ``n`` indexes neither completed, failed nor active (Indexed Jobs)."""
    completions = int(objects.spec(job).get("completions") or 0)
    busy = counts.completed | counts.failed_indexes | {i for p in counts.active if (i := pod_index(p)) is not None}
    out: list[int] = []
    for i in range(completions):
        if len(out) >= n:
            break
        if i not in busy:
            out.append(i)
    return out


def job_pod(job: Obj, index: int | None, counts: Counts | None = None) -> Obj:
    """A new pod of the Job (of one completion index for an Indexed Job; with
    ``backoffLimitPerIndex``, annotated with the index's failures so far)."""
    template = objects.spec(job).get("template") or {}
    name = objects.name(job)
    pod = pu.pod_from_template(template, job, API, "Job",
                               generate_name=f"{name}-{index}-" if index is not None else f"{name}-")
    if index is not None:
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations[JobAnnotation.COMPLETION_INDEX] = str(index)
        if counts is not None and counts.per_index:
            last = counts.last_failed.get(index)
            failures, ignored = next_failure_counts(last, counts.match(last) if last is not None else NO_RULE)
            annotations[JobAnnotation.INDEX_FAILURE_COUNT] = str(failures)
            if ignored:
                annotations[JobAnnotation.INDEX_IGNORED_FAILURE_COUNT] = str(ignored)
        pod["metadata"]["labels"][Label.JOB_COMPLETION_INDEX] = str(index)
        for c in pod["spec"].get("containers") or []:
            env = [e for e in c.get("env") or [] if e.get("name") != "JOB_COMPLETION_INDEX"]
            c["env"] = env + [{"name": "JOB_COMPLETION_INDEX", "value": str(index)}]
    return pod


class JobController(Controller):
    name = "job-controller"
    workers = 2

    def setup(self) -> None:
        self.job_informer = self.ctx.informers.get(JOBS)
        self.pod_informer = self.ctx.informers.get(PODS)
        self.expectations = pu.Expectations()
        self._last_failure: dict[str, tuple[int, float]] = {}   # key -> (failures, when seen)
        self.job_informer.add_handler(self._on_job)
        self.pod_informer.add_handler(self._on_pod)

    # --- handlers (enqueue only) ------------------------------------------------------
    def _on_job(self, etype: str, job: Obj, old: Obj | None) -> None:
        key = pu.pod_key(job)
        if etype == "DELETED":
            self.expectations.forget(key)
            self._last_failure.pop(key, None)
        self.queue.add(key)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        for k in pu.observe_pod(self.expectations, etype, pod, old, "Job"):
            self.queue.add(k)

    async def resync(self) -> None:
        for job in self.job_informer.list():
            self.queue.add(pu.pod_key(job))

    # --- sync -------------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        job = self.job_informer.get(key)
        if job is None:
            self.expectations.forget(key)
            self._last_failure.pop(key, None)
            return
        pods = [p for p in self.pod_informer.list()
                if objects.meta(p).get("namespace") == objects.meta(job).get("namespace")
                and pu.is_controlled_by(p, job)]
        counts = Counts(job, pods)
        if finished(job):
            await self._delete_pods(job, key, counts.active)
            await self._expire(job)
            return
        now = time.time()
        status = self._started(job)
        probe = {**job, "status": status}
        end = interim(job) or verdict(probe, counts, now)
        if end is not None:
            await self._finish(job, key, counts, status, end)
            return
        error: Exception | None = None
        if self.expectations.satisfied(key) and not objects.meta(job).get("deletionTimestamp"):
            try:
                await self._manage(job, key, counts)
            except Exception as e:  # noqa: BLE001 - status is still written, then retry
                error = e
        await self._write_status(job, self._status(job, status, counts))
        if error is not None:
            raise error
        self._requeue_for_deadline(job, key, status, now)

    def _started(self, job: Obj) -> Obj:
        """The status with startTime set once the Job runs (reset on resume), and its
        Suspended condition."""
        status = copy.deepcopy(objects.status(job))
        conditions = list(status.get("conditions") or [])
        if objects.spec(job).get("suspend"):
            status.pop("startTime", None)
            conditions = with_condition(conditions, new_condition(Condition.JOB_SUSPENDED, "JobSuspended",
                                                                  "Job suspended"))
        else:
            if objects.is_true(job, Condition.JOB_SUSPENDED):
                conditions = with_condition(conditions, new_condition(Condition.JOB_SUSPENDED, "JobResumed",
                                                                      "Job resumed", "False"))
                status.pop("startTime", None)
            status.setdefault("startTime", objects.rfc3339())
        if conditions:
            status["conditions"] = conditions
        return status

    @staticmethod
    def _status(job: Obj, status: Obj, counts: Counts) -> Obj:
        out = dict(status)
        out.update({"active": len(counts.active), "ready": counts.ready, "succeeded": counts.succeeded,
                    "failed": counts.failed, "terminating": len(counts.terminating)})
        if counts.indexed:
            out["completedIndexes"] = format_indexes(counts.completed)
        if counts.per_index:
            out["failedIndexes"] = format_indexes(counts.failed_indexes)
        out.setdefault("uncountedTerminatedPods", {})
        return out

    def _requeue_for_deadline(self, job: Obj, key: str, status: Obj, now: float) -> None:
        deadline = objects.spec(job).get("activeDeadlineSeconds")
        start = objects.parse_time(status.get("startTime"))
        if deadline is not None and start is not None:
            self.queue.add_after(key, min(max(start.timestamp() + deadline - now, 0) + 0.05, MAX_WAIT))

    async def _finish(self, job: Obj, key: str, counts: Counts, status: Obj, end: tuple[str, str, str]) -> None:
        """The interim condition ``end`` and the active pods' deletion; once no pod is left
        running or terminating, the finishing condition it turns into (as Kubernetes 1.32)."""
        ctype, reason, message = end
        await self._delete_pods(job, key, counts.active)
        out = self._status(job, status, counts)
        left = len(counts.active) + len(counts.terminating)
        out.update({"active": 0, "ready": 0, "terminating": left})
        conditions = with_condition(list(out.get("conditions") or []), new_condition(ctype, reason, message))
        final = TERMINAL[ctype] if left == 0 else None
        if final is not None:
            conditions = with_condition(conditions, new_condition(final, reason, message))
            if final == Condition.JOB_COMPLETE:
                out["completionTime"] = objects.rfc3339()
        out["conditions"] = conditions
        await self._write_status(job, out)
        if final == Condition.JOB_COMPLETE:
            await self.recorder.record(job, "Normal", "Completed", "Job completed")
        elif final is not None:
            await self.recorder.record(job, "Warning", reason, message)
        # The status write comes back as a watch event, the pods' deletions too: a later
        # sync writes the finishing condition, deletes leftovers and starts the TTL.

    async def _expire(self, job: Obj) -> None:
        """Delete a finished Job ``ttlSecondsAfterFinished`` after it finished."""
        ttl = objects.spec(job).get("ttlSecondsAfterFinished")
        if ttl is None or objects.meta(job).get("deletionTimestamp"):
            return
        st = objects.status(job)
        cond = objects.condition(job, finished(job) or "") or {}
        at = objects.parse_time(st.get("completionTime") or cond.get("lastTransitionTime"))
        left = (at.timestamp() + ttl - time.time()) if at is not None else 0.0
        if left > 0:
            self.queue.add_after(pu.pod_key(job), min(left + 0.05, MAX_WAIT))
            return
        md = objects.meta(job)
        try:
            await self.client.delete(JOBS, md["name"], md.get("namespace"), uid=md.get("uid"),
                                     propagation="Background")
        except ApiError as e:
            if e.code not in (404, 409):
                raise

    async def _manage(self, job: Obj, key: str, counts: Counts) -> None:
        doomed = [p for p in counts.active if pod_index(p) in counts.failed_indexes]
        if doomed:   # a failed index runs no more (backoffLimitPerIndex)
            await self._delete_pods(job, key, doomed[:BURST])
            return
        want = wanted_active(job, counts)
        diff = want - len(counts.active)
        if diff < 0:
            victims = sorted(counts.active, key=pu.deletion_rank)[:min(-diff, BURST)]
            await self._delete_pods(job, key, victims)
            return
        if diff == 0:
            return
        if counts.per_index:   # each index its own back-off, none for the whole Job
            indexes, wait = self._ready_indexes(counts, missing_indexes(job, counts, min(diff, BURST)))
            if wait > 0:
                self.queue.add_after(key, min(wait, MAX_WAIT) + 0.05)
            if indexes:
                await self._create(job, key, counts, list(indexes))
            return
        wait = self._backoff_left(key, counts)
        if wait > 0:
            self.queue.add_after(key, wait + 0.05)
            return
        todo: list[int | None] = list(missing_indexes(job, counts, min(diff, BURST))) if counts.indexed \
            else [None] * min(diff, BURST)
        await self._create(job, key, counts, todo)

    def _ready_indexes(self, counts: Counts, indexes: list[int]) -> tuple[list[int], float]:
        """Those of ``indexes`` past their back-off, and how long until the next of the others."""
        now = time.time()
        base = self.ctx.options.job_backoff_seconds
        left = {i: index_backoff_left(counts.last_failed.get(i), base, now) for i in indexes}
        waits = [w for w in left.values() if w > 0]
        return [i for i in indexes if left[i] <= 0], min(waits, default=0.0)

    def _backoff_left(self, key: str, counts: Counts) -> float:
        seen, when = self._last_failure.get(key, (0, 0.0))
        if counts.failures > seen:
            when = time.monotonic()
            self._last_failure[key] = (counts.failures, when)
        elif counts.failures == 0:
            return 0.0
        delay = backoff_delay(counts.failures, self.ctx.options.job_backoff_seconds)
        return when + delay - time.monotonic()

    async def _create(self, job: Obj, key: str, counts: Counts, indexes: list[int | None]) -> None:
        self.expectations.expect_creations(key, len(indexes))
        ns = objects.meta(job).get("namespace")
        results = await asyncio.gather(*(self.client.create(PODS, job_pod(job, i, counts), ns) for i in indexes),
                                       return_exceptions=True)
        first: BaseException | None = None
        for r in results:
            if isinstance(r, BaseException):
                self.expectations.creation_observed(key)
                first = first or r
                await self.recorder.record(job, "Warning", "FailedCreate", f"Error creating: {r}")
            else:
                await self.recorder.record(job, "Normal", "SuccessfulCreate", f"Created pod: {objects.name(r)}")
        if first is not None:
            raise first if isinstance(first, Exception) else RuntimeError(str(first))

    async def _delete_pods(self, job: Obj, key: str, victims: list[Obj]) -> None:
        if not victims:
            return
        self.expectations.expect_deletions(key, [pu.pod_key(p) for p in victims])

        results = await asyncio.gather(*(self.delete_pod(job, key, p, self.expectations) for p in victims),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _write_status(self, job: Obj, status: Obj) -> None:
        old = objects.status(job)
        if status == old:
            return
        patch = {**{k: None for k in old if k not in status}, **status}   # a merge patch: null removes
        try:
            await self.client.patch(JOBS, objects.meta(job)["name"], {"status": patch},
                                    objects.meta(job).get("namespace"), subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise
