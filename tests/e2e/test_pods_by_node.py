"""Lists of pods by node on a real cluster (issue 25): ``kubectl get pods --field-selector
spec.nodeName=...`` (a table, ``-A``, ``-o json``) and the ``kubernetes`` client's
list_namespaced_pod / list_pod_for_all_namespaces are answered from the API server's
watch-fed index (kube32.apiserver.nodeindex, counted in /metrics), and a pod moved or
bound just before shows at once on its new node and not on the old one."""
from __future__ import annotations

import json
import re
from typing import Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, start_cluster
from tests.e2e.helpers import cli, push
from tests.e2e.test_moves import counter_pod, running

pytestmark = pytest.mark.e2e

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("bynode"), 2, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


def by_node(cluster: ControlPlane, node: str, *args: str) -> set[str]:
    out = cluster.kubectl("get", "pods", "--field-selector", f"spec.nodeName={node}", "-o", "json", *args)
    return {p["metadata"]["name"] for p in json.loads(out.stdout)["items"]}


def index_lists(cluster: ControlPlane) -> dict[str, float]:
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^kube32_pod_lists_by_node_total\{answered="(\w+)"\} (\S+)$', text, re.M)}


def test_kubectl_lists_a_moved_pod_on_its_new_node_at_once(cluster: ControlPlane) -> None:
    image = push(cluster, COUNTER)
    cluster.kubectl("apply", "-f", "-", input=counter_pod("walker", "sim-1", image))
    running(cluster, "walker")
    before = index_lists(cluster).get("index", 0)
    assert "walker" in by_node(cluster, "sim-1")
    assert "walker" not in by_node(cluster, "sim-2", "-A")
    table = cluster.kubectl("get", "pods", "--field-selector", "spec.nodeName=sim-1", "-o", "wide").stdout
    assert re.search(r"^walker\s.*\ssim-1\s", table, re.M), table
    out = cli(cluster, "move", "walker", "--to", "sim-2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    # Right after the move's write: the new node lists it, the old one no longer does.
    assert "walker" in by_node(cluster, "sim-2", "-A")
    assert "walker" not in by_node(cluster, "sim-1")
    table = cluster.kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=sim-2").stdout
    assert re.search(r"^default\s+walker\s", table, re.M), table
    assert index_lists(cluster).get("index", 0) >= before + 6   # all of them from the index
    cluster.kubectl("delete", "pod", "walker", "--wait=false")


def test_the_kubernetes_client_lists_a_pod_bound_just_before(cluster: ControlPlane) -> None:
    from kubernetes import client as k8s

    api = k8s.CoreV1Api(cluster.client())
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="waiting"),
                    spec=k8s.V1PodSpec(scheduler_name="nobody", containers=[
                        k8s.V1Container(name="main", image="kube32.io/wasm-sha256:" + "0" * 64)]))
    api.create_namespaced_pod("default", pod)
    pending = api.list_namespaced_pod("default", field_selector="spec.nodeName=")
    assert "waiting" in {p.metadata.name for p in pending.items}
    rv = int(pending.metadata.resource_version)
    binding = k8s.V1Binding(metadata=k8s.V1ObjectMeta(name="waiting"),
                            target=k8s.V1ObjectReference(kind="Node", name="sim-2"))
    # (the client cannot read the Status a binding answers with: the answer is not parsed)
    api.create_namespaced_pod_binding("waiting", "default", binding, _preload_content=False)
    on_node = api.list_namespaced_pod("default", field_selector="spec.nodeName=sim-2")
    assert "waiting" in {p.metadata.name for p in on_node.items}
    assert int(on_node.metadata.resource_version) > rv
    everywhere = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=sim-2,metadata.namespace=default")
    assert "waiting" in {p.metadata.name for p in everywhere.items}
    assert "waiting" not in {p.metadata.name for p in
                             api.list_namespaced_pod("default", field_selector="spec.nodeName=").items}
    assert "waiting" not in {p.metadata.name for p in
                             api.list_pod_for_all_namespaces(field_selector="spec.nodeName=sim-1").items}
    # Other selectors still filter what the index holds.
    assert not api.list_namespaced_pod("default", field_selector="spec.nodeName=sim-2,metadata.name!=waiting",
                                       label_selector="app=none").items
    api.delete_namespaced_pod("waiting", "default", grace_period_seconds=0)
