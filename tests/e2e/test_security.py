"""Security end to end, with real kubectl and real processes: a control plane (with its
node ``devkit``) started with a static token file, and one worker ``w1`` that joined
with the bootstrap token.

* A ``view`` user lists Checkpoints but gets 403 on their data and on Secrets;
  ``kubectl auth can-i`` agrees; an ``edit`` user may read the data.
* A node's own credentials read only its pods, and only the Secrets and
  Checkpoint data its pods name.
* A kubelet's ``/checkpoint`` answers only the control plane, over TLS.
* The controllers' Unix socket is the control plane user's alone and asks for a token.
* Oversized and malformed bodies get a Status; the servers keep serving.
"""
from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from typing import Iterator

import pytest
import yaml

from tests.conftest import ControlPlane, Proc, sim_command, start, start_control_plane, wait_for
from tests.e2e.helpers import node_token

JANE, BOB = "t-jane-0123456789", "t-bob-0123456789"
NS = "default"
CK = f"/apis/kube32.io/v1/namespaces/{NS}/checkpoints"


class Cluster:
    def __init__(self, cp: ControlPlane, worker: Proc) -> None:
        self.cp, self.worker = cp, worker
        doc = yaml.safe_load(cp.kubeconfig.read_text())
        self.server = doc["clusters"][0]["cluster"]["server"]
        self.ctx = ssl.create_default_context(
            cadata=base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
        # Kubelets' certificates are from the kubelet-serving signer, which only the API server trusts.
        self.kubelet_ctx = ssl.create_default_context(cafile=str(cp.data_dir / "pki" / "kubelet-ca.crt"))

    def token_of(self, user: str) -> str:
        if user.startswith("system:node:"):
            return node_token(self.cp, user[len("system:node:"):])
        tokens = json.loads((self.cp.data_dir / "tokens.json").read_text())
        return next(t for t, u in tokens.items() if u["username"] == user)

    def kubectl(self, token: str | None, *args: str, check: bool = False, input: str | None = None):
        extra = ("--token", token) if token else ()
        return self.cp.kubectl(*extra, *args, check=check, input=input)

    def call(self, method: str, url: str, token: str | None = None, body: bytes | None = None,
             ctype: str = "application/json") -> tuple[int, bytes]:
        headers = {"Content-Type": ctype}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = url if url.startswith("http") else self.server + url
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        ctx = self.ctx if url.startswith(self.server) else self.kubelet_ctx
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def kubelet(self, node: str) -> str:
        n = json.loads(self.cp.kubectl("get", "node", node, "-o", "json").stdout)
        scheme = n["metadata"]["annotations"]["kube32.io/kubelet-scheme"]
        return f"{scheme}://127.0.0.1:{n['status']['daemonEndpoints']['kubeletEndpoint']['Port']}"


def _pod(name: str, node: str, secret: str, checkpoint: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"kube32.io/restore-from": checkpoint}},
            "spec": {"nodeName": node, "containers": [{
                "name": "main", "image": "kube32.io/wasm-sha256:" + "0" * 64,
                "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]}]}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("security")
    tokens = root / "users.csv"
    tokens.write_text(f'{JANE},jane,u-jane,"dev"\n{BOB},bob,u-bob\n')
    cp = start_control_plane(root / "cp", "--token-auth-file", str(tokens), "--interp-mops", "1",
                             "--lease-interval", "1")
    worker = start(sim_command("worker", "--kubeconfig", str(root / "cp" / "node.kubeconfig"), "--name", "w1",
                               "--port", "0", "--interp-mops", "1", "--lease-interval", "1"), root / "w1.log")
    try:
        def ready() -> bool:
            nodes = json.loads(cp.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
                       for n in nodes) == 2
        wait_for(ready, 60, what="devkit and w1 Ready")
        c = Cluster(cp, worker)
        docs = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": f"{user}-{role}"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
                for user, role in (("jane", "view"), ("bob", "edit"))]
        docs += [_pod("on-w1", "w1", "s-w1", "ck-w1"), _pod("on-devkit", "devkit", "s-devkit", "ck-devkit")]
        for name in ("s-w1", "s-devkit", "s-unused"):
            docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                         "stringData": {"k": name}})
        for name in ("ck-w1", "ck-devkit"):
            docs.append({"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name},
                         "spec": {"podName": "gone"}})
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        yield c
    finally:
        worker.stop()
        cp.proc.stop()


