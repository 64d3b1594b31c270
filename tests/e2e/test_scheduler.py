"""The scheduler end to end: a real control plane, fake nodes, kubectl and the kubernetes client."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from kubernetes import client as k8s

from tests.conftest import ControlPlane, start_control_plane, wait_for
from tests.e2e.fakenodes import FakeNodes

POD = """
apiVersion: v1
kind: Pod
metadata: {name: %(name)s, labels: {app: %(app)s}}
spec:
  containers:
  - name: c
    image: wasm://127.0.0.1/counter.wasm
    resources: {requests: {memory: %(memory)s}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[ControlPlane, FakeNodes]]:
    cp = start_control_plane(Path(tmp_path_factory.mktemp("sched")) / "cp", "--no-kubelet")
    try:
        with FakeNodes(cp.client()) as nodes:
            for i in (1, 2, 3):
                nodes.add(f"sim-{i}", memory="256Ki")
            yield cp, nodes
    finally:
        cp.proc.stop()


def pod_node(cp: ControlPlane, name: str) -> str:
    return json.loads(cp.kubectl("get", "pod", name, "-o", "json").stdout)["spec"].get("nodeName", "")


def events_for(cp: ControlPlane, name: str) -> list[dict]:
    items = json.loads(cp.kubectl("get", "events", "-o", "json").stdout)["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def test_pending_pods_are_bound_spread_and_reported(cluster) -> None:
    cp, _ = cluster
    for i in range(3):
        cp.kubectl("apply", "-f", "-", input=POD % {"name": f"web-{i}", "app": "web", "memory": "64Ki"})
    nodes = [wait_for(lambda i=i: pod_node(cp, f"web-{i}"), 20, what=f"web-{i} bound") for i in range(3)]
    assert sorted(nodes) == ["sim-1", "sim-2", "sim-3"]  # same labels: one per node
    wide = cp.kubectl("get", "pods", "-o", "wide").stdout
    assert any(line.startswith("web-0") and nodes[0] in line for line in wide.splitlines())
    scheduled = wait_for(lambda: [e for e in events_for(cp, "web-0") if e["reason"] == "Scheduled"], 10,
                         what="Scheduled event")
    assert scheduled[0]["message"] == f"Successfully assigned default/web-0 to {nodes[0]}"
    assert scheduled[0]["source"]["component"] == "default-scheduler"
    described = cp.kubectl("describe", "pod", "web-0").stdout
    assert f"Successfully assigned default/web-0 to {nodes[0]}" in described
    cond = {c["type"]: c for c in json.loads(cp.kubectl("get", "pod", "web-0", "-o", "json").stdout)["status"]["conditions"]}
    assert cond["PodScheduled"]["status"] == "True"
    for i in range(3):
        cp.kubectl("delete", "pod", f"web-{i}", "--wait=true")


def test_unschedulable_pod_gets_per_node_reasons_and_is_bound_when_room_appears(cluster) -> None:
    cp, _ = cluster
    cp.kubectl("cordon", "sim-1")
    try:
        cp.kubectl("apply", "-f", "-", input=POD % {"name": "big", "app": "big", "memory": "200Ki"})
        cp.kubectl("apply", "-f", "-", input=POD % {"name": "hog", "app": "hog", "memory": "100Ki"})
        hog_node = wait_for(lambda: pod_node(cp, "hog"), 20, what="hog bound")
        cp.kubectl("apply", "-f", "-", input=POD % {"name": "huge", "app": "huge", "memory": "300Ki"})
        msg = "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient memory."
        wait_for(lambda: msg in cp.kubectl("describe", "pod", "huge").stdout, 20, what="FailedScheduling")
        ev = [e for e in events_for(cp, "huge") if e["reason"] == "FailedScheduling"]
        assert ev and ev[0]["type"] == "Warning" and ev[0]["message"] == msg
        pod = json.loads(cp.kubectl("get", "pod", "huge", "-o", "json").stdout)
        cond = {c["type"]: c for c in pod["status"]["conditions"]}["PodScheduled"]
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", msg)
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        # "big" fits only the node without "hog": cordoned sim-1 is never used.
        assert wait_for(lambda: pod_node(cp, "big"), 20, what="big bound") not in ("sim-1", hog_node)
    finally:
        cp.kubectl("uncordon", "sim-1")
    # Uncordoning is a node event: a pod that fits only sim-1 is bound now.
    cp.kubectl("apply", "-f", "-", input=POD % {"name": "late", "app": "late", "memory": "250Ki"})
    assert wait_for(lambda: pod_node(cp, "late"), 20, what="late bound") == "sim-1"
    cp.kubectl("delete", "pod", "big", "hog", "huge", "late", "--wait=true")


def test_node_selector_taints_and_extended_resources(cluster) -> None:
    cp, nodes = cluster
    core = k8s.CoreV1Api(cp.client())
    nodes.add("screen", memory="256Ki", labels={"board": "cardputer"},
              extra={"hardware.kube32.io/display": "1"})
    core.patch_node("sim-2", {"spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}})
    try:
        ui = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ui"},
              "spec": {"containers": [{"name": "c", "image": "x",
                                       "resources": {"limits": {"hardware.kube32.io/display": "1"}}}]}}
        core.create_namespaced_pod("default", ui)
        assert wait_for(lambda: pod_node(cp, "ui"), 20, what="ui bound") == "screen"
        ui2 = {**ui, "metadata": {"name": "ui-2"}}
        core.create_namespaced_pod("default", ui2)
        # sim-1 and sim-3 lack the display, sim-2 is tainted, screen's display is taken.
        msg = ("0/4 nodes are available: 1 node(s) had untolerated taint {dedicated: x}, "
               "3 Insufficient hardware.kube32.io/display.")
        wait_for(lambda: any(e["message"] == msg for e in events_for(cp, "ui-2")), 20, what="display reasons")
        sel = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sel"},
               "spec": {"nodeSelector": {"board": "cardputer"}, "containers": [{"name": "c", "image": "x"}]}}
        core.create_namespaced_pod("default", sel)
        assert wait_for(lambda: pod_node(cp, "sel"), 20, what="sel bound") == "screen"
        tol = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tol"},
               "spec": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x"}],
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                    "values": ["sim-2"]}]}]}}},
                        "containers": [{"name": "c", "image": "x"}]}}
        core.create_namespaced_pod("default", tol)
        assert wait_for(lambda: pod_node(cp, "tol"), 20, what="tol bound") == "sim-2"
    finally:
        core.patch_node("sim-2", {"spec": {"taints": None}})
        for name in ("ui", "ui-2", "sel", "tol"):
            cp.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true")
