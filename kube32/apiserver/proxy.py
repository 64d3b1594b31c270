"""Forwarding to kubelets: the node proxy, pods/proxy, services/proxy and pods/log.

A kubelet's endpoint is read from its Node (``status.addresses`` InternalIP and
``status.daemonEndpoints.kubeletEndpoint.Port``).  Bodies stream both ways
(no buffering of a snapshot or a followed log); the API server authenticates to
the kubelet with its own token.  A pod's HTTP goes to the kubelet of its node at
``/pods/<ns>/<pod>/http/<path>``; a Service picks one Ready pod that matches
its selector, round robin.  HTTPS kubelets are verified with the cluster CA and
get the API server's client certificate instead of a token (``cert_auth``).

Confinement (see :mod:`kube32.urlpath`): a kubelet URL is only ever made by
:func:`kubelet_url`, from segments each checked and percent-encoded, and sent as
is; so a caller's suffix addresses only what is under the object it was
authorised for (a dot segment in any encoding is a 400, never resolved).  The
object is named ``[scheme:]name[:port]`` (:func:`proxied_name`, Kubernetes'
SplitSchemeNamePort); the port is accepted and ignored (a pod has one handler).
"""
from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import yarl
from aiohttp import web

from .. import urlpath
from . import errors
from .strategy import condition, get_path

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailers", "transfer-encoding", "upgrade", "host", "authorization",
                        "content-length"})


def kubelet_base(node: dict[str, Any]) -> str:
    addrs = get_path(node, "status", "addresses", default=[]) or []
    ip = next((a.get("address") for a in addrs if a.get("type") == "InternalIP"), None)
    port = get_path(node, "status", "daemonEndpoints", "kubeletEndpoint", "Port")
    if not ip or not port:
        raise errors.service_unavailable(f'node "{node["metadata"]["name"]}" has no kubelet endpoint')
    scheme = get_path(node, "metadata", "annotations", "kube32.io/kubelet-scheme", default="http")
    host = f"[{ip}]" if ":" in ip else ip
    return f"{scheme}://{host}:{port}"


PROXY_SCHEMES = ("", "http", "https")


def split_proxied_name(name: str) -> str | None:
    """The object's name in a proxy request's ``[scheme:]name[:port]``; None for more
    parts, another scheme or no name."""
    parts = name.split(":")
    scheme, plain = (parts[0], parts[1]) if len(parts) == 3 else ("", parts[0])
    if len(parts) > 3 or scheme not in PROXY_SCHEMES or not plain:
        return None
    return plain


def proxied_name(kind: str, name: str) -> str:
    """:func:`split_proxied_name`, or a 400 in Kubernetes' words."""
    plain = split_proxied_name(name)
    if plain is None:
        raise errors.bad_request(f'invalid {kind.lower()} request "{name}"')
    return plain


def kubelet_url(base: str, route: list[str], suffix: str | None = None, query: str = "") -> yarl.URL:
    """``base`` + ``route`` (the kubelet path naming one object) + the caller's
    ``suffix`` under it, every segment checked and percent-encoded (a 400 names a
    refused one), ``query`` as received."""
    path = _confined(route + ([] if suffix is None else suffix.split("/")))
    return urlpath.encoded_url(base, "/" + path, query)


def check_suffix(suffix: str) -> None:
    """A 400 for a proxy suffix that could leave its object (before any lookup)."""
    _confined(suffix.split("/"))


def _confined(segments: list[str]) -> str:
    try:
        return urlpath.confined(segments)
    except urlpath.PathRefused as e:
        raise errors.bad_request(str(e)) from None


class KubeletProxy:
    def __init__(self, token: str, ssl: Any = None) -> None:
        self.token = token
        self.ssl = ssl
        # With a client certificate in ``ssl``, HTTPS kubelets get no token: a node that
        # receives the control plane's token could replay it to other kubelets.
        self.cert_auth = False
        self._session: aiohttp.ClientSession | None = None
        self._rr = itertools.count()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                connector=aiohttp.TCPConnector(limit=0, ssl=self.ssl), auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def auth_headers(self, url: yarl.URL) -> dict[str, str]:
        """The token, unless the client certificate speaks for the control plane."""
        if self.token and not (self.cert_auth and url.scheme == "https"):
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    def pick(self, n: int) -> int:
        return next(self._rr) % n

    async def forward(self, request: web.Request, url: yarl.URL, *, method: str | None = None,
                      extra_headers: dict[str, str] | None = None,
                      statuses: bool = False) -> web.StreamResponse:
        """Stream the kubelet's answer back.  ``statuses``: a kubelet's plain-text refusal
        becomes a Status with its words (as the API server answers ``pods/log``), so
        kubectl prints the kubelet's reason instead of an unknown one."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers.update(self.auth_headers(url))
        headers.update(extra_headers or {})
        body = request.content if request.body_exists else None
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
        try:
            upstream = await self.session.request(method or request.method, url, headers=headers,
                                                  data=body, allow_redirects=False)
        except (aiohttp.ClientError, OSError) as e:
            raise errors.service_unavailable(f"error trying to reach the kubelet: {e}") from None
        async with upstream:
            if statuses and upstream.status >= 400 and upstream.content_type == "text/plain":
                text = (await upstream.text()).strip()
                raise errors.APIError(upstream.status, STATUS_REASONS.get(upstream.status, "InternalError"), text)
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    resp.headers.add(k, v)
            if upstream.content_length is not None:
                resp.content_length = upstream.content_length
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_chunked(1 << 20):
                    await resp.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):
                # The kubelet went away mid-stream: end the response short, the
                # client sees a truncated body, which it must treat as a failure.
                request.transport and request.transport.close()
                return resp
            await resp.write_eof()
            return resp


STATUS_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 503: "ServiceUnavailable"}


def ready_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in pods:
        c = condition(p, "Ready")
        if c and c.get("status") == "True" and not p["metadata"].get("deletionTimestamp"):
            out.append(p)
    return out
