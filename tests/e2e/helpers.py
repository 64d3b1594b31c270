"""Helpers shared by the end-to-end tests on a ``kube32-sim up`` cluster."""
from __future__ import annotations

import asyncio
import http.server
import json
import socketserver
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import yaml

from kube32.client import Client
from tests.conftest import ROOT, ControlPlane


def cli(cluster: ControlPlane, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kube32.cli.main", *args, "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, input=input, cwd=ROOT, timeout=60)


def push(cluster: ControlPlane, path: Path) -> str:
    out = cli(cluster, "image", "push", str(path))
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


def pod_yaml(name: str, node: str, image: str, annotations: dict | None = None, **spec) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations or {}},
                           "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}], **spec}})


def get_json(cluster: ControlPlane, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def raw(cluster: ControlPlane, path: str) -> dict:
    return json.loads(cluster.kubectl("get", "--raw", path).stdout)


def waiting_or_terminated(cluster: ControlPlane, name: str) -> dict:
    cs = (get_json(cluster, "pod", name).get("status") or {}).get("containerStatuses") or [{}]
    return cs[0]


def node_token(cluster: ControlPlane, node: str) -> str:
    """A copy of `node`'s current token, as the node holds it: signed with the control
    plane's key over the token id its Secret keeps (the token itself is stored nowhere)."""
    import base64

    from kube32.apiserver.auth import NODE_TOKEN_PREFIX, ServiceAccountTokens
    from kube32.apiserver.nodetokens import NAMESPACE, secret_name

    secret = get_json(cluster, "secret", secret_name(node), "-n", NAMESPACE)
    token_id = base64.b64decode(secret["data"]["id"]).decode()
    key = (cluster.data_dir / "sa.key").read_text().strip().encode()
    return ServiceAccountTokens(key).sign(NODE_TOKEN_PREFIX, {"node": node, "id": token_id})


def kubelet_client_token(cluster: ControlPlane, node: str) -> str:
    """The token the API server presents to `node`'s kubelet over plain HTTP (bound to
    that Node's name and uid; kube32.apiserver.kubeletcredentials), made as it makes it."""
    from kube32.apiserver.auth import KUBELET_TOKEN_PREFIX, ServiceAccountTokens

    uid = get_json(cluster, "node", node)["metadata"]["uid"]
    key = (cluster.data_dir / "sa.key").read_text().strip().encode()
    return ServiceAccountTokens(key).sign(KUBELET_TOKEN_PREFIX, {"node": node, "uid": uid})


def api_call(cluster: ControlPlane, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request through the API server with the admin's credentials: (status, headers, body)."""
    async def go() -> tuple[int, dict[str, str], bytes]:
        async with Client.from_kubeconfig(cluster.kubeconfig) as c:
            async with c.request(method, path) as r:
                return r.status, dict(r.headers), await r.read()
    return asyncio.run(go())


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


def rss_of(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def worker_pid(cluster: ControlPlane, node: str) -> int:
    """The process id of ``cluster``'s worker (kubelet) of ``node``."""
    want = ["--name", node, str(cluster.data_dir / "node.kubeconfig")]
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
