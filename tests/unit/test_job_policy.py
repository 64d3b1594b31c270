"""A Job's pod failure policy, success policy and per-index back-off: the rule matching
(kube32.controllers.jobpolicy, table-driven), the controller acting on them against the
in-memory API of test_controllers_workloads, and the API server's validation."""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from kube32.apiserver.strategies.batch import JobStrategy
from kube32.client import JOBS, PODS
from kube32.controllers.jobpolicy import (FAIL_INDEX, FAIL_JOB, IGNORE, Match, index_failed,
                                          match_pod_failure_policy, match_success_policy, next_failure_counts)
from tests.unit.test_controllers_workloads import FakeApi, run
from tests.unit.test_job_controller import KEY, condition, jobs_controller, status

Obj = dict[str, Any]


def failed_pod(*codes: tuple[str, int], conditions: list[Obj] | None = None, init: list[tuple[str, int]] = (),
               annotations: dict[str, str] | None = None) -> Obj:
    def statuses(cs: Any) -> list[Obj]:
        return [{"name": n, "state": {"terminated": {"exitCode": c, "reason": "Error" if c else "Completed"}}}
                for n, c in cs]
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "status": {"phase": "Failed", "containerStatuses": statuses(codes),
                       "initContainerStatuses": statuses(init), "conditions": conditions or []}}


def exit_rule(action: str, operator: str, values: list[int], container: str | None = None) -> Obj:
    req: Obj = {"operator": operator, "values": values}
    if container is not None:
        req["containerName"] = container
    return {"action": action, "onExitCodes": req}


def condition_rule(action: str, ctype: str, cstatus: str = "True") -> Obj:
    return {"action": action, "onPodConditions": [{"type": ctype, "status": cstatus}]}


DISRUPTED = [{"type": "DisruptionTarget", "status": "True"}]


@pytest.mark.parametrize(("rules", "pod", "want"), [
    ([], failed_pod(("main", 1)), Match()),
    ([exit_rule(FAIL_JOB, "In", [42])], failed_pod(("main", 42)),
     Match(action=FAIL_JOB, message="Container main for pod ns/p failed with exit code 42 matching FailJob "
                                    "rule at index 0")),
    ([exit_rule(FAIL_JOB, "In", [42])], failed_pod(("main", 1)), Match()),
    ([exit_rule(IGNORE, "NotIn", [1, 2])], failed_pod(("main", 3)), Match(counted=False, action=IGNORE)),
    ([exit_rule(IGNORE, "NotIn", [1, 2])], failed_pod(("main", 2)), Match()),
    # exit code 0 never matches, not even NotIn
    ([exit_rule(FAIL_JOB, "NotIn", [1])], failed_pod(("main", 0)), Match()),
    # containerName: only that container's code
    ([exit_rule(FAIL_JOB, "In", [5], "side")], failed_pod(("main", 5), ("side", 1)), Match()),
    ([exit_rule(FAIL_JOB, "In", [5], "side")], failed_pod(("main", 1), ("side", 5)),
     Match(action=FAIL_JOB, message="Container side for pod ns/p failed with exit code 5 matching FailJob "
                                    "rule at index 0")),
    # init containers are looked at after the containers
    ([exit_rule("Count", "In", [7])], failed_pod(init=[("setup", 7)]), Match(action="Count")),
    # the first matching rule wins
    ([exit_rule(IGNORE, "In", [3]), exit_rule(FAIL_JOB, "In", [3])], failed_pod(("main", 3)),
     Match(counted=False, action=IGNORE)),
    ([exit_rule(IGNORE, "In", [9]), exit_rule(FAIL_JOB, "NotIn", [9])], failed_pod(("main", 3)),
     Match(action=FAIL_JOB, message="Container main for pod ns/p failed with exit code 3 matching FailJob "
                                    "rule at index 1")),
    ([condition_rule(IGNORE, "DisruptionTarget")], failed_pod(("main", 1), conditions=DISRUPTED),
     Match(counted=False, action=IGNORE)),
    ([condition_rule(IGNORE, "DisruptionTarget", "False")], failed_pod(("main", 1), conditions=DISRUPTED), Match()),
    ([condition_rule(FAIL_JOB, "DisruptionTarget")], failed_pod(conditions=DISRUPTED),
     Match(action=FAIL_JOB, message="Pod ns/p has condition DisruptionTarget matching FailJob rule at index 0")),
    ([exit_rule(FAIL_INDEX, "In", [4])], failed_pod(("main", 4)), Match(action=FAIL_INDEX)),
    # a container still running has no exit code; an action this version does not know is skipped
    ([exit_rule(FAIL_JOB, "NotIn", [1])], {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"running": {}}}]}}, Match()),
    ([exit_rule("Explode", "In", [1]), exit_rule(IGNORE, "In", [1])], failed_pod(("main", 1)),
     Match(counted=False, action=IGNORE)),
])
def test_pod_failure_policy_rules(rules: list[Obj], pod: Obj, want: Match) -> None:
    assert match_pod_failure_policy({"rules": rules}, pod) == want


