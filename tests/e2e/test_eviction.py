"""Evictions and kubectl drain with PodDisruptionBudgets (real control plane, fake nodes)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.conftest import ControlPlane, start_control_plane, wait_for
from tests.e2e.fakenodes import FakeNodes

PDB = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web-pdb}
spec:
  %s
  selector: {matchLabels: {app: web}}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ControlPlane, FakeNodes]]:
    cp = start_control_plane(tmp_path / "cp", "--no-kubelet")
    try:
        with FakeNodes(cp.client()) as nodes:
            nodes.add("sim-1")
            nodes.add("sim-2")
            yield cp, nodes
    finally:
        cp.proc.stop()


def make_pods(core: k8s.CoreV1Api, node: str, names: list[str]) -> None:
    for name in names:
        core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})


def ready_count(core: k8s.CoreV1Api) -> int:
    return sum(1 for p in core.list_namespaced_pod("default", label_selector="app=web").items
               if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))


def test_eviction_honours_budgets_with_429_and_the_budget_name(cluster) -> None:
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    make_pods(core, "sim-1", ["web-1", "web-2"])
    wait_for(lambda: ready_count(core) == 2, 20, what="pods ready")
    cp.kubectl("apply", "-f", "-", input=PDB % "minAvailable: 2")
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "default"}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction("web-1", "default", evict)
    assert refused.value.status == 429
    body = json.loads(refused.value.body)
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"][0]["message"] == "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
    assert core.read_namespaced_pod("web-1", "default").metadata.deletion_timestamp is None

    # The status controller shows the same numbers kubectl get pdb prints.
    def pdb_status() -> dict:
        return json.loads(cp.kubectl("get", "pdb", "web-pdb", "-o", "json").stdout).get("status", {})
    wait_for(lambda: pdb_status().get("expectedPods") == 2, 20, what="pdb status")
    st = pdb_status()
    assert (st["currentHealthy"], st["desiredHealthy"], st["disruptionsAllowed"]) == (2, 2, 0)

    cp.kubectl("apply", "-f", "-", input=PDB % "minAvailable: 50%")
    wait_for(lambda: pdb_status().get("disruptionsAllowed") == 1, 20, what="budget allows one")
    core.create_namespaced_pod_eviction("web-1", "default", evict)  # allowed: graceful, the node confirms
    wait_for(lambda: len(core.list_namespaced_pod("default", label_selector="app=web").items) == 1, 20,
             what="web-1 gone")
    evict2 = {**evict, "metadata": {"name": "web-2", "namespace": "default"}}
    with pytest.raises(ApiException) as again:
        core.create_namespaced_pod_eviction("web-2", "default", evict2)
    assert again.value.status == 429 and "web-pdb needs 1 healthy pods and has 1 currently" in again.value.body


def test_drain_evicts_waits_and_reports_budgets(cluster) -> None:
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    make_pods(core, "sim-1", ["web-1", "web-2"])
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other"},
                                           "spec": {"nodeName": "sim-2", "containers": [{"name": "c", "image": "x"}]}})
    wait_for(lambda: ready_count(core) == 2, 20, what="pods ready")
    cp.kubectl("apply", "-f", "-", input=PDB % "minAvailable: 2")

    # Ownerless pods need --force (kubectl's own check); the budget then blocks with 429s.
    unforced = cp.kubectl("drain", "sim-1", "--ignore-daemonsets", "--timeout=5s", check=False)
    assert unforced.returncode != 0 and "cannot delete Pods that declare no controller" in unforced.stderr
    blocked = cp.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=3s", check=False)
    assert blocked.returncode != 0
    assert ("Cannot evict pod as it would violate the pod's disruption budget." in blocked.stdout + blocked.stderr)
    assert "SchedulingDisabled" in cp.kubectl("get", "node", "sim-1").stdout

    cp.kubectl("delete", "pdb", "web-pdb")
    drained = cp.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=30s")
    assert "node/sim-1 drained" in drained.stdout
    names = {p.metadata.name for p in core.list_namespaced_pod("default").items}
    assert names == {"other"}

    # Cordoned: a new pod goes to the other node; uncordon lets pods back.
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "new"},
                                           "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert wait_for(lambda: core.read_namespaced_pod("new", "default").spec.node_name, 20) == "sim-2"
    cp.kubectl("uncordon", "sim-1")
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "back"},
                                           "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert wait_for(lambda: core.read_namespaced_pod("back", "default").spec.node_name, 20) == "sim-1"


def test_an_eviction_for_another_uid_is_a_409_and_evicts_nothing(cluster) -> None:
    """deleteOptions.preconditions are judged before anything is done (issue 20): a
    client that names the pod it meant by uid never evicts what replaced it (a moved
    pod keeps its name)."""
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    make_pods(core, "sim-1", ["web-9"])
    wait_for(lambda: ready_count(core) == 1, 20, what="the pod ready")
    pod = core.read_namespaced_pod("web-9", "default")
    for pre, said in (({"uid": "not-its-uid"}, "UID in precondition: not-its-uid, UID in object meta: "),
                      ({"resourceVersion": "1"}, "ResourceVersion in precondition: 1, ResourceVersion in object meta")):
        evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-9"},
                 "deleteOptions": {"preconditions": pre}}
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod_eviction("web-9", "default", evict)
        body = json.loads(refused.value.body)
        assert refused.value.status == 409 and body["reason"] == "Conflict", body
        assert f"Precondition failed: {said}" in body["message"], body["message"]
        assert core.read_namespaced_pod("web-9", "default").metadata.deletion_timestamp is None
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-9"},
             "deleteOptions": {"preconditions": {"uid": pod.metadata.uid}}}
    core.create_namespaced_pod_eviction("web-9", "default", evict)
    wait_for(lambda: not [p for p in core.list_namespaced_pod("default").items if p.metadata.name == "web-9"
                          and p.metadata.deletion_timestamp is None], 20, what="the pod evicted")
