"""Attack round 19: what an outside attacker still breaks after issue #19's fixes.

Every test starts a real cluster with ``kube32-sim up`` (tests/conftest.py's
``start_cluster``) and attacks it only from outside: raw HTTPS, a node joined with
the bootstrap token from ``DATA_DIR/node.kubeconfig``, a ServiceAccount with ``edit``
in namespace ``other`` only, modules served over ``wasm://`` from a local HTTP
server.  Each test fails on the code it was written against and says, in its
assertion message, what it observed and what the docs promise.

Everything listens on 127.0.0.1 (ports chosen by the kernel); every loop is bounded.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for

pytestmark = pytest.mark.e2e

ECHO = ROOT / "examples" / "pods" / "echo.wasm"
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
MiB = 1 << 20


# --- helpers: a client as an outsider writes one -------------------------------------
class Api:
    """HTTPS to the API server with any token (urllib, the cluster CA)."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.base = cluster.server
        self.host, port = self.base.split("//")[1].rsplit(":", 1)
        self.port = int(port)
        self.ctx = ssl.create_default_context(cafile=str(cluster.data_dir / "pki" / "ca.crt"))
        self.admin = _token(cluster.data_dir / "admin.kubeconfig")
        self.bootstrap = _token(cluster.data_dir / "node.kubeconfig")

    def req(self, method: str, path: str, token: str | None, body: Any = None,
            ctype: str = "application/json", timeout: float = 60, base: str | None = None,
            ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        r = urllib.request.Request((base or self.base) + path, data=data, method=method)
        if token:
            r.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            r.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(r, timeout=timeout, context=ctx or self.ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, method: str, path: str, token: str | None, body: Any = None, **kw: Any) -> tuple[int, Any]:
        st, b = self.req(method, path, token, body, **kw)
        try:
            return st, json.loads(b)
        except ValueError:
            return st, b

    def tls_socket(self) -> ssl.SSLSocket:
        s = socket.create_connection((self.host, self.port), timeout=30)
        return self.ctx.wrap_socket(s, server_hostname=self.host)


def _token(kubeconfig: Path) -> str:
    return re.search(r"token: (\S+)", kubeconfig.read_text()).group(1)


class HealthProbe:
    """GET /healthz on a fresh connection every ``period`` s; the slowest answer."""

    def __init__(self, api: Api, period: float = 0.2) -> None:
        self.api, self.period = api, period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.api.req("GET", "/healthz", None, timeout=90)
            except Exception:  # noqa: BLE001 - a timeout is a slow answer
                pass
            self.samples.append(time.monotonic() - t0)
            self._stop.wait(self.period)

    def worst(self) -> float:
        self._stop.set()
        self._t.join(100)
        return max(self.samples, default=0.0)


def wat_module(wat: str) -> bytes:
    import wasmtime
    return wasmtime.wat2wasm(wat)


SPIN_WAT = """(module
  (import "k32" "k32_time_ms" (func $time_ms (result i64)))
  (memory 1)
  (func $spin (local $end i64)
    (local.set $end (i64.add (call $time_ms) (i64.const 60000)))
    (block $done (loop $l (br_if $done (i64.gt_s (call $time_ms) (local.get $end))) (br $l))))
  (func (export "k32_handle") (call $spin))
  (func (export "k32_tick") (call $spin)))"""

# 255 pages of memory (16 MiB less 64 KiB): its snapshot fills the simulator's whole
# 16 MiB checkpoint data space but for 65 KiB; k32_restored runs for 5 minutes.
PIN_WAT = """(module
  (import "k32" "k32_time_ms" (func $time_ms (result i64)))
  (memory 255)
  (func (export "k32_handle"))
  (func (export "k32_restored") (local $end i64)
    (local.set $end (i64.add (call $time_ms) (i64.const 300000)))
    (block $done (loop $l (br_if $done (i64.gt_s (call $time_ms) (local.get $end))) (br $l)))))"""


class ModuleServer:
    """``wasm://127.0.0.1:<port>/<name>``: the modules an attacker hosts for its pods."""

    def __init__(self, modules: dict[str, bytes | Callable[[], bytes]]) -> None:
        self.modules = modules
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                m = outer.modules.get(self.path.lstrip("/"))
                body = m() if callable(m) else m
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        socketserver.ThreadingTCPServer.daemon_threads = True
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def image(self, name: str) -> str:
        return f"wasm://127.0.0.1:{self.srv.server_address[1]}/{name}"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def push(cluster: ControlPlane, path: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "kube32.cli.main", "image", "push", str(path),
                          "--kubeconfig", str(cluster.kubeconfig)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


SETUP = """
apiVersion: v1
kind: Namespace
metadata: {{name: other}}
---
apiVersion: v1
kind: Secret
metadata: {{name: topsecret, namespace: default}}
stringData: {{password: hunter2-SUPERSECRET}}
---
apiVersion: v1
kind: Pod
metadata: {{name: sec, namespace: default, labels: {{app: sec}}}}
spec:
  nodeName: sim-1
  containers:
  - name: main
    image: "{echo}"
    env:
    - name: PASSWORD
      valueFrom: {{secretKeyRef: {{name: topsecret, key: password}}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: bot, namespace: other}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: bot-edit, namespace: other}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{kind: ServiceAccount, name: bot, namespace: other}}]
"""


class World:
    """A cluster with a victim (``default/sec``, an echo pod on sim-1 holding a Secret in
    its environment) and an attacker (``bot``, ``edit`` in ``other`` only)."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.api = Api(cluster)
        self.echo = push(cluster, ECHO)
        self.counter = push(cluster, COUNTER)
        cluster.kubectl("apply", "-f", "-", input=SETUP.format(echo=self.echo))
        cluster.kubectl("wait", "--for=condition=Ready", "pod/sec", "--timeout=90s", timeout=100)
        self.bot = cluster.kubectl("create", "token", "bot", "-n", "other", "--duration", "2h").stdout.strip()

    def pod(self, ns: str, name: str, image: str, token: str | None = None, node: str | None = "sim-1",
            annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
            memory: str | None = None) -> tuple[int, Any]:
        c: dict[str, Any] = {"name": "main", "image": image}
        if memory:
            c["resources"] = {"limits": {"memory": memory}}
        spec: dict[str, Any] = {"containers": [c]}
        if node:
            spec["nodeName"] = node
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}}, "spec": spec}
        return self.api.json("POST", f"/api/v1/namespaces/{ns}/pods", token or self.api.admin, body)

    def wait_running(self, ns: str, name: str, token: str | None = None, timeout: float = 90) -> None:
        def running() -> bool:
            st, p = self.api.json("GET", f"/api/v1/namespaces/{ns}/pods/{name}", token or self.api.admin)
            return st == 200 and any(c.get("type") == "Ready" and c.get("status") == "True"
                                     for c in (p.get("status") or {}).get("conditions") or [])
        wait_for(running, timeout, 0.3, what=f"pod {ns}/{name} Ready")

    def checkpoint(self, ns: str, name: str, pod: str, token: str | None = None, **spec: Any) -> None:
        body = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name},
                "spec": {"podName": pod, **spec}}
        st, out = self.api.json("POST", f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints", token or self.api.admin, body)
        assert st == 201, (st, out)

    def phase(self, ns: str, name: str) -> tuple[str | None, str]:
        st, ck = self.api.json("GET", f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints/{name}", self.api.admin)
        s = (ck.get("status") or {}) if st == 200 else {}
        return s.get("phase"), s.get("message", "")

    def wait_phase(self, ns: str, name: str, phases: tuple[str, ...], timeout: float) -> tuple[str | None, str, float]:
        t0 = time.monotonic()
        ph: tuple[str | None, str] = (None, "")
        while time.monotonic() - t0 < timeout:
            ph = self.phase(ns, name)
            if ph[0] in phases:
                break
            time.sleep(0.3)
        return ph[0], ph[1], time.monotonic() - t0

    def events(self, ns: str, token: str) -> list[dict[str, Any]]:
        st, out = self.api.json("GET", f"/api/v1/namespaces/{ns}/events", token)
        assert st == 200, (st, out)
        return out["items"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One cluster for the attacks that leave it usable."""
    cluster = start_cluster(tmp_path_factory.mktemp("attack19"), 2, "--backoff", "1")
    try:
        yield World(cluster)
    finally:
        cluster.proc.stop(timeout=30)


@pytest.fixture
def own_world(tmp_path: Path) -> Iterator[World]:
    """A cluster of its own, for an attack that stalls or fills the control plane."""
    cluster = start_cluster(tmp_path / "cluster", 2, "--backoff", "1")
    try:
        yield World(cluster)
    finally:
        cluster.proc.stop(timeout=30)


class EvilNode:
    """A node joined with the bootstrap token whose kubelet endpoint is this test's own
    listener on 127.0.0.1: it records what the API server sends it."""

    def __init__(self, w: World, name: str, scheme: str = "http",
                 answer: Callable[[http.server.BaseHTTPRequestHandler], None] | None = None) -> None:
        self.w, self.name = w, name
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.seen.append((self.command, self.path, self.headers.get("Authorization")))
                if answer is not None:
                    answer(self)
                    return
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = _any  # noqa: N815

            def log_message(self, *a: Any) -> None:
                pass

        socketserver.ThreadingTCPServer.daemon_threads = True
        self.srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
        api = w.api
        body: dict[str, Any] = {}
        key = b""
        if scheme == "https":
            from kube32.kubelet.join import make_csr
            key, csr = make_csr(name, ["127.0.0.1"])
            body = {"csr": csr.decode()}
        st, creds = api.json("POST", f"/apis/kube32.io/v1/nodecredentials/{name}", api.bootstrap, body)
        assert st == 201, (st, creds)
        self.token = creds["token"]
        if scheme == "https":
            import tempfile
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "c.pem").write_text(creds["certificate"])
                (Path(tmp) / "k.pem").write_bytes(key)
                ctx.load_cert_chain(Path(tmp) / "c.pem", Path(tmp) / "k.pem")
            self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        st, out = api.json("POST", "/api/v1/nodes", self.token, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kube32.io/kubelet-scheme": scheme}}})
        assert st == 201, (st, out)
        self.heartbeat()

    def heartbeat(self) -> None:
        api = self.w.api
        st, node = api.json("GET", f"/api/v1/nodes/{self.name}", self.token)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node["status"] = {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.srv.server_address[1]}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "capacity": {"memory": "512Mi", "pods": "10", "cpu": "1"},
            "allocatable": {"memory": "512Mi", "pods": "10", "cpu": "1"}}
        st, out = api.json("PUT", f"/api/v1/nodes/{self.name}/status", self.token, node)
        assert st == 200, (st, out)
        # and its Lease, as a kubelet renews it
        renew = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        st, lease = api.json("GET", f"{leases}/{self.name}", self.token)
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": renew}
        if st == 200:
            lease["spec"] = spec
            api.json("PUT", f"{leases}/{self.name}", self.token, lease)
        else:
            api.json("POST", leases, self.token, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                  "metadata": {"name": self.name}, "spec": spec})

    def report_running(self, ns: str, pod: str) -> None:
        api = self.w.api
        st, p = api.json("GET", f"/api/v1/namespaces/{ns}/pods/{pod}", self.token)
        assert st == 200, (st, p)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        c = p["spec"]["containers"][0]
        p["status"] = {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
                       "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"],
                                              "imageID": c["image"], "state": {"running": {"startedAt": now}}}]}
        st, out = api.json("PUT", f"/api/v1/namespaces/{ns}/pods/{pod}/status", self.token, p)
        assert st == 200, (st, out)

    def evict(self, ns: str, pod: str) -> int:
        st, _ = self.w.api.json("POST", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", self.token,
                                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}})
        return st

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def kubelet_base(w: World, node: str) -> str:
    st, n = w.api.json("GET", f"/api/v1/nodes/{node}", w.api.admin)
    ip = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
    return f"https://{ip}:{n['status']['daemonEndpoints']['kubeletEndpoint']['Port']}"


