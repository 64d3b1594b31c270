"""batch/v1 Jobs and CronJobs, and DaemonSet ControllerRevisions, with the real kubectl.

One ``kube32-sim up --workers 1`` cluster (nodes devkit and sim-1) whose control plane runs
under the test fault ``fast-cron`` (kube32.testing: a CronJob labelled
``kube32.io/test-fault: fast-cron`` lives on a clock where a minute of schedule passes in
a second), with a Job back-off of 1 s.  Jobs run command pods: the example ``clock``
(logs LINES ticks, then returns: Succeeded), the example ``exit`` (returns EXIT_CODE after
SLEEP_MS, per completion index with EXIT_CODE_<i>: its exit code) and a module whose
``_start`` traps (Failed).
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest
import wasmtime
import yaml

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import get_json, push

CLOCK = ROOT / "examples" / "pods" / "clock.wasm"
EXIT = ROOT / "examples" / "pods" / "exit.wasm"
TRAPS = '(module (memory (export "memory") 1) (func (export "_start") unreachable))'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBE32_TEST_FAULTS", "fast-cron")
        c = start_cluster(tmp_path_factory.mktemp("batch"), 1, "--backoff", "1", "--job-backoff", "1s")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def clock(cluster: ControlPlane) -> str:
    return push(cluster, CLOCK)


@pytest.fixture(scope="module")
def traps(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> str:
    wasm = tmp_path_factory.mktemp("traps") / "traps.wasm"
    wasm.write_bytes(wasmtime.wat2wasm(TRAPS))
    return push(cluster, wasm)


@pytest.fixture(scope="module")
def exits(cluster: ControlPlane) -> str:
    return push(cluster, EXIT)


def job_yaml(name: str, image: str, env: dict[str, str] | None = None, **spec: Any) -> str:
    container = {"name": "main", "image": image, "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    return yaml.safe_dump({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
                                    **spec}})


def job_pods(cluster: ControlPlane, job: str) -> list[dict]:
    return get_json(cluster, "pods", "-l", f"batch.kubernetes.io/job-name={job}")["items"]


def table(cluster: ControlPlane, *args: str) -> list[dict[str, str]]:
    """``kubectl get``'s table as rows of column name -> cell."""
    lines = cluster.kubectl("get", *args).stdout.splitlines()
    heads = list(re.finditer(r"\S+(?: \S+)*", lines[0]))   # names of one space: "LAST SCHEDULE"
    starts = [m.start() for m in heads]
    names = [m.group() for m in heads]
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [len(line) + 1], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


