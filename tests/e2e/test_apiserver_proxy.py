"""Forwarding to kubelets (node proxy, pods/proxy, services/proxy, pods/log) against a
small test kubelet: bodies stream both ways, and the API server authenticates itself."""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import ControlPlane

NODE_INFO = {k: "" for k in ("architecture", "bootID", "containerRuntimeVersion", "kernelVersion",
                             "kubeProxyVersion", "kubeletVersion", "machineID", "operatingSystem",
                             "osImage", "systemUUID")}


class FakeKubelet:
    """An aiohttp server on a thread that records what reached it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"method": request.method, "path": request.path, "query": request.query_string,
                          "auth": request.headers.get("Authorization", ""), "body": body})
        if request.path.startswith("/containerLogs/"):
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"line {i}\n".encode())
                await asyncio.sleep(0.05)
            await resp.write_eof()
            return resp
        if request.path == "/big":
            return web.Response(body=b"x" * (8 << 20), content_type="application/octet-stream")
        return web.json_response({"path": request.path, "query": request.query_string, "len": len(body)},
                                 headers={"X-Test": "yes"})


@pytest.fixture
def kubelet() -> FakeKubelet:
    return FakeKubelet()


def _register(cp: ControlPlane, kubelet: FakeKubelet) -> None:
    from kubernetes import client
    core = client.CoreV1Api(cp.client())
    core.create_node({"metadata": {"name": "n1"}, "status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port}},
        "conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": NODE_INFO}})
    core.create_namespaced_pod("default", {"metadata": {"name": "p1", "labels": {"app": "a"}},
                                           "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
    core.patch_namespaced_pod_status("p1", "default", {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}})
    core.create_namespaced_service("default", {"metadata": {"name": "svc"},
                                               "spec": {"selector": {"app": "a"}, "ports": [{"port": 80}]}})


def test_node_pod_and_service_proxies_reach_the_kubelet(control_plane: ControlPlane, kubelet: FakeKubelet) -> None:
    cp = control_plane
    _register(cp, kubelet)
    out = json.loads(cp.kubectl("get", "--raw", "/api/v1/nodes/n1/proxy/healthz?x=1").stdout)
    assert out == {"path": "/healthz", "query": "x=1", "len": 0}
    assert kubelet.seen[-1]["auth"].startswith("Bearer ") and len(kubelet.seen[-1]["auth"]) > 20
    admin_token = [line for line in cp.kubeconfig.read_text().splitlines() if "token:" in line][0].split()[-1]
    assert admin_token not in kubelet.seen[-1]["auth"], "the user's token is not passed on"

    out = json.loads(cp.kubectl("get", "--raw", "/api/v1/namespaces/default/pods/p1/proxy/count?n=2").stdout)
    assert out["path"] == "/pods/default/p1/http/count" and out["query"] == "n=2"
    out = json.loads(cp.kubectl("get", "--raw", "/api/v1/namespaces/default/services/svc:80/proxy/").stdout)
    assert out["path"] == "/pods/default/p1/http/"

    posted = cp.kubectl("create", "--raw", "/api/v1/nodes/n1/proxy/checkpoint/default/p1/c", "-f", "-",
                        input="y" * 100000)
    assert json.loads(posted.stdout)["len"] == 100000
    big = cp.kubectl("get", "--raw", "/api/v1/nodes/n1/proxy/big").stdout
    assert len(big) == 8 << 20


def test_pod_logs_stream_through(control_plane: ControlPlane, kubelet: FakeKubelet) -> None:
    cp = control_plane
    _register(cp, kubelet)
    out = cp.kubectl("logs", "p1", "-f", "--tail=5").stdout
    assert out == "line 0\nline 1\nline 2\n"
    assert kubelet.seen[-1]["path"] == "/containerLogs/default/p1/c"
    assert "follow=true" in kubelet.seen[-1]["query"] and "tailLines=5" in kubelet.seen[-1]["query"]


def test_service_without_ready_pods_is_unavailable(control_plane: ControlPlane, kubelet: FakeKubelet) -> None:
    cp = control_plane
    _register(cp, kubelet)
    cp.kubectl("label", "pod", "p1", "app=b", "--overwrite")
    out = cp.kubectl("get", "--raw", "/api/v1/namespaces/default/services/svc/proxy/", check=False)
    assert out.returncode == 1 and "no endpoints available" in out.stderr


def test_exec_attach_and_port_forward_are_refused_with_the_reason(control_plane: ControlPlane,
                                                                   kubelet: FakeKubelet) -> None:
    """A Kube32 pod has no processes to run commands in and no ports to forward: kubectl
    exec, attach, cp and port-forward say so instead of a bare 404, and nothing reaches
    the kubelet."""
    cp = control_plane
    _register(cp, kubelet)
    seen = len(kubelet.seen)
    for args in (("exec", "p1", "--", "ls"), ("attach", "p1"), ("cp", "p1:/x", "/tmp/kube32-cp-x")):
        out = cp.kubectl(*args, check=False, timeout=30)
        assert out.returncode == 1
        sub = "attach" if args[0] == "attach" else "exec"
        assert (f"Error from server (BadRequest): pods/{sub} is not supported: a Kube32 pod is a "
                "WebAssembly module, with no processes") in out.stderr, out.stderr
    out = cp.kubectl("port-forward", "pod/p1", "18080:80", check=False, timeout=30)
    assert out.returncode == 1
    assert "pods/portforward is not supported: a Kube32 pod has no network ports to forward" in out.stderr
    assert len(kubelet.seen) == seen
