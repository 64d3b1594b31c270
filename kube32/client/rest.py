"""The async REST client.

One aiohttp session per :class:`Client` (connection pooling: no per-request
connection setup).  Errors come back as :class:`ApiError` carrying the
server's Status (``code``, ``reason``, ``message``).  Watches are async
iterators of ``(type, object)``; an ERROR event raises ApiError (410 ->
re-list).

Several API servers (control planes on one etcd): a client knows them all
(``servers``; from a kubeconfig, the cluster's ``server`` and the extension
``kube32.io/servers``) and talks to one at a time.  When it cannot reach that one
it moves to the next: a request that never reached a server is sent again to the
next one (any verb); a GET that broke on the way is too; any other broken request
fails with ApiError code 0 (its outcome is unknown) and the next request goes to the
next server.  A broken watch ends with ApiError code 0, and the informer's next
list and watch go to the next server.

A server that hangs (a stopped process, a machine off the network) breaks nothing: its
kernel may even accept connections.  So with several servers, a request or a watch that
heard nothing from its server for `PROBE_AFTER` seconds asks that server's /healthz
(`PROBE_TIMEOUT`; one probe a server at a time, and any answer heard from the server
meanwhile counts): no answer, and the request is broken as above (a GET goes to the
next server, a watch ends with ApiError code 0), within seconds instead of a read
timeout.  /healthz does not depend on the store, so a store outage moves nobody.

Paths go as they are given, percent-encoded already (nothing quoted again, no dot
segment resolved): :meth:`Kind.path <kube32.client.kinds.Kind.path>` and
:func:`kube32.urlpath.api_path` build them, each name one checked segment, so a name
from an object or an annotation addresses only itself (issue 19: a ``restore-from`` of
``../../..`` made a kubelet read a Secret).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import aiohttp
import yaml

from .. import objects, urlpath
from ..terms import KUBECONFIG_SERVERS_EXTENSION
from .kinds import Kind

Obj = dict[str, Any]

SERVERS_EXTENSION = KUBECONFIG_SERVERS_EXTENSION  # a kubeconfig cluster's every API server
PROBE_AFTER = 3.0    # seconds of silence from a server before its /healthz is asked
PROBE_TIMEOUT = 2.0  # a server that does not answer /healthz within this is hung

PATCH_TYPES = {"merge": "application/merge-patch+json",
               "strategic": "application/strategic-merge-patch+json",
               "json": "application/json-patch+json",
               "apply": "application/apply-patch+yaml"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, body: Obj | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.body = body or {}

    @classmethod
    def from_body(cls, status: int, text: str) -> "ApiError":
        try:
            body = json.loads(text)
            return cls(int(body.get("code", status)), body.get("reason", ""), body.get("message", text), body)
        except (json.JSONDecodeError, AttributeError, ValueError):
            return cls(status, "", text[:500])


def kubeconfig_servers(cluster: Obj) -> list[str]:
    """A kubeconfig cluster's API servers: its ``server``, then those its
    ``kube32.io/servers`` extension lists (kubectl ignores the extension)."""
    servers = [cluster["server"]]
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == SERVERS_EXTENSION:
            listed = (ext.get("extension") or {}).get("servers") or []
            servers += [u for u in listed if isinstance(u, str) and u not in servers]
    return servers


def _ssl_from_ca(ca_pem: bytes | None, insecure: bool) -> ssl.SSLContext | bool:
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if ca_pem:
        return ssl.create_default_context(cadata=ca_pem.decode())
    return True


class ServerHung(TimeoutError):
    """The server answered nothing, not even /healthz (see the module docstring)."""


class Client:
    def __init__(self, server: str, token: str | None, *, ca_pem: bytes | None = None,
                 insecure: bool = False, user_agent: str = "kube32", unix_socket: str | None = None,
                 source_address: str | None = None, servers: list[str] | tuple[str, ...] = (),
                 pool: int = 64) -> None:
        """``unix_socket``: reach ``server`` (plain http) through this Unix socket instead of TCP.
        ``source_address``: connect from this local IP (a node's own address: the API server
        signs a node's certificate for the address its join came from).
        ``servers``: every API server of the cluster, to fail over to (``server`` first).
        ``pool``: connections open at once, at most."""
        self.server = server.rstrip("/")
        self.servers = [self.server] + [u.rstrip("/") for u in servers if u.rstrip("/") != self.server]
        self.unix_socket = unix_socket
        self.source_address = source_address
        self.token = token
        self._ssl = _ssl_from_ca(ca_pem, insecure) if server.startswith("https") else False
        self.ca_pem = ca_pem
        self.user_agent = user_agent
        self.pool = pool
        self._session: aiohttp.ClientSession | None = None
        self._heard: dict[str, float] = {}  # server -> when it last sent anything (loop time)
        # Checked before every request but a GET: a reason refuses it (ApiError code 0,
        # reason Fenced), as a leader's controllers once its term may have passed.
        self.guard: Callable[[], str | None] | None = None
        self._probes: dict[str, asyncio.Future[bool]] = {}

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike | None = None, **kw: Any) -> "Client":
        path = path or os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config"
        doc = yaml.safe_load(Path(path).read_text())
        ctx_name = doc.get("current-context")
        ctx = next((c["context"] for c in doc.get("contexts", []) if c["name"] == ctx_name),
                   doc["contexts"][0]["context"] if doc.get("contexts") else {})
        cluster = next((c["cluster"] for c in doc["clusters"] if c["name"] == ctx.get("cluster")),
                       doc["clusters"][0]["cluster"])
        user: dict[str, Any] = next((u["user"] for u in doc.get("users", []) if u["name"] == ctx.get("user")), {})
        ca = None
        if cluster.get("certificate-authority-data"):
            ca = base64.b64decode(cluster["certificate-authority-data"])
        elif cluster.get("certificate-authority"):
            ca = Path(cluster["certificate-authority"]).read_bytes()
        return cls(cluster["server"], user.get("token"), ca_pem=ca,
                   insecure=bool(cluster.get("insecure-skip-tls-verify")), servers=kubeconfig_servers(cluster),
                   **kw)

    def fail_over(self, failed: str) -> None:
        """`failed` could not be reached: the next server is the one (no-op if another
        request moved on already, or there is only one)."""
        if failed == self.server and len(self.servers) > 1:
            self.server = self.servers[(self.servers.index(failed) + 1) % len(self.servers)]

    def sibling(self, user_agent: str | None = None, pool: int | None = None) -> "Client":
        """A client with the same servers (failing over as this one does), source address
        and credentials, and a connection pool of its own (``pool`` connections): requests
        that may wait long (a proxy's) never take this one's connections."""
        other = Client(self.server, self.token, user_agent=user_agent or self.user_agent,
                       unix_socket=self.unix_socket, source_address=self.source_address,
                       servers=self.servers, pool=self.pool if pool is None else pool)
        other._ssl, other.ca_pem, other.guard = self._ssl, self.ca_pem, self.guard
        return other

    def url(self, path: str, server: str | None = None) -> Any:
        """``path`` (percent-encoded already) on ``server``, or on the current one."""
        return urlpath.encoded_url(server or self.server, path)

    def _check_guard(self, method: str) -> None:
        why = self.guard() if self.guard is not None and method.upper() != "GET" else None
        if why:
            raise ApiError(0, "Fenced", why)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": self.user_agent}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self.unix_socket, limit=self.pool) if self.unix_socket
                else aiohttp.TCPConnector(limit=self.pool, ssl=self._ssl,
                                          local_addr=(self.source_address, 0) if self.source_address else None))
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # --- raw -------------------------------------------------------------------
    def request(self, method: str, path: str, **kw: Any):
        """A raw request (an aiohttp context manager); the caller streams the body."""
        self._check_guard(method)
        return self.session.request(method, urlpath.encoded_url(self.server, path), **kw)

    async def post_bytes(self, path: str, data: bytes, content_type: str,
                         params: dict[str, str] | None = None) -> Obj:
        """POST raw bytes (a module, an event payload) and decode the JSON answer."""
        text = await self._send("POST", path, params=params, data=data,
                                headers={"Content-Type": content_type}, ok_below=300)
        return json.loads(text)

    async def post_json(self, path: str, body: Any, timeout: float | None = 30) -> Obj:
        """POST a JSON body to a path outside the kinds' verbs (a TokenReview, a node's
        join) and decode the answer; ApiError as the verbs raise it."""
        return await self._json("POST", path, body=body, timeout=timeout)

    async def _json(self, method: str, path: str, *, params: dict | None = None,
                    body: Any = None, content_type: str = "application/json",
                    timeout: float | None = 30) -> Obj:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        text = await self._send(method, path, params=params, data=data, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout))
        return json.loads(text) if text else {}

    # --- liveness of the servers (see the module docstring) ----------------------
    def _heard_from(self, server: str) -> None:
        self._heard[server] = asyncio.get_running_loop().time()

    async def _answers(self, server: str) -> bool:
        """Whether ``server`` is alive: heard from lately, or its /healthz answers now."""
        if asyncio.get_running_loop().time() - self._heard.get(server, 0.0) < PROBE_AFTER:
            return True
        probe = self._probes.get(server)
        if probe is None or probe.done():
            probe = self._probes[server] = asyncio.ensure_future(self._probe(server))
        return await asyncio.shield(probe)

    async def _probe(self, server: str) -> bool:
        try:
            async with self.session.get(urlpath.encoded_url(server, "/healthz"),
                                        timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
        self._heard_from(server)
        return True

    async def _watched(self, server: str, step: "asyncio.Future[Any]") -> Any:
        """``step``'s result; ServerHung (``step`` cancelled) once ``server`` stays silent
        and fails its probe.  With one server there is nowhere else to go: just wait."""
        if len(self.servers) == 1 or self.unix_socket:
            return await step
        try:
            while True:
                done, _ = await asyncio.wait({step}, timeout=PROBE_AFTER)
                if done:
                    if step.exception() is None:
                        self._heard_from(server)
                    return step.result()
                if not await self._answers(server):
                    raise ServerHung(f"the API server {server} answers nothing, not even /healthz "
                                     f"within {PROBE_TIMEOUT:g} s")
        finally:
            if not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)

    async def _send_once(self, server: str, method: str, path: str, ok_below: int, **kw: Any) -> str:
        async with self.session.request(method, urlpath.encoded_url(server, path), **kw) as r:
            text = await r.text()
            if r.status >= ok_below:
                raise ApiError.from_body(r.status, text)
            return text

    async def send(self, method: str, path: str, *, ok_below: int = 400, idempotent: bool = False,
                   **kw: Any) -> str:
        """One request and its text, failing over as the verbs do; ``idempotent``: the
        request may be sent again on the next server whatever happened to it (a thaw)."""
        return await self._send(method, path, ok_below=ok_below, idempotent=idempotent, **kw)

    async def _send(self, method: str, path: str, *, ok_below: int = 400, idempotent: bool = False,
                    **kw: Any) -> str:
        """One request and its text, on the current server or, when that cannot be
        reached, on the next ones (see the module docstring for which requests go again)."""
        for _ in range(len(self.servers)):
            self._check_guard(method)
            server = self.server
            try:
                return await self._watched(server, asyncio.ensure_future(
                    self._send_once(server, method, path, ok_below, **kw)))
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                self.fail_over(server)
                never_sent = isinstance(e, aiohttp.ClientConnectorError)
                if len(self.servers) == 1 or not (never_sent or idempotent or method == "GET"):
                    raise ApiError(0, "ConnectionError", f"cannot reach the API server {server}: {e}") from e
        raise ApiError(0, "ConnectionError", f"cannot reach any API server of {', '.join(self.servers)}")

    # --- verbs ------------------------------------------------------------------
    async def get(self, kind: Kind, name: str, namespace: str | None = None,
                  subresource: str | None = None) -> Obj:
        return await self._json("GET", kind.path(namespace, name, subresource))

    async def try_get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return await self.get(kind, name, namespace)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    async def list(self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None) -> tuple[list[Obj], str]:
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        out = await self._json("GET", kind.path(namespace), params=params)
        return out.get("items", []), out.get("metadata", {}).get("resourceVersion", "")

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None,
                     subresource_of: str | None = None, subresource: str | None = None) -> Obj:
        ns = namespace or objects.meta(obj).get("namespace")
        path = kind.path(ns, subresource_of, subresource) if subresource_of else kind.path(ns)
        return await self._json("POST", path, body=obj)

    async def post_subresource(self, kind: Kind, name: str, subresource: str, body: Any,
                               namespace: str | None = None, params: dict[str, str] | None = None) -> Obj:
        """POST to a subresource: binding, eviction, replacement."""
        return await self._json("POST", kind.path(namespace, name, subresource), params=params, body=body)

    async def update(self, kind: Kind, obj: Obj, subresource: str | None = None) -> Obj:
        md = obj["metadata"]
        return await self._json("PUT", kind.path(md.get("namespace"), md["name"], subresource), body=obj)

    async def patch(self, kind: Kind, name: str, patch: Any, namespace: str | None = None, *,
                    type: str = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool = False) -> Obj:
        params = {}
        if field_manager:
            params["fieldManager"] = field_manager
        if force:
            params["force"] = "true"
        return await self._json("PATCH", kind.path(namespace, name, subresource), params=params,
                                body=patch, content_type=PATCH_TYPES[type])

    async def delete(self, kind: Kind, name: str, namespace: str | None = None, *,
                     grace_period: int | None = None, uid: str | None = None,
                     propagation: str | None = None) -> Obj:
        body: Obj = {}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if uid:
            body["preconditions"] = {"uid": uid}
        if propagation:
            body["propagationPolicy"] = propagation
        return await self._json("DELETE", kind.path(namespace, name), body=body or None)

    async def watch(self, kind: Kind, namespace: str | None = None, *,
                    label_selector: str | None = None, field_selector: str | None = None,
                    resource_version: str | None = None,
                    timeout_seconds: int | None = None,
                    bookmarks: bool = False) -> AsyncIterator[tuple[str, Obj]]:
        """(type, object) of each event; ``bookmarks``: BOOKMARK events too (an object with
        only its resourceVersion), so a watch resumed after a quiet spell is not too old."""
        params = {"watch": "true"}
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if resource_version:
            params["resourceVersion"] = resource_version
        if timeout_seconds:
            params["timeoutSeconds"] = str(timeout_seconds)
        async for line in self.stream_lines(kind.path(namespace), params):
            ev = json.loads(line)
            if ev.get("type") == "ERROR":
                st = ev.get("object") or {}
                raise ApiError(int(st.get("code", 500)), st.get("reason", ""), st.get("message", ""), st)
            yield ev["type"], ev["object"]

    async def stream_lines(self, path: str, params: dict[str, str] | None = None) -> AsyncIterator[bytes]:
        """The non-empty lines of a streamed GET (a watch, the topic bus), as they arrive."""
        server = self.server
        try:
            opening = asyncio.ensure_future(self.session.get(urlpath.encoded_url(server, path), params=params,
                                                             headers={"Accept": "application/json"}))
            async with await self._watched(server, opening) as r:
                if r.status >= 400:
                    raise ApiError.from_body(r.status, await r.text())
                buf = b""
                while chunk := await self._watched(server, asyncio.ensure_future(r.content.readany())):
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            yield line
        except (aiohttp.ClientError, TimeoutError) as e:
            self.fail_over(server)  # the caller's next list and watch go to the next server
            raise ApiError(0, "ConnectionError", f"stream ended: {e}") from e
