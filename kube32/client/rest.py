"""The async REST client.

One aiohttp session per :class:`Client` (connection pooling: no per-request
connection setup).  Errors come back as :class:`ApiError` carrying the
server's Status (``code``, ``reason``, ``message``).  Watches are async
iterators of ``(type, object)``; an ERROR event raises ApiError (410 ->
re-list).
"""
from __future__ import annotations

import base64
import json
import os
import ssl
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import yaml

from .. import urlpath
from .kinds import Kind

Obj = dict[str, Any]

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


def _ssl_from_ca(ca_pem: bytes | None, insecure: bool) -> ssl.SSLContext | bool:
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if ca_pem:
        return ssl.create_default_context(cadata=ca_pem.decode())
    return True


class Client:
    def __init__(self, server: str, token: str | None, *, ca_pem: bytes | None = None,
                 insecure: bool = False, user_agent: str = "kube32", unix_socket: str | None = None,
                 source_address: str | None = None) -> None:
        """``unix_socket``: reach ``server`` (plain http) through this Unix socket instead of TCP.
        ``source_address``: connect from this local IP (a node's own address: the API server
        signs a node's certificate for the address its join came from)."""
        self.server = server.rstrip("/")
        self.unix_socket = unix_socket
        self.source_address = source_address
        self.token = token
        self._ssl = _ssl_from_ca(ca_pem, insecure) if server.startswith("https") else False
        self.ca_pem = ca_pem
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike | None = None, **kw: Any) -> "Client":
        path = path or os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config"
        doc = yaml.safe_load(Path(path).read_text())
        ctx_name = doc.get("current-context")
        ctx = next((c["context"] for c in doc.get("contexts", []) if c["name"] == ctx_name),
                   doc["contexts"][0]["context"] if doc.get("contexts") else {})
        cluster = next((c["cluster"] for c in doc["clusters"] if c["name"] == ctx.get("cluster")),
                       doc["clusters"][0]["cluster"])
        user = next((u["user"] for u in doc.get("users", []) if u["name"] == ctx.get("user")), {})
        ca = None
        if cluster.get("certificate-authority-data"):
            ca = base64.b64decode(cluster["certificate-authority-data"])
        elif cluster.get("certificate-authority"):
            ca = Path(cluster["certificate-authority"]).read_bytes()
        return cls(cluster["server"], user.get("token"), ca_pem=ca,
                   insecure=bool(cluster.get("insecure-skip-tls-verify")), **kw)

    def sibling(self, user_agent: str | None = None) -> "Client":
        """A client with the same server and credentials and a connection pool of its
        own: requests that may wait long (a proxy's) never take this one's connections."""
        other = Client(self.server, self.token, user_agent=user_agent or self.user_agent,
                       unix_socket=self.unix_socket)
        other._ssl, other.ca_pem = self._ssl, self.ca_pem
        return other

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": self.user_agent}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self.unix_socket, limit=64) if self.unix_socket
                else aiohttp.TCPConnector(limit=64, ssl=self._ssl,
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
    def request(self, method: str, path: str, *, encoded: bool = False, **kw: Any):
        """A raw request (an aiohttp context manager); the caller streams the body.
        ``encoded``: ``path`` (and any query on it) is percent-encoded already and goes as
        is, no dot segment resolved and nothing quoted again (see :mod:`kube32.urlpath`)."""
        url = urlpath.encoded_url(self.server, path) if encoded else self.server + path
        return self.session.request(method, url, **kw)

    async def post_bytes(self, path: str, data: bytes, content_type: str,
                         params: dict[str, str] | None = None) -> Obj:
        """POST raw bytes (a module, an event payload) and decode the JSON answer."""
        try:
            async with self.session.post(self.server + path, data=data, params=params,
                                         headers={"Content-Type": content_type}) as r:
                text = await r.text()
                if r.status >= 300:
                    raise ApiError.from_body(r.status, text)
                return json.loads(text)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiError(0, "ConnectionError", f"cannot reach the API server: {e}") from None

    async def post_json(self, path: str, body: Any, timeout: float | None = 30) -> Obj:
        """POST a JSON body to a path outside the kinds' verbs (a TokenReview, a node's
        join) and decode the answer; ApiError as the verbs raise it."""
        return await self._json("POST", path, body=body, timeout=timeout)

    async def _json(self, method: str, path: str, *, params: dict | None = None,
                    body: Any = None, content_type: str = "application/json",
                    timeout: float | None = 30) -> Obj:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"} if data is not None else {"Accept": "application/json"}
        try:
            async with self.session.request(method, self.server + path, params=params, data=data,
                                            headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                text = await r.text()
                if r.status >= 400:
                    raise ApiError.from_body(r.status, text)
                return json.loads(text) if text else {}
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ApiError(0, "ConnectionError", f"cannot reach the API server: {e}") from e

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
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
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
                    timeout_seconds: int | None = None) -> AsyncIterator[tuple[str, Obj]]:
        params = {"watch": "true"}
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
        try:
            async with self.session.get(self.server + path, params=params,
                                        headers={"Accept": "application/json"}) as r:
                if r.status >= 400:
                    raise ApiError.from_body(r.status, await r.text())
                buf = b""
                async for chunk in r.content.iter_any():
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            yield line
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ApiError(0, "ConnectionError", f"stream ended: {e}") from e
