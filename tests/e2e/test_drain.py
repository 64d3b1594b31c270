"""Drain, self-drain, the Auto policy, periodic checkpoints and node loss, end to end
(spec: "Drain and evictions", "Policies", "Periodic checkpoints and node loss",
"Retention"), with short control plane timings instead of minutes of sleep."""
from __future__ import annotations

import json
import signal
from typing import Iterator

import pytest
import yaml

from kube32.wasm.engine_wasmtime import WasmtimeEngine
from tests.conftest import ROOT, ControlPlane, sim_command, start, start_cluster, wait_for
from tests.e2e.helpers import get_json, push, raw
from tests.e2e.test_moves import api_call, counter_pod, extra_worker, running, state

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
FAST_LEASE = ("--lease-interval", "0.5")  # the cluster's node monitor grace period is 3 s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("drain"), 2, "--backoff", "1", "--interp-mops", "100",
                      "--lease-interval", "0.5",
                      "--node-monitor-grace-period", "3s", "--pod-eviction-timeout", "1s",
                      "--pressure-move-cooldown", "2s", "--auto-move-cooldown", "2s")
    try:
        yield c
    finally:
        c.proc.stop(timeout=60)


@pytest.fixture(scope="module")
def image(cluster: ControlPlane) -> str:
    return push(cluster, COUNTER)


def node_of(cluster: ControlPlane, pod: str) -> str:
    return get_json(cluster, "pod", pod)["spec"]["nodeName"]


