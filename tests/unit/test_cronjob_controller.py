"""The CronJob controller against the in-memory API of test_controllers_workloads, on a
clock the test sets; and the fast-cron test fault's clock."""
from __future__ import annotations

import datetime as dt
from typing import Any

from kube32 import testing
from kube32.apiserver.strategies.batch import CronJobStrategy
from kube32.client import CRONJOBS, JOBS
from kube32.controllers.base import ControllerContext, ControllerOptions, SharedInformers
from kube32.controllers.cronjob import CronClock, CronJobController, job_name
from tests.unit.test_controllers_workloads import FakeApi, run

Obj = dict[str, Any]
KEY = "default/tick"
UTC = dt.timezone.utc


def at(hh_mm: str) -> dt.datetime:
    h, m = hh_mm.split(":")
    return dt.datetime(2026, 3, 1, int(h), int(m), 30, tzinfo=UTC)


class SetClock(CronClock):
    def __init__(self, now: dt.datetime) -> None:
        super().__init__(1.0, 0.0)
        self.at = now

    def now(self) -> dt.datetime:
        return self.at


def cronjob(**spec: Any) -> Obj:
    obj = {"apiVersion": "batch/v1", "kind": "CronJob",
           "metadata": {"name": "tick", "namespace": "default", "creationTimestamp": "2026-03-01T10:00:00Z",
                        "labels": {"app": "tick"}},
           "spec": {"schedule": "*/5 * * * *",
                    "jobTemplate": {"metadata": {"labels": {"team": "a"}}, "spec": {"template": {"spec": {
                        "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}, **spec}}
    CronJobStrategy().default(obj)
    assert CronJobStrategy().validate(obj) == []
    return obj


def setup(now: str, **spec: Any) -> tuple[FakeApi, CronJobController, SetClock]:
    api = FakeApi()
    informers = SharedInformers(api)  # type: ignore[arg-type]
    api.informers = informers
    c = CronJobController(ControllerContext(api, informers, ControllerOptions(), None))  # type: ignore[arg-type]
    c.setup()
    clock = SetClock(at(now))
    c.clock = lambda cj: clock  # type: ignore[method-assign]
    api.put(CRONJOBS, cronjob(**spec))
    return api, c, clock


def jobs(api: FakeApi) -> list[Obj]:
    return sorted((o for (plural, _), o in api.objects.items() if plural == "jobs"),
                  key=lambda j: j["metadata"]["name"])


def status(api: FakeApi) -> Obj:
    return api.objects[("cronjobs", KEY)].get("status") or {}


async def complete(api: FakeApi, job: Obj, ctype: str = "Complete", when: str = "2026-03-01T10:06:00Z") -> None:
    st = {"conditions": [{"type": ctype, "status": "True"}]}
    if ctype == "Complete":
        st["completionTime"] = when
    await api.patch(JOBS, job["metadata"]["name"], {"status": st}, "default", subresource="status")
    api.deliver()


async def step(api: FakeApi, c: CronJobController) -> None:
    await c.sync(KEY)
    api.deliver()


def test_the_due_time_makes_one_job_named_for_it() -> None:
    async def go() -> None:
        api, c, _ = setup("10:07")
        await step(api, c)
        (job,) = jobs(api)
        scheduled = dt.datetime(2026, 3, 1, 10, 5, tzinfo=UTC)
        md = job["metadata"]
        assert md["name"] == job_name(api.objects[("cronjobs", KEY)], scheduled) == \
            f"tick-{int(scheduled.timestamp()) // 60}"
        assert md["labels"] == {"team": "a"} and md["ownerReferences"][0]["kind"] == "CronJob"
        assert md["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"] == "2026-03-01T10:05:00+00:00"
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        assert status(api)["lastScheduleTime"] == "2026-03-01T10:05:00Z"
        assert [r["name"] for r in status(api)["active"]] == [md["name"]]
        await step(api, c)                              # nothing new is due
        assert len(jobs(api)) == 1
        await complete(api, job)
        await step(api, c)
        assert "active" not in status(api) and status(api)["lastSuccessfulTime"] == "2026-03-01T10:06:00Z"
    run(go())


def test_forbid_skips_while_a_job_runs_and_runs_the_missed_time_after() -> None:
    async def go() -> None:
        api, c, clock = setup("10:07", concurrencyPolicy="Forbid")
        await step(api, c)
        clock.at = at("10:12")
        await step(api, c)
        assert len(jobs(api)) == 1 and status(api)["lastScheduleTime"] == "2026-03-01T10:05:00Z"
        await complete(api, jobs(api)[0])
        await step(api, c)
        assert len(jobs(api)) == 2 and status(api)["lastScheduleTime"] == "2026-03-01T10:10:00Z"
    run(go())


def test_replace_deletes_the_running_job_for_the_new_one() -> None:
    async def go() -> None:
        api, c, clock = setup("10:07", concurrencyPolicy="Replace")
        await step(api, c)
        first = jobs(api)[0]["metadata"]["name"]
        clock.at = at("10:11")
        await step(api, c)
        (job,) = jobs(api)
        assert job["metadata"]["name"] != first and api.deletes("jobs") == 1
        assert [r["name"] for r in status(api)["active"]] == [job["metadata"]["name"]]
    run(go())


def test_allow_runs_alongside() -> None:
    async def go() -> None:
        api, c, clock = setup("10:07")
        await step(api, c)
        clock.at = at("10:11")
        await step(api, c)
        assert len(jobs(api)) == 2 and len(status(api)["active"]) == 2
    run(go())


def test_history_limits_delete_the_oldest_finished_jobs() -> None:
    async def go() -> None:
        api, c, clock = setup("10:01", successfulJobsHistoryLimit=1, failedJobsHistoryLimit=0)
        for minute in ("10:06", "10:11", "10:16"):
            clock.at = at(minute)
            await step(api, c)
            await complete(api, jobs(api)[-1])
        clock.at = at("10:21")
        await step(api, c)
        await complete(api, jobs(api)[-1], "Failed")
        await step(api, c)
        names = [j["metadata"]["name"] for j in jobs(api)]
        assert len(names) == 1 and (names[0], len(status(api).get("active") or [])) == (names[0], 0)
        assert api.deletes("jobs") == 3
    run(go())


def test_suspended_and_too_late_times_make_no_job() -> None:
    async def go() -> None:
        api, c, _ = setup("10:07", suspend=True)
        await step(api, c)
        assert jobs(api) == []
        api, c, _ = setup("10:07", startingDeadlineSeconds=60)   # 10:05 is 2.5 minutes ago
        await step(api, c)
        assert jobs(api) == []
    run(go())


def test_many_missed_times_run_only_the_latest_and_say_so() -> None:
    async def go() -> None:
        api, c, clock = setup("10:07", schedule="* * * * *")
        clock.at = at("23:59")
        await step(api, c)
        assert len(jobs(api)) == 1 and status(api)["lastScheduleTime"] == "2026-03-01T23:59:00Z"
        reasons = [o.get("reason") for (plural, _), o in api.objects.items() if plural == "events"]
        assert "TooManyMissedTimes" in reasons
    run(go())


def test_fast_cron_runs_a_minute_a_second_only_when_named_twice(monkeypatch) -> None:
    labelled = {"metadata": {"labels": {"kube32.io/test-fault": "fast-cron"}}}
    assert testing.cron_speed(labelled) == 1.0                   # not in the environment
    monkeypatch.setenv("KUBE32_TEST_FAULTS", "fast-cron")
    assert testing.cron_speed(labelled) == 60.0
    assert testing.cron_speed({"metadata": {}}) == 1.0           # not on the CronJob
    clock = CronClock(60.0, 1000.0)
    assert clock.of(1002.0) == dt.datetime.fromtimestamp(1120.0, UTC)
    assert clock.scaled.real_delay(60.0) == 1.0
