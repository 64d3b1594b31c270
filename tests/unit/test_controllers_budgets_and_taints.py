"""Pure parts of the eviction path and the node lifecycle: budgets, taints, toleration periods."""
from __future__ import annotations

import pytest

from kube32.budgets import budget_status, pdb_selects
from kube32.intstr import scaled_value
from kube32.controllers.nodelifecycle import (eviction_deadline, parse_time, rfc3339, toleration_seconds,
                                              with_lifecycle_taints)
from kube32.controllers.podgc import grace_over
from kube32.terms import Taint

NOT_READY, UNREACHABLE = Taint.NOT_READY, Taint.UNREACHABLE


def pod(name: str, *, ready: bool = True, labels: dict | None = None, owner: str | None = None,
        phase: str = "Running", deleting: bool = False, tolerations: list | None = None) -> dict:
    md: dict = {"name": name, "namespace": "default", "uid": name, "labels": labels if labels is not None else {"app": "web"}}
    if owner:
        md["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "uid": owner, "controller": True}]
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "spec": {"tolerations": tolerations or []},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pdb(**spec) -> dict:
    return {"metadata": {"name": "b", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}}


def test_selectors_null_selects_nothing_empty_selects_all() -> None:
    assert pdb_selects(pdb(), pod("a"))
    assert not pdb_selects(pdb(), pod("a", labels={"app": "db"}))
    assert not pdb_selects({"metadata": {"namespace": "default"}, "spec": {}}, pod("a"))
    assert pdb_selects({"metadata": {"namespace": "default"}, "spec": {"selector": {}}}, pod("a", labels={}))
    assert not pdb_selects({"metadata": {"namespace": "other"}, "spec": {"selector": {}}}, pod("a"))


def test_int_or_percent_rounds_up_and_names_bad_values() -> None:
    assert scaled_value(2, 10, True) == 2 and scaled_value("3", 10, True) == 3
    assert scaled_value("50%", 3, True) == 2 and scaled_value("0%", 3, True) == 0
    with pytest.raises(ValueError, match="'half'"):
        scaled_value("half", 3, True)


def test_min_available_counts_healthy_pods() -> None:
    pods = [pod("a"), pod("b"), pod("c", ready=False), pod("d", deleting=True), pod("e", phase="Succeeded")]
    st = budget_status(pdb(minAvailable=2), pods)
    assert (st.expected_pods, st.current_healthy, st.desired_healthy, st.disruptions_allowed) == (4, 2, 2, 0)
    assert budget_status(pdb(minAvailable=1), pods).disruptions_allowed == 1


def test_max_unavailable_uses_the_controllers_scale() -> None:
    pods = [pod("a", owner="rs"), pod("b", owner="rs")]
    st = budget_status(pdb(maxUnavailable=1), pods, {"rs": 3})  # one replica is missing already
    assert (st.expected_pods, st.current_healthy, st.desired_healthy, st.disruptions_allowed) == (3, 2, 2, 0)
    st = budget_status(pdb(maxUnavailable="50%"), pods, {"rs": 2})
    assert (st.desired_healthy, st.disruptions_allowed) == (1, 1)
    assert budget_status(pdb(minAvailable="100%"), pods, {"rs": 2}).disruptions_allowed == 0


def test_lifecycle_taints_follow_ready() -> None:
    other = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
    lost = with_lifecycle_taints([other], "Unknown", 0.0)
    assert lost is not None and other in lost
    assert {(t["key"], t["effect"]) for t in lost} - {("dedicated", "NoSchedule")} == {
        (UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")}
    assert all("timeAdded" in t for t in lost if t["effect"] == "NoExecute")
    assert with_lifecycle_taints(lost, "Unknown", 1.0) is None           # already right: no write
    not_ready = with_lifecycle_taints(lost, "False", 2.0)
    assert {t["key"] for t in not_ready} == {"dedicated", NOT_READY}
    assert with_lifecycle_taints(not_ready, "True", 3.0) == [other]


def test_memory_pressure_taints_a_ready_node_no_schedule_as_taint_nodes_by_condition() -> None:
    """A node whose free heap (its pods and their modules counted) is below the pressure
    line gets node.kubernetes.io/memory-pressure NoSchedule: the scheduler places no more
    pods there (attack round 21b: a pwasm node said it had room it did not have)."""
    other = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
    pressed = with_lifecycle_taints([other], "True", 0.0, "True")
    assert pressed == [other, {"key": Taint.MEMORY_PRESSURE, "effect": "NoSchedule"}]
    assert with_lifecycle_taints(pressed, "True", 1.0, "True") is None
    assert with_lifecycle_taints(pressed, "True", 2.0, "False") == [other]
    lost = with_lifecycle_taints(pressed, "Unknown", 3.0, "True")       # the lifecycle taints instead
    assert lost is not None and {t["key"] for t in lost} == {"dedicated", UNREACHABLE}


def test_toleration_periods() -> None:
    taint = {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": rfc3339(1000.0)}
    assert toleration_seconds(pod("a"), taint, 300) == 300
    short = pod("a", tolerations=[{"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 5}])
    assert toleration_seconds(short, taint, 300) == 5
    forever = pod("a", tolerations=[{"operator": "Exists"}])
    assert toleration_seconds(forever, taint, 300) is None
    other = {"key": "evict-me", "effect": "NoExecute"}
    assert toleration_seconds(pod("a"), other, 300) == 0
    assert eviction_deadline(short, [taint, {"key": "x", "effect": "NoSchedule"}], 300, 2000.0) == 1005.0
    assert eviction_deadline(forever, [taint], 300, 2000.0) is None


def test_time_round_trip_and_grace() -> None:
    assert parse_time(rfc3339(1234.0)) == 1234.0 and parse_time("garbage") is None
    p = pod("a", deleting=True)
    p["metadata"]["deletionTimestamp"] = rfc3339(100.0)
    p["metadata"]["deletionGracePeriodSeconds"] = 30
    assert not grace_over(p, 120.0) and grace_over(p, 131.0)
