"""The CronJob controller: makes a CronJob's Jobs on its schedule, as Kubernetes'
``cronjob_controllerv2.go``.

Level-triggered: handlers only enqueue ``namespace/name`` of CronJobs (a Job event
enqueues its controlling CronJob); ``sync`` reads the caches and converges:

1. ``status.active`` lists the CronJob's Jobs (controlled by it: ownerReference with its
   uid) that have not finished; ``lastSuccessfulTime`` is the latest completionTime of
   one that completed;
2. finished Jobs beyond ``successfulJobsHistoryLimit`` / ``failedJobsHistoryLimit`` are
   deleted, oldest first (their pods go with them);
3. unless suspended or being deleted: the latest schedule time after
   ``lastScheduleTime`` (or its creation), and not before ``now - startingDeadlineSeconds``,
   that is not after now (kube32.cron, in ``spec.timeZone``) is due; a time missed by more
   than startingDeadlineSeconds is skipped (event MissedSchedule), more than 100 missed
   times give the event TooManyMissedTimes and only the latest runs;
4. a due time with Jobs still active: ``Forbid`` skips it (it stays due, and runs once
   they end if still within its deadline), ``Replace`` deletes them first, ``Allow`` runs
   alongside;
5. the Job is named ``<cronjob>-<scheduled time in minutes since the epoch>`` (so a time
   never runs twice: a second create is AlreadyExists), labelled and annotated from the
   jobTemplate plus ``batch.kubernetes.io/cronjob-scheduled-timestamp``, and owned by
   the CronJob; ``lastScheduleTime`` and ``active`` record it;
6. the CronJob is looked at again at its next schedule time (and at least every
   :data:`~kube32.timing.CRONJOB_LOOK_SECONDS`).

The schedule's clock is the wall clock, or under the test fault ``fast-cron`` one running
60 times as fast (kube32.testing.cron_speed, kube32.timing.ScaledClock): the controller
reads every time through :class:`CronClock`, and never mixes the two.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from .. import cron, objects, testing, timing
from ..client import CRONJOBS, JOBS, ApiError
from ..terms import Condition, JobAnnotation
from . import podutil as pu
from .base import Controller
from .job import finished

log = logging.getLogger("kube32.controllers.cronjob")
Obj = dict[str, Any]

API = "batch/v1"
MANY_MISSED = 100
MAX_DEADLINE = 10 ** 9   # s (31 years): a larger startingDeadlineSeconds means the same
UTC = dt.timezone.utc


class CronClock:
    """The time a CronJob's schedule is kept on (the wall clock but under fast-cron)."""

    def __init__(self, speed: float, origin: float) -> None:
        self.scaled = timing.ScaledClock(speed, origin)

    def now(self) -> dt.datetime:
        return self.of(time.time())

    def of(self, real: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.scaled.of(real), UTC)

    def real_delay(self, until: dt.datetime) -> float:
        return max(self.scaled.real_delay((until - self.now()).total_seconds()), 0.0)


def job_name(cronjob: Obj, scheduled: dt.datetime) -> str:
    """As Kubernetes' getJobName: the CronJob's name and the time in minutes since the epoch."""
    return f"{objects.name(cronjob)}-{int(scheduled.timestamp()) // 60}"


def job_from_template(cronjob: Obj, scheduled: dt.datetime, tz: dt.tzinfo) -> Obj:
    """The Job a CronJob makes for ``scheduled`` (as Kubernetes' getJobFromTemplate2)."""
    template = objects.spec(cronjob).get("jobTemplate") or {}
    tmd = objects.meta(template)
    annotations = dict(tmd.get("annotations") or {})
    annotations[JobAnnotation.CRONJOB_SCHEDULED_TIMESTAMP] = scheduled.astimezone(tz).isoformat()
    md: Obj = {"name": job_name(cronjob, scheduled), "namespace": objects.meta(cronjob).get("namespace"),
               "labels": dict(tmd.get("labels") or {}), "annotations": annotations,
               "ownerReferences": [pu.owner_reference(cronjob, API, "CronJob")]}
    return {"apiVersion": API, "kind": "Job", "metadata": md, "spec": dict(objects.spec(template))}


