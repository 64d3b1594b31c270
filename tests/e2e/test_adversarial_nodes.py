"""Adversarial nodes and what a node or a pod writes that the control plane acts on (#19).

A real ``kube32-sim up`` cluster (devkit, sim-1, sim-2), attacked only from outside:
raw HTTPS with urllib, a node joined with the bootstrap token from
``DATA_DIR/node.kubeconfig`` whose kubelet endpoint is this test's own listener, and a
ServiceAccount ``bot`` with ``edit`` in namespace ``other`` only.  The victim is
``default/sec``, an echo pod on sim-1 holding a Secret in its environment.

* A node writes its own kubelet endpoint (scheme annotation, address, port): whatever
  the API server sends there opens no other kubelet (the token it gets is bound to it),
  and the API server reaches only the kubelet of the node it means (verified by name).
* ``kube32.io/restore-from`` names a Checkpoint of the pod's namespace, refused (422)
  otherwise; a name never becomes a path that climbs (kube32.urlpath.api_path).
* A pod's topic never makes its node publish outside the pod's namespace's topics.
* ``?watch=<any spelling>`` is authorised as the watch it is served as.

Everything listens on 127.0.0.1 (ports chosen by the kernel); every wait is bounded.
Scenarios from the outside attack round (tests/attack/test_attack19.py).
"""
from __future__ import annotations

import http.server
import json
import re
import socket
import socketserver
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, sim_command, start, start_cluster, wait_for
from tests.e2e.helpers import kubelet_client_token, push

pytestmark = pytest.mark.e2e

ECHO = ROOT / "examples" / "pods" / "echo.wasm"
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"

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


def _token(kubeconfig: Path) -> str:
    found = re.search(r"token: (\S+)", kubeconfig.read_text())
    assert found is not None, kubeconfig
    return found.group(1)


class Api:
    """HTTPS to the API server (or, with ``base`` and ``ctx``, a kubelet) with any token."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.base = cluster.server
        self.host, port = self.base.split("//")[1].rsplit(":", 1)
        self.port = int(port)
        pki = cluster.data_dir / "pki"
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        # Kubelets serve certificates of the kubelet-serving signer (for their address).
        self.kubelet_ctx = ssl.create_default_context(cafile=str(pki / "kubelet-ca.crt"))
        self.admin = _token(cluster.data_dir / "admin.kubeconfig")
        self.bootstrap = _token(cluster.data_dir / "node.kubeconfig")

    def req(self, method: str, path: str, token: str | None, body: Any = None,
            ctype: str = "application/json", base: str | None = None,
            ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        r = urllib.request.Request((self.base if base is None else base) + path, data=data, method=method)
        if token:
            r.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            r.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(r, timeout=60, context=ctx or self.ctx) as resp:
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


class World:
    """The victim (``default/sec`` on sim-1) and the attacker (``bot``, edit in ``other``)."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.api = Api(cluster)
        self.echo = push(cluster, ECHO)
        self.counter = push(cluster, COUNTER)
        cluster.kubectl("apply", "-f", "-", input=SETUP.format(echo=self.echo))
        cluster.kubectl("wait", "--for=condition=Ready", "pod/sec", "--timeout=90s", timeout=100)
        self.bot = cluster.kubectl("create", "token", "bot", "-n", "other", "--duration", "2h").stdout.strip()

    def pod(self, ns: str, name: str, image: str, token: str | None = None, node: str = "sim-1",
            annotations: dict[str, str] | None = None) -> tuple[int, Any]:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}]}}
        return self.api.json("POST", f"/api/v1/namespaces/{ns}/pods", token or self.api.admin, body)

    def wait_ready(self, ns: str, name: str, timeout: float = 90) -> None:
        def ready() -> bool:
            st, p = self.api.json("GET", f"/api/v1/namespaces/{ns}/pods/{name}", self.api.admin)
            return st == 200 and any(c.get("type") == "Ready" and c.get("status") == "True"
                                     for c in (p.get("status") or {}).get("conditions") or [])
        wait_for(ready, timeout, 0.3, what=f"pod {ns}/{name} Ready")

    def kubelet_endpoint(self, node: str) -> tuple[str, int]:
        st, n = self.api.json("GET", f"/api/v1/nodes/{node}", self.api.admin)
        assert st == 200, (st, n)
        ip = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        return ip, n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    cluster = start_cluster(tmp_path_factory.mktemp("adversarial-nodes"), 2, "--backoff", "1")
    try:
        yield World(cluster)
    finally:
        cluster.proc.stop(timeout=30)


