"""The Job controller against the in-memory API of test_controllers_workloads (its watch
events delivered by the test), and the batch strategies' defaults and validation."""
from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from kube32 import objects
from kube32.apiserver.strategies.batch import CronJobStrategy, JobStrategy
from kube32.client import JOBS, PODS
from kube32.controllers.base import ControllerContext, ControllerOptions, SharedInformers
from kube32.controllers.job import JobController, format_indexes, parse_indexes
from tests.unit.test_controllers_workloads import FakeApi, run

Obj = dict[str, Any]
KEY = "default/pi"


def job(**spec: Any) -> Obj:
    obj = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "pi", "namespace": "default", "uid": str(uuid.uuid4())},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "wasm://x/clock.wasm"}]}},
                    **spec}}
    JobStrategy().default(obj)
    assert JobStrategy().validate(obj) == []
    return obj


def jobs_controller(api: FakeApi, **options: Any) -> JobController:
    informers = SharedInformers(api)  # type: ignore[arg-type]
    api.informers = informers
    ctx = ControllerContext(api, informers, ControllerOptions(**options), None)  # type: ignore[arg-type]
    c = JobController(ctx)
    c.setup()
    return c


async def finish(api: FakeApi, phase: str, *names: str) -> None:
    for name in names:
        await api.patch(PODS, name, {"status": {"phase": phase}}, "default", subresource="status")
    api.deliver()


def status(api: FakeApi) -> Obj:
    return api.objects[("jobs", KEY)].get("status") or {}


def condition(api: FakeApi, ctype: str) -> Obj | None:
    return next((c for c in status(api).get("conditions") or [] if c["type"] == ctype), None)


def pod_names(api: FakeApi) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.pods())


def test_a_job_runs_its_completions_one_at_a_time_and_completes() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        j = api.put(JOBS, job(completions=2, parallelism=1))
        await jc.sync(KEY)
        assert api.creates() == 1
        await jc.sync(KEY)                      # its pod not seen yet: no second create
        assert api.creates() == 1
        api.deliver()
        (pod,) = api.pods()
        md = pod["metadata"]
        assert md["generateName"] == "pi-" and md["ownerReferences"][0]["uid"] == j["metadata"]["uid"]
        assert md["labels"]["batch.kubernetes.io/job-name"] == "pi" and md["labels"]["job-name"] == "pi"
        assert md["labels"]["batch.kubernetes.io/controller-uid"] == j["metadata"]["uid"]
        await jc.sync(KEY)
        api.deliver()
        assert status(api)["active"] == 1 and status(api)["startTime"]
        await finish(api, "Succeeded", md["name"])
        await jc.sync(KEY)
        api.deliver()
        assert api.creates() == 2 and status(api)["succeeded"] == 1
        await finish(api, "Succeeded", *[n for n in pod_names(api) if n != md["name"]])
        await jc.sync(KEY)
        api.deliver()
        done = condition(api, "Complete")
        assert done and done["status"] == "True" and done["reason"] == "CompletionsReached"
        assert status(api)["succeeded"] == 2 and status(api)["active"] == 0 and status(api)["completionTime"]
        await jc.sync(KEY)
        assert api.creates() == 2               # finished: nothing more
    run(go())


def test_parallel_pods_and_extra_ones_deleted_when_parallelism_drops() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(completions=5, parallelism=3))
        await jc.sync(KEY)
        api.deliver()
        assert len(api.pods()) == 3
        await api.patch(JOBS, "pi", {"spec": {"parallelism": 1}}, "default")
        api.deliver()
        await jc.sync(KEY)
        api.deliver()
        assert len(api.pods()) == 1 and api.deletes() == 2
    run(go())