def due_time(schedule: cron.Schedule, cronjob: Obj, clock: CronClock,
             now: dt.datetime) -> tuple[dt.datetime | None, int, bool]:
    """(the latest schedule time due, how many were missed, whether it is too late to run),
    as Kubernetes' mostRecentScheduleTime: times before ``now - startingDeadlineSeconds``
    are not looked at."""
    spec, st = objects.spec(cronjob), objects.status(cronjob)
    last = objects.parse_time(st.get("lastScheduleTime"))
    if last is None:
        created = objects.parse_time(objects.meta(cronjob).get("creationTimestamp"))
        last = clock.of(created.timestamp()) if created is not None else now
    deadline = spec.get("startingDeadlineSeconds")
    if deadline is not None:
        deadline = min(int(deadline), MAX_DEADLINE)
    earliest = last if deadline is None else max(last, now - dt.timedelta(seconds=deadline))
    scheduled, missed = schedule.most_recent(earliest, now)
    too_late = scheduled is not None and deadline is not None and \
        scheduled + dt.timedelta(seconds=deadline) < now
    return scheduled, missed, too_late


def job_ref(job: Obj) -> Obj:
    md = objects.meta(job)
    return {"kind": "Job", "namespace": md.get("namespace"), "name": md.get("name"), "uid": md.get("uid"),
            "apiVersion": API, "resourceVersion": md.get("resourceVersion")}


def _created(job: Obj) -> str:
    return str(objects.meta(job).get("creationTimestamp") or "")


def history_victims(cronjob: Obj, jobs: list[Obj]) -> list[Obj]:
    """Finished Jobs beyond the history limits, oldest first."""
    spec = objects.spec(cronjob)
    out: list[Obj] = []
    for ctype, field, default in ((Condition.JOB_COMPLETE, "successfulJobsHistoryLimit", 3),
                                  (Condition.JOB_FAILED, "failedJobsHistoryLimit", 1)):
        limit = spec.get(field, default)
        if limit is None:
            continue
        done = sorted((j for j in jobs if finished(j) == ctype), key=lambda j: (_created(j), objects.name(j)))
        out += done[:max(len(done) - int(limit), 0)]
    return out