def test_no_policy_counts_every_failure() -> None:
    assert match_pod_failure_policy(None, failed_pod(("main", 1))) == Match()


@pytest.mark.parametrize(("rules", "succeeded", "want"), [
    ([{"succeededIndexes": "0"}], {0}, "Matched rules at index 0"),
    ([{"succeededIndexes": "0,2"}], {0, 1}, None),
    ([{"succeededIndexes": "0-3", "succeededCount": 2}], {1, 3}, "Matched rules at index 0"),
    ([{"succeededIndexes": "0-3", "succeededCount": 3}], {1, 3, 4}, None),
    ([{"succeededCount": 2}], {3, 4}, "Matched rules at index 0"),
    ([{"succeededCount": 3}, {"succeededIndexes": "4"}], {3, 4}, "Matched rules at index 1"),
    ([{"succeededIndexes": "x"}, {"succeededCount": 1}], {2}, "Matched rules at index 1"),   # unparsable: skipped
    ([{"succeededCount": 1}], set(), None),
])
def test_success_policy_rules(rules: list[Obj], succeeded: set[int], want: str | None) -> None:
    assert match_success_policy({"rules": rules}, 5, succeeded) == want


@pytest.mark.parametrize(("annotations", "match", "failed", "counts"), [
    ({}, Match(), False, (1, 0)),                                         # limit 1: one more try
    ({"batch.kubernetes.io/job-index-failure-count": "1"}, Match(), True, (2, 0)),
    ({"batch.kubernetes.io/job-index-failure-count": "1"}, Match(counted=False, action=IGNORE), False, (1, 1)),
    ({}, Match(action=FAIL_INDEX), True, (1, 0)),
    ({"batch.kubernetes.io/job-index-failure-count": "-3"}, Match(), False, (1, 0)),      # unreadable: 0
    ({"batch.kubernetes.io/job-index-failure-count": "99999999999"}, Match(), False, (1, 0)),
])
def test_per_index_failure_counts(annotations: dict[str, str], match: Match, failed: bool,
                                  counts: tuple[int, int]) -> None:
    job = {"spec": {"backoffLimitPerIndex": 1}}
    pod = failed_pod(("main", 1), annotations=annotations)
    assert index_failed(job, pod, match) is failed
    assert next_failure_counts(pod, match) == counts


# --- the controller ------------------------------------------------------------------------
def job(**spec: Any) -> Obj:
    obj = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "pi", "namespace": "default", "uid": str(uuid.uuid4())},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "wasm://x/exit.wasm"}]}},
                    **spec}}
    JobStrategy().default(obj)
    assert JobStrategy().validate(obj) == []
    return obj


async def end(api: FakeApi, name: str, code: int) -> None:
    await api.patch(PODS, name, {"status": {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "c", "state": {"terminated": {
            "exitCode": code, "finishedAt": "2020-01-01T00:00:00Z"}}}]}}, "default", subresource="status")
    api.deliver()


def live(api: FakeApi) -> list[Obj]:
    return sorted((p for p in api.pods() if not (p.get("status") or {}).get("phase")),
                  key=lambda p: p["metadata"]["name"])


def test_a_fail_job_rule_fails_the_job_at_once() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(completions=2, parallelism=2, backoffLimit=5,
                          podFailurePolicy={"rules": [exit_rule(FAIL_JOB, "In", [42])]}))
        await jc.sync(KEY)
        api.deliver()
        a, b = live(api)
        await end(api, a["metadata"]["name"], 42)
        await jc.sync(KEY)
        api.deliver()
        target = condition(api, "FailureTarget")
        assert target and target["reason"] == "PodFailurePolicy"
        assert target["message"] == (f"Container c for pod default/{a['metadata']['name']} failed with exit code 42 "
                                     "matching FailJob rule at index 0")
        assert condition(api, "Failed") is None and b["metadata"]["name"] not in {p["metadata"]["name"]
                                                                                 for p in api.pods()}
        await jc.sync(KEY)                      # the other pod is gone: Failed, same reason and message
        api.deliver()
        failed = condition(api, "Failed")
        assert failed and failed["reason"] == "PodFailurePolicy" and failed["message"] == target["message"]
        assert status(api)["failed"] == 1 and "completionTime" not in status(api)
    run(go())