def k32s(size: int) -> bytes:
    """A valid K32S snapshot of exactly ``size`` bytes (a MEMORY section, padded with a
    section of an unknown type, which readers skip)."""
    pages = (size - 200) // 65536
    mem = pages * 65536
    head = b"K32S" + struct.pack("<HH", 1, 0) + b"\x11" * 32 + struct.pack("<IIQQI", mem, pages, 1234, 0, 2)
    pad = size - len(head) - 6 - mem - 6 - 32
    body = head + struct.pack("<HI", 1, mem) + bytes(mem) + struct.pack("<HI", 99, pad) + bytes(pad)
    return body + hashlib.sha256(body).digest()


def rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def worker_pid(cluster: ControlPlane, node: str) -> int:
    want = [f"--name", node, str(cluster.data_dir / "node.kubeconfig")]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in cmd]
        if "worker" in args and all(x in args for x in want):
            return int(d.name)
    raise AssertionError(f"no worker process for {node}")


# --- 1. a node obtains a credential every TLS kubelet accepts ---------------------------
def test_a_node_cannot_harvest_a_token_that_other_kubelets_accept(world: World) -> None:
    """docs/security.md: HTTPS kubelets get the API server's client certificate, "never a
    token: a node that received the control plane's token could replay it against other
    kubelets".  But the scheme is the node's own annotation: a node (anyone holding the
    bootstrap token) sets ``kube32.io/kubelet-scheme: http`` on its Node, evicts a pod bound
    to it, and the Checkpoint controller's ``nodes/<n>/proxy/checkpoint`` arrives with
    ``Authorization: Bearer <system:kube-apiserver-kubelet-client>``, a token every TLS
    kubelet accepts: it snapshots ``default/sec`` on sim-1."""
    w = world
    evil = None
    try:
        evil = EvilNode(w, "evil-scheme", scheme="http")   # refused: fine, nothing to harvest
        st, out = w.pod("other", "on-evil", w.counter, node="evil-scheme")   # any workload the scheduler put there
        assert st == 201, (st, out)
        evil.report_running("other", "on-evil")
        assert evil.evict("other", "on-evil") == 201
        wait_for(lambda: any(a for _, _, a in evil.seen), 30, 0.2, what="the control plane to call the node")
    except AssertionError:
        pass
    finally:
        if evil is not None:
            evil.close()
    seen = evil.seen if evil is not None else []
    tokens = {a.split(" ", 1)[1] for _, _, a in seen if a and a.lower().startswith("bearer ")}
    ctx = ssl.create_default_context(cafile=str(w.cluster.data_dir / "pki" / "ca.crt"))
    ctx.check_hostname = False
    base = kubelet_base(w, "sim-1")
    stolen = []
    for token in tokens:
        st, body = w.api.req("POST", "/checkpoint/default/sec/main?leave=running", token, b"", base=base, ctx=ctx)
        if st == 200:
            stolen.append((token[:8] + "...", len(body), body[:4]))
    assert not stolen, (
        f"the API server sent node evil-scheme (scheme http, set by the node itself) the bearer token(s) "
        f"{sorted(t[:8] + '...' for t in tokens)} (requests {seen}); with it, sim-1's TLS kubelet answered "
        f"POST /checkpoint/default/sec/main with the snapshot of another namespace's pod: {stolen}. "
        "Expected: no token a kubelet accepts ever leaves the control plane for a node, whatever scheme the node claims")