class EvilNode:
    """A node joined with the bootstrap token whose kubelet endpoint is this test's own
    listener on 127.0.0.1 (or, with ``endpoint``, any address and port it claims): it
    records what the API server sends it.  ``scheme`` is what it writes in its
    ``kube32.io/kubelet-scheme``; with ``https`` it serves a certificate the kubelet
    signer gave it for its own address and name."""

    def __init__(self, w: World, name: str, scheme: str = "http",
                 endpoint: tuple[str, int] | None = None) -> None:
        self.w, self.name = w, name
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.seen.append((self.command, self.path, self.headers.get("Authorization")))
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
            key, csr = make_csr(name, ["127.0.0.1", name])
            body = {"csr": csr.decode()}
        st, creds = api.json("POST", f"/apis/kube32.io/v1/nodecredentials/{name}", api.bootstrap, body)
        assert st == 201, (st, creds)
        self.token = creds["token"]
        if scheme == "https":
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
        self.endpoint = endpoint or ("127.0.0.1", self.srv.server_address[1])
        self.heartbeat()

    def heartbeat(self) -> None:
        for _ in range(5):   # the control plane's controllers write Nodes too (409: again)
            st, out = self._heartbeat()
            if st != 409:
                break
        assert st == 200, (st, out)

    def _heartbeat(self) -> tuple[int, Any]:
        api = self.w.api
        st, node = api.json("GET", f"/api/v1/nodes/{self.name}", self.token)
        assert st == 200, (st, node)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node["status"] = {
            "addresses": [{"type": "InternalIP", "address": self.endpoint[0]}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.endpoint[1]}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "capacity": {"memory": "512Mi", "pods": "10", "cpu": "1"},
            "allocatable": {"memory": "512Mi", "pods": "10", "cpu": "1"}}
        return api.json("PUT", f"/api/v1/nodes/{self.name}/status", self.token, node)

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
        self.w.api.req("DELETE", f"/api/v1/nodes/{self.name}", self.w.api.admin)


