"""NodePort Services on this node: every node answers them on its own address.

For each port of a Service of type NodePort (or LoadBalancer) the kubelet listens
on ``<node IP>:<nodePort>`` and forwards each HTTP request, streaming, to the
API server's ``services/<name>:<port>/proxy/<path>``, which picks a Ready pod of
the Service on any node and holds a request through a move (kube32.apiserver.hold),
so a NodePort's clients see a move no more than the Service proxy's do.  These
requests go on a connection pool of their own (:meth:`Client.sibling`): held ones
never take the connections the kubelet reports its pods' status on (the Ready of a
replacement they wait for).
This is what kube-proxy does on a Kubernetes node; here pods answer HTTP through
their kubelet, so the hop goes through the API server.

Invariants: one listener per (nodePort); a Service changed or gone closes its
listeners; a port this node cannot bind is logged and recorded as an event on the
Service, never fatal.  A request reaches that Service's proxy and nothing else of
the API (the node's credentials carry it): its path is taken segment by segment,
a dot segment in any encoding, a backslash or a control character is a 400
(:mod:`kube32.urlpath`), and the API path is sent encoded, as is.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from .. import serving, urlpath
from ..client import SERVICES, Client, Informer
from .nodeapi import NodeServices

log = logging.getLogger("kube32.kubelet.nodeports")
HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "authorization"})


def node_ports(svc: dict[str, Any]) -> dict[int, tuple[str, str, int]]:
    """nodePort -> (namespace, name, service port) for a NodePort/LoadBalancer Service."""
    spec = svc.get("spec") or {}
    if spec.get("type") not in ("NodePort", "LoadBalancer"):
        return {}
    md = svc["metadata"]
    return {int(p["nodePort"]): (md["namespace"], md["name"], int(p["port"]))
            for p in spec.get("ports") or [] if p.get("nodePort") and p.get("port")}


class NodePorts:
    def __init__(self, kubelet: NodeServices) -> None:
        self.kl = kubelet
        self.informer = Informer(kubelet.client, SERVICES)
        self.listeners: dict[int, tuple[tuple[str, str, int], web.AppRunner]] = {}
        self._lock = asyncio.Lock()
        self._client: Client | None = None   # made at the first request: after the join set the token

    def start(self) -> asyncio.Task:
        self.informer.add_handler(lambda *_: self.kl.spawn(self.reconcile()))
        return self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()
        for _, runner in self.listeners.values():
            await runner.cleanup()
        self.listeners.clear()
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.kl.client.sibling(f"{self.kl.client.user_agent} (NodePort)")
        return self._client

    async def reconcile(self) -> None:
        async with self._lock:
            wanted: dict[int, tuple[str, str, int]] = {}
            for svc in self.informer.list():
                wanted.update(node_ports(svc))
            for port, (target, runner) in list(self.listeners.items()):
                if wanted.get(port) != target:
                    await runner.cleanup()
                    del self.listeners[port]
            for port, target in wanted.items():
                if port not in self.listeners:
                    await self._listen(port, target)

    async def _listen(self, port: int, target: tuple[str, str, int]) -> None:
        app = web.Application(middlewares=[serving.track_requests], client_max_size=16 << 20)
        app.router.add_route("*", "/{path:.*}", self._forwarder(target))
        runner = serving.GuardedRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.kl.ip, port, reuse_address=True).start()
        except OSError as e:
            await runner.cleanup()
            ns, name, _ = target
            log.warning("cannot serve NodePort %d of %s/%s on %s: %s", port, ns, name, self.kl.ip, e)
            return
        self.listeners[port] = (target, runner)

    def _forwarder(self, target: tuple[str, str, int]):
        ns, name, svc_port = target
        proxy = "/".join(urlpath.quote_segment(s) for s in
                         ("api", "v1", "namespaces", ns, "services", f"{name}:{svc_port}", "proxy"))

        async def forward(request: web.Request) -> web.StreamResponse:
            raw_path, _, query = request.raw_path.partition("?")
            try:
                suffix = urlpath.confined([unquote(s) for s in raw_path.split("/")[1:]])
            except urlpath.PathRefused as e:
                return web.Response(status=400, text=f"{e}\n")
            path = f"/{proxy}/{suffix}" + (f"?{query}" if query else "")
            # Impersonate-*: the node's credentials carry the request, never a caller's wish.
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in HOP and not k.lower().startswith("impersonate-")}
            try:
                async with self.client.request(request.method, path, encoded=True,
                                                  data=await request.read(), headers=headers) as up:
                    resp = web.StreamResponse(status=up.status, reason=up.reason)
                    for k, v in up.headers.items():
                        if k.lower() not in HOP:
                            resp.headers.add(k, v)
                    await resp.prepare(request)
                    async for chunk in up.content.iter_chunked(1 << 16):
                        await resp.write(chunk)
                    await resp.write_eof()
                    return resp
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                return web.Response(status=502, text=f"cannot reach service {ns}/{name}: {e}\n")
        return forward
