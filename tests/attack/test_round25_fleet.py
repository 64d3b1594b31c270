"""Round 25 attack: `kube32-sim fleet` and `kube32-sim up --fleet N` (issue 25).

An outsider's tests of the fleet: N real kubelets in one process, and a control plane
whose cost grows only with its work. Each test's docstring says what it did, what was
expected (quoting the spec, the issue or the docs) and what happened. A test that shows a
real failure fails now.

Design: one control plane with one ordinary worker (`kube32-sim up --workers 1`) for the
module, with a short node-monitor grace period; each test starts the fleets it needs
under its own prefix and address range (so fleets never share a node name by accident)
and stops them. Every data directory is under /tmp/attack25-*. Real processes, kubectl
and HTTP; nothing is mocked.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
COUNTER = REPO / "examples" / "pods" / "counter.wasm"


# ---------------------------------------------------------------- harness


class Cluster:
    """A `kube32-sim up --workers 1` cluster and how to talk to it as admin."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.image = ""

    def start(self) -> None:
        log = open(self.dir.parent / (self.dir.name + ".up.log"), "wb")
        self.proc = subprocess.Popen(
            [str(BIN / "kube32-sim"), "up", "--workers", "1", "--data-dir", str(self.dir),
             "--port", "0", "--node-monitor-grace-period", "20s", "--pod-eviction-timeout", "30s"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env())
        wait_for(lambda: b"cluster ready" in Path(log.name).read_bytes(), 90, "cluster ready")
        self.image = subprocess.run(
            [str(BIN / "kube32-cli"), "image", "push", str(COUNTER)], env=self.env(),
            check=True, capture_output=True, text=True).stdout.strip()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def env(self) -> dict[str, str]:
        return env(KUBECONFIG=str(self.dir / "admin.kubeconfig"))

    @property
    def server(self) -> str:
        return str(kubeconfig(self.dir / "admin.kubeconfig")[0])

    @property
    def token(self) -> str:
        return str(kubeconfig(self.dir / "admin.kubeconfig")[1])

    def ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.dir / "pki" / "ca.crt"))
        ctx.check_hostname = False
        return ctx

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        r = subprocess.run(["kubectl", *args], env=self.env(), capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}")
        return r.stdout + r.stderr

    def get(self, path: str, token: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.server + path, headers={
            "Authorization": f"Bearer {token or self.token}"})
        try:
            with urllib.request.urlopen(req, context=self.ssl(), timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            body = e.read()
            return e.code, json.loads(body) if body.startswith(b"{") else body

    def counter(self, pod: str) -> dict[str, Any]:
        """One request to the counter pod through the API server's pod proxy."""
        status, body = self.get(f"/api/v1/namespaces/default/pods/{pod}/proxy/")
        assert status == 200, (pod, status, body)
        return dict(body)

    def pods(self, **selector: str) -> list[dict[str, Any]]:
        q = "&".join(f"{k}={urllib.parse.quote(v)}" for k, v in selector.items())
        status, body = self.get("/api/v1/namespaces/default/pods" + (f"?{q}" if q else ""))
        assert status == 200, body
        return list(body["items"])

    def node(self, name: str) -> dict[str, Any] | None:
        status, body = self.get(f"/api/v1/nodes/{name}")
        return dict(body) if status == 200 else None

    def ready(self, name: str) -> str:
        n = self.node(name)
        if not n:
            return "absent"
        return next((c["status"] for c in n["status"].get("conditions", [])
                     if c["type"] == "Ready"), "none")

    def make_pod(self, name: str, node: str | None = None, annotations: dict[str, str] | None = None) -> None:
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": self.image}]}
        if node:
            spec["nodeName"] = node
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}
        r = subprocess.run(["kubectl", "apply", "-f", "-"], input=json.dumps(body), env=self.env(),
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    def wait_running(self, pods: list[str], timeout: float = 60) -> None:
        def all_running() -> bool:
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in self.pods()}
            return all(phases.get(p) == "Running" for p in pods)
        wait_for(all_running, timeout, f"pods {pods} Running")

    def delete_pods(self, *names: str) -> None:
        self.kubectl("delete", "pod", "--wait=false", "--ignore-not-found", *names)


class Fleet:
    """One `kube32-sim fleet` process, its stdin open for its one-node commands."""

    def __init__(self, cluster: Cluster, prefix: str, nodes: int, first: str, *extra: str,
                 stdin_devnull: bool = False) -> None:
        self.cluster, self.prefix, self.n, self.first = cluster, prefix, nodes, first
        self.log = Path(tempfile.mkstemp(prefix=f"attack25-{prefix}-", suffix=".log", dir="/tmp")[1])
        self.args = [str(BIN / "kube32-sim"), "fleet", "--kubeconfig",
                     str(cluster.dir / "node.kubeconfig"), "--nodes", str(nodes),
                     "--prefix", prefix, "--first-address", first,
                     "--data-dir", f"/tmp/attack25-fleetdata-{prefix}", "--lease-interval", "5",
                     *extra]
        self.stdin_devnull = stdin_devnull
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> "Fleet":
        self.proc = subprocess.Popen(
            self.args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL if self.stdin_devnull else subprocess.PIPE, env=env())
        if wait:
            wait_for(lambda: b"fleet ready" in self.log.read_bytes() or self.proc.poll() is not None,
                     120, f"fleet {self.prefix} ready")
            assert self.proc.poll() is None, self.text()
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def names(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(1, self.n + 1)]

    def address(self, i: int) -> str:
        return str(ipaddress.ip_address(self.first) + (i - 1))

    def command(self, line: str) -> None:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def delete_nodes(self) -> None:
        self.cluster.kubectl("delete", "node", "--ignore-not-found", "--wait=false", *self.names(),
                             check=False)


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}:{e['PATH']}"
    e.update(extra)
    return e


def kubeconfig(path: Path) -> tuple[str, str]:
    c = yaml.safe_load(path.read_text())
    return c["clusters"][0]["cluster"]["server"], c["users"][0]["user"]["token"]


