"""An outside attacker against a ``kube32-sim up`` cluster (issue 19, attack round 19b,
once tests/attack/k19b.py), with raw HTTP(S), curl and kubectl:
tests/e2e/test_adversarial_tenants.py.  :func:`use` names the cluster's data directory.

Nothing here imports kube32: the attacker has the data directory's kubeconfigs (admin
for set-up, node.kubeconfig for the bootstrap token) and the network."""
from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

DIR = Path("/nonexistent")
_CLUSTER: dict[str, Any] = {}
ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"


def _kubeconfig(name: str) -> dict[str, Any]:
    import yaml
    return yaml.safe_load((DIR / name).read_text())


def use(data_dir: Path) -> None:
    """The cluster every helper here talks to (its ``kube32-sim up --data-dir``)."""
    global DIR
    DIR = data_dir
    _CLUSTER.clear()


def cluster() -> dict[str, Any]:
    if _CLUSTER:
        return _CLUSTER
    adm = _kubeconfig("admin.kubeconfig")
    boot = _kubeconfig("node.kubeconfig")
    server = adm["clusters"][0]["cluster"]["server"]
    ca = base64.b64decode(adm["clusters"][0]["cluster"]["certificate-authority-data"])
    ca_file = DIR / "tenants-ca.crt"
    ca_file.write_bytes(ca)
    _CLUSTER.update({"server": server, "ca": ca, "ca_file": str(ca_file),
                     "admin": adm["users"][0]["user"]["token"], "bootstrap": boot["users"][0]["user"]["token"]})
    return _CLUSTER


def host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[1].split("/", 1)[0]
    h, p = rest.rsplit(":", 1)
    return h, int(p)


class Resp:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<{self.status} {self.body[:300]!r}>"


def raw(method: str, path: str, token: str | None = None, body: bytes | str | None = None,
        headers: dict[str, str] | None = None, host: str | None = None, port: int | None = None,
        tls: bool = True, source: str | None = None, timeout: float = 30.0,
        verify: bool = False) -> Resp:
    """One request with the path sent exactly as given (no normalisation)."""
    c = cluster()
    h, p = host_port(c["server"])
    host, port = host or h, port or p
    if tls:
        ctx = ssl.create_default_context(cadata=c["ca"].decode()) if verify else ssl._create_unverified_context()
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, context=ctx, timeout=timeout, source_address=(source, 0) if source else None)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout,
                                          source_address=(source, 0) if source else None)
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    if isinstance(body, str):
        body = body.encode()
    if body is not None and "Content-Type" not in hdrs:
        hdrs["Content-Type"] = "application/json"
    conn.putrequest(method, path, skip_accept_encoding=True)
    for k, v in hdrs.items():
        conn.putheader(k, v)
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data)


def admin(method: str, path: str, obj: Any = None, **kw: Any) -> Resp:
    body = json.dumps(obj) if obj is not None and not isinstance(obj, (bytes, str)) else obj
    return raw(method, path, cluster()["admin"], body, **kw)


def kubectl(*args: str, token: str | None = None, input: str | None = None,
            check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = ["kubectl", "--kubeconfig", str(DIR / "admin.kubeconfig"), "--cache-dir", str(DIR / "kubectl-cache")]
    if token:
        cmd += ["--token", token]
    p = subprocess.run(cmd + list(args), input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode:
        raise AssertionError(f"kubectl {' '.join(args)}: {p.stderr}")
    return p


def apply(manifest: str) -> None:
    kubectl("apply", "-f", "-", input=manifest, check=True)


def image(name: str = "counter") -> str:
    p = subprocess.run([str(BIN / "kube32-cli"), "--kubeconfig", str(DIR / "admin.kubeconfig"), "image", "push",
                        str(ROOT / "examples" / "pods" / f"{name}.wasm")], capture_output=True, text=True,
                       env={**os.environ, "KUBECONFIG": str(DIR / "admin.kubeconfig")})
    if p.returncode:
        p = subprocess.run([str(BIN / "kube32-cli"), "image", "push",
                            str(ROOT / "examples" / "pods" / f"{name}.wasm")], capture_output=True, text=True,
                           env={**os.environ, "KUBECONFIG": str(DIR / "admin.kubeconfig")})
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def namespace(ns: str) -> None:
    apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n")


def sa_token(ns: str, sa: str, role: str = "edit") -> str:
    """A ServiceAccount ``sa`` bound to ClusterRole ``role`` in ``ns`` only; its token."""
    namespace(ns)
    apply(f"""apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {sa}-{role}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]
""")
    return kubectl("create", "token", sa, "-n", ns, "--duration=2h", check=True).stdout.strip()


def pod(ns: str, name: str, img: str, *, node: str | None = None, labels: dict | None = None,
        annotations: dict | None = None, env_secret: tuple[str, str] | None = None, wait: bool = True) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": img}]}
    if node:
        spec["nodeName"] = node
    if env_secret:
        spec["containers"][0]["env"] = [{"name": "PW", "valueFrom": {"secretKeyRef": {
            "name": env_secret[0], "key": env_secret[1]}}}]
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns,
                                                           "labels": labels or {"app": name},
                                                           "annotations": annotations or {}}, "spec": spec}
    r = admin("POST", f"/api/v1/namespaces/{ns}/pods", obj)
    assert r.status in (201, 409), r
    if wait:
        kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", ns, "--timeout=90s", check=True)


def secret(ns: str, name: str, value: str) -> None:
    r = admin("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret",
                                                          "metadata": {"name": name}, "stringData": {"pw": value}})
    assert r.status in (201, 409), r


def save(ns: str, name: str, pod_name: str, timeout: float = 60) -> dict:
    r = admin("POST", f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints",
              {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name},
               "spec": {"podName": pod_name, "action": "Save"}})
    assert r.status in (201, 409), r
    deadline = time.time() + timeout
    while time.time() < deadline:
        ck = admin("GET", f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints/{name}").json()
        if (ck.get("status") or {}).get("phase") in ("Saved", "Failed"):
            return ck
        time.sleep(0.5)
    raise AssertionError(f"checkpoint {ns}/{name} not saved")


def join_node(name: str, source: str) -> str:
    """Join as node ``name`` from ``source`` with the bootstrap token (no CSR): its token."""
    r = raw("POST", f"/apis/kube32.io/v1/nodecredentials/{name}", cluster()["bootstrap"], "{}", source=source)
    assert r.status == 201, r
    return r.json()["token"]


def register_node(name: str, token: str, source: str, port: int = 1) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name}}, "status": {"addresses": [{"type": "InternalIP", "address": source}],
                                                      "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}}
    r = raw("POST", "/api/v1/nodes", token, json.dumps(node), source=source)
    assert r.status in (201, 409), r


def wait_for(pred, timeout: float = 30, step: float = 0.5) -> Any:
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    return last


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def tmpfile(data: bytes) -> str:
    f = tempfile.NamedTemporaryFile(delete=False)
    f.write(data)
    f.close()
    return f.name


def tcp(host: str, port: int, data: bytes, timeout: float = 5) -> bytes:
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    s.close()
    return out