# --- Jobs ---------------------------------------------------------------------------------
def test_a_job_of_command_pods_runs_to_completion(cluster: ControlPlane, clock: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=job_yaml("ticks", clock, {"LINES": "2", "PERIOD_MS": "100"},
                                                      completions=2, parallelism=2))
    cluster.kubectl("wait", "--for=condition=complete", "job/ticks", "--timeout=60s")
    job = get_json(cluster, "job", "ticks")
    st = job["status"]
    assert st["succeeded"] == 2 and st.get("active", 0) == 0 and st["startTime"] and st["completionTime"]
    (cond,) = [c for c in st["conditions"] if c["type"] == "Complete"]
    assert cond["status"] == "True" and cond["reason"] == "CompletionsReached"
    pods = job_pods(cluster, "ticks")
    assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    for p in pods:
        md = p["metadata"]
        assert md["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert md["labels"]["controller-uid"] == md["labels"]["batch.kubernetes.io/controller-uid"] == \
            job["metadata"]["uid"]
    (row,) = table(cluster, "jobs")
    assert (row["NAME"], row["STATUS"], row["COMPLETIONS"]) == ("ticks", "Complete", "2/2"), row
    assert "clock: tick 2" in cluster.kubectl("logs", "job/ticks").stdout
    described = cluster.kubectl("describe", "job", "ticks").stdout
    assert "0 Active (0 Ready) / 2 Succeeded / 0 Failed" in described, described
    cluster.kubectl("delete", "job", "ticks")
    wait_for(lambda: not job_pods(cluster, "ticks"), 30, what="the Job's pods to go with it")


def test_a_failing_job_retries_then_fails_at_its_backoff_limit(cluster: ControlPlane, traps: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=job_yaml("broken", traps, backoffLimit=1))
    cluster.kubectl("wait", "--for=condition=failed", "job/broken", "--timeout=60s")
    st = get_json(cluster, "job", "broken")["status"]
    (cond,) = [c for c in st["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "BackoffLimitExceeded" and st["failed"] == 2 and "completionTime" not in st
    assert [p["status"]["phase"] for p in job_pods(cluster, "broken")] == ["Failed", "Failed"]
    assert table(cluster, "job", "broken")[0]["STATUS"] == "Failed"
    cluster.kubectl("delete", "job", "broken")


def test_kubectl_create_job_logs_and_delete_with_its_pods(cluster: ControlPlane, clock: str) -> None:
    out = cluster.kubectl("create", "job", "forever", f"--image={clock}").stdout   # a protobuf body
    assert out.strip() == "job.batch/forever created"
    wait_for(lambda: "clock: tick 1" in cluster.kubectl("logs", "job/forever", check=False).stdout, 30,
             what="the Job's pod to log")
    (pod,) = job_pods(cluster, "forever")
    assert pod["spec"]["restartPolicy"] == "Never"
    cluster.kubectl("delete", "job", "forever")
    wait_for(lambda: not job_pods(cluster, "forever"), 30, what="the Job's pod to go with it")


def test_a_job_past_its_deadline_fails_and_a_finished_one_expires(cluster: ControlPlane, clock: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=job_yaml("slow", clock, activeDeadlineSeconds=2,
                                                      ttlSecondsAfterFinished=2))
    cluster.kubectl("wait", "--for=condition=failed", "job/slow", "--timeout=30s")
    cond = [c for c in get_json(cluster, "job", "slow")["status"]["conditions"] if c["type"] == "Failed"][0]
    assert cond["reason"] == "DeadlineExceeded"
    wait_for(lambda: cluster.kubectl("get", "job", "slow", check=False).returncode != 0, 30,
             what="the finished Job to be deleted after its TTL")
    wait_for(lambda: not job_pods(cluster, "slow"), 30, what="its pods to go with it")


# --- podFailurePolicy, successPolicy, backoffLimitPerIndex ---------------------------------
def conditions(cluster: ControlPlane, name: str) -> dict[str, dict]:
    return {c["type"]: c for c in get_json(cluster, "job", name)["status"].get("conditions") or []}


def by_index(pods: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
        out.setdefault(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"], []).append(p)
    return out


def test_a_fail_job_rule_on_an_exit_code_fails_the_job_at_once(cluster: ControlPlane, exits: str) -> None:
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                                              "values": [42]}}]}
    cluster.kubectl("apply", "-f", "-", input=job_yaml("doomed", exits, {"EXIT_CODE": "42"}, backoffLimit=6,
                                                      podFailurePolicy=policy))
    cluster.kubectl("wait", "--for=condition=failed", "job/doomed", "--timeout=60s")
    (pod,) = job_pods(cluster, "doomed")    # not retried: the rule failed the Job
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (42, "Error", "main returned 42")
    conds = conditions(cluster, "doomed")
    want = (f"Container main for pod default/{pod['metadata']['name']} failed with exit code 42 matching FailJob "
            "rule at index 0")
    for ctype in ("FailureTarget", "Failed"):
        assert (conds[ctype]["status"], conds[ctype]["reason"], conds[ctype]["message"]) == \
            ("True", "PodFailurePolicy", want), conds
    st = get_json(cluster, "job", "doomed")["status"]
    assert st["failed"] == 1 and "completionTime" not in st
    assert get_json(cluster, "job", "doomed")["spec"]["podReplacementPolicy"] == "Failed"   # its default
    events = get_json(cluster, "events", "--field-selector", "involvedObject.name=doomed,reason=PodFailurePolicy")
    assert [e["message"] for e in events["items"]] == [want]
    cluster.kubectl("delete", "job", "doomed")

    bad = yaml.safe_load(job_yaml("bad-policy", exits, podFailurePolicy=policy))
    bad["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert out.returncode != 0 and 'spec.template.spec.restartPolicy: Invalid value: "OnFailure": only "Never" ' \
        "is supported when podFailurePolicy is specified" in out.stderr, out.stderr


def test_an_ignored_exit_code_is_not_counted(cluster: ControlPlane, exits: str) -> None:
    """backoffLimit 0: a counted failure would fail the Job at once; failures that an Ignore
    rule matches are replaced, uncounted, until the deadline ends the Job."""
    policy = {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]}
    cluster.kubectl("apply", "-f", "-", input=job_yaml("shrugs", exits, {"EXIT_CODE": "3", "SLEEP_MS": "200"},
                                                      backoffLimit=0, activeDeadlineSeconds=5,
                                                      podFailurePolicy=policy))
    cluster.kubectl("wait", "--for=condition=failed", "job/shrugs", "--timeout=60s")
    assert conditions(cluster, "shrugs")["Failed"]["reason"] == "DeadlineExceeded"
    st = get_json(cluster, "job", "shrugs")["status"]
    failed = [p for p in job_pods(cluster, "shrugs") if p["status"]["phase"] == "Failed"]
    assert st["failed"] == 0 and len(failed) >= 3, (st, len(failed))   # replaced at once: no back-off
    cluster.kubectl("delete", "job", "shrugs")


def test_a_success_policy_completes_an_indexed_job_and_ends_its_other_pods(cluster: ControlPlane,
                                                                          exits: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=job_yaml(
        "leader", exits, {"SLEEP_MS": "60000", "SLEEP_MS_0": "300"}, completions=3, parallelism=3,
        completionMode="Indexed", successPolicy={"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}))
    cluster.kubectl("wait", "--for=condition=complete", "job/leader", "--timeout=60s")
    conds = conditions(cluster, "leader")
    for ctype in ("SuccessCriteriaMet", "Complete"):
        assert (conds[ctype]["reason"], conds[ctype]["message"]) == ("SuccessPolicy", "Matched rules at index 0")
    assert conds["SuccessCriteriaMet"]["lastTransitionTime"] <= conds["Complete"]["lastTransitionTime"]
    st = get_json(cluster, "job", "leader")["status"]
    assert (st["completedIndexes"], st["succeeded"], st.get("active", 0), st.get("terminating", 0)) == \
        ("0", 1, 0, 0), st
    assert st["completionTime"]
    pods = wait_for(lambda: (ps := job_pods(cluster, "leader")) and len(ps) == 1 and ps, 30,
                    what="the other indexes' pods to be deleted")
    assert pods[0]["status"]["phase"] == "Succeeded"
    assert table(cluster, "job", "leader")[0]["STATUS"] == "Complete"
    cluster.kubectl("delete", "job", "leader")


def test_backoff_limit_per_index_retries_one_index_then_fails_it(cluster: ControlPlane, exits: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=job_yaml(
        "perindex", exits, {"EXIT_CODE_1": "1"}, completions=3, parallelism=3, completionMode="Indexed",
        backoffLimitPerIndex=1))
    try:
        wait_for(lambda: "Failed" in conditions(cluster, "perindex"), 60, what="the Job to fail")
    except AssertionError as e:
        raise AssertionError(json.dumps({"job": get_json(cluster, "job", "perindex")["status"], "pods": [
            (p["metadata"]["name"], p["metadata"]["annotations"], p["status"])
            for p in job_pods(cluster, "perindex")]}, indent=1)) from e
    job = get_json(cluster, "job", "perindex")
    assert job["spec"]["backoffLimit"] == 2147483647        # defaulted: the limit is per index
    st = job["status"]
    assert (st["failedIndexes"], st["completedIndexes"], st["failed"], st["succeeded"]) == ("1", "0,2", 2, 2), st
    conds = conditions(cluster, "perindex")
    assert (conds["Failed"]["reason"], conds["Failed"]["message"]) == ("FailedIndexes", "Job has failed indexes")
    pods = by_index(job_pods(cluster, "perindex"))
    assert [len(pods[i]) for i in ("0", "1", "2")] == [1, 2, 1]
    counts = [p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] for p in pods["1"]]
    assert counts == ["0", "1"]
    first_end = pods["1"][0]["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    assert pods["1"][1]["metadata"]["creationTimestamp"] >= first_end     # after the index's back-off
    cluster.kubectl("delete", "job", "perindex")


def test_jobs_are_in_discovery_and_the_default_roles(cluster: ControlPlane) -> None:
    names = cluster.kubectl("api-resources", "--api-group=batch", "-o", "name").stdout.split()
    assert sorted(names) == ["cronjobs.batch", "jobs.batch"]
    for role, verb in (("view", "list"), ("edit", "create"), ("admin", "delete")):
        rules = get_json(cluster, "clusterrole", role)["rules"]
        assert any("batch" in r.get("apiGroups", []) and "jobs" in r.get("resources", []) and verb in r["verbs"]
                   for r in rules), role


# --- CronJobs (on the fast clock: a minute of schedule a second) -----------------------
def cronjob_yaml(name: str, image: str, env: dict[str, str] | None = None, **spec: Any) -> str:
    container = {"name": "main", "image": image, "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    return yaml.safe_dump({"apiVersion": "batch/v1", "kind": "CronJob",
                           "metadata": {"name": name, "labels": {"kube32.io/test-fault": "fast-cron"}},
                           "spec": {"schedule": "* * * * *", **spec, "jobTemplate": {
                               "metadata": {"labels": {"cron": name}},
                               "spec": {"template": {"spec": {"restartPolicy": "Never",
                                                              "containers": [container]}}}}}})


def cron_jobs(cluster: ControlPlane, name: str) -> list[dict]:
    items = get_json(cluster, "jobs", "-l", f"cron={name}")["items"]
    return sorted(items, key=lambda j: j["metadata"]["name"])


def created_count(cluster: ControlPlane, name: str) -> int:
    events = get_json(cluster, "events", "--field-selector",
                      f"involvedObject.name={name},involvedObject.kind=CronJob,reason=SuccessfulCreate")["items"]
    return sum(int(e.get("count") or 1) for e in events)


def test_a_forbid_cronjob_never_runs_two_jobs_at_once(cluster: ControlPlane, clock: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=cronjob_yaml("forbid", clock, {"LINES": "3", "PERIOD_MS": "400"},
                                                          concurrencyPolicy="Forbid",
                                                          successfulJobsHistoryLimit=10))
    done = wait_for(lambda: (js := [j for j in cron_jobs(cluster, "forbid")
                                    if (j.get("status") or {}).get("completionTime")]) and len(js) >= 3 and js,
                    60, what="three runs of the CronJob")
    cluster.kubectl("patch", "cronjob", "forbid", "-p", '{"spec":{"suspend":true}}')
    for before, after in zip(done, done[1:], strict=False):
        assert after["metadata"]["creationTimestamp"] >= before["status"]["completionTime"], (before, after)
    cj = get_json(cluster, "cronjob", "forbid")
    assert cj["status"]["lastScheduleTime"] and cj["status"]["lastSuccessfulTime"]
    ann = done[0]["metadata"]["annotations"]
    assert "batch.kubernetes.io/cronjob-scheduled-timestamp" in ann
    assert done[0]["metadata"]["ownerReferences"][0]["uid"] == cj["metadata"]["uid"]
    cluster.kubectl("delete", "cronjob", "forbid")
    wait_for(lambda: not cron_jobs(cluster, "forbid"), 30, what="the CronJob's Jobs to go with it")


def test_a_replace_cronjob_replaces_its_running_job(cluster: ControlPlane, clock: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=cronjob_yaml("replace", clock, concurrencyPolicy="Replace"))
    seen: set[str] = set()

    def three_in_turn() -> bool:
        active = (get_json(cluster, "cronjob", "replace").get("status") or {}).get("active") or []
        assert len(active) <= 1, active
        seen.update(r["name"] for r in active)
        return len(seen) >= 3
    wait_for(three_in_turn, 60, interval=0.3, what="three Jobs in turn")
    cluster.kubectl("delete", "cronjob", "replace")
    wait_for(lambda: not cron_jobs(cluster, "replace"), 30, what="the CronJob's Jobs to go with it")


def test_history_limits_keep_the_latest_finished_jobs(cluster: ControlPlane, clock: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=cronjob_yaml("hist", clock, {"LINES": "1", "PERIOD_MS": "10"},
                                                          successfulJobsHistoryLimit=2))

    def kept() -> bool:
        finished = [j for j in cron_jobs(cluster, "hist") if (j.get("status") or {}).get("completionTime")]
        return created_count(cluster, "hist") >= 5 and len(finished) <= 2
    wait_for(kept, 60, interval=0.5, what="five runs with two finished Jobs kept")
    cluster.kubectl("delete", "cronjob", "hist")


def test_kubectl_create_cronjob_and_a_job_from_it(cluster: ControlPlane, clock: str) -> None:
    out = cluster.kubectl("create", "cronjob", "nightly", f"--image={clock}", "--schedule=0 3 * * *").stdout
    assert out.strip() == "cronjob.batch/nightly created"
    (row,) = [r for r in table(cluster, "cronjobs") if r["NAME"] == "nightly"]
    assert (row["SCHEDULE"], row["TIMEZONE"], row["SUSPEND"], row["ACTIVE"], row["LAST SCHEDULE"]) == \
        ("0 3 * * *", "<none>", "False", "0", "<none>"), row
    described = cluster.kubectl("describe", "cronjob", "nightly").stdout
    assert "0 3 * * *" in described and "Concurrency Policy:" in described, described
    cluster.kubectl("create", "job", "by-hand", "--from=cronjob/nightly")
    job = get_json(cluster, "job", "by-hand")
    assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    assert job["metadata"]["ownerReferences"][0]["name"] == "nightly"
    wait_for(lambda: "clock: tick 1" in cluster.kubectl("logs", "job/by-hand", check=False).stdout, 30,
             what="the Job's pod to log")
    bad = cluster.kubectl("create", "cronjob", "bad", f"--image={clock}", "--schedule=61 * * * *", check=False)
    assert bad.returncode != 0 and "minute: 61 is out of range 0-59" in bad.stderr
    cluster.kubectl("delete", "cronjob", "nightly")
    wait_for(lambda: cluster.kubectl("get", "job", "by-hand", check=False).returncode != 0, 30,
             what="the Job to go with its CronJob")


# --- DaemonSet ControllerRevisions ------------------------------------------------------
def daemonset_yaml(image: str, version: str) -> str:
    return yaml.safe_dump({"apiVersion": "apps/v1", "kind": "DaemonSet",
                           "metadata": {"name": "agent", "annotations": {"kubernetes.io/change-cause": version}},
                           "spec": {"selector": {"matchLabels": {"app": "agent"}},
                                    "template": {"metadata": {"labels": {"app": "agent"}},
                                                 "spec": {"containers": [{"name": "main", "image": image, "env": [
                                                     {"name": "VERSION", "value": version}]}]}}}})


def history(cluster: ControlPlane) -> list[tuple[str, str]]:
    lines = cluster.kubectl("rollout", "history", "daemonset/agent").stdout.splitlines()
    rows = [line.split(None, 1) for line in lines if line[:1].isdigit()]
    return [(r[0], r[1].strip() if len(r) > 1 else "") for r in rows]


def template_version(cluster: ControlPlane) -> str:
    return get_json(cluster, "daemonset", "agent")["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"]


def test_daemonset_rollout_history_and_undo(cluster: ControlPlane) -> None:
    image = push(cluster, ROOT / "examples" / "pods" / "counter.wasm")
    cluster.kubectl("apply", "-f", "-", input=daemonset_yaml(image, "v1"))
    wait_for(lambda: history(cluster) == [("1", "v1")], 30, what="revision 1")
    cluster.kubectl("apply", "-f", "-", input=daemonset_yaml(image, "v2"))
    wait_for(lambda: history(cluster) == [("1", "v1"), ("2", "v2")], 30, what="revision 2")
    revs = get_json(cluster, "controllerrevisions")["items"]
    (two,) = [r for r in revs if r["revision"] == 2]
    assert two["metadata"]["labels"]["app"] == "agent" and two["data"]["spec"]["template"]["$patch"] == "replace"
    pods = wait_for(lambda: (ps := get_json(cluster, "pods", "-l", "app=agent")["items"]) and all(
        p["metadata"]["labels"]["controller-revision-hash"] == two["metadata"]["labels"]["controller-revision-hash"]
        for p in ps) and ps, 60, what="the pods of revision 2")
    assert pods
    (row,) = [r for r in table(cluster, "controllerrevisions") if r["NAME"] == two["metadata"]["name"]]
    assert (row["CONTROLLER"], row["REVISION"]) == ("daemonset.apps/agent", "2"), row

    out = cluster.kubectl("rollout", "undo", "daemonset/agent").stdout
    assert out.strip() == "daemonset.apps/agent rolled back"
    assert template_version(cluster) == "v1"
    # The template of revision 1 is on top again, as revision 3 (no second record of it).
    wait_for(lambda: [n for n, _ in history(cluster)] == ["2", "3"], 30, what="revision 1 renumbered to 3")
    shown = cluster.kubectl("rollout", "history", "daemonset/agent", "--revision=3").stdout
    assert "VERSION:\tv1" in shown or "VERSION: v1" in shown.replace("\t", " ").replace("  ", " "), shown
    out = cluster.kubectl("rollout", "undo", "daemonset/agent", "--to-revision=2").stdout
    assert out.strip() == "daemonset.apps/agent rolled back" and template_version(cluster) == "v2"
    cluster.kubectl("delete", "daemonset", "agent")
    wait_for(lambda: not get_json(cluster, "controllerrevisions")["items"], 30,
             what="the revisions to go with their DaemonSet")
