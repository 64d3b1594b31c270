"""Node lifecycle end to end: a Lease that lapses, Ready=Unknown, taints, evictions, recovery.

The control plane runs with short timings (``--node-monitor-grace-period 2s
--pod-eviction-timeout 2s``); the nodes are fake (the test renews their Leases).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.conftest import ControlPlane, start_control_plane, wait_for
from tests.e2e.fakenodes import FakeNodes

UNREACHABLE = "node.kubernetes.io/unreachable"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ControlPlane, FakeNodes]]:
    cp = start_control_plane(tmp_path / "cp", "--no-kubelet", "--node-monitor-grace-period", "2s",
                             "--pod-eviction-timeout", "2s", "--node-monitor-period", "200ms")
    try:
        with FakeNodes(cp.client()) as nodes:
            nodes.add("sim-1")
            nodes.add("sim-2")
            yield cp, nodes
    finally:
        cp.proc.stop()


def ready_of(core: k8s.CoreV1Api, name: str):
    return next(c for c in core.read_node(name).status.conditions if c.type == "Ready")


def taints_of(core: k8s.CoreV1Api, name: str) -> set[tuple[str, str]]:
    spec = core.read_node(name).spec
    return {(t.key, t.effect) for t in (spec.taints if spec else None) or []}


def gone(core: k8s.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "default")
        return False
    except ApiException as e:
        return e.status == 404


def test_lost_node_is_tainted_and_its_pods_evicted_after_their_toleration(cluster) -> None:
    cp, nodes = cluster
    core = k8s.CoreV1Api(cp.client())
    for name, tolerations in (("plain", None),
                              ("patient", [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
                                            "tolerationSeconds": 3600}])):
        core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": "sim-1", "containers": [{"name": "c", "image": "x"}],
                     **({"tolerations": tolerations} if tolerations else {})}})
    wait_for(lambda: core.read_namespaced_pod("plain", "default").status.phase == "Running", 20)

    nodes.kill("sim-1")
    wait_for(lambda: ready_of(core, "sim-1").status == "Unknown", 20, what="Ready=Unknown")
    ready = ready_of(core, "sim-1")
    assert (ready.reason, ready.message) == ("NodeStatusUnknown", "Kubelet stopped posting node status.")
    wait_for(lambda: {(UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")} <= taints_of(core, "sim-1"), 20,
             what="unreachable taints")
    assert ready_of(core, "sim-2").status == "True" and not taints_of(core, "sim-2")
    assert "Unknown" in cp.kubectl("get", "node", "sim-1").stdout or "NotReady" in cp.kubectl("get", "node", "sim-1").stdout

    # The pod without a toleration goes after the default timeout (forced: no kubelet will confirm).
    wait_for(lambda: gone(core, "plain"), 20, what="plain evicted")
    patient = core.read_namespaced_pod("patient", "default")
    assert patient.metadata.deletion_timestamp is None
    assert any(c.type == "Ready" and c.status == "False" for c in patient.status.conditions)

    events = json.loads(cp.kubectl("get", "events", "-o", "json").stdout)["items"]
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
    assert ("sim-1", "NodeNotReady") in reasons and ("plain", "TaintManagerEviction") in reasons
    node_event = next(e for e in events if e["reason"] == "NodeNotReady" and e["involvedObject"]["kind"] == "Node")
    assert node_event["message"] == "Node sim-1 status is now: NodeNotReady"

    # New pods avoid the lost node.
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fresh"},
                                           "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert wait_for(lambda: core.read_namespaced_pod("fresh", "default").spec.node_name, 20) == "sim-2"

    # The node comes back: Ready again, taints gone, the tolerating pod stayed.
    nodes.revive("sim-1")
    wait_for(lambda: ready_of(core, "sim-1").status == "True" and not taints_of(core, "sim-1"), 20,
             what="taints removed")
    assert not gone(core, "patient")
    wait_for(lambda: any(e["reason"] == "NodeReady" and e["involvedObject"]["name"] == "sim-1" for e in
                         json.loads(cp.kubectl("get", "events", "-o", "json").stdout)["items"]), 20,
             what="NodeReady event")


def test_not_ready_node_gets_the_not_ready_taint_and_a_graceful_eviction(cluster) -> None:
    cp, nodes = cluster
    core = k8s.CoreV1Api(cp.client())
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                           "spec": {"nodeName": "sim-2", "containers": [{"name": "c", "image": "x"}]}})
    wait_for(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running", 20)
    core.patch_node_status("sim-2", {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "runtime down"}]}})
    wait_for(lambda: ("node.kubernetes.io/not-ready", "NoExecute") in taints_of(core, "sim-2"), 20,
             what="not-ready taint")
    # The node's "kubelet" is alive and confirms the graceful deletion.
    wait_for(lambda: gone(core, "p"), 20, what="p evicted")
    core.patch_node_status("sim-2", {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]}})
    wait_for(lambda: not taints_of(core, "sim-2"), 20, what="taints removed")


def test_pods_on_a_deleted_node_are_collected(cluster) -> None:
    cp, nodes = cluster
    core = k8s.CoreV1Api(cp.client())
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan"},
                                           "spec": {"nodeName": "sim-1", "containers": [{"name": "c", "image": "x"}]}})
    nodes.kill("sim-1")
    core.delete_node("sim-1")
    wait_for(lambda: gone(core, "orphan"), 20, what="pod on a deleted node collected")