def _forbidden(out, text: str) -> None:
    assert out.returncode != 0
    assert f"Error from server (Forbidden): {text}" in out.stderr, out.stderr


def test_view_user_lists_checkpoints_but_not_their_data_nor_secrets(cluster: Cluster) -> None:
    out = cluster.kubectl(JANE, "get", "checkpoints")
    assert out.returncode == 0 and "ck-w1" in out.stdout
    _forbidden(cluster.kubectl(JANE, "get", "--raw", f"{CK}/ck-w1/data"),
               'checkpoints.kube32.io "ck-w1" is forbidden: User "jane" cannot get resource "checkpoints/data" '
               'in API group "kube32.io" in the namespace "default"')
    _forbidden(cluster.kubectl(JANE, "get", "secrets"),
               'secrets is forbidden: User "jane" cannot list resource "secrets" in API group "" '
               'in the namespace "default"')
    _forbidden(cluster.kubectl(JANE, "get", "secret", "s-w1"),
               'secrets "s-w1" is forbidden: User "jane" cannot get resource "secrets" in API group "" '
               'in the namespace "default"')
    _forbidden(cluster.kubectl(JANE, "delete", "checkpoint", "ck-w1"),
               'checkpoints.kube32.io "ck-w1" is forbidden: User "jane" cannot delete resource "checkpoints" '
               'in API group "kube32.io" in the namespace "default"')
    _forbidden(cluster.kubectl(JANE, "get", "pods", "-n", "kube-system"),
               'pods is forbidden: User "jane" cannot list resource "pods" in API group "" '
               'in the namespace "kube-system"')
    # The edit user reads the data (none uploaded: 404 after authorization), and Secrets.
    code, body = cluster.call("GET", f"{CK}/ck-w1/data", BOB)
    assert code == 404, body
    assert cluster.kubectl(BOB, "get", "secret", "s-w1").returncode == 0


@pytest.mark.parametrize("token,args,answer", [
    (JANE, ("list", "checkpoints"), "yes"),
    (JANE, ("get", "checkpoints", "--subresource", "data"), "no"),
    (JANE, ("get", "secrets"), "no"),
    (JANE, ("create", "pods"), "no"),
    (JANE, ("get", "pods", "--subresource", "log"), "yes"),
    (BOB, ("get", "checkpoints", "--subresource", "data"), "yes"),
    (BOB, ("get", "secrets"), "yes"),
    (BOB, ("create", "rolebindings"), "no"),
    (None, ("get", "checkpoints", "--subresource", "data"), "yes"),     # the admin
])
def test_auth_can_i_answers_through_selfsubjectaccessreview(cluster: Cluster, token, args, answer) -> None:
    out = cluster.kubectl(token, "auth", "can-i", *args)
    assert out.stdout.strip() == answer, out.stderr
    assert out.returncode == (0 if answer == "yes" else 1)


def test_whoami_and_can_i_list(cluster: Cluster) -> None:
    out = cluster.kubectl(JANE, "auth", "whoami", "-o", "json", check=True)
    assert json.loads(out.stdout)["status"]["userInfo"] == {
        "username": "jane", "uid": "u-jane", "groups": ["dev", "system:authenticated"]}
    lines = cluster.kubectl(JANE, "auth", "can-i", "--list", check=True).stdout.splitlines()
    checkpoints = next(line.split() for line in lines if line.startswith("checkpoints.kube32.io "))
    assert checkpoints[-3:] == ["[get", "list", "watch]"]
    assert not any(line.startswith(("secrets ", "checkpoints.kube32.io/data")) for line in lines)


