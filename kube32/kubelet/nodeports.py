"""NodePort Services on this node: every node answers them on its own address.

For each port of a Service of type NodePort (or LoadBalancer) the kubelet listens
on ``<node IP>:<nodePort>`` and forwards each HTTP request, streaming, to the
API server's ``services/<name>:<port>/proxy/<path>``, which picks a Ready pod of
the Service on any node and holds a request through a move (kube32.apiserver.hold),
so a NodePort's clients see a move no more than the Service proxy's do.  These
requests go on a connection pool of their own (:meth:`Client.sibling`): held ones
never take the connections the kubelet reports its pods' status on (the Ready of a
replacement they wait for).  A request held at the API server keeps its one connection
there while it waits, so the pool is as large as the node's bound, :data:`MAX_IN_FLIGHT`
requests at once, and one Service has at most :data:`MAX_PER_SERVICE` of them: one
Service's held requests never stall another's (past either bound: 503, Retry-After: 1).

A request takes a forwarding slot only once its client has sent it: the slots are
for requests the API server holds, never for clients slow to send (130 connections
that sent headers and trickled a byte every 8 s held every slot of a Service, and
nobody else was answered).  So the listener reads a body of up to
:data:`~kube32.holding.MAX_HELD_BODY` (64 KiB, what the API server may hold) whole
before it takes a slot, within :data:`BODY_SECONDS` (else 408 Request Timeout, the
connection closed); of a larger body it reads that much first the same way, then
streams the rest as it comes, at least 64 KiB every :data:`BODY_SECONDS` (else the
request is cut off with a 408): nothing of it is read whole.  Headers must come within
10 s and no body may pause longer than 10 s (:data:`kube32.serving.FORWARDER_LIMITS`).
Answers stream back as they come.  Headers go as they came, a repeated
one repeated.  API servers: the node's every one (its client's ``servers``).  A request
no API server could be reached for was not sent, so it goes to the next one, and round
again every :data:`RETRY_CONNECT` s until the Service's hold bound (then 503 with
Retry-After: 1); one an API server took and went away from before answering is a 503
with Retry-After: 1 (the next request goes to the next API server).
This is what kube-proxy does on a Kubernetes node; here pods answer HTTP through
their kubelet, so the hop goes through the API server.

Invariants: one listener per (nodePort), for one Service: the API server allocates
each nodePort to one Service of the cluster (kube32.apiserver.nodeports), and should
two ever claim one (a store written before that), the one created first keeps it,
never the last to write; a Service changed or gone closes its listeners; a port this
node cannot bind (another program holds it) is logged, never fatal, and tried again
every RETRY_BIND seconds until it binds or is no longer wanted: a Service must not stay
dark on a node because a port was busy at the moment the Service came. A
request reaches that Service's proxy and nothing else of the API (the node's
credentials carry it): its path is taken segment by segment, a dot segment in any
encoding, a backslash or a control character is a 400 (:mod:`kube32.urlpath`), and the
API path is sent encoded, as is.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from .. import holding, objects, serving, urlpath
from ..client import SERVICES, Client, Informer
from .nodeapi import NodeServices

log = logging.getLogger("kube32.kubelet.nodeports")
RETRY_BIND = 2.0   # seconds between tries of a port this node could not bind
HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "authorization",
                 "proxy-authorization", "proxy-authenticate", "te", "trailers", "upgrade"})
MAX_IN_FLIGHT = 512     # NodePort requests this node forwards at once (each has one connection)
MAX_PER_SERVICE = 128   # of those, for one Service: its held requests leave the rest to the others
RETRY_CONNECT = 0.5     # s between rounds of the API servers while none can be reached
BODY_SECONDS = 10.0     # s for each 64 KiB of a request body (the first before a slot is taken)
BLOCK = holding.MAX_HELD_BODY


class TooSlow(Exception):
    """The client sent its body slower than :data:`BLOCK` bytes per :data:`BODY_SECONDS`."""


def node_ports(svc: dict[str, Any]) -> dict[int, tuple[str, str, int]]:
    """nodePort -> (namespace, name, service port) for a NodePort/LoadBalancer Service."""
    spec = objects.spec(svc)
    if spec.get("type") not in ("NodePort", "LoadBalancer"):
        return {}
    md = svc["metadata"]
    return {int(p["nodePort"]): (md["namespace"], md["name"], int(p["port"]))
            for p in spec.get("ports") or [] if p.get("nodePort") and p.get("port")}


def _age_order(svc: dict[str, Any]) -> tuple[str, str, str]:
    """Oldest first (RFC 3339 times in UTC sort as text); the name breaks a tie."""
    md = svc.get("metadata") or {}
    return md.get("creationTimestamp") or "", md.get("namespace") or "", md.get("name") or ""


class NodePorts:
    def __init__(self, kubelet: NodeServices) -> None:
        self.kl = kubelet
        self.informer = Informer(kubelet.client, SERVICES)
        self.listeners: dict[int, tuple[tuple[str, str, int], web.AppRunner]] = {}
        self._lock = asyncio.Lock()
        self._client: Client | None = None   # made at the first request: after the join set the token
        self._retry: asyncio.TimerHandle | None = None
        self._warned: set[int] = set()   # ports whose failure to bind was logged once
        self._in_flight = 0
        self._per_service: dict[tuple[str, str], int] = {}

    def start(self) -> asyncio.Task:
        self.informer.add_handler(lambda *_: self.kl.spawn(self.reconcile()))
        return self.informer.start()

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        await self.informer.stop()
        for _, runner in self.listeners.values():
            await runner.cleanup()
        self.listeners.clear()
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.kl.client.sibling(f"{self.kl.client.user_agent} (NodePort)", pool=MAX_IN_FLIGHT)
        return self._client

    async def reconcile(self) -> None:
        async with self._lock:
            wanted: dict[int, tuple[str, str, int]] = {}
            for svc in sorted(self.informer.list(), key=_age_order):
                for port, target in node_ports(svc).items():
                    wanted.setdefault(port, target)
            for port, (target, runner) in list(self.listeners.items()):
                if wanted.get(port) != target:
                    await runner.cleanup()
                    del self.listeners[port]
            for port, target in wanted.items():
                if port not in self.listeners:
                    await self._listen(port, target)
            self._retry_unbound(any(port not in self.listeners for port in wanted))

    def _retry_unbound(self, needed: bool) -> None:
        """One timer at most: a reconcile tries every port again, so one retry serves all."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if needed:
            self._retry = asyncio.get_running_loop().call_later(
                RETRY_BIND, lambda: self.kl.spawn(self.reconcile()))

    async def _listen(self, port: int, target: tuple[str, str, int]) -> None:
        app = web.Application(middlewares=[serving.track_requests])
        app.router.add_route("*", "/{path:.*}", self._forwarder(target))
        runner = serving.GuardedRunner(app, limits=serving.FORWARDER_LIMITS, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.kl.ip, port, reuse_address=True).start()
        except OSError as e:
            await runner.cleanup()
            ns, name, _ = target
            if port not in self._warned:
                self._warned.add(port)
                log.warning("cannot serve NodePort %d of %s/%s on %s (trying again every %.0f s): %s",
                            port, ns, name, self.kl.ip, RETRY_BIND, e)
            return
        self._warned.discard(port)
        self.listeners[port] = (target, runner)

    def _forwarder(self, target: tuple[str, str, int]):
        ns, name, svc_port = target
        proxy = urlpath.api_path("api", "v1", "namespaces", ns, "services", f"{name}:{svc_port}", "proxy")

        async def forward(request: web.Request) -> web.StreamResponse:
            raw_path, _, query = request.raw_path.partition("?")
            try:
                suffix = urlpath.confined([unquote(s) for s in raw_path.split("/")[1:]])
            except urlpath.PathRefused as e:
                return web.Response(status=400, text=f"{e}\n")
            path = f"{proxy}/{suffix}" + (f"?{query}" if query else "")
            try:
                body = await read_body(request)   # before a slot: a slow client holds none
            except TooSlow as e:
                return _too_slow(request, str(e))
            busy = self._take_slot(ns, name)
            if busy is not None:
                return _retry_later(busy)
            try:
                return await self._send(request, ns, name, path, body)
            except TooSlow as e:
                return _too_slow(request, str(e))
            finally:
                self._give_slot(ns, name)
        return forward

    # --- what one node forwards at once ------------------------------------------------
    def _take_slot(self, ns: str, name: str) -> str | None:
        """A slot for one request to Service ns/name, or why there is none (the node's
        bound, or that Service's share of it)."""
        if self._in_flight >= MAX_IN_FLIGHT:
            return f"this node forwards {MAX_IN_FLIGHT} NodePort requests already"
        if self._per_service.get((ns, name), 0) >= MAX_PER_SERVICE:
            return f"this node forwards {MAX_PER_SERVICE} requests for service {ns}/{name} already"
        self._in_flight += 1
        self._per_service[(ns, name)] = self._per_service.get((ns, name), 0) + 1
        return None

    def _give_slot(self, ns: str, name: str) -> None:
        self._in_flight -= 1
        left = self._per_service[(ns, name)] - 1
        if left:
            self._per_service[(ns, name)] = left
        else:
            del self._per_service[(ns, name)]

    # --- one request -------------------------------------------------------------------
    def _bound(self, ns: str, name: str) -> float:
        """How long a request the API server cannot be reached for may wait (the Service's
        hold bound: no API server took it, so nothing of it ran)."""
        svc = self.informer.get(f"{ns}/{name}")
        return holding.hold_seconds(objects.meta(svc).get("annotations") if svc else None)

    async def _send(self, request: web.Request, ns: str, name: str, path: str, body: Any) -> web.StreamResponse:
        """Send to an API server (the next one when one cannot be reached, again until the
        Service's bound while none can), and stream its answer back.  ``body``: bytes,
        None, or the paced stream of a large body (:func:`read_body`)."""
        headers = forwarded_headers(request)
        if isinstance(body, bytes) and request.content_length is None:
            headers["Content-Length"] = str(len(body))   # a chunked body read whole goes sized
        deadline = time.monotonic() + self._bound(ns, name)
        client = self.client
        tried = 0
        while True:
            server = client.server
            try:
                up = await client.session.request(request.method, client.url(path, server), data=body,
                                                  headers=headers, allow_redirects=False)
            except aiohttp.ClientConnectorError as e:   # no connection: nothing was sent
                client.fail_over(server)
                tried += 1
                if tried % len(client.servers) == 0:
                    if time.monotonic() + RETRY_CONNECT > deadline:
                        return _retry_later(f"cannot reach the API server for service {ns}/{name}: {e}")
                    await asyncio.sleep(RETRY_CONNECT)
                continue
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                slow = next((x for x in (e.__cause__, e.__context__) if isinstance(x, TooSlow)), None)
                if slow is not None:
                    raise slow from None   # our client's pace, not the API server
                client.fail_over(server)   # it took the request and went away: the next one
                return _retry_later(f"the API server went away before answering for service {ns}/{name}: {e}")
            return await _relay(request, up)