def wait_for(cond: Any, timeout: float, what: str, every: float = 0.5) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def join_as(cluster: Cluster, name: str, source: str) -> tuple[int, Any]:
    """Join as node `name` from `source` with the bootstrap token, as a kubelet does."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    server, token = kubeconfig(cluster.dir / "node.kubeconfig")
    host, port = server.split("//")[1].split(":")
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{name}"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes")])).add_extension(
        x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(source))]),
        False).sign(key, hashes.SHA256())
    conn = http.client.HTTPSConnection(host, int(port), context=cluster.ssl(),
                                       source_address=(source, 0), timeout=15)
    conn.request("POST", f"/apis/kube32.io/v1/nodecredentials/{name}",
                 body=json.dumps({"csr": csr.public_bytes(serialization.Encoding.PEM).decode()}),
                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    return r.status, json.loads(body) if body.startswith(b"{") else body


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(Path(tempfile.mkdtemp(prefix="attack25-cp-", dir="/tmp")))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def fleets(cluster: Cluster) -> Iterator[list[Fleet]]:
    started: list[Fleet] = []
    yield started
    for f in started:
        f.stop(signal.SIGKILL)
    for f in started:
        f.delete_nodes()


# ---------------------------------------------------------------- findings (fail now)


def test_a_second_fleet_with_the_same_prefix_takes_over_a_running_fleets_nodes(
        cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: start a fleet `dup` of 3 nodes with 1 pod each, give each pod some state (3
    requests), then start a second `kube32-sim fleet` with the same --prefix and
    --first-address (an operator starting the same command twice), then stop the second.

    Expected: the issue: each node a real kubelet "sharing ... nothing that a node must
    own"; fleets.md: "its client: credentials, source address, connections" and "its pods"
    are owned by each node. A second process claiming nodes that already run is refused
    (or at least leaves the running nodes and their pods alone), as the join already
    refuses a name "registered at <address>" from another address.

    Happened: the second fleet joined as dup-1..3 ("fleet ready"), the Node's
    kubeletEndpoint now points at the second process, every pod on those nodes restarted
    from scratch in it (requests back to 1, init_calls 1: state lost without any move or
    checkpoint), and the first fleet's tokens were revoked: it only logs "cannot renew the
    node lease: 401 Unauthorized" forever. When the second fleet stops, the nodes go
    NotReady/Unknown for good (the first fleet never rejoins) and their pods are evicted.
    """
    first = Fleet(cluster, "dup", 3, "127.41.0.1", "--pods-per-node", "1", "--image", cluster.image)
    fleets.append(first.start())
    pods = [f"{n}-1" for n in first.names()]
    cluster.wait_running(pods)
    for p in pods:
        for _ in range(3):
            cluster.counter(p)
    second = Fleet(cluster, "dup", 3, "127.41.0.1")
    second.log = Path(str(first.log) + ".second")
    fleets.append(second.start(wait=False))
    time.sleep(15)
    states = {p: cluster.counter(p) for p in pods}
    first_log = first.text()
    second.stop()
    time.sleep(25)
    ready = {n: cluster.ready(n) for n in first.names()}
    assert b"fleet ready" not in second.log.read_bytes() and all(
        s["requests"] == 4 for s in states.values()), (
        f"the second fleet took the nodes: its log says ready={b'fleet ready' in second.log.read_bytes()}, "
        f"the pods' state after it: {[(p, s['requests'], s['init_calls']) for p, s in states.items()]}, "
        f"first fleet 401s: {first_log.count('401 Unauthorized')}, Ready after the second stopped: {ready}")
    assert all(v == "True" for v in ready.values()), ready