def test_a_failing_job_retries_after_a_back_off_then_hits_its_backoff_limit() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api, job_backoff_seconds=30.0)
        api.put(JOBS, job(backoffLimit=1))
        await jc.sync(KEY)
        api.deliver()
        await finish(api, "Failed", *pod_names(api))
        await jc.sync(KEY)
        api.deliver()
        assert api.creates() == 1 and status(api)["failed"] == 1   # waiting out the back-off
        jc._last_failure[KEY] = (1, 0.0)                           # ... which has passed
        await jc.sync(KEY)
        api.deliver()
        assert api.creates() == 2
        second = [p["metadata"]["name"] for p in api.pods() if not (p.get("status") or {}).get("phase")]
        await finish(api, "Failed", *second)
        await jc.sync(KEY)
        api.deliver()
        failed = condition(api, "Failed")
        assert failed and failed["reason"] == "BackoffLimitExceeded"
        assert failed["message"] == "Job has reached the specified backoff limit"
        assert status(api)["failed"] == 2 and "completionTime" not in status(api)
    run(go())


def test_restarts_under_on_failure_count_toward_the_backoff_limit() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        j = job(backoffLimit=2)
        j["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
        api.put(JOBS, j)
        await jc.sync(KEY)
        api.deliver()
        (name,) = pod_names(api)
        await api.patch(PODS, name, {"status": {"phase": "Running", "containerStatuses": [
            {"name": "c", "restartCount": 3, "state": {"running": {}}}]}}, "default", subresource="status")
        api.deliver()
        await jc.sync(KEY)
        api.deliver()
        assert condition(api, "FailureTarget")["reason"] == "BackoffLimitExceeded"
        assert condition(api, "Failed") is None and status(api)["terminating"] == 1
        assert api.pods() == []                 # the active pod is deleted ...
        await jc.sync(KEY)                      # ... and seen gone: Failed follows
        api.deliver()
        assert condition(api, "Failed")["reason"] == "BackoffLimitExceeded"
        assert status(api)["terminating"] == 0
    run(go())


def test_active_deadline_fails_the_job_and_deletes_its_pods() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(activeDeadlineSeconds=5))
        await jc.sync(KEY)
        api.deliver()
        await api.patch(JOBS, "pi", {"status": {"startTime": "2020-01-01T00:00:00Z"}}, "default",
                        subresource="status")
        api.deliver()
        await jc.sync(KEY)
        api.deliver()
        await jc.sync(KEY)
        api.deliver()
        c = condition(api, "Failed")
        assert c and c["reason"] == "DeadlineExceeded" and api.pods() == []
        assert condition(api, "FailureTarget")["reason"] == "DeadlineExceeded"
    run(go())


def test_an_indexed_job_runs_each_index_once() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(completions=3, parallelism=2, completionMode="Indexed"))
        await jc.sync(KEY)
        api.deliver()
        by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
                    for p in api.pods()}
        assert sorted(by_index) == ["0", "1"]
        zero = by_index["0"]
        assert zero["metadata"]["generateName"] == "pi-0-"
        assert {"name": "JOB_COMPLETION_INDEX", "value": "0"} in zero["spec"]["containers"][0]["env"]
        await finish(api, "Succeeded", zero["metadata"]["name"])
        await jc.sync(KEY)
        api.deliver()
        assert status(api)["completedIndexes"] == "0"
        new = [p for p in api.pods() if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "2"]
        assert len(new) == 1
        await finish(api, "Succeeded", *[p["metadata"]["name"] for p in api.pods()
                                         if (p.get("status") or {}).get("phase") != "Succeeded"])
        await jc.sync(KEY)
        assert status(api)["completedIndexes"] == "0-2" and condition(api, "Complete")
    run(go())


def test_a_suspended_job_has_no_pods_and_says_so() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(suspend=True))
        await jc.sync(KEY)
        api.deliver()
        assert api.pods() == [] and condition(api, "Suspended")["status"] == "True"
        assert "startTime" not in status(api)
        await api.patch(JOBS, "pi", {"spec": {"suspend": False}}, "default")
        api.deliver()
        await jc.sync(KEY)
        api.deliver()
        assert len(api.pods()) == 1 and condition(api, "Suspended")["status"] == "False"
    run(go())


def test_a_finished_job_with_a_ttl_is_deleted() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(ttlSecondsAfterFinished=0))
        await jc.sync(KEY)
        api.deliver()
        await finish(api, "Succeeded", *pod_names(api))
        await jc.sync(KEY)
        api.deliver()
        assert condition(api, "Complete")
        await jc.sync(KEY)
        assert ("jobs", KEY) not in api.objects
    run(go())