class CronJobController(Controller):
    name = "cronjob-controller"
    workers = 2

    def setup(self) -> None:
        self.cj_informer = self.ctx.informers.get(CRONJOBS)
        self.job_informer = self.ctx.informers.get(JOBS)
        self.origin = time.time()
        self.cj_informer.add_handler(self._on_cronjob)
        self.job_informer.add_handler(self._on_job)

    # --- handlers (enqueue only) ------------------------------------------------------
    def _on_cronjob(self, etype: str, cj: Obj, old: Obj | None) -> None:
        self.queue.add(pu.pod_key(cj))

    def _on_job(self, etype: str, job: Obj, old: Obj | None) -> None:
        owner = pu.owner_key_of(job, "CronJob")
        if owner:
            self.queue.add(owner)

    async def resync(self) -> None:
        for cj in self.cj_informer.list():
            self.queue.add(pu.pod_key(cj))

    def clock(self, cj: Obj) -> CronClock:
        return CronClock(testing.cron_speed(cj), self.origin)

    # --- sync -------------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        cj = self.cj_informer.get(key)
        if cj is None:
            return
        ns = objects.meta(cj).get("namespace")
        jobs = [j for j in self.job_informer.list()
                if objects.meta(j).get("namespace") == ns and pu.is_controlled_by(j, cj)]
        active = [j for j in jobs if not finished(j) and not objects.meta(j).get("deletionTimestamp")]
        for victim in history_victims(cj, jobs):
            await self._delete_job(cj, victim, "SuccessfulDelete")
        status = self._status(cj, jobs, active)
        if not objects.spec(cj).get("suspend") and not objects.meta(cj).get("deletionTimestamp"):
            status = await self._run_schedule(cj, key, active, status)
        await self._write_status(cj, status)

    @staticmethod
    def _status(cj: Obj, jobs: list[Obj], active: list[Obj]) -> Obj:
        status = dict(objects.status(cj))
        known = {r.get("uid"): r for r in status.get("active") or [] if isinstance(r, dict)}
        refs = [known.get(objects.uid(j)) or job_ref(j)
                for j in sorted(active, key=lambda j: (_created(j), objects.name(j)))]
        if refs:
            status["active"] = refs
        else:
            status.pop("active", None)
        done = [t for j in jobs if finished(j) == Condition.JOB_COMPLETE
                and (t := objects.status(j).get("completionTime"))]
        latest = max(done + ([status["lastSuccessfulTime"]] if status.get("lastSuccessfulTime") else []),
                     default=None)
        if latest:
            status["lastSuccessfulTime"] = latest
        return status

    async def _run_schedule(self, cj: Obj, key: str, active: list[Obj], status: Obj) -> Obj:
        """Run the due schedule time, if any, and look again at the next; the status to write."""
        spec = objects.spec(cj)
        try:
            schedule = cron.parse(spec.get("schedule", ""), spec.get("timeZone"))
        except cron.CronError as e:
            await self.recorder.record(cj, "Warning", "InvalidSchedule", f"invalid schedule: {e}")
            return status
        clock = self.clock(cj)
        now = clock.now()
        self._look_again(key, schedule, clock, now)
        scheduled, missed, too_late = due_time(schedule, {**cj, "status": status}, clock, now)
        if scheduled is None:
            return status
        if too_late:
            await self.recorder.record(cj, "Warning", "MissedSchedule",
                                       f"Missed scheduled time to start a job: {scheduled.isoformat()}")
            return status
        if missed > MANY_MISSED:
            await self.recorder.record(cj, "Warning", "TooManyMissedTimes",
                                       "too many missed start times. Set or decrease .spec.startingDeadlineSeconds "
                                       "or check clock skew")
        policy = spec.get("concurrencyPolicy", "Allow")
        if active and policy == "Forbid":
            return status
        if active and policy == "Replace":
            for old in active:
                await self._delete_job(cj, old, "SuccessfulDelete")
            status.pop("active", None)
        created = await self._create_job(cj, scheduled, schedule.tz)
        if created is not None:
            refs = [r for r in status.get("active") or [] if r.get("uid") != objects.uid(created)]
            status["active"] = refs + [job_ref(created)]
        status["lastScheduleTime"] = objects.rfc3339(scheduled)
        return status

    def _look_again(self, key: str, schedule: cron.Schedule, clock: CronClock, now: dt.datetime) -> None:
        try:
            nxt = schedule.next_after(now)
        except cron.CronError:
            return
        self.queue.add_after(key, min(clock.real_delay(nxt) + 0.05, timing.CRONJOB_LOOK_SECONDS))

    async def _create_job(self, cj: Obj, scheduled: dt.datetime, tz: dt.tzinfo) -> Obj | None:
        body = job_from_template(cj, scheduled, tz)
        try:
            job = await self.client.create(JOBS, body, objects.meta(cj).get("namespace"))
        except ApiError as e:
            if e.code == 409:
                return None   # this time ran already (a write of ours the status missed)
            await self.recorder.record(cj, "Warning", "FailedCreate", f"Error creating job: {e}")
            raise
        await self.recorder.record(cj, "Normal", "SuccessfulCreate", f"Created job {objects.name(job)}")
        return job

    async def _delete_job(self, cj: Obj, job: Obj, reason: str) -> None:
        md = objects.meta(job)
        try:
            await self.client.delete(JOBS, md["name"], md.get("namespace"), uid=md.get("uid"),
                                     propagation="Background")
        except ApiError as e:
            if e.code in (404, 409):
                return
            await self.recorder.record(cj, "Warning", "FailedDelete", f"Error deleting job: {e}")
            raise
        await self.recorder.record(cj, "Normal", reason, f"Deleted job {md['name']}")

    async def _write_status(self, cj: Obj, status: Obj) -> None:
        old = objects.status(cj)
        if status == old:
            return
        patch = {**{k: None for k in old if k not in status}, **status}   # a merge patch: null removes
        try:
            await self.client.patch(CRONJOBS, objects.meta(cj)["name"], {"status": patch},
                                    objects.meta(cj).get("namespace"), subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise
