"""What the API server presents to a kubelet, and how it knows it reached the right one.

A node writes its own kubelet endpoint: the Node's ``status.addresses`` (InternalIP),
``status.daemonEndpoints.kubeletEndpoint.Port`` and the annotation
``kube32.io/kubelet-scheme``.  Anyone holding the bootstrap token can be a node, so
whatever the API server sends there must be worthless anywhere else (issue 19: a node
that set its scheme to ``http`` received a token every kubelet accepted).  Hence:

* **HTTPS** (the default): the API server verifies the kubelet's certificate with the
  kubelet-serving signer *for the node's name* (TLS server name = the Node's name; the
  signer gives a node a certificate for its own name only, kube32.apiserver.pki), so a
  Node pointing its endpoint at another node's kubelet gets a refused handshake, not
  that kubelet.  It authenticates with its client certificate
  (``CN=system:kube-apiserver-kubelet-client``, from the API server CA), which nobody
  can replay: no token is sent.  Each node has a TLS context of its own, so a pooled
  connection verified for one node never carries a request for another (whatever the
  HTTP client keys its pool by).
* **plain HTTP** (``--kubelet-insecure-http``): a bearer token bound to that Node,
  ``k32kubelet.<payload>.<hmac>`` naming its name and uid (kube32.apiserver.auth).  A
  kubelet accepts only a token whose TokenReview names its own node
  (``user.extra`` ``authentication.kubernetes.io/node-name``), and the API server only
  while a Node of that name *and uid* exists: deleting the Node revokes it.  Its user,
  ``system:kube-apiserver-kubelet-client``, has no permissions on the API.

So the only kubelet a credential opens is the kubelet of the node it was sent to.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Callable

from ..terms import KubeletScheme
from .auth import KUBELET_TOKEN_PREFIX, KubeletTokenRef, ServiceAccountTokens, User
from .registry import Registry
from .resources import by_plural

MAX_CONTEXTS = 1024   # TLS contexts kept (one per node); past it they are made again


@dataclass(frozen=True)
class KubeletEndpoint:
    """Where a Node's kubelet listens, as the node reported it (checked: an IP address,
    a port, ``http`` or ``https``), and which Node that is."""
    node: str
    uid: str
    scheme: str
    host: str   # an IP address
    port: int

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class Dial:
    """What a request to one kubelet carries: aiohttp's ``headers``, ``ssl`` and
    ``server_hostname`` keyword arguments."""
    headers: dict[str, str]
    ssl: Any
    server_hostname: str | None

    def kwargs(self) -> dict[str, Any]:
        return {"ssl": self.ssl, "server_hostname": self.server_hostname}


class KubeletCredentials:
    """``tls``: makes the client context for kubelets (the kubelet signer to verify them,
    the API server's client certificate); None: no TLS to kubelets (a unit test's API
    server).  ``signer``: signs the node-bound tokens of plain-HTTP kubelets."""

    def __init__(self, signer: ServiceAccountTokens | None, tls: Callable[[], ssl.SSLContext] | None) -> None:
        self._signer = signer
        self._tls = tls
        self._contexts: dict[str, ssl.SSLContext] = {}

    def dial(self, endpoint: KubeletEndpoint) -> Dial:
        if endpoint.scheme == KubeletScheme.HTTPS:
            return Dial({}, self._context(endpoint.node), endpoint.node)
        return Dial(self._token_headers(endpoint), False, None)

    def _context(self, node: str) -> ssl.SSLContext | bool:
        if self._tls is None:
            return True
        ctx = self._contexts.get(node)
        if ctx is None:
            if len(self._contexts) >= MAX_CONTEXTS:
                self._contexts.clear()
            ctx = self._contexts[node] = self._tls()
        return ctx

    def _token_headers(self, endpoint: KubeletEndpoint) -> dict[str, str]:
        if self._signer is None:
            return {}
        token = self._signer.sign(KUBELET_TOKEN_PREFIX, {"node": endpoint.node, "uid": endpoint.uid})
        return {"Authorization": f"Bearer {token}"}


async def still_valid(registry: Registry, user: User) -> bool:
    """The store's part of a kubelet client token's check: its Node still exists, with
    the uid the token names."""
    ref = user.extra.get("kubelet_node")
    if not isinstance(ref, KubeletTokenRef):
        return True
    node = await registry.try_get(by_plural("nodes"), None, ref.node)
    return node is not None and bool(ref.uid) and node["metadata"].get("uid") == ref.uid
