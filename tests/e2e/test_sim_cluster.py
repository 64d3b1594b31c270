"""End to end: ``kube32-sim up --workers 2`` as real processes, driven with kubectl,
``kube32-cli`` and the kubernetes Python client.

One cluster per module (nodes devkit, sim-1, sim-2, restart back-off 1 s).  Pods
are bound by ``spec.nodeName`` (the scheduler is separate work).
"""
from __future__ import annotations

import hashlib
import json
import http.server
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import wasmtime
import yaml

from tests.conftest import ROOT, ControlPlane, sim_command, start, wait_for

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
TRAP_ON_INIT = """
(module
  (memory (export "memory") 1)
  (func (export "k32_init") unreachable)
  (func (export "k32_handle")))
"""


from tests.e2e.helpers import cli, get_json, pod_yaml, push, raw, waiting_or_terminated  # noqa: E402


def test_three_ready_nodes_with_interp_mops(sim_cluster: ControlPlane) -> None:
    nodes = {n["metadata"]["name"]: n for n in get_json(sim_cluster, "nodes")["items"]}
    assert set(nodes) == {"devkit", "sim-1", "sim-2"}
    for name, node in nodes.items():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", name
        assert float(node["metadata"]["annotations"]["kube32.io/interp-mops"]) > 0
        assert int(node["metadata"]["annotations"]["kube32.io/free-heap"]) > 0
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] > 0
    assert "node-role.kubernetes.io/control-plane" in nodes["devkit"]["metadata"]["labels"]
    assert nodes["devkit"]["status"]["capacity"]["memory"] == str(8 << 20)
    assert nodes["sim-1"]["metadata"]["labels"]["kube32.io/profile"] == "laptop"
    table = sim_cluster.kubectl("get", "nodes").stdout
    assert table.count(" Ready ") == 3, table
    # The kubernetes Python client deserializes the nodes (it refuses incomplete nodeInfo).
    from kubernetes import client as k8s
    listed = k8s.CoreV1Api(sim_cluster.client()).list_node()
    assert sorted(n.metadata.name for n in listed.items) == ["devkit", "sim-1", "sim-2"]
    leases = get_json(sim_cluster, "leases", "-n", "kube-node-lease")["items"]
    assert {lease["metadata"]["name"] for lease in leases} == {"devkit", "sim-1", "sim-2"}


def test_counter_pod_serves_ticks_hears_events_and_logs(sim_cluster: ControlPlane) -> None:
    image = push(sim_cluster, COUNTER)
    assert image == "kube32.io/wasm-sha256:" + hashlib.sha256(COUNTER.read_bytes()).hexdigest()
    docs = pod_yaml("counter", "sim-1", image, {"kube32.io/events": "news", "kube32.io/tick-interval": "50ms"})
    docs += "---\n" + yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "counter"},
                                      "spec": {"selector": {"app": "counter"}, "ports": [{"port": 80}]}})
    sim_cluster.kubectl("apply", "-f", "-", input=docs)
    wait_for(lambda: get_json(sim_cluster, "pod", "counter")["status"].get("containerStatuses", [{}])[0].get("ready"),
             30, what="counter to be Ready")
    pod = get_json(sim_cluster, "pod", "counter")
    status = pod["status"]
    node_ip = next(a["address"] for a in get_json(sim_cluster, "node", "sim-1")["status"]["addresses"]
                   if a["type"] == "InternalIP")
    assert node_ip == "127.0.0.2", "kube32-sim up gives each worker a loopback address of its own"
    assert status["phase"] == "Running" and status["podIP"] == node_ip and status["hostIP"] == node_ip
    assert status["containerStatuses"][0]["imageID"] == image
    assert {c["type"] for c in status["conditions"]} >= {"PodScheduled", "Initialized", "ContainersReady", "Ready"}

    first = raw(sim_cluster, "/api/v1/namespaces/default/pods/counter/proxy/")
    assert first["hostname"] == "counter" and first["init_calls"] == 1
    via_service = raw(sim_cluster, "/api/v1/namespaces/default/services/counter/proxy/")
    assert via_service["requests"] == first["requests"] + 1
    wait_for(lambda: raw(sim_cluster, "/api/v1/namespaces/default/pods/counter/proxy/")["ticks"] > first["ticks"],
             10, what="ticks")

    out = cli(sim_cluster, "publish", "news", "hello")
    assert out.returncode == 0, out.stderr.decode()
    state = wait_for(lambda: (s := raw(sim_cluster, "/api/v1/namespaces/default/pods/counter/proxy/"))["events"] == 1 and s,
                     10, what="the published event")
    assert state["last_event"] == "news:hello"
    cli(sim_cluster, "publish", "other-topic", "x")   # not subscribed: not delivered
    assert raw(sim_cluster, "/api/v1/namespaces/default/pods/counter/proxy/")["events"] == 1

    logs = sim_cluster.kubectl("logs", "counter").stdout
    assert "counter: init" in logs
    stamped = sim_cluster.kubectl("logs", "counter", "--timestamps", "--tail=1").stdout.strip()
    assert stamped.endswith("counter: init") and stamped[:4].isdigit() and "T" in stamped.split()[0]

    follower = sim_cluster.kubectl_bg("logs", "-f", "counter")
    time.sleep(0.5)
    sim_cluster.kubectl("delete", "pod", "counter", "--wait=true", timeout=30)
    out_f, _ = follower.communicate(timeout=15)   # the follow ends when the pod stops
    assert "counter: init" in out_f
    assert sim_cluster.kubectl("get", "pod", "counter", check=False).returncode != 0


