"""NodePorts against an attacker (issue 19, attack round 19): a real cluster (``kube32-sim
up``, nodes devkit, sim-1 and sim-2, each on its own loopback address), a victim Service
in ``default`` and a ServiceAccount ``bot`` with ``edit`` in namespace ``other`` only.

Every node answers a NodePort Service on its address at the Service's nodePort, so a
nodePort is the whole cluster's: Kube32 allocates them cluster-wide in the store, as
kube-apiserver's allocator does.  Before, ``bot`` could create a Service with the
victim's nodePort (every node then forwarded ``default``'s clients, headers and bodies,
to bot's pod), or claim any port of every node's address (the API server's, 80, 10250).
Moved from tests/attack/test_attack19.py.
"""
from __future__ import annotations

import json
import random
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import push

pytestmark = pytest.mark.e2e

NODE_IPS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
ALLOCATED = "provided port is already allocated"
OUT_OF_RANGE = "provided port is not in the valid range. The range of valid ports is 30000-32767"

SETUP = """
apiVersion: v1
kind: Namespace
metadata: {{name: other}}
---
apiVersion: v1
kind: Pod
metadata: {{name: sec, namespace: default, labels: {{app: sec}}}}
spec:
  nodeName: sim-1
  containers: [{{name: main, image: "{echo}"}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: thief, namespace: other, labels: {{app: thief}}}}
spec:
  nodeName: sim-2
  containers: [{{name: main, image: "{counter}"}}]
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


class Lab:
    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.base = cluster.server
        self.api_port = int(self.base.rsplit(":", 1)[1])
        self.ctx = ssl.create_default_context(cafile=str(cluster.data_dir / "pki" / "ca.crt"))
        cluster.kubectl("apply", "-f", "-", input=SETUP.format(echo=push(cluster, ROOT / "examples/pods/echo.wasm"),
                                                              counter=push(cluster, ROOT / "examples/pods/counter.wasm")))
        for ns, pod in (("default", "sec"), ("other", "thief")):
            cluster.kubectl("wait", "--for=condition=Ready", f"pod/{pod}", "-n", ns, "--timeout=90s", timeout=100)
        self.bot = cluster.kubectl("create", "token", "bot", "-n", "other").stdout.strip()
        self.admin = cluster.kubectl("config", "view", "--raw", "-o", "jsonpath={.users[0].user.token}").stdout

    def service(self, ns: str, name: str, node_port: int | None, token: str, app: str) -> tuple[int, Any]:
        port: dict[str, Any] = {"port": 80, **({"nodePort": node_port} if node_port is not None else {})}
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"type": "NodePort", "selector": {"app": app}, "ports": [port]}}
        return self.call("POST", f"/api/v1/namespaces/{ns}/services", token, body)

    def call(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(self.base + path, data=data, method=method,
                                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(r, timeout=60, context=self.ctx) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


def answer(ip: str, port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=10) as r:
            return r.read()
    except (OSError, urllib.error.URLError) as e:
        return repr(e).encode()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    cluster = start_cluster(tmp_path_factory.mktemp("adversarial-services"), 2, "--backoff", "1")
    try:
        yield Lab(cluster)
    finally:
        cluster.proc.stop(timeout=30)


def a_port() -> int:
    """A nodePort that no program holds on any node's address now: CI runs two suites
    at once on the same loopback addresses, so a fixed choice could be the other
    suite's (a node then cannot bind it, and tries again, see below)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(31000, 32700)
        if all(bindable(ip, port) for ip in NODE_IPS):
            return port
    raise AssertionError("no free nodePort on the node addresses")