def test_kubectl_drain_moves_movable_pods_and_deletes_the_others(cluster: ControlPlane, image: str) -> None:
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dweb"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "dweb"}},
                    "template": {"metadata": {"labels": {"app": "dweb"}},
                                 "spec": {"nodeSelector": {"kubernetes.io/hostname": "sim-1"},
                                          "containers": [{"name": "main", "image": image}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(dep))
    cluster.kubectl("apply", "-f", "-", input=counter_pod("solo", "sim-1", image))
    cluster.kubectl("apply", "-f", "-", input=counter_pod("stay", "sim-1", image,
                                                          annotations={"kube32.io/migration": "Never"}))
    cluster.kubectl("rollout", "status", "deployment/dweb", "--timeout=60s", timeout=90)
    running(cluster, "solo")
    running(cluster, "stay")
    dpod = get_json(cluster, "pods", "-l", "app=dweb")["items"][0]["metadata"]["name"]
    before = {n: state(cluster, n) for n in ("solo",)}
    uids = {n: get_json(cluster, "pod", n)["metadata"]["uid"] for n in ("solo", "stay", dpod)}

    # The Deployment's pod is pinned to sim-1 by its nodeSelector, so it cannot move:
    # its eviction deletes it and the Deployment starts a new one (Pending while sim-1 is cordoned).
    out = cluster.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=90s", timeout=120)
    assert "node/sim-1 drained" in out.stdout, out.stdout + out.stderr
    solo = get_json(cluster, "pod", "solo")
    assert solo["metadata"]["uid"] != uids["solo"] and solo["spec"]["nodeName"] != "sim-1"
    after = wait_for(lambda: state(cluster, "solo"), 15, what="solo answering")
    assert after["requests"] == before["solo"]["requests"] + 1 and after["restored_calls"] == 1
    assert cluster.kubectl("get", "pod", "stay", check=False).returncode == 1, "a Never pod is deleted"
    evictions = [c for c in get_json(cluster, "checkpoints")["items"]
                 if (c["metadata"].get("labels") or {}).get("kube32.io/trigger") == "eviction"]
    assert any(c["spec"]["podName"] == "solo" and c["status"]["phase"] == "Completed" for c in evictions)
    assert not any(c["spec"]["podName"] == "stay" for c in evictions)
    cluster.kubectl("uncordon", "sim-1")
    cluster.kubectl("rollout", "status", "deployment/dweb", "--timeout=60s", timeout=90)
    cluster.kubectl("delete", "deployment", "dweb")
    cluster.kubectl("delete", "pod", "solo")


def test_checkpoint_interval_below_ten_seconds_is_refused(cluster: ControlPlane, image: str) -> None:
    out = cluster.kubectl("apply", "-f", "-", check=False, input=counter_pod(
        "fast", "sim-1", image, annotations={"kube32.io/checkpoint-interval": "5s"}))
    assert out.returncode == 1
    assert 'metadata.annotations[kube32.io/checkpoint-interval]: Invalid value: "5s": the checkpoint ' \
           'interval must be at least 10s' in out.stderr


def test_periodic_checkpoints_keep_only_the_latest_and_restore_after_node_loss(cluster: ControlPlane,
                                                                              image: str) -> None:
    board = extra_worker(cluster, "lossy", *FAST_LEASE)
    try:
        cluster.kubectl("apply", "-f", "-", input=counter_pod(
            "keeper", "lossy", image, annotations={"kube32.io/checkpoint-interval": "10s"}))
        running(cluster, "keeper")
        for _ in range(3):
            raw(cluster, "/api/v1/namespaces/default/pods/keeper/proxy/")

        def periodic() -> list[dict]:
            return [c for c in get_json(cluster, "checkpoints")["items"]
                    if (c["metadata"].get("labels") or {}).get("kube32.io/trigger") == "periodic"
                    and c["spec"]["podName"] == "keeper"]
        wait_for(lambda: sum(c["status"].get("phase") == "Saved" for c in periodic()) >= 1, 20,
                 what="a periodic checkpoint")
        first = [c["metadata"]["name"] for c in periodic()]
        wait_for(lambda: set(c["metadata"]["name"] for c in periodic()) - set(first), 20,
                 what="a second periodic checkpoint")
        wait_for(lambda: len(periodic()) == 1 and periodic()[0]["status"]["phase"] == "Saved", 10,
                 what="retention to leave exactly the latest")
        saved = periodic()[0]
        at_save = saved["status"]["podTimeMs"]
        uid = get_json(cluster, "pod", "keeper")["metadata"]["uid"]

        board.popen.send_signal(signal.SIGKILL)
        board.popen.wait(10)
        pod = wait_for(lambda: (p := get_json(cluster, "pod", "keeper"))["metadata"]["uid"] != uid and
                       p["spec"].get("nodeName") and p["spec"]["nodeName"] != "lossy" and p, 40,
                       what="the pod to come back on another node")
        running(cluster, "keeper")
        restored = state(cluster, "keeper")
        assert restored["restored_calls"] == 1 and restored["init_calls"] == 1
        assert restored["time_ms"] >= at_save and restored["requests"] >= 1
        events = wait_for(lambda: (e := cluster.kubectl("get", "events", "--field-selector",
                                                        "involvedObject.name=keeper,reason=Restored").stdout)
                          and "Restored" in e and e, 15, what="the Restored event")
        assert saved["metadata"]["name"] in events and "taken" in events and "ago" in events
        assert pod["metadata"]["name"] == "keeper"
    finally:
        board.stop()
        cluster.kubectl("delete", "pod", "keeper", "--wait=false", check=False)
        cluster.kubectl("delete", "node", "lossy", "--wait=false", check=False)


def test_a_stopped_worker_drains_itself(cluster: ControlPlane, image: str) -> None:
    board = extra_worker(cluster, "leaving", *FAST_LEASE)
    cluster.kubectl("apply", "-f", "-", input=counter_pod("mover", "leaving", image))
    running(cluster, "mover")
    before = state(cluster, "mover")
    board.popen.send_signal(signal.SIGTERM)
    assert board.popen.wait(40) == 0
    node = get_json(cluster, "node", "leaving")
    assert node["spec"].get("unschedulable") is True
    assert node["metadata"]["annotations"].get("kube32.io/left") == "true"
    moved = running(cluster, "mover")
    assert moved["spec"]["nodeName"] != "leaving"
    assert state(cluster, "mover")["requests"] == before["requests"] + 1
    cluster.kubectl("delete", "pod", "mover")
    cluster.kubectl("delete", "node", "leaving")


def test_memory_pressure_moves_the_largest_auto_pod(cluster: ControlPlane, image: str) -> None:
    # A heap of what the counter's module and two instances cost wasmtime, six pages (one
    # for large, five for small once it grew) and 8 KiB: under the 24 KiB of pressure.
    engine = WasmtimeEngine
    heap = engine.bytes_per_module_byte * COUNTER.stat().st_size + 2 * engine.instance_bytes + 6 * 65536 + 8192
    board = extra_worker(cluster, "tight", "--heap", str(heap), *FAST_LEASE)
    try:
        for name, mem in (("large", "128Ki"), ("small", "64Ki")):
            cluster.kubectl("apply", "-f", "-", input=counter_pod(
                name, "tight", image, annotations={"kube32.io/migration": "Auto"},
                container={"resources": {"requests": {"memory": mem}}}))
            running(cluster, name)
        # Grow the small one until the node's free heap falls under 24 KiB: it takes what
        # is free, as a pod on a board does.
        code, _, body = api_call(cluster, "POST", "/api/v1/namespaces/default/pods/small/proxy/alloc?kb=256")
        assert code == 200, body
        try:
            wait_for(lambda: node_of(cluster, "large") != "tight", 30, what="the large Auto pod to move")
        except AssertionError:
            node = get_json(cluster, "node", "tight")
            print(cluster.kubectl("get", "ckpt", "-o", "wide").stdout, node["metadata"]["annotations"],
                  node["status"]["conditions"], state(cluster, "small"))
            raise
        assert node_of(cluster, "small") == "tight"
        ck = next(c for c in get_json(cluster, "checkpoints")["items"]
                  if (c["metadata"].get("labels") or {}).get("kube32.io/trigger") == "memory-pressure")
        assert ck["spec"]["podName"] == "large"
        assert state(cluster, "large")["restored_calls"] == 1
    finally:
        cluster.kubectl("delete", "pod", "small", "large", "--wait=false", check=False)
        board.stop()
        cluster.kubectl("delete", "node", "tight", "--wait=false", check=False)


def test_placement_fastest_follows_a_fast_node_and_comes_back(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod(
        "racer", "sim-1", image, annotations={"kube32.io/migration": "Auto", "kube32.io/placement": "fastest"}))
    running(cluster, "racer")
    fast = start(sim_command("worker", "--kubeconfig", str(cluster.data_dir / "node.kubeconfig"),
                             "--name", "turbo", "--interp-mops", "1000", *FAST_LEASE), cluster.data_dir / "turbo.log")
    try:
        wait_for(lambda: node_of(cluster, "racer") == "turbo", 40, what="the pod to follow the fast node")
        ck = next(c for c in get_json(cluster, "checkpoints")["items"]
                  if (c["metadata"].get("labels") or {}).get("kube32.io/trigger") == "placement")
        assert ck["spec"]["target"]["nodeName"] == "turbo"
        running(cluster, "racer")
        fast.popen.send_signal(signal.SIGTERM)
        assert fast.popen.wait(40) == 0
        assert node_of(cluster, "racer") != "turbo"
        assert state(cluster, "racer")["restored_calls"] >= 1
    finally:
        fast.stop()
        cluster.kubectl("delete", "pod", "racer", "--wait=false", check=False)
        cluster.kubectl("delete", "node", "turbo", "--wait=false", check=False)


def test_server_dry_runs_change_nothing(cluster: ControlPlane, image: str) -> None:
    """kubectl says dry run in the body for delete (DeleteOptions) and drain (each
    Eviction's deleteOptions), not in the query: such a request moves, deletes and
    cordons nothing."""
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException

    cluster.kubectl("apply", "-f", "-", input=counter_pod("dry-move", "sim-1", image))
    cluster.kubectl("apply", "-f", "-", input=counter_pod("dry-stay", "sim-1", image,
                                                          annotations={"kube32.io/migration": "Never"}))
    running(cluster, "dry-move")
    running(cluster, "dry-stay")
    uids = {n: get_json(cluster, "pod", n)["metadata"]["uid"] for n in ("dry-move", "dry-stay")}
    checkpoints = len(get_json(cluster, "checkpoints")["items"])

    def unchanged() -> None:
        for n, uid in uids.items():
            pod = get_json(cluster, "pod", n)
            assert pod["metadata"]["uid"] == uid and pod["spec"]["nodeName"] == "sim-1"
            assert not pod["metadata"].get("deletionTimestamp")
        assert not get_json(cluster, "node", "sim-1")["spec"].get("unschedulable")
        assert len(get_json(cluster, "checkpoints")["items"]) == checkpoints

    out = cluster.kubectl("delete", "pod", "dry-move", "--dry-run=server")
    assert 'pod "dry-move" deleted (server dry run)' in out.stdout
    cluster.kubectl("delete", "pods", "--all", "--dry-run=server")
    unchanged()
    cluster.kubectl("create", "configmap", "dry-cm", "--from-literal=a=b", "--dry-run=server")
    assert cluster.kubectl("get", "configmap", "dry-cm", check=False).returncode == 1
    cluster.kubectl("label", "pod", "dry-move", "dry=yes", "--dry-run=server")
    assert "dry" not in (get_json(cluster, "pod", "dry-move")["metadata"].get("labels") or {})
    out = cluster.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--dry-run=server", timeout=60)
    assert "node/sim-1 drained (server dry run)" in out.stdout, out.stdout + out.stderr
    unchanged()

    core = k8s.CoreV1Api(cluster.client())
    core.delete_namespaced_pod("dry-stay", "default", body=k8s.V1DeleteOptions(dry_run=["All"]))
    eviction = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name="dry-move", namespace="default"),
                                     delete_options=k8s.V1DeleteOptions(dry_run=["All"]))
    core.create_namespaced_pod_eviction("dry-move", "default", eviction)
    unchanged()
    with pytest.raises(ApiException) as e:
        core.delete_namespaced_pod("dry-stay", "default", body=k8s.V1DeleteOptions(dry_run=["Some"]))
    assert e.value.status == 422
    assert json.loads(e.value.body)["message"] == ('DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported '
                                                   'value: []string{"Some"}: supported values: "All"')
    unchanged()
    cluster.kubectl("delete", "pod", "dry-move", "dry-stay")


def test_an_eviction_that_moves_is_answered_once_the_pod_is_replaced(cluster: ControlPlane, image: str) -> None:
    """kubectl drain looks at the pod right after the eviction's answer: it must find the
    replacement then, not the pod being moved (else it waits a second for its next look)."""
    from kubernetes import client as k8s

    cluster.kubectl("apply", "-f", "-", input=counter_pod("held", "sim-1", image))
    running(cluster, "held")
    before = state(cluster, "held")
    uid = get_json(cluster, "pod", "held")["metadata"]["uid"]
    core = k8s.CoreV1Api(cluster.client())
    core.create_namespaced_pod_eviction("held", "default", k8s.V1Eviction(
        metadata=k8s.V1ObjectMeta(name="held", namespace="default")))
    replaced = core.read_namespaced_pod("held", "default")
    assert replaced.metadata.uid != uid
    after = wait_for(lambda: state(cluster, "held"), 15, what="held answering")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1
    cluster.kubectl("delete", "pod", "held")