async def read_body(request: web.Request) -> Any:
    """The request's body: None, bytes when it is at most :data:`BLOCK` bytes (read whole
    within :data:`BODY_SECONDS`), else a stream whose first :data:`BLOCK` bytes came
    within that and whose every further :data:`BLOCK` bytes must come within it too
    (:class:`TooSlow` otherwise)."""
    if not request.body_exists:
        return None
    content = request.content
    head = bytearray()
    deadline = asyncio.get_running_loop().time() + BODY_SECONDS
    try:
        while len(head) <= BLOCK:
            left = deadline - asyncio.get_running_loop().time()
            chunk = await asyncio.wait_for(content.read(BLOCK + 1 - len(head)), max(left, 0))
            if not chunk:
                return bytes(head)
            head += chunk
    except asyncio.TimeoutError:
        raise TooSlow(f"the request body did not come within {BODY_SECONDS:g} s ({len(head)} bytes came): "
                      f"a NodePort takes at least {BLOCK} bytes every {BODY_SECONDS:g} s") from None

    async def rest() -> AsyncIterator[bytes]:
        yield bytes(head)
        loop = asyncio.get_running_loop()
        block, since = 0, loop.time()
        while True:
            try:
                chunk = await asyncio.wait_for(content.read(BLOCK - block), max(since + BODY_SECONDS - loop.time(), 0))
            except asyncio.TimeoutError:
                raise TooSlow(f"the request body came slower than {BLOCK} bytes in {BODY_SECONDS:g} s "
                              f"after {content.total_bytes} bytes") from None
            if not chunk:
                return
            block += len(chunk)
            if block >= BLOCK:
                block, since = 0, loop.time()
            yield chunk
    return rest()