def test_impersonation_with_kubectl_as(cluster: Cluster) -> None:
    """kubectl --as / --as-group: the admin may be anyone and then gets that user's answers;
    edit may be its namespace's service accounts; view may be nobody."""
    out = cluster.kubectl(None, "--as=jane", "--as-group=dev", "auth", "whoami", "-o", "json", check=True)
    info = json.loads(out.stdout)["status"]["userInfo"]
    assert (info["username"], info["groups"]) == ("jane", ["dev", "system:authenticated"])
    cluster.kubectl(None, "--as=jane", "get", "pods", check=True)
    _forbidden(cluster.kubectl(None, "--as=jane", "get", "secrets"),
               'secrets is forbidden: User "jane" cannot list resource "secrets" in API group "" '
               'in the namespace "default"')
    assert cluster.kubectl(None, "--as=jane", "auth", "can-i", "create", "pods").stdout.strip() == "no"
    _forbidden(cluster.kubectl(BOB, "--as=system:serviceaccount:default:default", "get", "pods"),
               'pods is forbidden: User "system:serviceaccount:default:default" cannot list resource "pods" '
               'in API group "" in the namespace "default"')
    _forbidden(cluster.kubectl(BOB, "--as=jane", "get", "pods"),
               'users "jane" is forbidden: User "bob" cannot impersonate resource "users" in API group "" '
               'at the cluster scope')
    _forbidden(cluster.kubectl(JANE, "--as=bob", "--as-group=system:masters", "get", "pods"),
               'users "bob" is forbidden: User "jane" cannot impersonate resource "users" in API group "" '
               'at the cluster scope')
    # A group without a user: kubectl refuses that itself; the API server too.
    admin = yaml.safe_load(cluster.cp.kubeconfig.read_text())["users"][0]["user"]["token"]
    req = urllib.request.Request(cluster.server + "/api/v1/namespaces/default/pods", headers={
        "Authorization": f"Bearer {admin}", "Impersonate-Group": "dev"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, context=cluster.ctx, timeout=30)
    assert err.value.code == 400 and b"without impersonating a user" in err.value.read()


def test_node_credentials_reach_only_what_the_nodes_pods_use(cluster: Cluster) -> None:
    node = cluster.token_of("system:node:w1")
    base = f"/api/v1/namespaces/{NS}"
    assert cluster.call("GET", f"{base}/pods/on-w1", node)[0] == 200
    code, body = cluster.call("GET", f"{base}/pods/on-devkit", node)
    assert code == 403
    status = json.loads(body)
    assert status["reason"] == "Forbidden" and status["message"] == (
        'pods "on-devkit" is forbidden: User "system:node:w1" cannot get resource "pods" in API group "" '
        "in the namespace \"default\": no relationship found between node 'w1' and this object")
    assert cluster.call("GET", "/api/v1/pods", node)[0] == 403
    code, body = cluster.call("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dw1", node)
    assert code == 200 and [p["metadata"]["name"] for p in json.loads(body)["items"]] == ["on-w1"]
    assert cluster.call("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Ddevkit", node)[0] == 403
    assert cluster.call("GET", f"{base}/secrets/s-w1", node)[0] == 200
    assert cluster.call("GET", f"{base}/secrets/s-devkit", node)[0] == 403
    assert cluster.call("GET", f"{base}/secrets/s-unused", node)[0] == 403
    assert cluster.call("GET", f"{CK}/ck-w1/data", node)[0] == 404       # allowed; no data yet
    assert cluster.call("GET", f"{CK}/ck-devkit/data", node)[0] == 403
    assert cluster.call("PUT", f"{CK}/ck-w1/data", node, b"x", "application/octet-stream")[0] == 403
    assert cluster.call("PATCH", "/api/v1/nodes/devkit/status", node, b"{}",
                        "application/merge-patch+json")[0] == 403
    # kubectl with the node's token, and kubectl auth can-i as the node.
    _forbidden(cluster.kubectl(node, "get", "pod", "on-devkit"), 'pods "on-devkit" is forbidden')
    assert cluster.kubectl(node, "auth", "can-i", "list", "pods").stdout.strip() == \
        "no - node 'w1' may only list and watch pods with fieldSelector spec.nodeName=w1"
    assert cluster.kubectl(node, "auth", "can-i", "get", "secrets/s-w1").stdout.strip() == "yes"
    assert cluster.kubectl(node, "auth", "can-i", "get", "secrets/s-devkit").stdout.strip() == \
        "no - no relationship found between node 'w1' and this object"
    # The bootstrap token only buys node credentials.
    boot = yaml.safe_load((cluster.cp.data_dir / "node.kubeconfig").read_text())["users"][0]["user"]["token"]
    assert cluster.call("GET", f"{base}/pods", boot)[0] == 403
    assert cluster.call("GET", f"{base}/secrets/s-w1", boot)[0] == 403


def test_service_account_tokens_from_kubectl_create_token(cluster: Cluster) -> None:
    cluster.kubectl(None, "apply", "-f", "-", check=True, input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "bot-view"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
         "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": NS}]}]))
    out = cluster.kubectl(None, "create", "token", "bot", "--duration", "20m", check=True)
    token = out.stdout.strip()
    assert cluster.kubectl(token, "get", "checkpoints").returncode == 0
    _forbidden(cluster.kubectl(token, "get", "secrets"),
               'secrets is forbidden: User "system:serviceaccount:default:bot" cannot list resource "secrets"')
    assert cluster.kubectl(token, "auth", "can-i", "get", "checkpoints", "--subresource", "data").stdout.strip() == "no"
    out = cluster.kubectl(JANE, "create", "token", "bot")
    assert out.returncode != 0 and out.stderr.strip() == (
        'error: failed to create token: serviceaccounts "bot" is forbidden: User "jane" cannot create '
        'resource "serviceaccounts/token" in API group "" in the namespace "default"')
    # Deleting the ServiceAccount revokes its tokens, even if one of the same name comes back.
    cluster.kubectl(None, "delete", "serviceaccount", "bot", check=True)
    cluster.kubectl(None, "apply", "-f", "-", check=True, input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}}))
    assert cluster.call("GET", f"/api/v1/namespaces/{NS}/pods", token)[0] == 401