@pytest.mark.parametrize("indexes,text", [(set(), ""), ({0}, "0"), ({0, 1, 2, 4}, "0-2,4"),
                                          ({1, 3, 5, 6}, "1,3,5,6"), ({5, 6, 7}, "5-7")])
def test_completed_indexes_round_trip(indexes: set[int], text: str) -> None:
    assert format_indexes(indexes) == text and parse_indexes(text, 10) == indexes


def test_completed_indexes_written_by_hand_stay_within_the_job() -> None:
    assert parse_indexes("0-999999999999,x,3-", 5) == {0, 1, 2, 3, 4}


# --- strategies ---------------------------------------------------------------------
def test_job_defaults_as_kubernetes() -> None:
    j = job()
    spec = j["spec"]
    uid = j["metadata"]["uid"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"], spec["completionMode"],
            spec["suspend"]) == (1, 1, 6, "NonIndexed", False)
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert spec["template"]["metadata"]["labels"] == {
        "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid,
        "job-name": "pi", "batch.kubernetes.io/job-name": "pi"}
    assert job(parallelism=3)["spec"].get("completions") is None


@pytest.mark.parametrize("change,field,message", [
    ({"restartPolicy": "Always"}, "spec.template.spec.restartPolicy", 'Unsupported value: "Always"'),
    ({"restartPolicy": None}, "spec.template.spec.restartPolicy", "Required value"),
])
def test_a_job_template_must_run_to_completion(change: Obj, field: str, message: str) -> None:
    j = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi", "uid": "u"},
         "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    for k, v in change.items():
        if v is not None:
            j["spec"]["template"]["spec"][k] = v
    JobStrategy().default(j)
    errs = JobStrategy().validate(j)
    assert any(f == field and message in m for f, m in errs), errs


def test_job_fields_are_checked_and_immutable() -> None:
    bad = job()
    bad["spec"].update({"backoffLimit": -1, "completionMode": "Sometimes"})
    fields = {f for f, _ in JobStrategy().validate(bad)}
    assert {"spec.backoffLimit", "spec.completionMode"} <= fields
    old = job()
    new = copy.deepcopy(old)
    new["spec"]["completions"] = 4
    assert ("spec.completions", "Invalid value: field is immutable") in JobStrategy().validate_update(new, old)
    assert JobStrategy().unknown_nested({"spec": {"completion": 1}}) == ["spec.completion"]


def cronjob(**spec: Any) -> Obj:
    obj = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick", "namespace": "default"},
           "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
               "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "x"}]}}}}, **spec}}
    CronJobStrategy().default(obj)
    return obj


def test_cronjob_defaults_and_validation() -> None:
    cj = cronjob()
    assert CronJobStrategy().validate(cj) == []
    assert (cj["spec"]["concurrencyPolicy"], cj["spec"]["suspend"], cj["spec"]["successfulJobsHistoryLimit"],
            cj["spec"]["failedJobsHistoryLimit"]) == ("Allow", False, 3, 1)
    errs = dict(CronJobStrategy().validate(cronjob(schedule="61 * * * *", timeZone="Nowhere/Land",
                                                    concurrencyPolicy="Sometimes")))
    assert errs["spec.schedule"] == 'Invalid value: "61 * * * *": minute: 61 is out of range 0-59'
    assert "unknown time zone" in errs["spec.timeZone"]
    assert errs["spec.concurrencyPolicy"].startswith('Unsupported value: "Sometimes"')
    long_name = cronjob()
    long_name["metadata"]["name"] = "x" * 53
    assert "metadata.name" in dict(CronJobStrategy().validate(long_name))


def test_job_and_cronjob_rows_as_kubectl() -> None:
    j = job(completions=3)
    j["status"] = {"succeeded": 1, "startTime": objects.rfc3339()}
    row = JobStrategy().row(j)
    assert row[:3] == ["pi", "Running", "1/3"] and row[5:] == ["c", "wasm://x/clock.wasm",
                                                              f"batch.kubernetes.io/controller-uid={j['metadata']['uid']}"]
    cj = cronjob(timeZone="Europe/Berlin")
    assert CronJobStrategy().row(cj)[:6] == ["tick", "*/5 * * * *", "Europe/Berlin", "False", 0, "<none>"]
