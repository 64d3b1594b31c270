"""Forwarding to kubelets: the node proxy, pods/proxy, services/proxy and pods/log.

A kubelet's endpoint is read from its Node (``status.addresses`` InternalIP,
``status.daemonEndpoints.kubeletEndpoint.Port``, the ``kube32.io/kubelet-scheme``
annotation), which the node writes itself: :func:`kubelet_endpoint` takes only an IP
address, a port and ``http``/``https`` from it (anything else is a 503 naming the
field), and what the request carries - and how the kubelet is verified to be that
node's - is :mod:`.kubeletcredentials`'s.  Bodies stream both ways (no buffering of a
snapshot or a followed log).  A pod's HTTP goes to the kubelet of its node at
``/pods/<ns>/<pod>/http/<path>``; a Service picks one Ready pod that matches its
selector, round robin.

Confinement (see :mod:`kube32.urlpath`): a kubelet URL is only ever made by
:func:`kubelet_url`, from segments each checked and percent-encoded, and sent as
is; so a caller's suffix addresses only what is under the object it was
authorised for (a dot segment in any encoding is a 400, never resolved).  The
object is named ``[scheme:]name[:port]`` (:func:`proxied_name`, Kubernetes'
SplitSchemeNamePort); the port is accepted and ignored (a pod has one handler).
"""
from __future__ import annotations

import ipaddress
import itertools
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl
from aiohttp import web
from multidict import CIMultiDict

from .. import holding, urlpath
from ..terms import Annotation, Condition, KubeletScheme
from . import errors
from .kubeletcredentials import KubeletCredentials, KubeletEndpoint
from .strategy import condition, get_path

ORDER = holding.ORDER.lower()
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailers", "transfer-encoding", "upgrade", "host", "authorization",
                        "content-length"})


def kubelet_endpoint(node: dict[str, Any]) -> KubeletEndpoint:
    """The Node's kubelet endpoint, each field checked (the node wrote them): a 503 that
    names the field when it is missing or not what it must be."""
    md = node["metadata"]
    name = md["name"]
    addrs = get_path(node, "status", "addresses", default=[]) or []
    ip = next((a.get("address") for a in addrs if isinstance(a, dict) and a.get("type") == "InternalIP"), None)
    port = get_path(node, "status", "daemonEndpoints", "kubeletEndpoint", "Port")
    if not ip or not port:
        raise errors.service_unavailable(f'node "{name}" has no kubelet endpoint')
    try:
        host = str(ipaddress.ip_address(ip)) if isinstance(ip, str) else ""
    except ValueError:
        host = ""
    if not host:
        raise errors.service_unavailable(f'node "{name}" has no kubelet endpoint: its InternalIP {ip!r} is not '
                                         "an IP address")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise errors.service_unavailable(f'node "{name}" has no kubelet endpoint: its kubelet port {port!r} is not '
                                         "a port number")
    scheme = get_path(node, "metadata", "annotations", Annotation.KUBELET_SCHEME, default=KubeletScheme.HTTP)
    if scheme not in KubeletScheme.ALL:
        raise errors.service_unavailable(f'node "{name}" has no kubelet endpoint: its annotation '
                                         f'{Annotation.KUBELET_SCHEME} is {scheme!r}, not "http" or "https"')
    return KubeletEndpoint(name, str(md.get("uid") or ""), scheme, host, port)


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


@dataclass(frozen=True)
class KubeletURL:
    """A URL on one node's kubelet (what :class:`KubeletProxy` sends to)."""
    endpoint: KubeletEndpoint
    url: yarl.URL


def kubelet_url(endpoint: KubeletEndpoint, route: list[str], suffix: str | None = None,
                query: str = "") -> KubeletURL:
    """``endpoint`` + ``route`` (the kubelet path naming one object) + the caller's
    ``suffix`` under it, every segment checked and percent-encoded (a 400 names a
    refused one), ``query`` as received."""
    path = _confined(route + ([] if suffix is None else suffix.split("/")))
    return KubeletURL(endpoint, urlpath.encoded_url(endpoint.base, "/" + path, query))


def check_suffix(suffix: str) -> None:
    """A 400 for a proxy suffix that could leave its object (before any lookup)."""
    _confined(suffix.split("/"))