def test_kubelet_checkpoint_answers_only_the_control_plane(cluster: Cluster) -> None:
    base = cluster.kubelet("w1")
    assert base.startswith("https://")
    url = f"{base}/checkpoint/{NS}/on-w1/main"
    assert cluster.call("POST", url)[0] == 401
    assert cluster.call("POST", url, "not-a-token")[0] == 401
    for token in (JANE, cluster.token_of("system:node:w1"), cluster.token_of("system:node:devkit"),
                  cluster.token_of("kubernetes-admin")):
        code, body = cluster.call("POST", url, token)
        assert code == 403 and b"may not use the kubelet API" in body
    # Plain HTTP to the TLS endpoint is no way in either.
    with pytest.raises((urllib.error.URLError, ConnectionError, http_client_errors())):
        urllib.request.urlopen(urllib.request.Request(url.replace("https", "http"), data=b"", method="POST"),
                               timeout=10)
    # Client certificates: only the API server's CN passes; another CA-signed name is refused.
    from kube32.apiserver import pki
    pki_dir = cluster.cp.data_dir / "pki"
    other = pki.issue_client_cert(pki_dir, "test-other", "test-other")
    own = (pki_dir / "apiserver-kubelet-client.crt", pki_dir / "apiserver-kubelet-client.key")
    for cert, want in ((other, 403), (own, 404)):
        ctx = ssl.create_default_context(cafile=str(pki.ensure_pki(pki_dir).kubelet))
        ctx.load_cert_chain(*cert)
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{base}/containerLogs/{NS}/nope/main"),
                                        context=ctx, timeout=10) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        assert code == want, cert
    # The control plane itself gets through (the pod is not running: 4xx/5xx from the kubelet, not 401/403).
    admin = cluster.token_of("kubernetes-admin")
    code, _ = cluster.call("POST", f"/api/v1/nodes/w1/proxy/checkpoint/{NS}/nope/main", admin)
    assert code not in (401, 403)


def test_the_controllers_unix_socket_is_private_and_asks_for_a_token(cluster: Cluster) -> None:
    """The controllers reach the API server over a Unix socket (no TLS inside one process):
    only the control plane's user may open it, and it authenticates as the TCP port does."""
    import http.client
    import socket
    import stat
    path = cluster.cp.data_dir.resolve() / "apiserver.sock"
    mode = path.stat().st_mode
    assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o600

    def get(token: str | None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("localhost", timeout=10)
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.connect(str(path))
        conn.request("GET", "/api/v1/namespaces/default/secrets",
                     headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        return r.status, r.read()
    assert get(None)[0] == 401
    assert get(JANE)[0] == 403
    assert get(cluster.token_of("kubernetes-admin"))[0] == 200


def test_a_runaway_call_ends_when_its_pod_is_deleted(cluster: Cluster) -> None:
    import subprocess
    import sys
    import threading
    import time
    from tests.conftest import ROOT
    out = subprocess.run([sys.executable, "-m", "kube32.cli.main", "image", "push",
                          str(ROOT / "examples" / "pods" / "counter.wasm"), "--kubeconfig", str(cluster.cp.kubeconfig)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    image = out.stdout.strip()
    # Its Secret and ConfigMap are read by w1's kubelet under the node authorizer: Ready proves it.
    cluster.kubectl(None, "apply", "-f", "-", check=True, input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "busy-cfg"}, "data": {"a.conf": "x"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy"},
         "spec": {"nodeName": "w1", "containers": [{
             "name": "main", "image": image,
             "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s-w1", "key": "k"}}}],
             "volumeMounts": [{"name": "cfg", "mountPath": "/etc/busy"}]}],
             "volumes": [{"name": "cfg", "configMap": {"name": "busy-cfg"}}]}}]))
    admin = cluster.token_of("kubernetes-admin")

    def ready() -> bool:
        pod = json.loads(cluster.kubectl(None, "get", "pod", "busy", "-o", "json", check=True).stdout)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
    wait_for(ready, 30, what="the busy pod Ready")
    result: list[tuple[int, bytes]] = []
    # Ten minutes of busy loop: only the pod's deletion (or the 10 s call timeout) can end it.
    call = threading.Thread(target=lambda: result.append(cluster.call(
        "POST", f"/api/v1/namespaces/{NS}/pods/busy/proxy/work?ms=600000", admin, b"")))
    call.start()
    time.sleep(1)   # ordering only: let the call reach the pod before it is deleted
    cluster.kubectl(None, "delete", "pod", "busy", "--wait=true", check=True)
    call.join(30)
    assert not call.is_alive()
    code, body = result[0]
    assert code == 502 and b"pod stopped" in body, (code, body[:300])