# --- 2. the kubelet resolves kube32.io/restore-from as a path --------------------------
def test_restore_from_never_reaches_outside_the_pods_checkpoints(world: World) -> None:
    """The kubelet builds ``GET /apis/kube32.io/v1/namespaces/<ns>/checkpoints/<annotation>/data``
    by string and its HTTP client resolves dot segments: ``bot`` (edit in ``other``) makes
    sim-1's kubelet fetch ``default``'s Secret with the node's credentials, and learns from the
    pod's events which Secrets other namespaces' pods on that node use (200 vs 403) -- the
    issue's "the kubelet must never resolve a path out of the pod the request names"."""
    w = world
    probes = {"rf-secret": "../../../../../../api/v1/namespaces/default/secrets/topsecret#",
              "rf-none": "../../../../../../api/v1/namespaces/default/secrets/nonexistent#"}
    created = {}
    for name, rf in probes.items():
        created[name] = w.pod("other", name, w.counter, token=w.bot, node="sim-1",
                              annotations={"kube32.io/restore-from": rf})[0]
    if all(st >= 400 for st in created.values()):
        return   # refused at admission: fine
    messages: dict[str, list[str]] = {}

    def restore_reported() -> bool:
        for e in w.events("other", w.bot):
            n = e["involvedObject"]["name"]
            if n in probes and e["reason"] in ("RestoreError", "MoveFailed"):
                messages.setdefault(n, [])
                if e["message"] not in messages[n]:
                    messages[n].append(e["message"])
        return all(n in messages for n, st in created.items() if st < 400)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not restore_reported():
        time.sleep(0.5)
    read = [m for m in messages.get("rf-secret", []) if "not a K32S snapshot" in m]
    assert not read, (
        f"a pod in namespace other with kube32.io/restore-from: {probes['rf-secret']!r} made sim-1's kubelet "
        f"GET /api/v1/namespaces/default/secrets/topsecret with the node's credentials (200, then: {read[0]!r}); "
        f"for a Secret no pod on sim-1 uses the event says {messages.get('rf-none')}. Expected: the annotation is "
        "a Checkpoint name of the pod's namespace (refused otherwise), percent-encoded into the URL, never resolved")


