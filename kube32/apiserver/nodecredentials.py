"""Node join: ``POST /apis/kube32.io/v1/nodecredentials/<node>`` trades the bootstrap
token for the node's own credentials.

Body ``{"csr": "<PEM certificate signing request>"}`` (optional: without it the
node gets no serving certificate and must serve plain HTTP).  Answer (201)::

    {"kind": "NodeCredentials", "apiVersion": API_VERSION, "metadata": {"name": node},
     "user": "system:node:<node>", "token": "...", "certificate": "<PEM>", "ca": "<PEM>"}

``certificate`` is from the kubelet-serving signer, ``ca`` the API server CA (what
the kubelet verifies the API server and its client certificate with).

Who may call: the bootstrap group (RBAC ``system:kube32:node-bootstrapper``), the
node itself (to rotate), ``system:masters``.  Joining again revokes the node's
previous token (on every API server sharing the store: kube32.apiserver.nodetokens).
As Kubernetes' auto-approved bootstrap CSRs, whoever holds the bootstrap token can join
under a node name nobody has yet: keep ``node.kubeconfig`` as secret as the admin's.

What a node owns, and so what it can get: its node name and its own address, the
address of the TCP connection the request came over (the kubelet connects from
its node address; the control plane knows no other address it did not take from
the node itself).  Hence:

* the certificate names only those (:func:`kube32.apiserver.pki.node_csr_sans`);
* a Node that exists with an ``InternalIP`` is joined or renewed only from that
  address: credentials for a node at 127.0.0.3 are not handed to a request from
  127.0.0.2, whoever's token it carries (to move a node, delete its Node first).

A node held by a running kubelet is not joined again with the bootstrap token (409):
its Lease renewed within its duration and its kubelet endpoint taking connections.  A
second ``kube32-sim fleet`` of the same names would otherwise take the nodes over, its
kubelets start every pod afresh (their state gone with no move), and the first
kubelets' tokens revoked.  A kubelet restarted after a crash joins at once (its old
endpoint takes no connection), and one that stopped renewing its Lease is no holder.
A Node deleted while its kubelet runs leaves the endpoint its Lease names
(``kube32.io/kubelet-endpoint``, written with each renewal): a kubelet that stopped, or
crashed, after its Node was deleted frees the name at once; a Lease naming no endpoint
holds the name until it is old.
The node itself (rotating) and ``system:masters`` are not asked.
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import objects
from ..terms import API_VERSION, GROUP, GROUP_PATH, NODE_LEASE_NAMESPACE, Annotation
from . import bodies, errors, pki
from .proxy import kubelet_endpoint
from .rbac import BOOTSTRAP_GROUP
from .resources import by_plural
from .auth import TokenAuthenticator, User
from .nodeindex import NodeIndex
from .nodetokens import NodeTokens
from .registry import Registry
from .routing import json_response
from .strategy import get_path

Obj = dict[str, Any]
PATH = GROUP_PATH + "/nodecredentials/{name}"
MAX_BODY = 16 << 10
HOLDER_PROBE_TIMEOUT = 1.0   # a kubelet that takes no connection within this is no holder
FUTURE_SKEW = 5.0            # seconds: a Lease written later than now by more than this was not renewed
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def peer_address(request: web.Request) -> str | None:
    """The IP address the request's connection came from (None over a Unix socket).

    The transport's, never a header's: a client cannot claim it."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not isinstance(peer, tuple) or not peer:
        return None
    try:
        ip = ipaddress.ip_address(str(peer[0]).split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped   # a dual-stack socket's ::ffff:127.0.0.2 is 127.0.0.2
    return str(ip)


def _check_registered_address(obj: Obj | None, node: str, address: str | None) -> None:
    """A registered node's credentials go only to a request from its own address."""
    if obj is None:
        return
    registered = [a["address"] for a in get_path(obj, "status", "addresses", default=[]) or []
                  if isinstance(a, dict) and a.get("type") == "InternalIP" and isinstance(a.get("address"), str)]
    if registered and address not in registered:
        raise errors.forbidden(
            f'nodecredentials "{node}" is forbidden: node "{node}" is registered at {", ".join(registered)}, '
            f"and its credentials are issued only to a request from that address (this one came from "
            f"{address or 'a Unix socket'}); to join it from elsewhere, delete the Node first")


async def _check_not_held(registry: Registry, obj: Obj | None, node: str) -> None:
    """A 409 when ``node`` (its Node ``obj``) is held by a running kubelet: its Lease
    renewed within its duration and its kubelet endpoint taking connections. The endpoint
    is the Node's; with the Node deleted, the one its Lease names (a Lease naming none
    holds the name until it is old)."""
    lease = await registry.try_get(by_plural("leases"), NODE_LEASE_NAMESPACE, node)
    if lease is None:
        return
    duration = get_path(lease, "spec", "leaseDurationSeconds", default=40)
    age = _age(lease)
    if age is None or not isinstance(duration, int) or age > duration:
        return
    if obj is None:
        # Its Node deleted while its kubelet still renews the Lease (round 25b): a join
        # now would revoke the running kubelet's token.
        lease_ep = _lease_endpoint(lease)
        if lease_ep is not None and not await _accepts_connections(*lease_ep):
            return
        raise errors.conflict("nodecredentials", node, GROUP, why=(
            f'node "{node}" is held by a running kubelet: its Node is gone but its Lease was renewed '
            f"{age:.0f} s ago" + (f" and its kubelet endpoint {lease_ep[0]}:{lease_ep[1]} takes connections"
                                          if lease_ep else "")
            + f"; stop that kubelet first (or wait until its Lease is {duration} s old), or join under another name"))
    try:
        ep = kubelet_endpoint(obj)
    except errors.APIError:
        return
    if not await _accepts_connections(ep.host, ep.port):
        return
    raise errors.conflict("nodecredentials", node, GROUP, why=(
        f'node "{node}" is held by a running kubelet: its Lease was renewed {age:.0f} s ago and its '
        f"kubelet endpoint {ep.host}:{ep.port} takes connections; stop that kubelet first (or wait until its "
        f"Lease is {duration} s old), or join under another name"))


async def _address_warning(registry: Registry, by_address: NodeIndex, node: str, address: str) -> str | None:
    """What to tell a node joining on ``address`` when another node with it as its
    InternalIP is held by a running kubelet (:func:`_check_not_held`): the two collide on
    their NodePorts (round 25c: the second one's NodePort Services never served).  A
    warning, not a refusal: kube-apiserver takes any addresses, and a worker's default
    address is the control plane's node's (127.0.0.1).  None when no running node has it."""
    for other in await by_address.names(address) or ():
        if other == node:
            continue
        try:
            await _check_not_held(registry, await registry.try_get(by_plural("nodes"), None, other), other)
        except errors.APIError:
            return (f'address {address} is also node "{other}"\'s, whose kubelet runs: the two nodes\' NodePort '
                    "Services collide there (one of them cannot listen); give this node an address of its own "
                    "(kube32-sim worker --address, fleet --first-address)")
    return None


def _age(lease: Obj) -> float | None:
    """Seconds since the Lease was last renewed, by this control plane's clock: since its
    last write (the newest time of its managedFields, which the API server stamps), as
    Kubernetes' node lifecycle judges a Lease by when it saw it change, not by the
    ``renewTime`` the kubelet's clock wrote (a board's clock ahead by a day held its name
    for a day, round 25c).  None: never renewed (no ``renewTime``)."""
    renewed = objects.parse_time(get_path(lease, "spec", "renewTime"))
    if renewed is None:
        return None
    stamps = [objects.parse_time(e.get("time")) for e in objects.meta(lease).get("managedFields") or []
              if isinstance(e, dict)]
    written = max((t for t in stamps if t is not None), default=None)
    age = (objects.now() - (written or renewed)).total_seconds()
    # A stamp in the future was written by a client (managedFields given in the body):
    # no renewal this control plane saw, so it holds nothing.
    return max(age, 0.0) if age > -FUTURE_SKEW else None


def _lease_endpoint(lease: Obj) -> tuple[str, int] | None:
    """The "ip:port" a node's Lease names (its kubelet wrote it), or None when it names
    none that parses."""
    text = get_path(lease, "metadata", "annotations", Annotation.KUBELET_ENDPOINT)
    if not isinstance(text, str):
        return None
    host, _, port = text.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        number = int(port)
    except ValueError:
        return None
    return (str(ip), number) if 0 < number < 65536 else None


async def _accepts_connections(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), HOLDER_PROBE_TIMEOUT)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def add_routes(router: web.UrlDispatcher, registry: Registry, auth: TokenAuthenticator, node_tokens: NodeTokens,
               pki_dir: Path | None, by_address: NodeIndex | None = None) -> None:
    """``pki_dir``: the cluster CA that signs kubelet certificates (None: tokens only);
    ``by_address``: the Nodes by InternalIP (None: a join's address is not compared with
    other nodes')."""
    async def issue(request: web.Request) -> web.Response:
        node = request.match_info["name"]
        if not _SUBDOMAIN.fullmatch(node) or len(node) > 253:
            raise errors.invalid("NodeCredentials", node, [("metadata.name", "Invalid value: not a valid node name")],
                                 GROUP)
        raw = await bodies.read_raw(request, MAX_BODY)
        body = (await bodies.decode_async(raw, bodies.media_type(request), "cannot create nodecredentials")
                if raw.strip() else {})
        if not isinstance(body, dict):
            raise errors.bad_request("cannot create nodecredentials: the body must be an object")
        csr = body.get("csr")
        address = peer_address(request)
        registered = await registry.try_get(by_plural("nodes"), None, node)
        _check_registered_address(registered, node, address)
        user: User = request["user"]
        if BOOTSTRAP_GROUP in user.groups:
            await _check_not_held(registry, registered, node)
        cert = ""
        ca = ""
        if csr:
            if pki_dir is None:
                raise errors.service_unavailable("this control plane has no cluster CA to sign kubelet certificates")
            try:
                cert = pki.sign_node_csr(pki_dir, str(csr).encode(), node, address).decode()
            except pki.CSRError as e:
                raise errors.invalid("NodeCredentials", node, [("csr", f"Invalid value: {e}")], GROUP) from None
            ca = pki.ensure_pki(pki_dir).apiserver.read_text()
        warning = (await _address_warning(registry, by_address, node, address)
                   if by_address is not None and address else None)
        token = await node_tokens.issue(auth.service_accounts, node)
        return json_response({"kind": "NodeCredentials", "apiVersion": API_VERSION,
                              "metadata": {"name": node}, "user": f"system:node:{node}",
                              "token": token, "certificate": cert, "ca": ca,
                              "warnings": [warning] if warning else []}, 201)

    router.add_post(PATH, issue)
