"""The scheduler's pure choice: filters, reasons, spreading (no API server needed)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from kube32.controllers.scheduler import fit_error, pick_node, pod_requests, wants_scheduling
from kube32.matching import node_selector_term_matches
from kube32.quantity import parse_quantity


def node(name: str, *, memory: str = "1Mi", pods: int = 10, ready: str = "True", labels: dict | None = None,
         taints: list | None = None, unschedulable: bool = False, extra: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {**({"taints": taints} if taints else {}), **({"unschedulable": True} if unschedulable else {})},
            "status": {"allocatable": {"memory": memory, "pods": str(pods), **(extra or {})},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def pod(name: str, *, memory: str | None = None, node_name: str | None = None, owner: str | None = None,
        labels: dict | None = None, extra: dict | None = None, **spec) -> dict:
    requests = {**({"memory": memory} if memory else {}), **(extra or {})}
    md: dict = {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels or {},
                "creationTimestamp": "2026-01-01T00:00:00Z"}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                  "uid": f"uid-{owner}", "controller": True}]
    return {"metadata": md,
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}],
                     "schedulerName": "default-scheduler",
                     **({"nodeName": node_name} if node_name else {}), **spec},
            "status": {"phase": "Running" if node_name else "Pending"}}


@pytest.mark.parametrize("text,value", [("64Ki", 65536), ("1Mi", 2**20), ("1.5Mi", 3 * 2**19), ("128M", 128 * 10**6),
                                        ("100m", Fraction(1, 10)), ("1e3", 1000), (3, 3), ("2", 2), ("1k", 1000)])
def test_quantities(text, value) -> None:
    assert parse_quantity(text) == value


def test_bad_quantity_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'lots'"):
        parse_quantity("lots")


def test_requests_use_limits_when_unset_and_init_containers_as_a_floor() -> None:
    p = {"spec": {"containers": [{"resources": {"limits": {"memory": "64Ki", "hardware.kube32.io/display": "1"}}},
                                 {"resources": {"requests": {"memory": "64Ki", "cpu": "1"}, "limits": {"memory": "1Mi"}}}],
                  "initContainers": [{"resources": {"requests": {"memory": "512Ki"}}}]}}
    assert pod_requests(p) == {"memory": 512 * 1024, "hardware.kube32.io/display": 1}


def test_binds_to_a_fitting_node_and_spreads_an_owner_over_nodes() -> None:
    nodes = [node("sim-1"), node("sim-2"), node("sim-3")]
    placed: list[dict] = []
    for i in range(3):
        p = pod(f"web-{i}", memory="64Ki", owner="web-rs")
        chosen, msg = pick_node(p, nodes, placed)
        assert chosen is not None and msg == f"Successfully assigned default/web-{i} to {chosen}"
        placed.append({**p, "spec": {**p["spec"], "nodeName": chosen}})
    assert sorted(p["spec"]["nodeName"] for p in placed) == ["sim-1", "sim-2", "sim-3"]


def test_least_requested_memory_breaks_ties() -> None:
    nodes = [node("a"), node("b")]
    busy = [pod("other", memory="512Ki", node_name="a", labels={"app": "x"})]
    assert pick_node(pod("new", memory="64Ki", labels={"app": "y"}), nodes, busy)[0] == "b"


def test_pods_that_request_nothing_spread_over_idle_nodes() -> None:
    """Round 25: eight ownerless, label-less pods without requests all went to the first
    node by name; the fraction of pod slots in use breaks the tie, as Kubernetes' default
    non-zero requests do, and a node with more slots takes more."""
    nodes = [node(f"n-{i}", pods=16) for i in range(1, 9)] + [node("big", pods=32)]
    placed: list[dict] = []
    for i in range(18):
        p = pod(f"p-{i}")
        chosen, _ = pick_node(p, nodes, placed)
        placed.append({**p, "spec": {**p["spec"], "nodeName": chosen}})
    counts = {n["metadata"]["name"]: sum(p["spec"]["nodeName"] == n["metadata"]["name"] for p in placed)
              for n in nodes}
    # By the share of slots in use: the 32-slot node about twice as many as each 16-slot one.
    assert all(counts[f"n-{i}"] in (1, 2) for i in range(1, 9)) and counts["big"] == 3, counts


def test_reasons_are_counted_per_node_as_kubernetes_prints_them() -> None:
    nodes = [node("a", unschedulable=True), node("b", memory="64Ki"), node("c", memory="64Ki")]
    chosen, msg = pick_node(pod("big", memory="128Ki"), nodes, [])
    assert chosen is None
    assert msg == "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient memory."
    assert pick_node(pod("p"), [], [])[1] == "no nodes available to schedule pods"


def test_room_counts_pods_already_bound() -> None:
    nodes = [node("a", memory="128Ki", pods=2)]
    assert pick_node(pod("p", memory="64Ki"), nodes, [pod("q", memory="96Ki", node_name="a")]) == (
        None, "0/1 nodes are available: 1 Insufficient memory.")
    full = [pod("q", node_name="a"), pod("r", node_name="a")]
    assert pick_node(pod("p"), nodes, full)[1] == "0/1 nodes are available: 1 Too many pods."
    done = [{**pod("q", node_name="a", memory="128Ki"), "status": {"phase": "Succeeded"}}]
    assert pick_node(pod("p", memory="64Ki"), nodes, done)[0] == "a"


def test_extended_resources() -> None:
    nodes = [node("plain"), node("screen", extra={"hardware.kube32.io/display": "1"})]
    want = pod("ui", extra={"hardware.kube32.io/display": "1"})
    assert pick_node(want, nodes, [])[0] == "screen"
    taken = [pod("ui-0", node_name="screen", extra={"hardware.kube32.io/display": "1"})]
    assert pick_node(want, nodes, taken)[1] == "0/2 nodes are available: 2 Insufficient hardware.kube32.io/display."


def test_taints_and_tolerations() -> None:
    tainted = node("a", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    assert pick_node(pod("p"), [tainted], [])[1] == (
        "0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }.")
    tol = pod("p", tolerations=[{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}])
    assert pick_node(tol, [tainted], [])[0] == "a"
    soft = node("b", taints=[{"key": "x", "value": "y", "effect": "PreferNoSchedule"}])
    assert pick_node(pod("p"), [soft], [])[0] == "b"
    dedicated = node("c", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    assert pick_node(pod("p", tolerations=[{"key": "dedicated", "value": "cpu"}]), [dedicated], [])[0] is None
    assert pick_node(pod("p", tolerations=[{"key": "dedicated", "value": "gpu"}]), [dedicated], [])[0] == "c"
    assert pick_node(pod("p", tolerations=[{"operator": "Exists"}]), [dedicated], [])[0] == "c"


def test_not_ready_nodes_are_skipped() -> None:
    assert pick_node(pod("p"), [node("a", ready="Unknown")], [])[1] == "0/1 nodes are available: 1 node(s) were not ready."


def test_node_selector_affinity_and_the_checkpoint_controllers_questions() -> None:
    nodes = [node("a", labels={"board": "devkit"}), node("b", labels={"board": "cardputer", "speed": "9"})]
    assert pick_node(pod("p", nodeSelector={"board": "cardputer"}), nodes, [])[0] == "b"
    assert pick_node(pod("p"), nodes, [], extra_node_selector={"board": "devkit"})[0] == "a"
    assert pick_node(pod("p"), nodes, [], exclude={"a"})[0] == "b"
    chosen, msg = pick_node(pod("p", nodeSelector={"board": "cardputer"}), nodes, [], exclude={"b"})
    assert chosen is None
    assert msg == ("0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                   "1 node(s) were excluded.")
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "speed", "operator": "Gt", "values": ["8"]}]}]}}}
    assert pick_node(pod("p", affinity=affinity), nodes, [])[0] == "b"


@pytest.mark.parametrize("expr,expected", [
    ({"key": "board", "operator": "In", "values": ["devkit", "x"]}, True),
    ({"key": "board", "operator": "NotIn", "values": ["devkit"]}, False),
    ({"key": "missing", "operator": "NotIn", "values": ["devkit"]}, True),
    ({"key": "board", "operator": "Exists"}, True),
    ({"key": "board", "operator": "DoesNotExist"}, False),
    ({"key": "speed", "operator": "Lt", "values": ["10"]}, True),
    ({"key": "speed", "operator": "Gt", "values": ["ten"]}, False),
    ({"key": "board", "operator": "Bogus"}, False),
])
def test_match_expressions(expr, expected) -> None:
    n = node("a", labels={"board": "devkit", "speed": "9"})
    assert node_selector_term_matches({"matchExpressions": [expr]}, n) is expected


def test_match_fields_and_empty_terms() -> None:
    n = node("a")
    assert node_selector_term_matches({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}, n)
    assert not node_selector_term_matches({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}, n)
    assert not node_selector_term_matches({}, n)


def test_which_pods_want_scheduling() -> None:
    assert wants_scheduling(pod("p"))
    assert not wants_scheduling(pod("p", node_name="a"))
    assert not wants_scheduling(pod("p", schedulerName="other"))
    gone = pod("p")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not wants_scheduling(gone)


def test_fit_error_sorts_reasons() -> None:
    assert fit_error(3, {"Insufficient memory": 2, "node(s) were unschedulable": 1}) == (
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient memory.")
