"""Node join: ``POST /apis/kube32.io/v1/nodecredentials/<node>`` trades the bootstrap
token for the node's own credentials.

Body ``{"csr": "<PEM certificate signing request>"}`` (optional: without it the
node gets no serving certificate and must serve plain HTTP).  Answer (201)::

    {"kind": "NodeCredentials", "apiVersion": "kube32.io/v1", "metadata": {"name": node},
     "user": "system:node:<node>", "token": "...", "certificate": "<PEM>", "ca": "<PEM>"}

Who may call: the bootstrap group (RBAC ``system:kube32:node-bootstrapper``), the
node itself (to rotate), ``system:masters``.  Joining again revokes the node's
previous token.  As Kubernetes' auto-approved bootstrap CSRs, whoever holds the
bootstrap token can join under any node name: keep ``node.kubeconfig`` as secret
as the admin's.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from . import bodies, errors, pki

if TYPE_CHECKING:
    from .server import APIServer

PATH = "/apis/kube32.io/v1/nodecredentials/{name}"
MAX_BODY = 16 << 10
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def add_routes(router: web.UrlDispatcher, server: "APIServer") -> None:
    async def issue(request: web.Request) -> web.Response:
        from .server import json_response
        node = request.match_info["name"]
        if not _SUBDOMAIN.fullmatch(node) or len(node) > 253:
            raise errors.invalid("NodeCredentials", node, [("metadata.name", "Invalid value: not a valid node name")],
                                 "kube32.io")
        raw = await bodies.read_raw(request, MAX_BODY)
        body = (await bodies.decode_async(raw, bodies.media_type(request), "cannot create nodecredentials")
                if raw.strip() else {})
        if not isinstance(body, dict):
            raise errors.bad_request("cannot create nodecredentials: the body must be an object")
        csr = body.get("csr")
        cert = ""
        ca = ""
        if csr:
            pki_dir: Path | None = server.pki_dir
            if pki_dir is None:
                raise errors.service_unavailable("this control plane has no cluster CA to sign kubelet certificates")
            try:
                cert = pki.sign_node_csr(pki_dir, str(csr).encode(), node).decode()
            except pki.CSRError as e:
                raise errors.invalid("NodeCredentials", node, [("csr", f"Invalid value: {e}")], "kube32.io") from None
            ca = (pki_dir / "ca.crt").read_text()
        token = server.auth.issue_node_token(node)
        return json_response({"kind": "NodeCredentials", "apiVersion": "kube32.io/v1",
                              "metadata": {"name": node}, "user": f"system:node:{node}",
                              "token": token, "certificate": cert, "ca": ca}, 201)

    router.add_post(PATH, issue)