class _OneFile(http.server.BaseHTTPRequestHandler):
    data = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's API
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.end_headers()
        self.wfile.write(self.data)

    def log_message(self, *args) -> None:
        pass


def test_wasm_http_image_with_wrong_pin_shows_err_image_pull(sim_cluster: ControlPlane) -> None:
    _OneFile.data = COUNTER.read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OneFile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"wasm://127.0.0.1:{server.server_address[1]}/counter.wasm"
        sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("pinned-ok", "sim-2", url, {
            "kube32.io/wasm-sha256": hashlib.sha256(_OneFile.data).hexdigest()}))
        sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("pinned-bad", "sim-2", url, {
            "kube32.io/wasm-sha256": "ab" * 32}))
        wait_for(lambda: waiting_or_terminated(sim_cluster, "pinned-ok").get("ready"), 30, what="pinned-ok Ready")
        cs = wait_for(lambda: (c := waiting_or_terminated(sim_cluster, "pinned-bad")).get("state", {}).get("waiting", {})
                      .get("reason") in ("ErrImagePull", "ImagePullBackOff") and c, 30, what="ErrImagePull")
        assert "image digest mismatch: expected " + "ab" * 32 in cs["state"]["waiting"]["message"]
        assert "ImagePull" in sim_cluster.kubectl("get", "pod", "pinned-bad").stdout
    finally:
        server.shutdown()
        sim_cluster.kubectl("delete", "pod", "pinned-ok", "pinned-bad", "--wait=false", check=False)


def test_module_whose_init_traps_is_in_crash_loop_back_off(sim_cluster: ControlPlane, tmp_path: Path) -> None:
    module = tmp_path / "trap.wasm"
    module.write_bytes(wasmtime.wat2wasm(TRAP_ON_INIT))
    image = push(sim_cluster, module)
    sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("trapper", "devkit", image))
    cs = wait_for(lambda: (c := waiting_or_terminated(sim_cluster, "trapper")).get("restartCount", 0) >= 1
                  and c.get("lastState", {}).get("terminated") and c, 30, what="a restart after the trap")
    assert cs["lastState"]["terminated"]["reason"] == "Error"
    assert "k32_init failed" in cs["lastState"]["terminated"]["message"]
    wait_for(lambda: "CrashLoopBackOff" in sim_cluster.kubectl("get", "pod", "trapper").stdout, 30,
             what="CrashLoopBackOff in kubectl get")
    sim_cluster.kubectl("delete", "pod", "trapper", "--wait=false")


LOG_THEN_TRAP = """
(module
  (import "k32" "k32_log" (func $log (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "about to trap")
  (func (export "k32_init") (drop (call $log (i32.const 16) (i32.const 13))) unreachable)
  (func (export "k32_handle")))
"""


def test_logs_previous_since_and_limit_bytes(sim_cluster: ControlPlane, tmp_path: Path) -> None:
    """kubectl logs --previous / --since / --since-time / --limit-bytes, against a pod that
    logs a line and traps, over and over (CrashLoopBackOff), as the kubelet picks the
    container: the running or ended one, else the last that ended; -p the last that ended."""
    module = tmp_path / "logtrap.wasm"
    module.write_bytes(wasmtime.wat2wasm(LOG_THEN_TRAP))
    image = push(sim_cluster, module)
    sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("logtrap", "sim-1", image))
    try:
        wait_for(lambda: waiting_or_terminated(sim_cluster, "logtrap").get("restartCount", 0) >= 2, 30,
                 what="two restarts")
        for args in ((), ("-p",), ("--since=1h",), ("--previous", "--timestamps")):
            out = sim_cluster.kubectl("logs", "logtrap", *args).stdout
            assert out.endswith("about to trap\n") and out.count("about to trap") == 1, (args, out)
        assert sim_cluster.kubectl("logs", "logtrap", "--since-time=2999-01-01T00:00:00Z").stdout == ""
        assert sim_cluster.kubectl("logs", "logtrap", "--limit-bytes=5").stdout == "about"
        sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("logfresh", "sim-1", push(sim_cluster, COUNTER)))
        wait_for(lambda: "Running" in sim_cluster.kubectl("get", "pod", "logfresh").stdout, 30, what="Running")
        never = sim_cluster.kubectl("logs", "logfresh", "-p", check=False)
        assert never.returncode == 1
        assert 'previous terminated container "main" in pod "logfresh" not found' in never.stderr
    finally:
        sim_cluster.kubectl("delete", "pod", "logtrap", "logfresh", "--wait=false", check=False)