# --- 3. NodePorts: no range, no uniqueness -> another namespace's traffic -----------------
def test_a_nodeport_cannot_be_taken_from_another_namespace(world: World) -> None:
    """A Service of ``default`` answers on nodePort P of every node.  ``bot`` creates a
    Service in ``other`` with the same nodePort: Kubernetes refuses it ("provided port is
    already allocated"); here it is stored and every node's listener on P then forwards
    ``default``'s clients (their requests, headers and bodies) to bot's pod."""
    w = world
    api = w.api
    port = 31000 + (os.getpid() % 700)
    st, out = api.json("POST", "/api/v1/namespaces/default/services", api.admin, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "sec-np"},
        "spec": {"type": "NodePort", "selector": {"app": "sec"}, "ports": [{"port": 80, "nodePort": port}]}})
    assert st == 201, (st, out)

    def get(ip: str) -> bytes:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=10) as r:
            return r.read()
    wait_for(lambda: b"method:" in get("127.0.0.2"), 30, 0.5, what="the NodePort to reach default/sec")
    st, out = w.pod("other", "thief", w.counter, token=w.bot, node="sim-2", labels={"app": "thief"})
    assert st == 201, (st, out)
    w.wait_running("other", "thief", w.bot)
    st, out = api.json("POST", "/api/v1/namespaces/other/services", w.bot, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "steal"},
        "spec": {"type": "NodePort", "selector": {"app": "thief"}, "ports": [{"port": 80, "nodePort": port}]}})
    time.sleep(5)
    answers = {ip: get(ip)[:120] for ip in ("127.0.0.1", "127.0.0.2", "127.0.0.3")}
    hijacked = {ip: a for ip, a in answers.items() if b'"hostname":"thief"' in a}
    assert st == 422 and not hijacked, (
        f"bot (edit in other) created a Service with default/sec-np's nodePort {port}: {st}; the nodes now "
        f"answer that port with bot's pod: {hijacked}. Expected 422 (port already allocated) and default's "
        "traffic staying with default")