def _too_slow(request: web.Request, why: str) -> web.StreamResponse:
    """``408 Request Timeout`` and the connection closed: its client sent too slowly (what
    is left of its body is not read).  Only before an answer began."""
    resp = web.Response(status=408, body=serving.timeout_body(why), content_type="application/json")
    resp.force_close()
    return resp


def forwarded_headers(request: web.Request) -> CIMultiDict[str]:
    """The request's headers as sent (a repeated one repeated), without hop-by-hop ones and
    Impersonate-* (the node's credentials carry the request, never a caller's wish)."""
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in request.headers.items():
        if k.lower() not in HOP and not k.lower().startswith("impersonate-"):
            out.add(k, v)
    if request.content_length is not None:
        out["Content-Length"] = str(request.content_length)
    return out


def _retry_later(why: str) -> web.Response:
    return web.Response(status=503, text=f"{why}\n", headers={"Retry-After": "1"})


async def _relay(request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
    """Stream the API server's answer back; one that breaks off mid-way ends the client's
    connection (a short body, which the client must take as a failure)."""
    async with up:
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        for k, v in up.headers.items():
            if k.lower() not in HOP:
                resp.headers.add(k, v)
        await resp.prepare(request)
        try:
            async for chunk in up.content.iter_chunked(1 << 16):
                await resp.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionResetError):
            if request.transport is not None:
                request.transport.close()
            return resp
        await resp.write_eof()
        return resp