def _confined(segments: list[str]) -> str:
    try:
        return urlpath.confined(segments)
    except urlpath.PathRefused as e:
        raise errors.bad_request(str(e)) from None


class KubeletProxy:
    """Requests to kubelets, each with what :mod:`.kubeletcredentials` gives its node."""

    def __init__(self, credentials: KubeletCredentials) -> None:
        self.credentials = credentials
        self._session: aiohttp.ClientSession | None = None
        self._rr = itertools.count()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def request(self, method: str, target: KubeletURL, *, headers: Any = None, **kw: Any) -> Any:
        """One request to ``target``'s kubelet (an aiohttp context manager), with that
        node's credentials and TLS verification; never a redirect followed.  ``headers``:
        a mapping or a multidict (a repeated header stays repeated)."""
        dial = self.credentials.dial(target.endpoint)
        sent: CIMultiDict[str] = CIMultiDict(headers or {})
        sent.update(dial.headers)
        return self.session.request(method, target.url, headers=sent,
                                    allow_redirects=False, **dial.kwargs(), **kw)

    def pick(self, n: int) -> int:
        return next(self._rr) % n

    async def forward(self, request: web.Request, target: KubeletURL, *, method: str | None = None,
                      extra_headers: dict[str, str] | None = None,
                      statuses: bool = False) -> web.StreamResponse:
        """Stream the kubelet's answer back.  ``statuses``: a kubelet's plain-text refusal
        becomes a Status with its words (as the API server answers ``pods/log``), so
        kubectl prints the kubelet's reason instead of an unknown one."""
        body = request.content if request.body_exists else None
        upstream = await self.send(request, target, body, method=method, extra_headers=extra_headers)
        return await self.relay(request, upstream, statuses=statuses)

    async def send(self, request: web.Request, target: KubeletURL, body: Any, *, method: str | None = None,
                   extra_headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        """Send ``request`` (its headers, ``body``: the request's stream, bytes or None)
        to ``target``; the kubelet's answer once its headers are in.  A kubelet that could
        not be reached (no connection made, nothing sent) is :class:`Unreached`."""
        headers: CIMultiDict[str] = CIMultiDict()   # a repeated header goes repeated, as it came
        for k, v in request.headers.items():
            if k.lower() not in HOP_BY_HOP and k.lower() != ORDER:   # only the hold numbers requests
                headers.add(k, v)
        headers.update(extra_headers or {})
        if isinstance(body, bytes):
            headers["Content-Length"] = str(len(body))
        elif request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
        try:
            return await self.request(method or request.method, target, headers=headers, data=body)
        except aiohttp.ClientConnectorCertificateError as e:
            # Whoever listens there is not that node's kubelet (another node's, or none).
            raise Unreached(f'error trying to reach the kubelet of node "{target.endpoint.node}": the '
                            f"server at {target.endpoint.base} is not it: {e.certificate_error}") from None
        except aiohttp.ClientConnectorError as e:
            raise Unreached(f"error trying to reach the kubelet: {e}") from None
        except aiohttp.ClientResponseError as e:
            # It answered, not in HTTP: the pod's answer is lost, not unavailable.
            raise errors.APIError(502, "BadGateway", f'the kubelet of node "{target.endpoint.node}" sent an '
                                  f"answer that is not valid HTTP: {e.message}") from None
        except (aiohttp.ClientError, OSError) as e:
            # Sent, and the connection broke before an answer: not held (the pod may have
            # begun it), but as unavailable as a refusal, so it says when to ask again.
            raise errors.service_unavailable(f"error trying to reach the kubelet: {e}", retry_after=1) from None

    async def relay(self, request: web.Request, upstream: aiohttp.ClientResponse, *,
                    statuses: bool = False) -> web.StreamResponse:
        """Stream the kubelet's answer (from :meth:`send`) back to the client."""
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
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
            return resp


class Unreached(errors.APIError):
    """No connection to the kubelet could be made: the request was never sent (503, with
    Retry-After: 1, as the kubelet's own refusal of a request its pod did not begin)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "ServiceUnavailable", message, headers={"Retry-After": "1"})


STATUS_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 503: "ServiceUnavailable"}


def ready_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in pods:
        c = condition(p, Condition.READY)
        if c and c.get("status") == "True" and not p["metadata"].get("deletionTimestamp"):
            out.append(p)
    return out