def test_an_ignored_failure_is_not_counted_and_is_replaced_at_once() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api, job_backoff_seconds=3600.0)
        api.put(JOBS, job(backoffLimit=0, podFailurePolicy={"rules": [exit_rule(IGNORE, "In", [7])]}))
        await jc.sync(KEY)
        api.deliver()
        (first,) = live(api)
        await end(api, first["metadata"]["name"], 7)
        await jc.sync(KEY)
        api.deliver()
        assert status(api)["failed"] == 0 and condition(api, "FailureTarget") is None
        (second,) = live(api)                   # no back-off: the failure does not count
        await end(api, second["metadata"]["name"], 0)
        await jc.sync(KEY)
        api.deliver()
        done = condition(api, "Complete")
        assert done and done["reason"] == "CompletionsReached"
        assert condition(api, "SuccessCriteriaMet")["reason"] == "CompletionsReached"
    run(go())


def test_a_success_policy_completes_the_job_and_ends_the_other_indexes() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api)
        api.put(JOBS, job(completions=3, parallelism=3, completionMode="Indexed",
                          successPolicy={"rules": [{"succeededIndexes": "0"}]}))
        await jc.sync(KEY)
        api.deliver()
        zero = next(p for p in live(api) if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                    == "0")
        await end(api, zero["metadata"]["name"], 0)
        await jc.sync(KEY)
        api.deliver()
        met = condition(api, "SuccessCriteriaMet")
        assert met and (met["reason"], met["message"]) == ("SuccessPolicy", "Matched rules at index 0")
        assert live(api) == [] and api.deletes() == 2
        await jc.sync(KEY)
        api.deliver()
        done = condition(api, "Complete")
        assert done and done["reason"] == "SuccessPolicy" and status(api)["completionTime"]
        assert status(api)["completedIndexes"] == "0" and status(api)["succeeded"] == 1
    run(go())


