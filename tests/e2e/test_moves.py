"""Pod migration end to end on ``kube32-sim up --workers 2`` (spec: "Moves", "Kubelet
endpoints", "What keeps a pod from moving"): real processes, real kubectl, the
counter pod built from C."""
from __future__ import annotations

import datetime
import json
import signal
import threading
import time
import warnings
from typing import Any, Iterator

import pytest
import yaml

from tests.conftest import ROOT, ControlPlane, sim_command, start, start_cluster, wait_for
from tests.e2e.helpers import api_call, cli, get_json, push, raw

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
CLOCK = ROOT / "examples" / "pods" / "clock.wasm"

# Holds an asset file open between calls: the node must refuse to move it.
HOLDS_A_FILE = """
(module
  (import "k32" "k32_fs_open" (func $open (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "/etc/app/conf")
  (global $fd (mut i32) (i32.const -1))
  (func (export "k32_init"))
  (func (export "k32_handle")
    (if (i32.lt_s (global.get $fd) (i32.const 0))
      (then (global.set $fd (call $open (i32.const 0) (i32.const 13)))))))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("moves"), 2, "--backoff", "1", "--checkpoint-retention", "6s")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: ControlPlane) -> str:
    return push(cluster, COUNTER)


def counter_pod(name: str, node: str, image: str, **extra: Any) -> str:
    annotations = {"kube32.io/events": "greet", "kube32.io/tick-interval": "100ms", **extra.pop("annotations", {})}
    container = {"name": "main", "image": image, **extra.pop("container", {})}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
                           "spec": {"nodeName": node, "containers": [container], **extra}})


def running(cluster: ControlPlane, name: str) -> dict:
    def check() -> dict | None:
        pod = get_json(cluster, "pod", name)
        cs = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return pod if cs[0].get("ready") else None
    return wait_for(check, 30, what=f"pod {name} ready")


def state(cluster: ControlPlane, name: str) -> dict:
    return raw(cluster, f"/api/v1/namespaces/default/pods/{name}/proxy/")


def move(cluster: ControlPlane, pod: str, *args: str):
    return cli(cluster, "move", pod, *args)


def checkpoint_named(cluster: ControlPlane, pod: str, phase: str) -> dict:
    """The newest Checkpoint of ``pod`` in ``phase``."""
    items = [c for c in get_json(cluster, "checkpoints")["items"]
             if c["spec"]["podName"] == pod and c["status"].get("phase") == phase]
    return max(items, key=lambda c: int(c["metadata"]["resourceVersion"]))


def test_counter_moves_with_its_state(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod("ctr", "sim-1", image))
    old = running(cluster, "ctr")
    for _ in range(3):
        before = state(cluster, "ctr")
    assert before["requests"] == 3 and before["init_calls"] == 1 and before["channel"] == 1

    # Frozen first (as a move's snapshot leaves it): events published now are held and
    # must reach the pod after the restore on the other node.
    node_path = "/api/v1/nodes/sim-1/proxy/checkpoint/default/ctr/main?leave=frozen"
    status, headers, body = api_call(cluster, "POST", node_path)
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    assert headers["X-Kube32-Image-Sha256"] == image.split(":")[1]
    assert headers["X-Kube32-Snapshot-Sha256"] == body[-32:].hex() and len(body) == int(headers["Content-Length"])
    again = api_call(cluster, "POST", node_path)[2]
    assert again == body, "the same frozen pod gives the same snapshot every time"
    for word in ("one", "two"):
        assert cli(cluster, "publish", "greet", word).returncode == 0
    time.sleep(0.5)
    typo = cli(cluster, "publish", "greet", "lost", "-n", "defualt")
    assert typo.returncode == 1 and b'namespaces "defualt" not found' in typo.stdout + typo.stderr, typo

    out = move(cluster, "ctr", "--to", "sim-2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    text = out.stdout.decode()
    assert "Saving" in text and "Moving" in text and "Completed" in text and "after the freeze" in text

    new = running(cluster, "ctr")
    assert new["spec"]["nodeName"] == "sim-2" and new["metadata"]["uid"] != old["metadata"]["uid"]
    # A request routed to the old node while the pod was frozen there, arriving after the
    # move: told to ask again (the retry reaches the pod where it runs now), never a 404.
    status, headers, body = api_call(cluster, "GET", "/api/v1/nodes/sim-1/proxy/pods/default/ctr/http/")
    assert (status, headers.get("Retry-After")) == (503, "1") and b"moved away from node" in body, body
    assert "kube32.io/restore-from" not in (new["metadata"].get("annotations") or {})
    after = wait_for(lambda: (s := state(cluster, "ctr"))["events"] >= before["events"] + 2 and s, 10,
                     what="the held events")
    assert after["requests"] == before["requests"] + 1
    assert after["init_calls"] == 1 and after["restored_calls"] == 1
    assert after["time_ms"] >= before["time_ms"]
    assert after["channel"] == before["channel"] and after["last_event"] == "greet:two"

    ck = checkpoint_named(cluster, "ctr", "Completed")
    st = ck["status"]
    assert st["nodeName"] == "sim-1" and st["targetNode"] == "sim-2" and st["newPodName"] == "ctr"
    # The target began the restore while the snapshot was taken (kube32.kubelet.prefetch):
    # the replacement only finished it, held events and channels included.
    # Not always: this pod was frozen by the test first, so its Saving lasts ~50 ms, and the
    # target's watch of Checkpoints races its watch of pods (the replacement can come
    # first; it then restores by itself, ~20 ms slower).  Measured 2026-12-02: 7 of 9 such
    # moves began early; moveMillis (~1.5 s here) counts from the test's own freeze, the
    # move itself took 60-80 ms either way.  Shown as a warning, not to hide it.
    target_log = (cluster.data_dir / "logs" / "sim-2.log").read_text(errors="replace")
    if f"restoring default/ctr from checkpoint {ck['metadata']['name']}: begun before the replacement " \
            "arrived" not in target_log:
        warnings.warn(f"the target did not begin the restore early (prefetch missed): {st.get('moveMillis')} ms", stacklevel=1)
    assert st["sizeBytes"] > 65536 and st["imageSha256"] == image.split(":")[1]
    wide = cluster.kubectl("get", "ckpt", "-o", "wide").stdout
    assert ck["metadata"]["name"] in wide and "Completed" in wide and "sim-2" in wide
    events = cluster.kubectl("get", "events", "--field-selector", "involvedObject.name=ctr").stdout
    assert "Moving" in events and "Moved" in events and "after the freeze" in events
    cluster.kubectl("delete", "pod", "ctr")


def test_a_restore_begun_for_another_config_is_dropped_and_done_again(cluster: ControlPlane, image: str) -> None:
    """The target begins the restore from the pod being moved; a replacement whose config
    differs (here: its uid, through the downward API) restores by itself, state intact."""
    cluster.kubectl("apply", "-f", "-", input=counter_pod("uidenv", "sim-1", image, container={"env": [
        {"name": "MY_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]}))
    running(cluster, "uidenv")
    for _ in range(2):
        before = state(cluster, "uidenv")
    out = move(cluster, "uidenv", "--to", "sim-2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    after = state(cluster, "uidenv")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1 and after["init_calls"] == 1
    target_log = (cluster.data_dir / "logs" / "sim-2.log").read_text(errors="replace")
    assert "restoring default/uidenv" not in target_log
    cluster.kubectl("delete", "pod", "uidenv")


def test_frozen_pod_answers_503_is_not_ready_and_thaws(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod("frz", "sim-1", image))
    running(cluster, "frz")
    base = "/api/v1/nodes/sim-1/proxy"
    assert api_call(cluster, "POST", f"{base}/checkpoint/default/frz/main?leave=frozen")[0] == 200
    status, headers, _ = api_call(cluster, "GET", "/api/v1/namespaces/default/pods/frz/proxy/")
    assert status == 503 and headers.get("Retry-After") == "1"
    frozen_at = time.monotonic()
    wait_for(lambda: not get_json(cluster, "pod", "frz")["status"]["containerStatuses"][0]["ready"], 5,
             what="Ready=False")
    assert time.monotonic() - frozen_at < 2.5
    status, _, body = api_call(cluster, "POST", f"{base}/thaw/default/frz/main")
    assert (status, json.loads(body)) == (200, {"thawed": True})
    assert api_call(cluster, "POST", f"{base}/thaw/default/frz/main")[0] == 404
    assert state(cluster, "frz")["requests"] >= 1
    cluster.kubectl("delete", "pod", "frz")


def test_checkpoint_endpoint_refusals_leave_the_pod_running(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod("busy", "sim-1", image))
    running(cluster, "busy")
    base = "/api/v1/nodes/sim-1/proxy/checkpoint/default"
    status, _, body = api_call(cluster, "POST", f"{base}/busy/main?timeoutMs=0")
    assert status == 400 and "timeoutMs must be from 1 to 60000" in json.loads(body)["message"]
    status, _, body = api_call(cluster, "POST", f"{base}/busy/main?leave=later")
    assert status == 400 and 'leave must be "running" or "frozen"' in json.loads(body)["message"]
    status, _, body = api_call(cluster, "POST", f"{base}/nope/main")
    assert status == 404 and json.loads(body)["reason"] == "NotFound"

    worker = threading.Thread(target=lambda: api_call(cluster, "POST", "/api/v1/namespaces/default/pods/busy/proxy/work?ms=2500"))
    worker.start()
    time.sleep(0.5)
    status, _, body = api_call(cluster, "POST", f"{base}/busy/main?timeoutMs=300")
    worker.join()
    assert status == 504
    assert json.loads(body)["reason"] == "Timeout"
    assert json.loads(body)["blockers"] == ["call k32_handle still running after 300 ms"]
    assert state(cluster, "busy")["requests"] >= 2, "the pod keeps running and answering"
    cluster.kubectl("delete", "pod", "busy")


def test_save_checkpoint_keeps_the_pod_running(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod("saved", "sim-2", image))
    running(cluster, "saved")
    out = cli(cluster, "checkpoint", "saved")
    assert out.returncode == 0, out.stdout.decode()
    assert "saved saved on sim-2" in out.stdout.decode()
    ck = checkpoint_named(cluster, "saved", "Saved")
    assert ck["status"]["sizeBytes"] > 0 and ck["spec"]["action"] == "Save"
    assert get_json(cluster, "pod", "saved")["spec"]["nodeName"] == "sim-2"
    assert state(cluster, "saved")["restored_calls"] == 0
    assert "Checkpointed" in cluster.kubectl("get", "events", "--field-selector", "involvedObject.name=saved").stdout
    cluster.kubectl("delete", "pod", "saved")


BLOCKING_PODS = [
    ("hw", {"container": {"resources": {"limits": {"hardware.kube32.io/display": "1"}}}},
     ["grant hardware.kube32.io/display"]),
    ("esp", {"container": {"resources": {"requests": {"esp32.io/gpio": "1"}, "limits": {"esp32.io/gpio": "1"}}}},
     ["grant esp32.io/gpio"]),
    ("cap", {"container": {"securityContext": {"capabilities": {"add": ["DISPLAY"]}}}},
     ["grant capability DISPLAY"]),
    ("i2c", {"annotations": {"kube32.io/i2c-device": "0x3c"}}, ["grant kube32.io/i2c-device"]),
    ("pvc", {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "card"}}]},
     ["volume claim card on node storage"]),
    ("never", {"annotations": {"kube32.io/migration": "Never"}}, ["annotation kube32.io/migration: Never"]),
]


@pytest.mark.parametrize("name, extra, blockers", BLOCKING_PODS, ids=[b[0] for b in BLOCKING_PODS])
def test_control_plane_blockers_refuse_the_move_word_for_word(cluster: ControlPlane, image: str, name: str,
                                                             extra: dict, blockers: list[str]) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod(name, "sim-1", image, **extra))
    try:
        out = move(cluster, name, "--to", "sim-2")
        assert out.returncode == 1
        text = out.stdout.decode()
        for b in blockers:
            assert f"- {b}" in text, text
        ck = checkpoint_named(cluster, name, "Failed")
        assert ck["status"]["blockers"] == blockers
        events = cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={name},reason=MoveFailed").stdout
        assert blockers[0] in events
        assert get_json(cluster, "pod", name)["spec"]["nodeName"] == "sim-1"
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false")


def test_node_blockers_open_file_and_entry_point(cluster: ControlPlane, image: str, tmp_path) -> None:
    import wasmtime
    wasm = tmp_path / "holds.wasm"
    wasm.write_bytes(wasmtime.wat2wasm(HOLDS_A_FILE))
    holds = push(cluster, wasm)
    cluster.kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {conf: x=1}\n")
    cluster.kubectl("apply", "-f", "-", input=counter_pod(
        "holder", "sim-1", holds, container={"volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}]},
        volumes=[{"name": "cfg", "configMap": {"name": "app"}}]))
    running(cluster, "holder")
    api_call(cluster, "GET", "/api/v1/namespaces/default/pods/holder/proxy/")
    out = move(cluster, "holder", "--to", "sim-2")
    assert out.returncode == 1 and "- open file /etc/app/conf (descriptor" in out.stdout.decode(), out.stdout.decode()

    clock = push(cluster, CLOCK)  # a command pod, embedded: the control plane knows its entry point
    cluster.kubectl("apply", "-f", "-", input=counter_pod("clock", "sim-1", clock))
    out = move(cluster, "clock", "--to", "sim-2")
    assert out.returncode == 1 and "- entry point _start runs on its own thread" in out.stdout.decode()
    for name in ("holder", "clock"):
        cluster.kubectl("delete", "pod", name, "--wait=false")


def test_target_must_fit(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod("fit", "sim-1", image))
    running(cluster, "fit")
    assert "already runs on sim-1" in move(cluster, "fit", "--to", "sim-1").stdout.decode()
    cluster.kubectl("cordon", "sim-2")
    try:
        assert "node(s) were unschedulable" in move(cluster, "fit", "--to", "sim-2").stdout.decode()
    finally:
        cluster.kubectl("uncordon", "sim-2")
    assert 'node "nowhere" not found' in move(cluster, "fit", "--to", "nowhere").stdout.decode()
    out = move(cluster, "fit", "--selector", "kubernetes.io/hostname=sim-2")
    assert out.returncode == 0, out.stdout.decode()
    assert get_json(cluster, "pod", "fit")["spec"]["nodeName"] == "sim-2"
    cluster.kubectl("delete", "pod", "fit")


def test_deployment_pod_moves_and_the_replicaset_counts_one(cluster: ControlPlane, image: str) -> None:
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dctr"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "dctr"}},
                    "template": {"metadata": {"labels": {"app": "dctr"}},
                                 "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                     "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                                                 "operator": "In", "values": ["sim-1", "sim-2"]}]}]}}},
                                          "containers": [{"name": "main", "image": image}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(dep))
    cluster.kubectl("rollout", "status", "deployment/dctr", "--timeout=60s", timeout=90)
    pods = get_json(cluster, "pods", "-l", "app=dctr")["items"]
    assert len(pods) == 1
    name, source = pods[0]["metadata"]["name"], pods[0]["spec"]["nodeName"]
    before = state(cluster, name)

    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch_counts() -> None:
        while not stop.is_set():
            items = get_json(cluster, "pods", "-l", "app=dctr")["items"]
            terminating = sum(1 for p in items if p["metadata"].get("deletionTimestamp"))
            rs = get_json(cluster, "rs", "-l", "app=dctr")["items"][0]
            seen.append((len(items) + terminating, rs["status"].get("replicas", 0)))
    t = threading.Thread(target=watch_counts)
    t.start()
    try:
        out = move(cluster, name)
        assert out.returncode == 0, out.stdout.decode()
        time.sleep(1)
    finally:
        stop.set()
        t.join()
    moved = get_json(cluster, "pod", name)
    assert moved["spec"]["nodeName"] != source
    assert state(cluster, name)["requests"] == before["requests"] + 1
    assert all(n == 1 for n, _ in seen) and all(r <= 1 for _, r in seen), seen
    assert len(get_json(cluster, "pods", "-l", "app=dctr")["items"]) == 1
    cluster.kubectl("delete", "deployment", "dctr")


def extra_worker(cluster: ControlPlane, name: str, *flags: str):
    w = start(sim_command("worker", "--kubeconfig", str(cluster.data_dir / "node.kubeconfig"), "--name", name,
                          "--interp-mops", "100", *flags), cluster.data_dir / f"{name}.log")
    wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                         for c in get_json(cluster, "node", name)["status"]["conditions"]), 30, what=f"{name} Ready")
    return w


@pytest.mark.parametrize("flags, cause", [
    (("--fault", "corrupt-restores"), "cannot restore the snapshot: the snapshot's trailer does not match its "
                                      "contents (damaged in transfer or storage)"),
    # Room for counter.wasm (what its module and instance cost wasmtime, and a page), not
    # for the 5 pages the pod grew to.
    (("--heap", "320Ki", "--profile", "laptop"), "cannot restore the snapshot: the pod's memory limit"),
], ids=["corrupted", "memory-limit"])
def test_a_failed_restore_rolls_back_to_the_source_with_the_state(cluster: ControlPlane, image: str,
                                                                  flags: tuple, cause: str) -> None:
    worker = extra_worker(cluster, "bad-target", *flags)
    name = "rb"
    try:
        cluster.kubectl("apply", "-f", "-", input=counter_pod(name, "sim-1", image))
        running(cluster, name)
        raw(cluster, f"/api/v1/namespaces/default/pods/{name}/proxy/")
        if "memory-limit" in cause or "limit" in cause:
            api_call(cluster, "POST", f"/api/v1/namespaces/default/pods/{name}/proxy/alloc?kb=256")
        before = state(cluster, name)
        out = move(cluster, name, "--to", "bad-target")
        assert out.returncode == 1
        text = out.stdout.decode()
        assert "rolled back to sim-1" in text, text
        ck = checkpoint_named(cluster, name, "Failed")
        assert cause in ck["status"]["message"], ck["status"]["message"]
        back = running(cluster, name)
        assert back["spec"]["nodeName"] == "sim-1"
        after = state(cluster, name)
        assert after["requests"] == before["requests"] + 1 and after["init_calls"] == 1
        events = cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}").stdout
        assert "MoveFailed" in events and "RestoreError" in events
        wait_for(lambda: "Restored" in cluster.kubectl("get", "events", "--field-selector",
                                                       f"involvedObject.name={name},reason=Restored").stdout,
                 15, what="the Restored event")
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false")
        worker.stop()
        cluster.kubectl("delete", "node", "bad-target", "--wait=false", check=False)


def _ready(cluster: ControlPlane, name: str) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in get_json(cluster, "node", name)["status"]["conditions"])


def test_a_deleted_nodes_name_is_held_while_its_kubelet_runs_and_free_once_it_stops(cluster: ControlPlane) -> None:
    """A join under the name of a running kubelet whose Node was deleted is refused (it
    would revoke that kubelet's token); once that kubelet stops, gracefully or killed, the
    name joins at once, though its Lease is still fresh (the endpoint the Lease names
    takes no connection)."""
    first = extra_worker(cluster, "held")
    lease = get_json(cluster, "lease", "-n", "kube-node-lease", "held")
    assert lease["metadata"]["annotations"]["kube32.io/kubelet-endpoint"].endswith(
        f':{get_json(cluster, "node", "held")["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]}')
    try:
        cluster.kubectl("delete", "node", "held")
        second = start(sim_command("worker", "--kubeconfig", str(cluster.data_dir / "node.kubeconfig"),
                                   "--name", "held"), cluster.data_dir / "held-second.log")
        assert second.popen.wait(60) == 1
        text = second.output()
        assert 'node "held" is held by a running kubelet: its Node is gone' in text and "takes connections" in text, \
            text[-800:]
        assert "Traceback" not in text, text[-800:]
        for stop in (signal.SIGTERM, signal.SIGKILL):
            first.stop(stop)
            cluster.kubectl("delete", "node", "held", "--ignore-not-found")
            t0 = time.monotonic()
            first = extra_worker(cluster, "held")
            assert time.monotonic() - t0 < 25, f"rejoin after {stop!r} took {time.monotonic() - t0:.0f} s"
            assert _ready(cluster, "held")
    finally:
        first.stop()
        cluster.kubectl("delete", "node", "held", "--wait=false", check=False)


def test_a_lease_stamped_in_the_future_holds_its_name_only_for_its_duration(cluster: ControlPlane) -> None:
    """A board whose clock runs a day ahead wrote its Lease's renewTime; it died.  The name
    is free once the Lease's duration has passed by the control plane's clock (round 25c:
    it was held for the day, "renewed 0 s ago")."""
    ahead = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "ahead", "namespace": "kube-node-lease"},
             "spec": {"holderIdentity": "ahead", "leaseDurationSeconds": 4, "renewTime": ahead}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(lease))
    worker = None
    try:
        time.sleep(6)
        worker = extra_worker(cluster, "ahead")
        assert _ready(cluster, "ahead")
    finally:
        if worker is not None:
            worker.stop()
        cluster.kubectl("delete", "node", "ahead", "--wait=false", check=False)


def test_a_kubelet_whose_token_is_revoked_says_so_once(cluster: ControlPlane, tmp_path) -> None:
    """An admin joining a node again revokes its running kubelet's token: the kubelet logs
    the cause in one line, once, not a warning per Lease renewal."""
    worker = extra_worker(cluster, "revoked", "--lease-interval", "1")
    try:
        body = tmp_path / "empty.json"
        body.write_text("{}")
        cluster.kubectl("create", "--raw", "/apis/kube32.io/v1/nodecredentials/revoked", "-f", str(body))
        said = "the API server no longer accepts this node's token (401)"
        wait_for(lambda: said in worker.output(), 30, what="the kubelet to say its token is refused")
        time.sleep(3)
        text = worker.output()
        assert text.count(said) == 1 and "cannot renew the node lease" not in text, text[-1500:]
        assert "cannot report node status" not in text, text[-1500:]
    finally:
        worker.stop()
        cluster.kubectl("delete", "node", "revoked", "--wait=false", check=False)


def test_finished_checkpoints_go_after_the_retention_unless_a_pod_names_them(cluster: ControlPlane, image: str) -> None:
    """The cluster runs with --checkpoint-retention 6s (1 hour by default)."""
    cluster.kubectl("apply", "-f", "-", input=counter_pod("kept", "sim-1", image))
    running(cluster, "kept")
    assert cli(cluster, "checkpoint", "kept").returncode == 0
    saved = checkpoint_named(cluster, "kept", "Saved")["metadata"]["name"]
    # A pod whose restore-from names a Checkpoint keeps it (here a pod that never runs).
    pinned = yaml.safe_load(counter_pod("pinned", "x", image, annotations={"kube32.io/restore-from": saved}))
    del pinned["spec"]["nodeName"]
    pinned["spec"]["nodeSelector"] = {"kube32.io/no-such-label": "x"}  # stays Pending
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pinned))
    assert cli(cluster, "checkpoint", "kept").returncode == 0
    names = {c["metadata"]["name"] for c in get_json(cluster, "checkpoints")["items"]
             if c["spec"]["podName"] == "kept"}
    other = (names - {saved}).pop()
    wait_for(lambda: other not in {c["metadata"]["name"] for c in get_json(cluster, "checkpoints")["items"]},
             20, what="the unreferenced checkpoint to go")
    assert saved in {c["metadata"]["name"] for c in get_json(cluster, "checkpoints")["items"]}
    cluster.kubectl("delete", "pod", "pinned", "kept", "--wait=false")


def test_a_never_pod_is_never_checkpointed(cluster: ControlPlane, image: str) -> None:
    """A Save Checkpoint of a pod that opts out fails with the blocker and CheckpointFailed."""
    cluster.kubectl("apply", "-f", "-", input=counter_pod("nosave", "sim-1", image,
                                                          annotations={"kube32.io/migration": "Never"}))
    running(cluster, "nosave")
    out = cli(cluster, "checkpoint", "nosave")
    assert out.returncode == 1 and "- annotation kube32.io/migration: Never" in out.stdout.decode()
    ck = checkpoint_named(cluster, "nosave", "Failed")
    assert ck["spec"]["action"] == "Save" and ck["status"]["blockers"] == ["annotation kube32.io/migration: Never"]
    events = cluster.kubectl("get", "events", "--field-selector", "involvedObject.name=nosave,reason=CheckpointFailed").stdout
    assert "annotation kube32.io/migration: Never" in events
    cluster.kubectl("delete", "pod", "nosave", "--wait=false")