def http_client_errors():
    import http.client
    return http.client.HTTPException


def test_oversized_and_malformed_bodies_get_a_status(cluster: Cluster) -> None:
    admin = cluster.token_of("kubernetes-admin")
    pods = f"/api/v1/namespaces/{NS}/pods"
    cases = [
        ("POST", pods, b"{not json", "application/json", 400, "not valid JSON"),
        ("POST", pods, b"x" * (3 * 1024 * 1024 + 1), "application/json", 413, "limit"),
        ("POST", pods, b'{"a": 1, "a": 2}', "application/json", 400, "duplicate field"),
        ("POST", "/apis/kube32.io/v1/images", b"\0" * (8 * 1024 * 1024 + 1), "application/wasm", 413, "limit"),
        ("POST", "/apis/kube32.io/v1/images", b"not wasm", "application/wasm", 400, ""),
        ("POST", f"/apis/kube32.io/v1/namespaces/{NS}/topics/t", b"x" * (64 * 1024 + 1),
         "application/octet-stream", 413, ""),
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", b"[]", "application/json", 400, ""),
        ("POST", "/apis/kube32.io/v1/nodecredentials/w9", b'{"csr": "garbage"}', "application/json", 422,
         "not a PEM CSR"),
        ("PUT", f"{CK}/ck-w1/data", b"not a snapshot", "application/octet-stream", None, ""),
    ]
    for method, path, body, ctype, want, text in cases:
        code, out = cluster.call(method, path, admin, body, ctype)
        status = json.loads(out)
        assert status["kind"] == "Status" and status["code"] == code, (path, out[:300])
        assert code >= 400 and (want is None or code == want), (path, code, out[:300])
        assert text in status["message"], (path, status["message"])
    assert cluster.call("GET", "/healthz")[0] == 200
    # The kubelet: a pod request larger than its limit is refused, the kubelet keeps serving.
    code, out = cluster.call("POST", f"/api/v1/namespaces/{NS}/pods/on-w1/proxy/x", admin,
                             b"x" * (17 * 1024 * 1024), "application/octet-stream")
    assert code == 413, out[:300]
    assert cluster.call("GET", f"{cluster.kubelet('w1')}/healthz")[0] == 200
    assert cluster.kubectl(None, "get", "nodes").returncode == 0


def test_a_chunked_event_payload_is_read_whole_and_limited(cluster: Cluster) -> None:
    import http.client
    admin = cluster.token_of("kubernetes-admin")
    host, port = cluster.server.removeprefix("https://").split(":")

    def publish(pieces: list[bytes]) -> tuple[int, dict]:
        conn = http.client.HTTPSConnection(host, int(port), context=cluster.ctx, timeout=30)
        conn.putrequest("POST", f"/apis/kube32.io/v1/namespaces/{NS}/topics/t")
        conn.putheader("Authorization", f"Bearer {admin}")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for p in pieces:
            conn.send(b"%x\r\n%s\r\n" % (len(p), p))
        conn.send(b"0\r\n\r\n")
        r = conn.getresponse()
        out = r.status, json.loads(r.read())
        conn.close()
        return out
    code, body = publish([b"a" * 40000, b"b" * 20000])
    assert code == 201 and body["size"] == 60000
    code, body = publish([b"a" * 40000, b"b" * 40000])
    assert code == 413 and body["kind"] == "Status" and "at most 65536 bytes" in body["message"]