def test_kubelet_endpoint_admits_only_the_api_server(sim_cluster: ControlPlane) -> None:
    node = get_json(sim_cluster, "node", "sim-1")
    import ssl  # the kubelet serves TLS with a certificate from the kubelet-serving signer
    assert node["metadata"]["annotations"]["kube32.io/kubelet-scheme"] == "https"
    ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    base = f"https://{ip}:{node['status']['daemonEndpoints']['kubeletEndpoint']['Port']}"
    ctx = ssl.create_default_context(cafile=str(sim_cluster.data_dir / "pki" / "kubelet-ca.crt"))
    token = yaml.safe_load(sim_cluster.kubeconfig.read_text())["users"][0]["user"]["token"]
    codes = []
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": f"Bearer {token}"}):
        try:
            urllib.request.urlopen(urllib.request.Request(base + "/containerLogs/default/x/main", headers=headers),
                                   context=ctx)
            codes.append(200)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
    assert codes == [401, 401, 403]
    assert urllib.request.urlopen(base + "/healthz", context=ctx).read() == b"ok\n"


def test_keyboard_events_and_a_killed_worker_stops_renewing(sim_cluster: ControlPlane) -> None:
    worker = start(sim_command("worker", "--kubeconfig", str(sim_cluster.data_dir / "node.kubeconfig"),
                               "--name", "board-x", "--profile", "cardputer", "--lease-interval", "0.3",
                               "--heap", "2Mi",   # counter.wasm costs pwasm 0.7 MiB: more than 320 KiB
                               "--interp-mops", "7"), sim_cluster.data_dir / "board-x.log")
    try:
        def ready_node() -> dict | None:
            n = get_json(sim_cluster, "node", "board-x")
            ok = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            return n if ok else None
        node = wait_for(ready_node, 30, what="board-x Ready")
        assert node["status"]["capacity"]["hardware.kube32.io/keyboard"] == "1"
        assert node["metadata"]["annotations"]["kube32.io/interp-mops"] == "7.00"
        image = "kube32.io/wasm-sha256:" + hashlib.sha256(COUNTER.read_bytes()).hexdigest()
        push(sim_cluster, COUNTER)
        sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("keys", "board-x", image, {"kube32.io/events": "keyboard"}))
        wait_for(lambda: waiting_or_terminated(sim_cluster, "keys").get("ready"), 30, what="keys Ready")
        sim_cluster.kubectl("get", "--raw", "/api/v1/nodes/board-x/proxy/devices/keyboard?key=a")
        state = wait_for(lambda: (s := raw(sim_cluster, "/api/v1/namespaces/default/pods/keys/proxy/"))["events"] == 1 and s,
                         10, what="the key event")
        assert state["last_event"] == "keyboard:a"

        def renew_time() -> str:
            return get_json(sim_cluster, "lease", "board-x", "-n", "kube-node-lease")["spec"]["renewTime"]
        before = renew_time()
        wait_for(lambda: renew_time() != before, 10, what="the lease to be renewed")
        worker.popen.send_signal(signal.SIGKILL)
        worker.popen.wait(10)
        time.sleep(0.5)
        frozen = renew_time()
        time.sleep(1.5)   # five lease intervals
        assert renew_time() == frozen
        # NotReady needs the node lifecycle controller (separate work); when it runs, the
        # Node turns NotReady after the lease's 40 s - not waited for here.
    finally:
        worker.stop()
        sim_cluster.kubectl("delete", "pod", "keys", "--wait=false", check=False)


def test_nodeport_service_answers_on_every_node(sim_cluster: ControlPlane) -> None:
    """Each node has its own loopback address; a NodePort Service answers on all of them."""
    image = push(sim_cluster, COUNTER)
    sim_cluster.kubectl("apply", "-f", "-", input=pod_yaml("np", "sim-1", image))
    sim_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "np"},
        "spec": {"type": "NodePort", "selector": {"app": "np"}, "ports": [{"port": 80}]}}))
    wait_for(lambda: waiting_or_terminated(sim_cluster, "np").get("ready"), 30, what="np Ready")
    port = get_json(sim_cluster, "service", "np")["spec"]["ports"][0]["nodePort"]
    addresses = {n["metadata"]["name"]: next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
                 for n in get_json(sim_cluster, "nodes")["items"] if n["metadata"]["name"] in ("devkit", "sim-1", "sim-2")}
    assert len(set(addresses.values())) == 3, addresses
    seen = []
    for node, ip in sorted(addresses.items()):
        body = wait_for(lambda: urllib.request.urlopen(f"http://{ip}:{port}/", timeout=5).read(), 15,
                        what=f"NodePort {port} on {node} ({ip})")
        seen.append(json.loads(body)["requests"])
    assert sorted(seen) == seen and len(set(seen)) == 3, seen   # one pod, its counter going up
    sim_cluster.kubectl("delete", "service", "np")
    sim_cluster.kubectl("delete", "pod", "np", "--wait=false")