def test_backoff_limit_per_index_fails_one_index_and_the_rest_complete() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api, job_backoff_seconds=0.0)
        api.put(JOBS, job(completions=2, parallelism=2, completionMode="Indexed", backoffLimitPerIndex=1))
        assert api.objects[("jobs", KEY)]["spec"]["backoffLimit"] == 2**31 - 1
        await jc.sync(KEY)
        api.deliver()
        pods = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in live(api)}
        assert pods["1"]["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "0"
        await end(api, pods["0"]["metadata"]["name"], 0)
        await end(api, pods["1"]["metadata"]["name"], 1)
        await jc.sync(KEY)
        api.deliver()
        (again,) = live(api)                     # index 1's second try, its failure counted
        assert again["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "1"
        assert status(api)["failedIndexes"] == ""
        await end(api, again["metadata"]["name"], 1)
        await jc.sync(KEY)
        api.deliver()
        assert status(api)["failedIndexes"] == "1" and live(api) == []
        failed = condition(api, "Failed")
        assert failed and (failed["reason"], failed["message"]) == ("FailedIndexes", "Job has failed indexes")
        assert status(api)["completedIndexes"] == "0" and status(api)["failed"] == 2
    run(go())


def test_max_failed_indexes_and_fail_index() -> None:
    async def go() -> None:
        api = FakeApi()
        jc = jobs_controller(api, job_backoff_seconds=0.0)
        api.put(JOBS, job(completions=3, parallelism=3, completionMode="Indexed", backoffLimitPerIndex=5,
                          maxFailedIndexes=0, podFailurePolicy={"rules": [exit_rule(FAIL_INDEX, "In", [3])]}))
        await jc.sync(KEY)
        api.deliver()
        first = live(api)[0]
        await end(api, first["metadata"]["name"], 3)
        await jc.sync(KEY)
        api.deliver()
        target = condition(api, "FailureTarget")
        assert target and target["reason"] == "MaxFailedIndexesExceeded"
        assert target["message"] == "Job has exceeded the specified maximal number of failed indexes"
        assert status(api)["failedIndexes"] == first["metadata"]["annotations"][
            "batch.kubernetes.io/job-completion-index"]
    run(go())


# --- validation ------------------------------------------------------------------------------
def errors(rp: str = "Never", **spec: Any) -> list[tuple[str, str]]:
    obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi", "uid": "u"},
           "spec": {"template": {"spec": {"restartPolicy": rp, "containers": [{"name": "c", "image": "x"}]}},
                    **spec}}
    JobStrategy().default(obj)
    return JobStrategy().validate(obj)


@pytest.mark.parametrize(("spec", "want"), [
    ({"rp": "OnFailure", "podFailurePolicy": {"rules": []}},
     ("spec.template.spec.restartPolicy",
      'Invalid value: "OnFailure": only "Never" is supported when podFailurePolicy is specified')),
    ({"podFailurePolicy": {"rules": [exit_rule(FAIL_INDEX, "In", [1])]}},
     ("spec.podFailurePolicy.rules[0].action", 'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set')),
    ({"podFailurePolicy": {"rules": [exit_rule("Explode", "In", [1])]}},
     ("spec.podFailurePolicy.rules[0].action",
      'Unsupported value: "Explode": supported values: "Count", "FailIndex", "FailJob", "Ignore"')),
    ({"podFailurePolicy": {"rules": [exit_rule(FAIL_JOB, "In", [0])]}},
     ("spec.podFailurePolicy.rules[0].onExitCodes.values[0]", "Invalid value: 0: must not be 0 for the In operator")),
    ({"podFailurePolicy": {"rules": [exit_rule(FAIL_JOB, "In", [2, 1])]}},
     ("spec.podFailurePolicy.rules[0].onExitCodes.values", "Invalid value: [2,1]: must be ordered")),
    ({"podFailurePolicy": {"rules": [exit_rule(FAIL_JOB, "In", [1], "nope")]}},
     ("spec.podFailurePolicy.rules[0].onExitCodes.containerName",
      'Invalid value: "nope": must be one of the container or initContainer names in the pod template')),
    ({"podFailurePolicy": {"rules": [{"action": FAIL_JOB}]}},
     ("spec.podFailurePolicy.rules[0]",
      "Invalid value: specifying one of OnExitCodes and OnPodConditions is required")),
    ({"podFailurePolicy": {"rules": [exit_rule(FAIL_JOB, "In", [1])] * 21}},
     ("spec.podFailurePolicy.rules", "Too many: 21: must have at most 20 items")),
    ({"podFailurePolicy": {"rules": []}, "podReplacementPolicy": "TerminatingOrFailed"},
     ("spec.podReplacementPolicy", 'Unsupported value: "TerminatingOrFailed": supported values: "Failed"')),
    ({"successPolicy": {"rules": [{"succeededCount": 1}]}},
     ("spec.successPolicy", 'Invalid value: {"rules":[{"succeededCount":1}]}: requires indexed completion mode')),
    ({"completionMode": "Indexed", "completions": 3, "successPolicy": {"rules": [{"succeededIndexes": "1-5"}]}},
     ("spec.successPolicy.rules[0].succeededIndexes",
      'Invalid value: "1-5": error parsing succeededIndexes: too large index: "5"')),
    ({"completionMode": "Indexed", "completions": 3, "successPolicy": {"rules": [{}]}},
     ("spec.successPolicy.rules[0]",
      "Required value: at least one of succeededCount or succeededIndexes must be specified")),
    ({"completionMode": "Indexed", "completions": 3,
      "successPolicy": {"rules": [{"succeededIndexes": "0,1", "succeededCount": 3}]}},
     ("spec.successPolicy.rules[0].succeededCount", "Invalid value: 3: must be less than or equal to 2 "
                                                    "(the number of indexes in the specified succeededIndexes field)")),
    ({"backoffLimitPerIndex": 1}, ("spec.backoffLimitPerIndex", "Invalid value: 1: requires indexed completion mode")),
    ({"completionMode": "Indexed", "completions": 3, "maxFailedIndexes": 1},
     ("spec.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified")),
    ({"completionMode": "Indexed", "completions": 3, "backoffLimitPerIndex": 1, "maxFailedIndexes": 4},
     ("spec.maxFailedIndexes", "Invalid value: 4: must be less than or equal to completions")),
])
def test_validation_in_kubernetes_words(spec: dict[str, Any], want: tuple[str, str]) -> None:
    assert want in errors(**spec)


def test_valid_policies_pass_and_are_immutable() -> None:
    spec = {"completionMode": "Indexed", "completions": 3, "backoffLimitPerIndex": 1, "maxFailedIndexes": 1,
            "podFailurePolicy": {"rules": [exit_rule(FAIL_INDEX, "In", [1, 2]),
                                           condition_rule(IGNORE, "DisruptionTarget")]},
            "successPolicy": {"rules": [{"succeededIndexes": "0-2", "succeededCount": 2}]}}
    assert errors(**spec) == []
    old = job(**spec)
    new = {**old, "spec": {**old["spec"], "successPolicy": {"rules": [{"succeededCount": 1}]}}}
    assert ("spec.successPolicy", "Invalid value: field is immutable") in JobStrategy().validate_update(new, old)