def test_a_nodeport_must_be_in_the_nodeport_range(world: World) -> None:
    """Kubernetes keeps nodePorts in --service-node-port-range (30000-32767).  Here a user
    may claim any port on every node's address: the API server's own port, 80, 10250."""
    w = world
    accepted = []
    for port in (w.api.port, 80, 10250):
        st, out = w.api.json("POST", "/api/v1/namespaces/other/services", w.bot, {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": f"np-{port}"},
            "spec": {"type": "NodePort", "selector": {"app": "x"}, "ports": [{"port": 80, "nodePort": port}]}})
        if st < 300:
            accepted.append(port)
            w.api.req("DELETE", f"/api/v1/namespaces/other/services/np-{port}", w.bot)
    assert not accepted, (f"NodePort Services accepted with nodePort {accepted} (the API server listens on "
                          f"{w.api.port}); expected 422 outside 30000-32767")


# --- 5. numbers that are not JSON get stored --------------------------------------------
def test_no_request_stores_infinity(world: World) -> None:
    """docs/security.md: "NaN/Infinity ... 400".  A number whose exponent overflows
    (``1e999``) decodes to Infinity and is stored as the non-JSON token ``Infinity``: one
    merge patch by ``bot`` on its own pod makes every Go client's pod list fail
    (``kubectl get pods -A -o name``, ``kubectl describe``, ``kubectl drain``: "invalid
    character 'I' looking for beginning of value")."""
    w = world
    api = w.api
    st, out = w.pod("other", "inf", w.counter, token=w.bot, node="sim-2")
    assert st == 201, (st, out)
    cm_st, _ = api.req("POST", "/api/v1/namespaces/other/configmaps", w.bot,
                       b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"inf"},"data":{"a":"b"},"x":1e999}')
    patch_st, _ = api.req("PATCH", "/api/v1/namespaces/other/pods/inf", w.bot,
                          b'{"spec":{"activeDeadlineSeconds":1e999}}', ctype="application/merge-patch+json")
    listed = w.cluster.kubectl("get", "pods", "-A", "-o", "name", check=False)
    for path in ("/api/v1/namespaces/other/pods/inf?gracePeriodSeconds=0", "/api/v1/namespaces/other/configmaps/inf"):
        api.req("DELETE", path, api.admin)
    assert cm_st == 400 and patch_st >= 400 and listed.returncode == 0, (
        f"a ConfigMap with 1e999 answered {cm_st}, a pod patch with activeDeadlineSeconds 1e999 answered "
        f"{patch_st}; then the admin's kubectl get pods -A -o name: rc={listed.returncode} {listed.stderr.strip()!r}. "
        "Expected 400 for both (a number JSON cannot hold) and kubectl unharmed")


