"""A move as watchers see it (issue 23 item 3): the store keeps one write (the pod's
owners count one pod at every step), but a watch shows the old pod end (DELETED, with
``kube32.io/replaced-by`` naming the new uid) and the new one begin (ADDED), as no
Kubernetes server changes a uid in place.  Seen through the real kubernetes Python
client's watch, ``kubectl wait --for=delete`` and ``kubectl get -w``; a Deployment's
ReplicaSet still counts one pod throughout."""
from __future__ import annotations

import subprocess
import threading
from typing import Any, Iterator

import pytest
import yaml

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import cli, get_json, push

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("watchers"), 2, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


def pod(name: str, node: str, image: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}]}})


def test_a_watch_sees_the_moved_pod_end_and_its_replacement_begin(cluster: ControlPlane) -> None:
    from kubernetes import client, config, watch
    image = push(cluster, ROOT / "examples/pods/counter.wasm")
    cluster.kubectl("apply", "-f", "-", input=pod("w", "sim-1", image))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/w", "--timeout=60s", timeout=70)
    old = get_json(cluster, "pod", "w")
    api = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    events: list[tuple[str, Any]] = []
    on_node: list[tuple[str, Any]] = []   # a kubelet's view: the watch of spec.nodeName=sim-1
    stop = threading.Event()

    def watching_the_node() -> None:
        w = watch.Watch()
        for ev in w.stream(api.list_pod_for_all_namespaces, field_selector="spec.nodeName=sim-1",
                           resource_version=old["metadata"]["resourceVersion"], timeout_seconds=60):
            on_node.append((ev["type"], ev["object"]))
            if stop.is_set() or (ev["type"] == "DELETED" and ev["object"].metadata.name == "w"):
                w.stop()

    def watching() -> None:
        w = watch.Watch()
        for ev in w.stream(api.list_namespaced_pod, "default", field_selector="metadata.name=w",
                           resource_version=old["metadata"]["resourceVersion"], timeout_seconds=60):
            events.append((ev["type"], ev["object"]))
            if stop.is_set() or (ev["type"] == "ADDED" and ev["object"].metadata.uid != old["metadata"]["uid"]):
                w.stop()
    watcher = threading.Thread(target=watching, daemon=True)
    watcher.start()
    node_watcher = threading.Thread(target=watching_the_node, daemon=True)
    node_watcher.start()
    waiter = subprocess.Popen(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "wait", "--for=delete",
                               "pod/w", "--timeout=60s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kubectl_w = subprocess.Popen(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "get", "pod", "w", "-w",
                                  "-o", "jsonpath={.type} {.object.metadata.uid}{\"\\n\"}", "--output-watch-events",
                                  "--request-timeout=40s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = cli(cluster, "move", "w", "--to", "sim-2")
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
        watcher.join(60)
        stop.set()
        new = get_json(cluster, "pod", "w")
        assert new["metadata"]["uid"] != old["metadata"]["uid"] and new["spec"]["nodeName"] == "sim-2"
        kinds = [(t, o.metadata.uid) for t, o in events]
        deleted = kinds.index(("DELETED", old["metadata"]["uid"]))
        assert kinds[deleted + 1] == ("ADDED", new["metadata"]["uid"]), kinds
        assert not any(t == "MODIFIED" and uid == new["metadata"]["uid"] for t, uid in kinds[:deleted]), kinds
        gone = events[deleted][1]
        assert gone.metadata.annotations["kube32.io/replaced-by"] == new["metadata"]["uid"]
        assert gone.spec.node_name == "sim-1"
        # the DELETED one revision before the ADDED: a watch resumed from it (client-go's
        # reflector after a break) is still sent the ADDED (attack round 23)
        assert int(gone.metadata.resource_version) == int(events[deleted + 1][1].metadata.resource_version) - 1
        resumed = []
        w = watch.Watch()
        for ev in w.stream(api.list_namespaced_pod, "default", field_selector="metadata.name=w",
                           resource_version=gone.metadata.resource_version, timeout_seconds=5):
            resumed.append((ev["type"], ev["object"].metadata.uid))
            if ev["type"] == "ADDED":
                w.stop()
        assert ("ADDED", new["metadata"]["uid"]) in resumed, resumed
        # the source node's watch gets the pod's DELETED alone, saying what replaced it
        node_watcher.join(30)
        left = [o for t, o in on_node if t == "DELETED" and o.metadata.name == "w"]
        assert left and left[0].metadata.uid == old["metadata"]["uid"], on_node
        assert left[0].metadata.annotations["kube32.io/replaced-by"] == new["metadata"]["uid"]
        # kubectl wait --for=delete of the old pod ends: it saw its uid end.
        assert waiter.wait(60) == 0, waiter.stderr.read()
    finally:
        for p in (waiter, kubectl_w):
            if p.poll() is None:
                p.kill()
    seen = kubectl_w.communicate(timeout=10)[0]
    assert f"DELETED {old['metadata']['uid']}" in seen and f"ADDED {new['metadata']['uid']}" in seen, seen
    cluster.kubectl("delete", "pod", "w", "--wait=false")


def test_a_deployment_counts_one_pod_through_a_move(cluster: ControlPlane) -> None:
    image = push(cluster, ROOT / "examples/pods/counter.wasm")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "one"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "one"}},
                           "template": {"metadata": {"labels": {"app": "one"}},
                                        "spec": {"containers": [{"name": "main", "image": image}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(deployment))
    cluster.kubectl("rollout", "status", "deploy/one", "--timeout=60s", timeout=70)
    (first,) = get_json(cluster, "pods", "-l", "app=one")["items"]
    target = "sim-2" if first["spec"]["nodeName"] != "sim-2" else "sim-1"
    rs = get_json(cluster, "rs", "-l", "app=one")["items"][0]["metadata"]["name"]
    counts: list[str] = []
    watch = subprocess.Popen(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "get", "rs", rs, "-w",
                              "-o", "jsonpath={.status.replicas}{\"\\n\"}", "--request-timeout=30s"],
                             stdout=subprocess.PIPE, text=True)
    try:
        out = cli(cluster, "move", first["metadata"]["name"], "--to", target)
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
        wait_for(lambda: get_json(cluster, "pods", "-l", "app=one")["items"][0]["spec"]["nodeName"] == target, 30,
                 what="the pod on the target")
    finally:
        watch.kill()
    counts = [c for c in watch.communicate(timeout=10)[0].split() if c]
    assert counts and set(counts) == {"1"}, counts
    assert len(get_json(cluster, "pods", "-l", "app=one")["items"]) == 1
    cluster.kubectl("delete", "deploy", "one")
