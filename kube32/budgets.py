"""PodDisruptionBudgets: which pods a budget protects and how many may go now.

Pure functions over plain dicts, after Kubernetes' ``disruption.go``: the eviction
subresource decides with :func:`budget_status` (kube32.apiserver.eviction) and the
disruption controller writes the same numbers into a budget's ``status``
(kube32.controllers.disruption), so what ``kubectl get pdb`` shows is what an eviction
finds.

* A budget selects the pods of its namespace its ``spec.selector`` matches (policy/v1:
  a null selector selects nothing, an empty one every pod; kube32.matching).
* Finished pods (Succeeded, Failed) do not count; a pod is healthy when Ready and not
  being deleted.
* ``maxUnavailable`` and a percentage ``minAvailable`` count the pods each controller
  wants (``scale_of``, by controller uid); an absolute ``minAvailable`` the pods there are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import matching, objects
from .intstr import scaled_value
from .terms import Condition, PodPhase

Obj = dict[str, Any]


def pdb_selects(pdb: Obj, pod: Obj) -> bool:
    """policy/v1: a null selector selects nothing, an empty one every pod of the namespace."""
    if objects.namespace(pdb) != objects.namespace(pod):
        return False
    return matching.selects(objects.spec(pdb).get("selector"), objects.labels(pod))


def pod_ready(pod: Obj) -> bool:
    return objects.is_true(pod, Condition.READY)


def pod_healthy(pod: Obj) -> bool:
    return not objects.meta(pod).get("deletionTimestamp") and pod_ready(pod)


@dataclass(frozen=True)
class BudgetStatus:
    expected_pods: int
    current_healthy: int
    desired_healthy: int
    disruptions_allowed: int

    def as_status(self) -> Obj:
        return {"expectedPods": self.expected_pods, "currentHealthy": self.current_healthy,
                "desiredHealthy": self.desired_healthy, "disruptionsAllowed": self.disruptions_allowed}


def expected_count(pods: list[Obj], scale_of: dict[str, int]) -> int:
    """How many pods the budget protects: each controller's desired count (``scale_of``,
    by controller uid) once, each pod without a known controller as one."""
    seen: set[str] = set()
    total = 0
    for pod in pods:
        ctrl = objects.controller_ref(pod)
        uid = ctrl.get("uid") if ctrl else None
        if uid and uid in scale_of:
            if uid not in seen:
                seen.add(uid)
                total += scale_of[uid]
        else:
            total += 1
    return total


def budget_status(pdb: Obj, pods: list[Obj], scale_of: dict[str, int] | None = None) -> BudgetStatus:
    """The budget over the pods it selects (``pods`` may hold others: they are filtered).
    Raises ValueError naming a bad minAvailable/maxUnavailable."""
    mine = [p for p in pods if pdb_selects(pdb, p)
            and objects.phase(p) not in PodPhase.TERMINAL]
    healthy = sum(1 for p in mine if pod_healthy(p))
    spec = objects.spec(pdb)
    if spec.get("maxUnavailable") is not None:
        expected = expected_count(mine, scale_of or {})
        desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected, round_up=True))
    elif spec.get("minAvailable") is not None:
        value = spec["minAvailable"]
        percent = isinstance(value, str) and value.strip().endswith("%")
        expected = expected_count(mine, scale_of or {}) if percent else len(mine)
        desired = scaled_value(value, expected, round_up=True)
    else:
        expected, desired = len(mine), len(mine)
    return BudgetStatus(expected, healthy, desired, max(0, healthy - desired))