# --- 6. ?watch=yes is authorised as a list --------------------------------------------
def test_a_watch_is_authorised_as_a_watch_whatever_its_spelling(world: World) -> None:
    """The authorizer reads ``watch`` as 1/true, the server as 1/true/yes: a user allowed
    only ``list`` pods opens a watch with ``?watch=yes``."""
    w = world
    w.cluster.kubectl("apply", "-f", "-", input="""
apiVersion: v1
kind: ServiceAccount
metadata: {name: lister, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: list-only, namespace: default}
rules: [{apiGroups: [""], resources: ["pods"], verbs: ["list"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: lister, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: list-only}
subjects: [{kind: ServiceAccount, name: lister, namespace: default}]
""")
    token = w.cluster.kubectl("create", "token", "lister").stdout.strip()
    got = {}
    for spelling in ("true", "yes"):
        s = w.api.tls_socket()
        s.sendall(f"GET /api/v1/namespaces/default/pods?watch={spelling}&timeoutSeconds=2 HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        s.settimeout(10)
        try:
            while len(data) < 4096 and (chunk := s.recv(4096)):
                data += chunk
        except OSError:
            pass
        s.close()
        got[spelling] = data.split(b"\r\n", 1)[0].decode() + (" (a watch stream)" if b'"type":"ADDED"' in data else "")
    assert "403" in got["true"] and "403" in got["yes"], (
        f"a user with only list on pods: ?watch=true -> {got['true']}, ?watch=yes -> {got['yes']}. "
        "Expected both refused as a watch (403)")


# --- 7. big objects held on the event loop ----------------------------------------------
def _labels(n: int) -> dict[str, str]:
    return {f"l{i}": "" for i in range(n)}


def test_reading_big_objects_does_not_stall_healthz(own_world: World) -> None:
    """docs/security.md: "No request can hold the event loop that answers /healthz and Lease
    renewals ... each pass over an object of at most 200,000 values costs milliseconds".
    ``bot`` stores 14 ConfigMaps of 150,000 labels each (each within every limit), then two
    lists of its own namespace (any ``view`` user can send them), one strategic merge patch
    of one of them: /healthz waits for each of them (30 such objects and 4 lists: 60 s, and
    the control plane's own node went NotReady)."""
    w = own_world
    api = w.api
    for i in range(14):
        st, out = api.json("POST", "/api/v1/namespaces/other/configmaps", w.bot,
                           {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"big-{i}", "labels": _labels(150_000)}},
                           timeout=120)
        assert st == 201, (st, str(out)[:300])
    time.sleep(2)
    probe = HealthProbe(api)
    t0 = time.monotonic()
    lists: list[tuple[int, bytes]] = []
    readers = [threading.Thread(target=lambda: lists.append(
        api.req("GET", "/api/v1/namespaces/other/configmaps?limit=1", w.bot, timeout=300))) for _ in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(300)
    took = time.monotonic() - t0
    st, body = lists[0] if lists else (0, b"")
    time.sleep(0.5)
    worst_list = probe.worst()
    probe = HealthProbe(api)
    pst, _ = api.req("PATCH", "/api/v1/namespaces/other/configmaps/big-0", w.bot,
                     {"metadata": {"labels": {f"l{i}": "y" for i in range(150_000)}}},
                     ctype="application/strategic-merge-patch+json", timeout=300)
    time.sleep(0.5)
    worst_patch = probe.worst()
    assert worst_list < 2 and worst_patch < 2, (
        f"two lists of namespace other ({st}, {len(body)} bytes each, {took:.1f} s; limit=1 ignored) held /healthz "
        f"up to {worst_list:.1f} s; one strategic merge patch ({pst}) up to {worst_patch:.1f} s. Expected /healthz "
        "within 1 s (off-loop encoding, paginated lists)")


def test_a_write_fanned_out_to_many_watchers_does_not_stall_healthz(own_world: World) -> None:
    """``bot`` opens 200 watches of its own ConfigMaps (reading nothing) and writes one
    ConfigMap of 80,000 labels: every watcher's copy is encoded on the event loop (and
    buffered: the watchers do not read), /healthz and Lease renewals stop for seconds to
    minutes; with 300 watchers and 100,000 labels the control plane's node went NotReady and
    the process grew to 4 GB."""
    w = own_world
    api = w.api
    socks = []
    try:
        for _ in range(200):
            s = api.tls_socket()
            s.sendall(f"GET /api/v1/namespaces/other/configmaps?watch=true&labelSelector=amp%3D1 HTTP/1.1\r\n"
                      f"Host: x\r\nAuthorization: Bearer {w.bot}\r\n\r\n".encode())
            socks.append(s)
        time.sleep(3)
        probe = HealthProbe(api)
        st, _ = api.req("POST", "/api/v1/namespaces/other/configmaps", w.bot,
                        {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "amp", "labels": {"amp": "1", **_labels(80_000)}}}, timeout=120)
        time.sleep(10)
        worst = probe.worst()
    finally:
        for s in socks:
            s.close()
    assert worst < 2, (f"one ConfigMap create ({st}) seen by 200 non-reading watchers held /healthz for up to "
                       f"{worst:.1f} s. Expected /healthz within 1 s whatever the watchers do")


# --- 8. modules that cost a node 100 times their size -------------------------------------
def test_a_module_cannot_make_a_node_allocate_a_hundred_times_its_size(own_world: World) -> None:
    """The kubelet parses a module's sections (kube32.wasm.binary) before any engine sees
    it, accepting unknown section ids and keeping a tuple per section: 10 MiB of zeros after
    the Wasm header (5 million empty custom sections) cost the node about 1 GB and seconds
    of GIL.  The pull limit is 64 MiB, and a pod on ``devkit`` does it in the control plane's
    own process: 8 such pods of 50 MiB took it to 12 GB within a minute."""
    w = own_world
    size = 10 * MiB
    zeros = b"\0asm\x01\0\0\0" + bytes(size - 8)
    srv = ModuleServer({"zeros.wasm": zeros})
    pid = worker_pid(w.cluster, "sim-2")
    before = rss_of(pid)
    peak = before
    try:
        st, out = w.pod("other", "zeros", srv.image("zeros.wasm"), token=w.bot, node="sim-2")
        assert st == 201, (st, out)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 45:
            peak = max(peak, rss_of(pid))
            time.sleep(0.1)
    finally:
        w.api.req("DELETE", "/api/v1/namespaces/other/pods/zeros?gracePeriodSeconds=0", w.api.admin)
        srv.close()
    assert peak - before < 300 * MiB, (
        f"a {size // MiB} MiB module of zeros (pod other/zeros on sim-2, image wasm://) grew sim-2's kubelet from "
        f"{before // MiB} MiB to {peak // MiB} MiB. Expected a module refused (section id / structure) at a cost "
        "near its size")