# --- a node's endpoint: the scheme, the address, the port are the node's own --------------
def test_a_node_cannot_harvest_a_token_that_other_kubelets_accept(world: World) -> None:
    """A node (anyone holding the bootstrap token) sets ``kube32.io/kubelet-scheme: http``
    on its Node and evicts a pod bound to it: the Checkpoint controller's
    ``nodes/<n>/proxy/checkpoint`` arrives with a bearer token.  It was the one token of
    ``system:kube-apiserver-kubelet-client``, which every TLS kubelet accepted: with it, the
    node snapshotted ``default/sec`` on sim-1.  Now the token is bound to that node: sim-1
    refuses it (403 naming the node it is bound to), and the API grants it nothing."""
    w = world
    evil = EvilNode(w, "evil-scheme", scheme="http")
    try:
        st, out = w.pod("other", "on-evil", w.counter, node="evil-scheme")   # any workload put there
        assert st == 201, (st, out)
        evil.report_running("other", "on-evil")
        assert evil.evict("other", "on-evil") == 201
        wait_for(lambda: any(a for _, _, a in evil.seen), 30, 0.2, what="the control plane to call the node")
        tokens = {a.split(" ", 1)[1] for _, _, a in evil.seen if a and a.lower().startswith("bearer ")}
        assert tokens, f"the control plane called node evil-scheme (plain HTTP) without a credential: {evil.seen}"
        stolen, answers = _try_on_sim1(w, tokens)
        assert all(w.api.req("GET", "/api/v1/namespaces/default/secrets", t)[0] == 403 for t in tokens)
    finally:
        evil.close()
    assert not stolen, (
        f"the API server sent node evil-scheme (scheme http, set by the node itself) the bearer token(s) "
        f"{sorted(t[:12] + '...' for t in tokens)} (requests {evil.seen}); with it, sim-1's TLS kubelet answered "
        f"POST /checkpoint/default/sec/main with the snapshot of another namespace's pod: {stolen}. "
        "Expected: no token a kubelet accepts ever leaves the control plane for another node")
    assert all(st == 403 and b'bound to node "evil-scheme", not to node "sim-1"' in body
               for st, body in answers), answers
    # The Node gone, its token is no credential at all (what the kubelet asks is 401).
    wait_for(lambda: w.api.req("GET", "/api/v1/nodes/evil-scheme", w.api.admin)[0] == 404, 30, 0.2,
             what="node evil-scheme deleted")
    for token in tokens:
        st, out = w.api.json("POST", "/apis/authentication.k8s.io/v1/tokenreviews", w.api.admin,
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        assert st == 201 and out["status"] == {"authenticated": False}, (st, out)


def test_a_plain_http_kubelet_takes_the_token_bound_to_it_and_no_other(world: World, tmp_path: Path) -> None:
    """A real worker with ``--kubelet-insecure-http``: the API server reaches it with the
    token bound to its Node (``kubectl logs`` works); the token bound to sim-1 (what
    sim-1 would get over plain HTTP) opens nothing there, nor does the admin's."""
    w = world
    worker = start(sim_command("worker", "--kubeconfig", str(w.cluster.data_dir / "node.kubeconfig"),
                               "--name", "plain-1", "--port", "0", "--interp-mops", "1", "--kubelet-insecure-http"),
                   tmp_path / "plain-1.log")
    try:
        wait_for(lambda: w.api.req("GET", "/api/v1/nodes/plain-1", w.api.admin)[0] == 200, 60, 0.3,
                 what="node plain-1 registered")
        st, out = w.pod("default", "on-plain", w.counter, node="plain-1")
        assert st == 201, (st, out)
        w.wait_ready("default", "on-plain")
        logs = w.cluster.kubectl("logs", "on-plain")
        assert logs.stdout.strip() == "counter: init", (logs.stdout, logs.stderr, worker.output()[-2000:])
        ip, port = w.kubelet_endpoint("plain-1")
        url = f"http://{ip}:{port}/containerLogs/default/on-plain/main"
        for token, want in ((kubelet_client_token(w.cluster, "sim-1"), b'bound to node "sim-1", not to node "plain-1"'),
                            (w.api.admin, b'user "kubernetes-admin" may not use the kubelet API')):
            st, body = w.api.req("GET", url, token, base="")
            assert st == 403 and want in body, (st, body)
        st, body = w.api.req("GET", url, kubelet_client_token(w.cluster, "plain-1"), base="")
        assert st == 200 and body.strip() == b"counter: init", (st, body)
    finally:
        w.api.req("DELETE", "/api/v1/namespaces/default/pods/on-plain?gracePeriodSeconds=0", w.api.admin)
        worker.stop()
        w.api.req("DELETE", "/api/v1/nodes/plain-1", w.api.admin)


def _try_on_sim1(w: World, tokens: set[str]) -> tuple[list, list]:
    """Each token against sim-1's kubelet (``POST /checkpoint`` of default/sec): (the
    snapshots it gave, every answer)."""
    ip, port = w.kubelet_endpoint("sim-1")
    stolen, answers = [], []
    for token in tokens:
        st, body = w.api.req("POST", "/checkpoint/default/sec/main?leave=running", token, b"",
                             base=f"https://{ip}:{port}", ctx=w.api.kubelet_ctx)
        answers.append((st, body[:200]))
        if st == 200:
            stolen.append((token[:12] + "...", len(body), body[:4]))
    return stolen, answers


def test_a_node_cannot_point_the_api_server_at_another_nodes_kubelet(world: World) -> None:
    """A node reports sim-1's kubelet address and port as its own (HTTPS, its own
    certificate from the kubelet signer): the API server verified a kubelet only for the
    address, so it sent what it meant for that node, with its client certificate, to
    sim-1, which answered with another namespace's pod's logs.  Now it verifies the
    kubelet is the node it means (its certificate names that node): 503, nothing sent."""
    w = world
    sim1 = w.kubelet_endpoint("sim-1")
    evil = EvilNode(w, "evil-addr", scheme="https", endpoint=sim1)
    try:
        for path in ("containerLogs/default/sec/main", "pods/default/sec/http/"):
            st, body = w.api.req("GET", f"/api/v1/nodes/evil-addr/proxy/{path}", w.api.admin)
            assert st == 503, (f"GET nodes/evil-addr/proxy/{path} (the node claims sim-1's kubelet endpoint "
                               f"{sim1}) answered {st}: {body[:300]!r}. Expected 503: sim-1 is not evil-addr")
            message = json.loads(body)["message"]
            assert f'error trying to reach the kubelet of node "evil-addr": the server at https://{sim1[0]}:' \
                   f'{sim1[1]} is not it' in message, message
        # sim-1 itself is reached as before.
        st, body = w.api.req("GET", "/api/v1/nodes/sim-1/proxy/containerLogs/default/sec/main", w.api.admin)
        assert st == 200, (st, body[:300])
    finally:
        evil.close()


@pytest.mark.parametrize("field,value,cause", [
    ("address", "127.0.0.1:1/#", "its InternalIP '127.0.0.1:1/#' is not an IP address"),
    ("port", "1@127.0.0.9", "its kubelet port '1@127.0.0.9' is not a port number"),
])
def test_a_kubelet_endpoint_is_an_address_a_port_and_a_scheme(world: World, field: str, value: str,
                                                               cause: str) -> None:
    """What a node writes for its endpoint went into a URL as it was (``127.0.0.1:1/#``
    made the API server dial port 1; a scheme of ``https://127.0.0.9:1/#`` any host, a
    port of ``1@127.0.0.9`` a 500): only an IP address, a port number and http/https are
    taken; anything else is a 503 that names the field (the scheme is refused on write)."""
    w = world
    evil = EvilNode(w, f"evil-endpoint-{field}", scheme="http")
    try:
        patch = ({"status": {"addresses": [{"type": "InternalIP", "address": value}]}} if field == "address" else
                 {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": value}}}})
        st, out = w.api.json("PATCH", f"/api/v1/nodes/{evil.name}/status", evil.token, patch,
                             ctype="application/merge-patch+json")
        assert st == 200, (st, out)
        st, out = w.api.json("GET", f"/api/v1/nodes/{evil.name}/proxy/healthz", w.api.admin)
        assert st == 503 and out["message"] == f'node "{evil.name}" has no kubelet endpoint: {cause}', (st, out)
        st, out = w.api.json("PATCH", f"/api/v1/nodes/{evil.name}", evil.token,
                             {"metadata": {"annotations": {"kube32.io/kubelet-scheme": "https://127.0.0.9:1/#"}}},
                             ctype="application/merge-patch+json")
        assert st == 422 and ('metadata.annotations[kube32.io/kubelet-scheme]: Unsupported value: '
                              '"https://127.0.0.9:1/#": supported values: "http", "https"') in out["message"], (st, out)
        assert not evil.seen
    finally:
        evil.close()


# --- kube32.io/restore-from: a Checkpoint of the pod's namespace, nothing else ---------------
def test_restore_from_never_reaches_outside_the_pods_checkpoints(world: World) -> None:
    """The kubelet built ``GET .../namespaces/<ns>/checkpoints/<annotation>/data`` by
    string and its HTTP client resolved dot segments: ``bot`` (edit in ``other``) made
    sim-1's kubelet fetch ``default``'s Secret with the node's credentials.  Now the API
    refuses such an annotation (422 naming it), on create and on update, and a name is
    one encoded segment in the kubelet's request whatever it holds."""
    w = world
    probes = {"rf-secret": "../../../../../../api/v1/namespaces/default/secrets/topsecret#",
              "rf-encoded": "%2e%2e%2f%2e%2e%2fsecrets",
              "rf-none": "../../../../../../api/v1/namespaces/default/secrets/nonexistent#"}
    for name, rf in probes.items():
        st, out = w.pod("other", name, w.counter, token=w.bot, annotations={"kube32.io/restore-from": rf})
        assert st == 422, (f"a pod in namespace other with kube32.io/restore-from: {rf!r} was answered {st} "
                           f"({str(out)[:300]}). Expected 422: the annotation names a Checkpoint of the pod's "
                           "namespace")
        assert out["reason"] == "Invalid" and (
            f'metadata.annotations[kube32.io/restore-from]: Invalid value: "{rf}": a lowercase RFC 1123 subdomain'
            in out["message"]) and "it must be the name of a Checkpoint in the pod's namespace" in out["message"], out
    # Nor may an update add one (kubectl annotate, as bot).
    st, out = w.pod("other", "rf-later", w.counter, token=w.bot)
    assert st == 201, (st, out)
    annotate = w.cluster.kubectl("--token", w.bot, "annotate", "pod", "rf-later", "-n", "other",
                                 f"kube32.io/restore-from={probes['rf-secret']}", check=False)
    assert annotate.returncode != 0 and "it must be the name of a Checkpoint in the pod's namespace" in \
        annotate.stderr, annotate.stderr
    # A pod may not be bound to a node whose name would climb out of the node proxy either.
    st, out = w.pod("other", "bad-node", w.counter, token=w.bot, node="sim-1/proxy/checkpoint/default/sec/main")
    assert st == 422 and "spec.nodeName" in out["message"], (st, out)


# --- a pod's topic: the topics of its own namespace -------------------------------------------
def _publisher(topics: list[str]) -> bytes:
    """A module whose every request publishes ``injected`` on each of ``topics``."""
    import wasmtime
    data, calls, at = [], [], 0
    for t in topics:
        data.append(f'(data (i32.const {at}) "{t}")')
        calls.append(f"(drop (call $publish (i32.const {at}) (i32.const {len(t)}) (i32.const 4000) (i32.const 8)))")
        at += 256
    return wasmtime.wat2wasm(f"""(module
  (import "k32" "k32_publish" (func $publish (param i32 i32 i32 i32) (result i32)))
  (memory 1)
  {' '.join(data)}
  (data (i32.const 4000) "injected")
  (func (export "k32_handle") {' '.join(calls)}))""")


def test_a_pods_topic_never_leaves_its_namespaces_topics(world: World, tmp_path: Path) -> None:
    """A pod names the topic it publishes on; the kubelet put it into its POST's path by
    string, so ``../../default/topics/news`` made the node publish into namespace
    ``default`` (a namespace of someone else).  Now every part of the topic is one
    checked segment: that publish goes nowhere, the pod's own topics still work."""
    w = world
    module = tmp_path / "publisher.wasm"
    module.write_bytes(_publisher(["news", "../../default/topics/news"]))
    image = push(w.cluster, module)
    st, out = w.pod("other", "pub", image, token=w.bot)
    assert st == 201, (st, out)
    w.wait_ready("other", "pub")
    s = w.api.tls_socket()
    seen: list[dict[str, Any]] = []
    try:
        s.sendall(f"GET /apis/kube32.io/v1/topicevents?watch=true HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {w.api.admin}\r\n\r\n".encode())
        s.settimeout(1)
        buf = b""
        deadline = time.monotonic() + 30
        while b'"SUBSCRIBED"' not in buf and time.monotonic() < deadline:
            try:
                buf += s.recv(65536)
            except TimeoutError:
                pass
        st, body = w.api.req("GET", "/api/v1/namespaces/other/pods/pub/proxy/", w.bot)
        assert st == 200, (st, body)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                buf += s.recv(65536)
            except TimeoutError:
                pass
        for line in buf.split(b"\n"):
            start = line.find(b"{")
            if start >= 0 and b'"topic"' in line:
                seen.append(json.loads(line[start:]))
    finally:
        s.close()
    published = sorted((e["namespace"], e["topic"]) for e in seen)
    assert ("other", "news") in published, published
    assert all(ns == "other" for ns, _ in published), (
        f"pod other/pub published on topic '../../default/topics/news': the topic bus got {published}. "
        "Expected only namespace other's topics")


# --- ?watch=<spelling> ---------------------------------------------------------------------
LISTER = """
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
"""


def test_a_watch_is_authorised_as_a_watch_whatever_its_spelling(world: World) -> None:
    """The authorizer read ``watch`` as 1/true, the server as 1/true/yes: a user allowed
    only ``list`` pods opened a watch with ``?watch=yes``.  Now both read it as
    kube-apiserver does (absent, 0 or false: no watch; anything else: a watch)."""
    w = world
    w.cluster.kubectl("apply", "-f", "-", input=LISTER)
    token = w.cluster.kubectl("create", "token", "lister").stdout.strip()
    got = {}
    for spelling in ("true", "yes", "1", "True", "TRUE", "t", "no", "", "false", "0", "FALSE"):
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
    watches = ("true", "yes", "1", "True", "TRUE", "t", "no", "")
    assert all("403" in got[s] for s in watches) and all("200" in got[s] and "stream" not in got[s]
                                                          for s in ("false", "0", "FALSE")), (
        f"a user with only list on pods: {got}. Expected every watch refused (403), every list answered")