def bindable(ip: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def test_a_nodeport_cannot_be_taken_from_another_namespace(lab: Lab) -> None:
    port = a_port()
    st, out = lab.service("default", "sec-np", port, lab.admin, "sec")
    assert st == 201, out
    wait_for(lambda: all(b"method:" in answer(ip, port) for ip in NODE_IPS), 30, 0.5,
             what="every node to answer the NodePort with default/sec")
    st, out = lab.service("other", "steal", port, lab.bot, "thief")
    assert st == 422 and out["message"] == (f'Service "steal" is invalid: spec.ports[0].nodePort: Invalid value: '
                                            f"{port}: {ALLOCATED}"), out
    # kubectl says it the same way, to the same user.
    cp = lab.cluster.kubectl("--token", lab.bot, "-n", "other", "create", "service", "nodeport", "steal2",
                             "--tcp=80", f"--node-port={port}", check=False)
    assert cp.returncode != 0 and ALLOCATED in cp.stderr, cp.stderr
    # Nor through an update of a Service of its own.
    st, out = lab.service("other", "mine", None, lab.bot, "thief")
    assert st == 201, out
    mine = out["spec"]["ports"][0]["nodePort"]
    assert mine in range(30000, 32768) and mine != port
    out["spec"]["ports"][0]["nodePort"] = port
    st, upd = lab.call("PUT", "/api/v1/namespaces/other/services/mine", lab.bot, out)
    assert st == 422 and ALLOCATED in upd["message"], upd
    time.sleep(3)
    answers = {ip: answer(ip, port)[:120] for ip in NODE_IPS}
    assert all(b"method:" in a and b'"hostname":"thief"' not in a for a in answers.values()), answers
    lab.call("DELETE", "/api/v1/namespaces/other/services/mine", lab.bot)
    lab.call("DELETE", "/api/v1/namespaces/default/services/sec-np", lab.admin)


@pytest.mark.parametrize("which", ["api-server", "80", "10250", "29999", "32768"])
def test_a_nodeport_must_be_in_the_nodeport_range(lab: Lab, which: str) -> None:
    port = lab.api_port if which == "api-server" else int(which)
    st, out = lab.service("other", f"np-{which}", port, lab.bot, "x")
    if st < 300:
        lab.call("DELETE", f"/api/v1/namespaces/other/services/np-{which}", lab.bot)
    assert st == 422 and out["message"] == (f'Service "np-{which}" is invalid: spec.ports[0].nodePort: Invalid '
                                            f"value: {port}: {OUT_OF_RANGE}"), out


def test_two_creates_of_one_port_at_once_one_wins_and_a_delete_frees_it(lab: Lab) -> None:
    port = a_port()
    go = threading.Barrier(2)
    results: dict[str, tuple[int, Any]] = {}

    def create(ns: str, token: str, app: str) -> None:
        go.wait()
        results[ns] = lab.service(ns, "race", port, token, app)
    threads = [threading.Thread(target=create, args=("default", lab.admin, "sec")),
               threading.Thread(target=create, args=("other", lab.bot, "thief"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    codes = sorted(st for st, _ in results.values())
    assert codes == [201, 422], results
    winner = next(ns for ns, (st, _) in results.items() if st == 201)
    loser = "other" if winner == "default" else "default"
    assert ALLOCATED in results[loser][1]["message"]
    expected = b"method:" if winner == "default" else b'"hostname":"thief"'
    wait_for(lambda: all(expected in answer(ip, port) for ip in NODE_IPS), 30, 0.5,
             what=f"every node to answer {port} with {winner}'s pod")
    token = lab.admin if winner == "default" else lab.bot
    st, _ = lab.call("DELETE", f"/api/v1/namespaces/{winner}/services/race", token)
    assert st == 200
    st, out = lab.service(loser, "race", port, lab.admin if loser == "default" else lab.bot,
                          "sec" if loser == "default" else "thief")
    assert st == 201, out
    lab.call("DELETE", f"/api/v1/namespaces/{loser}/services/race", lab.admin)


def test_a_port_busy_on_one_node_is_served_there_once_it_is_free(lab: Lab) -> None:
    """Another program holds the nodePort on one node's address when the Service comes:
    the other nodes serve it at once, and that node takes the port as soon as it is
    free (it tries again every 2 s), not at the next change of some Service."""
    port = a_port()
    squatter = socket.socket()
    squatter.bind((NODE_IPS[1], port))
    squatter.listen()
    try:
        st, out = lab.service("default", "busy", port, lab.admin, "sec")
        assert st == 201, out
        wait_for(lambda: all(b"method:" in answer(ip, port) for ip in (NODE_IPS[0], NODE_IPS[2])), 30, 0.5,
                 what="the nodes whose port was free to serve it")
    finally:
        squatter.close()
    wait_for(lambda: b"method:" in answer(NODE_IPS[1], port), 15, 0.5,
             what="the node whose port was busy to serve it once it is free")
    lab.call("DELETE", "/api/v1/namespaces/default/services/busy", lab.admin)