# --- 9. the checkpoint data space: a paced upload ahead, another namespace's PUT fails -------
def _slow_put(api: Api, token: str, ns: str, name: str, data: bytes, go: threading.Event | None,
              log: list) -> None:
    """A PUT of ``data`` at the least pace docs/security.md allows (1 MiB/s after 10 s,
    a byte at least every 10 s), counted from when ``go`` is set (when the server begins to
    read: the upload ahead ended); a byte every 5 s until then."""
    s = api.tls_socket()
    s.sendall((f"PUT /apis/kube32.io/v1/namespaces/{ns}/checkpoints/{name}/data HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode())
    sent = 100
    s.sendall(data[:sent])
    answer: list[bytes] = []

    def reader() -> None:
        try:
            s.settimeout(120)
            answer.append(s.recv(65536))
        except OSError as e:
            answer.append(repr(e).encode())
    rt = threading.Thread(target=reader, daemon=True)
    rt.start()
    try:
        while go is not None and not go.wait(5) and rt.is_alive():
            s.sendall(data[sent:sent + 1])
            sent += 1
    except OSError:
        pass
    start = time.time()
    k = 1
    try:
        while sent < len(data) and rt.is_alive():
            time.sleep(max(0.0, start + 7 + k - time.time()))
            n = min(k * MiB, len(data)) - sent
            if n > 0:
                s.sendall(data[sent:sent + n])
                sent += n
            k += 1
    except OSError:
        pass
    rt.join(60)
    s.close()
    log.append((name, answer[0].split(b"\r\n", 1)[0] if answer else b"no answer"))


def test_paced_uploads_cannot_make_other_namespaces_uploads_fail(own_world: World) -> None:
    """docs/security.md: "a PUT that finds it full waits its turn (up to 30 s ...). A slow
    client ahead of it is cut by the rule above, so it cannot make others fail."  But a
    16 MiB upload at exactly the allowed pace lasts 26 s, and a second one queued behind it
    (ahead of everyone else) takes the room next: the admin's 128 KiB PUT in ``default``
    waits 30 s and gets 429 "checkpoint data space is busy"."""
    w = own_world
    api = w.api
    for name in ("a1", "a2"):
        w.checkpoint("other", name, "ghost", token=w.bot)
    w.checkpoint("default", "victim-data", "ghost")
    time.sleep(2)
    big = k32s(16 * MiB)
    small = k32s(128 << 10)
    log: list = []
    first_done = threading.Event()

    def a1() -> None:
        _slow_put(api, w.bot, "other", "a1", big, None, log)
        first_done.set()

    def a2() -> None:
        _slow_put(api, w.bot, "other", "a2", big, first_done, log)

    victim: list = []

    def put_victim() -> None:
        t0 = time.monotonic()
        st, body = api.req("PUT", "/apis/kube32.io/v1/namespaces/default/checkpoints/victim-data/data", api.admin,
                           small, ctype="application/octet-stream", timeout=120)
        victim.append((st, round(time.monotonic() - t0, 1), body[:200]))
    threads = [threading.Thread(target=a1), threading.Thread(target=lambda: (time.sleep(0.5), a2())),
               threading.Thread(target=lambda: (time.sleep(2), put_victim()))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert victim and victim[0][0] == 200, (
        f"while bot's two 16 MiB uploads came at the allowed pace ({log}), the admin's 128 KiB PUT of "
        f"default/victim-data answered {victim}. Expected 200: a client at the allowed pace may not make "
        "another namespace's upload fail")


# --- 10. one snapshot at a time: a tenant's slow pods hold every other move ---------------
def test_a_tenants_busy_pod_does_not_hold_other_namespaces_checkpoints(own_world: World) -> None:
    """The control plane takes one snapshot at a time; a Save of a pod busy in a call waits
    10 s (the freeze timeout) before it fails.  ``bot`` runs one busy pod and creates 4 Save
    Checkpoints of it: the admin's Save of ``default/sec`` waits behind all of them (about
    40 s; 100 Checkpoints would hold every move, drain and periodic checkpoint of the
    cluster for 17 minutes)."""
    w = own_world
    srv = ModuleServer({"spin.wasm": wat_module(SPIN_WAT)})
    try:
        st, out = w.pod("other", "spin", srv.image("spin.wasm"), token=w.bot, node="sim-2",
                        annotations={"kube32.io/tick-interval": "100ms"})
        assert st == 201, (st, out)
        w.wait_running("other", "spin", w.bot)
        time.sleep(2)
        for i in range(4):
            w.checkpoint("other", f"spin-{i}", "spin", token=w.bot)
        time.sleep(1)
        w.checkpoint("default", "sec-save", "sec")
        phase, msg, took = w.wait_phase("default", "sec-save", ("Saved", "Failed"), 90)
    finally:
        srv.close()
    assert phase == "Saved" and took < 15, (
        f"the admin's Save of default/sec ended {phase} ({msg!r}) after {took:.1f} s behind bot's 4 Saves of its "
        "busy pod. Expected one namespace's snapshots not to hold another's (Saved within seconds)")


def test_a_node_that_stalls_its_snapshot_does_not_hold_every_other_checkpoint(own_world: World) -> None:
    """A node (joined with the bootstrap token) evicts a pod bound to it and answers the
    control plane's ``/checkpoint`` only after 115 s: the one-at-a-time lock is held all
    that time, and a Save of ``default/sec`` on sim-1 (a healthy node) waits for it."""
    w = own_world

    def stall(h: http.server.BaseHTTPRequestHandler) -> None:
        if h.command == "POST" and h.path.startswith("/checkpoint/"):
            time.sleep(115)
        h.send_response(503)
        h.send_header("Content-Length", "0")
        h.end_headers()
    evil = EvilNode(w, "evil-stall", scheme="https", answer=stall)
    try:
        st, out = w.pod("other", "on-stall", w.counter, node="evil-stall")
        assert st == 201, (st, out)
        evil.report_running("other", "on-stall")
        assert evil.evict("other", "on-stall") == 201
        wait_for(lambda: any(p.startswith("/checkpoint/") for _, p, _ in evil.seen), 30, 0.2,
                 what="the control plane to ask the node for its snapshot")
        w.checkpoint("default", "sec-save", "sec")
        phase, msg, took = w.wait_phase("default", "sec-save", ("Saved", "Failed"), 45)
    finally:
        evil.close()
    assert phase == "Saved" and took < 15, (
        f"while node evil-stall sat on one /checkpoint request, the admin's Save of default/sec on sim-1 was "
        f"{phase} ({msg!r}) after {took:.1f} s. Expected a healthy node's snapshot not to wait on a stalled node")


# --- 11. a tenant's move in flight pins the whole data space: drains delete other pods -----
def test_a_tenants_move_in_flight_cannot_pin_the_whole_data_space(own_world: World) -> None:
    """docs/security.md: "The data of a move in flight ... never goes", and fair shares
    protect only periodic checkpoints and pending restores.  ``bot`` moves its own pod of
    16 MiB less 64 KiB whose ``k32_restored`` never returns: the move stays Moving for 60 s,
    its rollback restores for 120 s more, and all that time the data space has no room for
    any other namespace: the admin's move of ``default/sec`` fails "does not fit ... beside
    the data that may not go", and ``kubectl drain sim-1`` then deletes ``default/sec`` (its
    state is gone) instead of moving it."""
    w = own_world
    srv = ModuleServer({"pin.wasm": wat_module(PIN_WAT)})
    try:
        st, out = w.pod("other", "pin", srv.image("pin.wasm"), token=w.bot, node="sim-1", memory="16Mi")
        assert st == 201, (st, out)
        w.wait_running("other", "pin", w.bot)
        w.checkpoint("other", "pin-move", "pin", token=w.bot, action="Move", target={"nodeName": "sim-2"})
        ph = w.wait_phase("other", "pin-move", ("Moving", "Completed", "Failed"), 60)
        assert ph[0] == "Moving", ph
        time.sleep(2)
        w.checkpoint("default", "sec-move", "sec", action="Move", target={"nodeName": "sim-2"})
        phase, msg, took = w.wait_phase("default", "sec-move", ("Completed", "Failed"), 60)
        uid = w.api.json("GET", "/api/v1/namespaces/default/pods/sec", w.api.admin)[1]["metadata"]["uid"]
        drain = None
        if phase != "Completed":   # what an operator's drain of sim-1 does meanwhile
            drain = w.cluster.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=60s",
                                      check=False, timeout=90)
        st_after, _ = w.api.json("GET", "/api/v1/namespaces/default/pods/sec", w.api.admin)
    finally:
        srv.close()
    assert phase == "Completed" and st_after == 200, (
        f"while bot's own move was in flight, the admin's move of default/sec ended {phase}: {msg[:250]!r}; "
        f"kubectl drain sim-1 then: {drain.stdout.strip()[-200:] if drain else None!r}, and GET default/sec answered {st_after} "
        f"(uid before {uid}). Expected one namespace's move in flight not to refuse every other namespace's "
        "moves, nor make a drain delete their pods")