def test_the_scheduler_spreads_new_pods_over_idle_fleet_nodes(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `spr` of 8 idle devkit nodes; created 8 pods with no nodeName and no
    requests, then drained (kubectl drain --force) 2 nodes holding 2 pods each.

    Expected: the issue names "scheduler node scoring" as a part of the control plane that
    must stay cheap at fleet size, i.e. it scores nodes as Kubernetes' does; Kubernetes'
    default scoring (LeastAllocated, with its default non-zero requests for pods without
    requests) spreads pods over equally idle nodes: no node of 8 idle ones should get
    more than a few of 8 new pods.

    Happened: every new pod goes to the same node (the first by name that fits: on the
    shared cluster `devkit`, the control plane's own node, then `fleet-1`): while 29 fleet
    nodes held 2 pods or none, a drain of 10 nodes put 16 of its 20 pods on devkit (its
    16-pod capacity) and the other 4 plus 6 new pods on fleet-1. A fleet's load lands on
    one board until it is full.
    """
    f = Fleet(cluster, "spr", 8, "127.42.0.1")
    fleets.append(f.start())
    # keep the cluster's other nodes out of the picture: only spr-* may take the pods
    others = [n["metadata"]["name"] for n in cluster.get("/api/v1/nodes")[1]["items"]
              if not n["metadata"]["name"].startswith("spr-")]
    cluster.kubectl("cordon", *others)
    try:
        names = [f"spr-pod-{i}" for i in range(8)]
        for p in names:
            cluster.make_pod(p)
        cluster.wait_running(names)
        where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods()
                 if p["metadata"]["name"] in names}
        per_node: dict[str, int] = {}
        for n in where.values():
            per_node[n] = per_node.get(n, 0) + 1
        cluster.delete_pods(*names)
    finally:
        cluster.kubectl("uncordon", *others, check=False)
    assert max(per_node.values()) <= 3, f"8 pods on 8 idle nodes landed {per_node}"


def test_a_fleet_whose_stdin_is_dev_null_logs_a_traceback(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: `kube32-sim fleet --nodes 2 ... < /dev/null` (as under nohup, systemd, a CI
    step or `ssh host cmd &`).

    Expected: reference.md: "Lines on stdin act on one node"; a fleet with no commands
    to read runs quietly, as `worker` does (which reads no stdin).

    Happened: once "fleet ready" is printed, asyncio logs "ERROR Exception in callback
    _UnixReadPipeTransport._add_reader ... PermissionError: [Errno 1] Operation not
    permitted" (a regular file cannot be registered with epoll); the fleet goes on, its
    stdin commands silently gone.
    """
    f = Fleet(cluster, "nul", 2, "127.43.0.1", stdin_devnull=True)
    fleets.append(f.start())
    time.sleep(3)
    assert "Traceback" not in f.text() and " ERROR " not in f.text(), f.text()[-1500:]


# ---------------------------------------------------------------- what held


def test_fleet_nodes_are_real_kubelets_each_on_its_own_address(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `real` of 6 nodes with --pods-per-node 2; looked at every Node, Lease,
    listening socket, pod IP, log and the pod proxy.

    Expected: issue 25: "each a real kubelet of this product (Lease renewals, node
    status, heap and MemoryPressure, its own address 127.x.y.z for its kubelet
    endpoint, pods running on a real engine ...)"; fleets.md: nodes on 127.32.0.1,
    127.32.0.2, ... (`--first-address`).

    Happened: as documented: each Node Ready with InternalIP its own address, a
    MemoryPressure condition and kube32.io/free-heap, its Lease renewed, a kubelet
    listening on its address, its pods Running with that IP, logs and proxy answer.
    """
    f = Fleet(cluster, "real", 6, "127.44.0.1", "--pods-per-node", "2", "--image", cluster.image)
    fleets.append(f.start())
    pods = [f"{n}-{k}" for n in f.names() for k in (1, 2)]
    cluster.wait_running(pods)
    leases_before = {n: cluster.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{n}")[1]["spec"]["renewTime"]
                     for n in f.names()}
    for i, name in enumerate(f.names(), start=1):
        node = cluster.node(name)
        assert node is not None
        ips = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert ips == [f.address(i)], ips
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conds["Ready"] == "True" and conds["MemoryPressure"] == "False", conds
        assert "kube32.io/free-heap" in node["metadata"]["annotations"]
        port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        with socket.create_connection((f.address(i), port), timeout=5):
            pass
    for p in cluster.pods(labelSelector="kube32.io/fleet-node=real-3"):
        assert p["status"]["podIP"] == f.address(3), p["status"]
    assert cluster.counter("real-3-1")["hostname"] == "real-3-1"
    assert "counter: init" in cluster.kubectl("logs", "real-3-1")
    time.sleep(7)
    leases_after = {n: cluster.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{n}")[1]["spec"]["renewTime"]
                    for n in f.names()}
    assert all(leases_after[n] > leases_before[n] for n in f.names()), (leases_before, leases_after)
    cluster.delete_pods(*pods)


def test_a_pod_moves_fleet_to_fleet_to_worker_to_fleet_with_its_state(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a counter pod on a fleet node, 3 requests, then `kube32-cli move` to another
    fleet node, to the ordinary worker sim-1, back to a fleet node (a request between
    each).

    Expected: fleets.md: "A pod moves between a fleet node and an ordinary worker, in
    both directions, with its state."

    Happened: as documented: requests go on counting (4, 5, 6), restored_calls 1, 2, 3,
    init_calls stays 1; each move ~20 ms from the freeze.
    """
    f = Fleet(cluster, "mov", 3, "127.45.0.1", "--pods-per-node", "1", "--image", cluster.image)
    fleets.append(f.start())
    cluster.wait_running(["mov-1-1"])
    for _ in range(3):
        cluster.counter("mov-1-1")
    for k, target in enumerate(["mov-2", "sim-1", "mov-3"], start=1):
        out = subprocess.run([str(BIN / "kube32-cli"), "move", "mov-1-1", "--to", target],
                             env=cluster.env(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        s = cluster.counter("mov-1-1")
        assert (s["requests"], s["restored_calls"], s["init_calls"]) == (3 + k, k, 1), (target, s)
    cluster.delete_pods("mov-1-1", "mov-2-1", "mov-3-1")


def test_one_fleet_nodes_identity_reaches_nothing_of_another_fleet_node(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: joined as node `evilnode` with the bootstrap token (a board's credentials),
    then, with its token: get/log/proxy/evict/status-patch a fleet node's pod, list
    pods with field selectors that name both nodes (both orders, repeated fieldSelector,
    `!=` tricks, a label selector of the other node), get/patch the other node's Lease,
    patch its Node status, create a Node of another name, renew the other node's
    credentials, list Checkpoints moving to it, impersonate it, and the other node's
    kubelet endpoint asked (as admin, through nodes/proxy) for a pod of a third node.

    Expected: security.md, the node authorizer: "pods: get / delete / status ... of pods
    with spec.nodeName=<n> only; list and watch only with fieldSelector=spec.nodeName=<n>";
    "leases: only kube-node-lease/<n>"; "a node's own token only its own" credentials.

    Happened: every one 403 or an empty list; the kubelet endpoint answers 404 "not
    running on node".
    """
    f = Fleet(cluster, "auth", 3, "127.46.0.1", "--pods-per-node", "1", "--image", cluster.image)
    fleets.append(f.start())
    cluster.wait_running(["auth-2-1", "auth-3-1"])
    status, cred = join_as(cluster, "evilnode", "127.46.1.1")
    assert status == 201, cred
    tok = cred["token"]
    for path in ["/api/v1/namespaces/default/pods/auth-2-1",
                 "/api/v1/namespaces/default/pods/auth-2-1/log",
                 "/api/v1/namespaces/default/pods/auth-2-1/proxy/",
                 "/api/v1/namespaces/kube-node-lease/leases/auth-2",
                 "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/auth-2",
                 "/apis/kube32.io/v1/checkpoints?fieldSelector=status.targetNode%3Dauth-2",
                 "/api/v1/pods?fieldSelector=spec.nodeName%3Dauth-2",
                 "/api/v1/nodes/auth-2/proxy/healthz"]:
        s, body = cluster.get(path, tok)
        assert s == 403, (path, s, body)
    for q in ["spec.nodeName%3Devilnode,spec.nodeName%3Dauth-2",
              "spec.nodeName%3Dauth-2,spec.nodeName%3Devilnode",
              "spec.nodeName%3Devilnode&fieldSelector=spec.nodeName%3Dauth-2",
              "spec.nodeName!%3Dauth-2,spec.nodeName%3Devilnode",
              "spec.nodeName%3Devilnode&labelSelector=kube32.io/fleet-node%3Dauth-2"]:
        s, body = cluster.get(f"/api/v1/pods?fieldSelector={q}", tok)
        assert s == 403 or (s == 200 and body["items"] == []), (q, s, body)
    writes = [("PATCH", "/api/v1/nodes/auth-2/status", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
              ("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "auth-99"}}),
              ("POST", "/api/v1/namespaces/default/pods/auth-2-1/eviction",
               {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "auth-2-1"}}),
              ("POST", "/apis/kube32.io/v1/nodecredentials/auth-2", {"csr": "x"}),
              ("PATCH", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/auth-2",
               {"spec": {"holderIdentity": "evilnode"}}),
              ("PATCH", "/api/v1/namespaces/default/pods/auth-2-1/status", {"status": {"phase": "Failed"}})]
    for method, path, body in writes:
        req = urllib.request.Request(cluster.server + path, method=method, data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {tok}", "Content-Type":
                                              "application/merge-patch+json" if method == "PATCH" else "application/json"})
        try:
            urllib.request.urlopen(req, context=cluster.ssl(), timeout=15)
            raise AssertionError(f"{method} {path} was allowed to evilnode")
        except urllib.error.HTTPError as e:
            assert e.code == 403, (method, path, e.code, e.read())
    req = urllib.request.Request(cluster.server + "/api/v1/namespaces/default/pods/auth-2-1", headers={
        "Authorization": f"Bearer {tok}", "Impersonate-User": "system:node:auth-2", "Impersonate-Group": "system:nodes"})
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(req, context=cluster.ssl(), timeout=15)
    assert denied.value.code == 403
    s, body = cluster.get("/api/v1/nodes/auth-2/proxy/pods/default/auth-3-1/http/")
    assert s == 404, (s, body)
    cluster.kubectl("delete", "node", "evilnode", "--ignore-not-found", check=False)
    cluster.delete_pods("auth-1-1", "auth-2-1", "auth-3-1")


def test_a_watch_by_node_name_sees_only_that_nodes_pods_with_bookmarks(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `wat` of 4 nodes, 2 pods each; a client's watch of pods with
    fieldSelector=spec.nodeName=wat-2&allowWatchBookmarks=true; annotated a pod of wat-3
    and one of wat-2, then moved wat-2-2 to wat-4.

    Expected: issue 25: "watch fan-out by selector"; Kubernetes: a watch by
    spec.nodeName sees only that node's pods, a pod leaving the node is DELETED for it,
    and BOOKMARK events come when asked for.

    Happened: as expected: ADDED wat-2-1, wat-2-2, MODIFIED wat-2-1, DELETED wat-2-2 (the
    move), a BOOKMARK; nothing of wat-3.
    """
    f = Fleet(cluster, "wat", 4, "127.47.0.1", "--pods-per-node", "2", "--image", cluster.image)
    fleets.append(f.start())
    pods = [f"{n}-{k}" for n in f.names() for k in (1, 2)]
    cluster.wait_running(pods)
    events: list[dict[str, Any]] = []

    def watch() -> None:
        req = urllib.request.Request(
            cluster.server + "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dwat-2"
            "&allowWatchBookmarks=true&timeoutSeconds=12", headers={"Authorization": f"Bearer {cluster.token}"})
        with urllib.request.urlopen(req, context=cluster.ssl(), timeout=30) as r:
            for line in r:
                events.append(json.loads(line))
    t = threading.Thread(target=watch)
    t.start()
    time.sleep(1.5)
    cluster.kubectl("annotate", "pod", "wat-3-1", "poke=1", "--overwrite")
    cluster.kubectl("annotate", "pod", "wat-2-1", "poke=1", "--overwrite")
    out = subprocess.run([str(BIN / "kube32-cli"), "move", "wat-2-2", "--to", "wat-4"], env=cluster.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    t.join(30)
    seen = [(e["type"], e["object"].get("metadata", {}).get("name")) for e in events]
    nodes = {e["object"]["spec"]["nodeName"] for e in events if e["type"] != "BOOKMARK"}
    assert nodes == {"wat-2"}, seen
    assert ("MODIFIED", "wat-2-1") in seen and ("DELETED", "wat-2-2") in seen, seen
    assert any(t == "BOOKMARK" for t, _ in seen), seen
    cluster.delete_pods(*pods)


def test_many_fleet_nodes_drained_at_once_keep_every_pods_state(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `drn` of 12 nodes, 2 pods each, 2 requests to each pod; `kubectl drain
    --force` of 6 nodes in one command, and at the same time Eviction-API POSTs (20 in
    parallel threads) for every pod of 3 more nodes.

    Expected: issue 25: "a drain of 50 nodes (500 pods) through the Eviction API, all
    state kept"; fleets.md: "a movable pod moves with its state".

    Happened: as expected: every pod of the 9 nodes runs elsewhere with requests 3,
    restored_calls 1 (kubectl drain of 6 nodes ~7 s).
    """
    f = Fleet(cluster, "drn", 12, "127.48.0.1", "--pods-per-node", "2", "--image", cluster.image)
    fleets.append(f.start())
    pods = [f"{n}-{k}" for n in f.names() for k in (1, 2)]
    cluster.wait_running(pods)
    for p in pods:
        cluster.counter(p)
        cluster.counter(p)
    kubectl_nodes = [f"drn-{i}" for i in range(1, 7)]
    api_nodes = [f"drn-{i}" for i in range(7, 10)]
    cluster.kubectl("cordon", *api_nodes)
    errors: list[str] = []

    def evict(pod: str) -> None:
        body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}).encode()
        for _ in range(30):
            req = urllib.request.Request(cluster.server + f"/api/v1/namespaces/default/pods/{pod}/eviction",
                                         method="POST", data=body, headers={
                                             "Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, context=cluster.ssl(), timeout=30)
                return
            except urllib.error.HTTPError as e:
                if e.code != 429:
                    errors.append(f"{pod}: {e.code} {e.read()[:200]!r}")
                    return
                time.sleep(1)
        errors.append(f"{pod}: still 429")
    threads = [threading.Thread(target=evict, args=(f"{n}-{k}",)) for n in api_nodes for k in (1, 2)]
    for t in threads:
        t.start()
    drain = cluster.kubectl("drain", "--force", "--timeout=120s", *kubectl_nodes, timeout=150)
    for t in threads:
        t.join(60)
    assert not errors, errors
    moved = [f"{n}-{k}" for n in kubectl_nodes + api_nodes for k in (1, 2)]

    def all_moved() -> bool:
        where = {p["metadata"]["name"]: (p["spec"].get("nodeName"), p["status"].get("phase")) for p in cluster.pods()}
        return all(p in where and where[p][0] not in kubectl_nodes + api_nodes and where[p][1] == "Running"
                   for p in moved)
    wait_for(all_moved, 60, "every drained pod running elsewhere")
    lost = {}
    for p in moved:
        s = cluster.counter(p)
        if (s["requests"], s["restored_calls"], s["init_calls"]) != (3, 1, 1):
            lost[p] = s
    assert not lost, (lost, drain[-500:])
    cluster.kubectl("uncordon", *kubectl_nodes, *api_nodes, check=False)
    cluster.delete_pods(*pods)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def control_plane_pid(cluster: Cluster) -> int:
    out = subprocess.run(["pgrep", "-f", f"control-plane --data-dir {cluster.dir} "], capture_output=True,
                         text=True).stdout.split()
    return int(out[0])


def test_hostile_clients_holding_unread_watches_do_not_stall_the_fleets_leases(
        cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `hos` of 20 nodes (Lease every 5 s, grace 20 s); 200 TLS watches of
    every pod that never read a byte (4 KiB receive buffers), while a client patched a
    20 KB annotation onto pods as fast as it could for 40 s; counted NotReady nodes every
    5 s, then closed the watches and compared the control plane's RSS.

    Expected: issue 25: "watch delivery p99 under 100 ms"; nothing a slow client does may
    stop the Lease handling (a node whose Lease is not renewed for 20 s turns Unknown).

    Happened: no node left Ready; every patch answered within 1 s; the control plane's
    RSS grew (see the assertion message) but stayed bounded.
    """
    f = Fleet(cluster, "hos", 20, "127.49.0.1", "--pods-per-node", "1", "--image", cluster.image)
    fleets.append(f.start())
    pods = [f"{n}-1" for n in f.names()]
    cluster.wait_running(pods)
    cp = control_plane_pid(cluster)
    rss_before = rss_mib(cp)
    host, port = cluster.server.split("//")[1].split(":")
    socks = []
    for _ in range(200):
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s = cluster.ssl().wrap_socket(s)
        s.sendall(f"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {cluster.token}\r\n\r\n".encode())
        socks.append(s)
    stop = time.monotonic() + 40
    slow = patches = 0
    not_ready: list[int] = []
    next_check = time.monotonic()
    try:
        while time.monotonic() < stop:
            p = pods[patches % len(pods)]
            a = time.monotonic()
            req = urllib.request.Request(cluster.server + f"/api/v1/namespaces/default/pods/{p}", method="PATCH",
                                         data=json.dumps({"metadata": {"annotations": {"churn": "x" * 20000 + str(patches)}}}).encode(),
                                         headers={"Authorization": f"Bearer {cluster.token}",
                                                  "Content-Type": "application/merge-patch+json"})
            urllib.request.urlopen(req, context=cluster.ssl(), timeout=30).read()
            patches += 1
            slow += time.monotonic() - a > 1
            if time.monotonic() >= next_check:
                not_ready.append(sum(cluster.ready(n) != "True" for n in f.names()))
                next_check += 5
        rss_during = rss_mib(cp)
    finally:
        for s in socks:
            s.close()
    time.sleep(5)
    rss_after = rss_mib(cp)
    assert max(not_ready) == 0 and slow == 0, (not_ready, slow, patches)
    assert rss_after - rss_before < 300, (rss_before, rss_during, rss_after, patches)
    cluster.delete_pods(*pods)


def test_a_fleet_killed_or_stopped_and_started_again_takes_its_nodes_back(
        cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `rst` of 10 nodes with --pods-per-node 1; SIGTERM; started the same
    command again; SIGKILL; started it again; each time counted the Nodes, their Ready
    condition and the pods.

    Expected: fleets.md: "Ctrl-C or SIGTERM stops every node without a drain: each Node
    is marked NotReady"; `start NAME` / a worker started again "joins again under the
    same name and address"; the --pods-per-node pods are not made twice.

    Happened: as expected: after SIGTERM all 10 NotReady at once; each restart 10 Ready
    nodes, no duplicates, 10 pods Running (the pods that existed start afresh on their
    node: no checkpoint was asked for).
    """
    args = ("--pods-per-node", "1", "--image", cluster.image)
    f = Fleet(cluster, "rst", 10, "127.50.0.1", *args)
    fleets.append(f.start())
    pods = [f"{n}-1" for n in f.names()]
    cluster.wait_running(pods)
    f.stop(signal.SIGTERM)
    assert {cluster.ready(n) for n in f.names()} == {"False"}, [cluster.ready(n) for n in f.names()]
    for sig in (signal.SIGKILL, None):
        g = Fleet(cluster, "rst", 10, "127.50.0.1", *args)
        fleets.append(g.start())
        wait_for(lambda: all(cluster.ready(n) == "True" for n in f.names()), 60, "rst nodes Ready again")
        cluster.wait_running(pods)
        rst_nodes = [n["metadata"]["name"] for n in cluster.get("/api/v1/nodes")[1]["items"]
                     if n["metadata"]["name"].startswith("rst-")]
        assert sorted(rst_nodes) == sorted(f.names()), rst_nodes
        rst_pods = [p["metadata"]["name"] for p in cluster.pods() if p["metadata"]["name"].startswith("rst-")]
        assert sorted(rst_pods) == sorted(pods), rst_pods
        if sig:
            g.stop(sig)
    cluster.delete_pods(*pods)


def test_one_node_killed_and_started_from_the_fleets_stdin(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `one` of 4 nodes; a pod with kube32.io/checkpoint-interval "10s" on
    one-2 with 5 requests; after a periodic checkpoint, `kill one-2` on the fleet's
    stdin; waited for the restore; then `start one-2`.

    Expected: fleets.md: "`kill NAME` ... its Lease goes stale, the node lifecycle marks
    it Unknown and evicts its pods"; the spec: a lost node's pod "comes back on another
    node" from its periodic checkpoint; "`start NAME` ... joins again under the same
    name and address".

    Happened: as expected: one-2 Unknown after the grace period, the pod restored on
    another node with its checkpointed state (restored_calls 1), and one-2 Ready again
    after `start`.
    """
    f = Fleet(cluster, "one", 4, "127.51.0.1")
    fleets.append(f.start())
    cluster.make_pod("keeper25", node="one-2", annotations={"kube32.io/checkpoint-interval": "10s"})
    cluster.wait_running(["keeper25"])
    for _ in range(5):
        cluster.counter("keeper25")

    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))

    def saved() -> bool:
        # a periodic checkpoint begun after the 5 requests (the first one may predate them)
        s, body = cluster.get("/apis/kube32.io/v1/namespaces/default/checkpoints")
        return any(c["metadata"]["name"].startswith("keeper25")
                   and c["metadata"]["creationTimestamp"] > after
                   and c.get("status", {}).get("phase") == "Saved" for c in body.get("items", []))
    wait_for(saved, 40, "a periodic checkpoint of keeper25")
    f.command("kill one-2")
    wait_for(lambda: cluster.ready("one-2") == "Unknown", 60, "one-2 Unknown")

    def restored() -> bool:
        p = [p for p in cluster.pods() if p["metadata"]["name"] == "keeper25"]
        return bool(p) and p[0]["spec"].get("nodeName") not in (None, "one-2") and p[0]["status"].get("phase") == "Running"
    wait_for(restored, 90, "keeper25 restored elsewhere")
    s = cluster.counter("keeper25")
    assert s["restored_calls"] == 1 and s["requests"] >= 6 and s["init_calls"] == 1, s
    f.command("start one-2")
    wait_for(lambda: cluster.ready("one-2") == "True", 60, "one-2 Ready after start")
    cluster.delete_pods("keeper25")
    cluster.kubectl("delete", "checkpoints", "-l", "kube32.io/trigger=periodic", "--wait=false", check=False)


def test_fleet_flags_at_their_bounds_are_refused(cluster: Cluster) -> None:
    """Did: `kube32-sim fleet` with --nodes 0, -1, 10001; --prefix sim, devkit,
    Bad_Prefix, a 60-character prefix; --first-address ::1, 127.255.255.254 (2 nodes do
    not fit), 10.0.0.1 (outside 127/8); --joins-at-once 0; --pods-per-node -1.

    Expected: reference.md: "--nodes N: how many nodes (1 to 10000; required)",
    "--prefix P ... (not sim or devkit)", "--first-address IP ... within its /8": each
    refused, the process ending non-zero, nothing left joined.

    Happened: every one ends with status 1 and a message. The invalid prefixes and
    10.0.0.1 are not refused up front: each node tries to join and fails ("not a valid
    node name"; the CSR library's "Attribute's length must be >= 1 and <= 64, but it was
    74" for a 60-character prefix, whose names are valid node names; "cannot assign
    requested address" for 10.0.0.1), then "no node joined".
    """
    bad = [["--nodes", "0"], ["--nodes", "-1"], ["--nodes", "10001"],
           ["--nodes", "2", "--prefix", "sim"], ["--nodes", "2", "--prefix", "devkit"],
           ["--nodes", "2", "--prefix", "Bad_Prefix"], ["--nodes", "2", "--prefix", "a" * 60],
           ["--nodes", "2", "--first-address", "::1"], ["--nodes", "2", "--first-address", "127.255.255.254"],
           ["--nodes", "2", "--first-address", "10.0.0.1"], ["--nodes", "2", "--joins-at-once", "0"],
           ["--nodes", "2", "--pods-per-node", "-1"]]
    for extra in bad:
        r = subprocess.run([str(BIN / "kube32-sim"), "fleet", "--kubeconfig", str(cluster.dir / "node.kubeconfig"),
                            "--data-dir", "/tmp/attack25-fleetdata-bounds", *extra], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60, env=env())
        assert r.returncode != 0, (extra, r.stdout[-500:], r.stderr[-500:])
    names = [n["metadata"]["name"] for n in cluster.get("/api/v1/nodes")[1]["items"]]
    assert not [n for n in names if n.startswith(("Bad", "aaaa"))], names


def test_up_with_a_fleet_logs_a_traceback_in_its_fleet_log(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Did: `kube32-sim up --fleet 3 --workers 0`, the documented way to get a cluster with a
    fleet; read DIR/logs/fleet.log once `cluster ready`; Ctrl-C.

    Expected: reference.md: "`--fleet N` also a fleet of N boards in one process ...
    Log: DIR/logs/fleet.log"; a log of a healthy start holds no ERROR.

    Happened: fleet.log holds "asyncio ERROR Exception in callback
    _UnixReadPipeTransport._add_reader ... PermissionError: [Errno 1] Operation not
    permitted", twice a traceback: `up` gives the fleet /dev/null as stdin, which the
    fleet tries to watch for its one-node commands. The cluster works, and Ctrl-C stops
    it cleanly.
    """
    d = Path(tempfile.mkdtemp(prefix="attack25-upfleet-", dir="/tmp"))
    log = d.parent / (d.name + ".log")
    proc = subprocess.Popen([str(BIN / "kube32-sim"), "up", "--workers", "0", "--fleet", "3", "--data-dir", str(d),
                             "--port", "0"], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env())
    try:
        wait_for(lambda: b"cluster ready" in log.read_bytes(), 120, "cluster ready")
        time.sleep(3)
        fleet_log = (d / "logs" / "fleet.log").read_text(errors="replace")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode is not None
    assert " ERROR " not in fleet_log and "Traceback" not in fleet_log, fleet_log[-1200:]


def timed(cluster: Cluster, paths: list[str], n: int) -> list[float]:
    """The median time of each path's GET, the paths interleaved so load hits them alike."""
    out: list[list[float]] = [[] for _ in paths]
    for _ in range(n):
        for i, path in enumerate(paths):
            a = time.perf_counter()
            s, _ = cluster.get(path)
            out[i].append((time.perf_counter() - a) * 1000)
            assert s == 200
    return [sorted(o)[n // 2] for o in out]


def test_a_list_of_one_nodes_pods_costs_what_that_node_holds_not_the_fleet(
        cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `cst` of 30 nodes, 1 pod each; median of 15 lists of
    `pods?fieldSelector=spec.nodeName=cst-1` (1 pod) and of all pods; then a second fleet
    `cs2` of 30 nodes with 10 pods each (300 more pods, cst-1 still holds 1) and the same
    lists again. Also the delivery of 60 merge patches to a watch of the namespace's pods.

    Expected: issue 25: "nothing in it may be O(nodes) or O(pods) per event where
    Kubernetes is O(1)"; fleets.md: "node lifecycle reads a lost node's pods by index";
    Kubernetes' watch cache answers a spec.nodeName list from its index; benchmarks.md
    (100 nodes) "list all / by node 138 / 58 ms", "watch p50 / p99 6 / 24 ms" and the
    issue's goal "watch delivery p99 under 100 ms".

    Happened (load average 5.8 on 2 cores, indicative): interleaved medians of 21: at 30
    pods by node 24 ms, all 28 ms; at 330 pods by node 87 ms, all 78 ms: the list of one
    node's single pod costs as much as the list of every pod and grows with the cluster
    (3.6x for 11x pods): a scan, not an index (benchmarks.md's own rows grow n^1.5).
    A full-file run at load 0.8: by node 14.7 -> 78.0 ms, all 16.4 -> 72.7 ms, watch
    p50/p99 14.8/41.4 ms (within the goal; 30/114 and 24/147 ms at load 5.8).
    """
    f = Fleet(cluster, "cst", 30, "127.52.0.1", "--pods-per-node", "1", "--image", cluster.image)
    fleets.append(f.start())
    cluster.wait_running([f"{n}-1" for n in f.names()], 120)
    by_node = "/api/v1/pods?fieldSelector=spec.nodeName%3Dcst-1"
    small_node, small_all = timed(cluster, [by_node, "/api/v1/pods"], 21)
    g = Fleet(cluster, "cs2", 30, "127.53.0.1", "--pods-per-node", "10", "--image", cluster.image)
    fleets.append(g.start())
    wait_for(lambda: sum(p.get("status", {}).get("phase") == "Running" for p in cluster.pods()) >= 320, 240,
             "330 pods Running")
    time.sleep(20)
    big_node, big_all = timed(cluster, [by_node, "/api/v1/pods"], 21)
    # watch delivery at rest: a patch's send to its event
    got: dict[str, float] = {}
    sent: dict[str, float] = {}

    def watch() -> None:
        req = urllib.request.Request(cluster.server + "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=40"
                                     "&labelSelector=kube32.io/fleet-node%3Dcst-5",
                                     headers={"Authorization": f"Bearer {cluster.token}"})
        with urllib.request.urlopen(req, context=cluster.ssl(), timeout=60) as r:
            for line in r:
                e = json.loads(line)
                v = e["object"]["metadata"].get("annotations", {}).get("seq")
                if v and v not in got:
                    got[v] = time.perf_counter()
                if len(got) >= 60:
                    return
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(2)
    for i in range(60):
        body = json.dumps({"metadata": {"annotations": {"seq": str(i)}}}).encode()
        req = urllib.request.Request(cluster.server + "/api/v1/namespaces/default/pods/cst-5-1", method="PATCH",
                                     data=body, headers={"Authorization": f"Bearer {cluster.token}",
                                                         "Content-Type": "application/merge-patch+json"})
        sent[str(i)] = time.perf_counter()
        urllib.request.urlopen(req, context=cluster.ssl(), timeout=30).read()
        time.sleep(0.1)
    t.join(20)
    lat = sorted((got[k] - sent[k]) * 1000 for k in sent if k in got)
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    facts = (f"30 pods: by node {small_node:.1f} ms, all {small_all:.1f} ms; 330 pods: by node {big_node:.1f} ms, "
             f"all {big_all:.1f} ms; watch p50/p99 {p50:.1f}/{p99:.1f} ms over {len(lat)} of 60; "
             f"load {os.getloadavg()[0]:.2f}")
    print(facts)
    assert big_node < 2.5 * small_node and big_node < 0.5 * big_all, facts
    assert len(lat) == 60 and p99 < 100, facts


def test_a_fleet_killed_while_it_drains_into_itself_loses_no_pod(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `kmv` of 8 nodes, 2 pods each (every other node cordoned, so the pods
    of kmv-1..4 can only move to kmv-5..8 in the same process); `kubectl drain --force`
    of kmv-1..4 and a SIGKILL of the fleet 1.5 s into it (source and target of every
    move die together); the same fleet started again at once.

    Expected: moving-pods.md: "The replacement does not run within 60 s (the target
    hangs, or is lost) ... when the source is not Ready then, the scheduler binds the pod
    and it restores there"; issue 25: "all state kept", "nothing lost". At least: every
    pod exists once and runs again, no Checkpoint is left Saving or Moving, and a pod
    whose move had frozen it keeps its state.

    Happened: held: every pod back once, Running, no move left under way.
    """
    args = ("--pods-per-node", "2", "--image", cluster.image)
    f = Fleet(cluster, "kmv", 8, "127.54.0.1", *args)
    fleets.append(f.start())
    pods = [f"{n}-{k}" for n in f.names() for k in (1, 2)]
    cluster.wait_running(pods)
    for p in pods:
        cluster.counter(p)
    others = [n["metadata"]["name"] for n in cluster.get("/api/v1/nodes")[1]["items"]
              if not n["metadata"]["name"].startswith("kmv-")]
    cluster.kubectl("cordon", *others)
    try:
        drain = subprocess.Popen(["kubectl", "drain", "--force", "--timeout=100s", *f.names()[:4]],
                                 env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.5)
        f.stop(signal.SIGKILL)
        g = Fleet(cluster, "kmv", 8, "127.54.0.1", *args)
        fleets.append(g.start())
        out = drain.communicate(timeout=150)[0].decode(errors="replace")

        def settled() -> bool:
            s, body = cluster.get("/apis/kube32.io/v1/namespaces/default/checkpoints")
            busy = [c for c in body.get("items", []) if c["metadata"]["name"].startswith("kmv-")
                    and c.get("status", {}).get("phase") in ("Pending", "Saving", "Moving")]
            return not busy
        wait_for(settled, 120, "no kmv move under way")
        time.sleep(5)
        live = {p["metadata"]["name"]: (p["spec"].get("nodeName"), p["status"].get("phase")) for p in cluster.pods()
                if p["metadata"]["name"].startswith("kmv-")}
        s, body = cluster.get("/apis/kube32.io/v1/namespaces/default/checkpoints")
        ckpts = {c["spec"].get("podName", c["metadata"]["name"]): (c.get("status", {}).get("phase"),
                                                                     c.get("status", {}).get("message", "")[:120])
                 for c in body.get("items", []) if c["metadata"]["name"].startswith("kmv-")}
        missing = [p for p in pods if p not in live or live[p][1] != "Running"]
        assert not missing, (missing, live, ckpts, out[-800:])
    finally:
        cluster.kubectl("uncordon", *others, check=False)
        cluster.kubectl("uncordon", *f.names(), check=False)
    cluster.delete_pods(*pods)


def post(cluster: Cluster, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(cluster.server + path, method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        with urllib.request.urlopen(req, context=cluster.ssl(), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_memory_pressure_is_each_fleet_nodes_own(cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `mem` of 3 nodes with --heap 1004Ki (free heap then 64 KiB pages plus under 24 KiB) --status-interval 2, one counter pod
    each; grew the linear memory of mem-2's pod (POST /alloc?kb=64 until refused or the
    node's kube32.io/free-heap fell under 24 KiB).

    Expected: fleets.md: each node owns "its pods, their threads and their heap
    accounting"; reference.md: "below 24 KiB the node reports MemoryPressure and is
    tainted node.kubernetes.io/memory-pressure:NoSchedule". So mem-2 alone.

    Happened: held: mem-2 alone reports MemoryPressure and the taint; mem-1 and mem-3
    keep their free heap to the byte.
    """
    f = Fleet(cluster, "mem", 3, "127.55.0.1", "--heap", "1004Ki", "--status-interval", "2",
              "--pods-per-node", "1", "--image", cluster.image)
    fleets.append(f.start())
    cluster.wait_running([f"{n}-1" for n in f.names()])
    time.sleep(4)

    def heap(n: str) -> int:
        node = cluster.node(n)
        assert node
        return int(node["metadata"]["annotations"]["kube32.io/free-heap"])
    before = {n: heap(n) for n in f.names()}
    for _ in range(40):
        s, body = post(cluster, "/api/v1/namespaces/default/pods/mem-2-1/proxy/alloc?kb=64")
        if s != 200:
            break
        time.sleep(0.3)
        if heap("mem-2") < 24 * 1024:
            break
    time.sleep(5)
    after = {n: heap(n) for n in f.names()}
    conds = {n: {c["type"]: c["status"] for c in (cluster.node(n) or {})["status"]["conditions"]}["MemoryPressure"]
             for n in f.names()}
    taints = {n: [t["key"] for t in (cluster.node(n) or {})["spec"].get("taints", [])] for n in f.names()}
    facts = (before, after, conds, taints)
    assert conds == {"mem-1": "False", "mem-2": "True", "mem-3": "False"}, facts
    assert "node.kubernetes.io/memory-pressure" in taints["mem-2"], facts
    assert abs(after["mem-1"] - before["mem-1"]) < 8192 and abs(after["mem-3"] - before["mem-3"]) < 8192, facts
    cluster.delete_pods(*[f"{n}-1" for n in f.names()])


def test_one_node_drained_from_the_fleets_stdin_moves_its_pods_with_state(
        cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: a fleet `sdr` of 4 nodes, 2 pods each, 2 requests each; `drain sdr-1` on the
    fleet's stdin; then `start sdr-1`.

    Expected: fleets.md: "`drain NAME` ... it cordons itself and evicts its pods (a
    movable pod moves with its state), then stops, NotReady"; "`start NAME` ... joins
    again under the same name and address and undoes its own drain".

    Happened: held: both pods elsewhere with requests 3, restored_calls 1; sdr-1
    NotReady, then Ready and schedulable after `start`.
    """
    f = Fleet(cluster, "sdr", 4, "127.56.0.1", "--pods-per-node", "2", "--image", cluster.image)
    fleets.append(f.start())
    pods = [f"{n}-{k}" for n in f.names() for k in (1, 2)]
    cluster.wait_running(pods)
    for p in ("sdr-1-1", "sdr-1-2"):
        cluster.counter(p)
        cluster.counter(p)
    f.command("drain sdr-1")
    wait_for(lambda: cluster.ready("sdr-1") == "False", 60, "sdr-1 NotReady after its drain")
    where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods()}
    states = {p: cluster.counter(p) for p in ("sdr-1-1", "sdr-1-2")}
    assert all(where.get(p) not in (None, "sdr-1") for p in states), where
    assert all((s["requests"], s["restored_calls"]) == (3, 1) for s in states.values()), states
    f.command("start sdr-1")
    wait_for(lambda: cluster.ready("sdr-1") == "True", 60, "sdr-1 Ready after start")
    node = cluster.node("sdr-1") or {}
    assert not node["spec"].get("unschedulable"), node["spec"]
    cluster.delete_pods(*pods)


def test_a_fleet_node_whose_token_was_replaced_recovers_as_a_worker_does(
        cluster: Cluster, fleets: list[Fleet]) -> None:
    """Did: an ordinary `kube32-sim worker --name w25` on 127.57.0.1 and a fleet `tok` of 2
    nodes; joined again (bootstrap token, CSR) as w25 from 127.57.0.1 and as tok-1 from
    127.58.0.1, which revokes each one's token; waited 35 s (grace 20 s).

    Expected: reference.md: a fleet node is "a real kubelet as `worker` runs it";
    security.md: "Joining again ... replaces (revokes) the node's previous token". A
    fleet node does what a worker does when its token is revoked under it.

    Happened: the same for both (so the test passes): neither rejoins; w25 and tok-1
    stay Ready=Unknown for good, each logging "401 Unauthorized" on every Lease renewal
    (tok-2 stays Ready). Not a fleet bug, but it is how the fleet takeover above ends,
    and a board holding the bootstrap token on a node's address takes that node offline
    for good.
    """
    wlog = Path(tempfile.mkstemp(prefix="attack25-w25-", suffix=".log", dir="/tmp")[1])
    worker = subprocess.Popen([str(BIN / "kube32-sim"), "worker", "--kubeconfig", str(cluster.dir / "node.kubeconfig"),
                               "--name", "w25", "--address", "127.57.0.1", "--profile", "devkit",
                               "--lease-interval", "5", "--data-dir", "/tmp/attack25-w25"],
                              stdout=open(wlog, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env())
    try:
        f = Fleet(cluster, "tok", 2, "127.58.0.1")
        fleets.append(f.start())
        wait_for(lambda: cluster.ready("w25") == "True", 90, "w25 Ready")
        for name, addr in (("w25", "127.57.0.1"), ("tok-1", "127.58.0.1")):
            status, body = join_as(cluster, name, addr)
            assert status == 201, body
        time.sleep(35)
        ready = {n: cluster.ready(n) for n in ("w25", "tok-1", "tok-2")}
        facts = (ready, "worker 401s:", wlog.read_text(errors="replace").count("401"),
                 "fleet 401s:", f.text().count("401"))
        print(facts)
        assert ready["tok-1"] == ready["w25"], facts
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        cluster.kubectl("delete", "node", "w25", "--ignore-not-found", check=False)
