"""Node tokens that every API server of a cluster accepts, and their revocation.

A node's token (``k32node.<payload>.<hmac>``, kube32.apiserver.auth) names the node and
a random token id, signed with the control planes' shared key.  Which id is the node's
current one lives in the object store, in the Secret ``kube-system/kube32-node-token-
<hash of the node name>`` (type ``kube32.io/node-token``, data ``node`` and ``id``):
several API servers on one etcd all see it, so a node that joined through one
API server is known by every other, and joining again (a new id) revokes the previous
token on all of them.  No token itself is stored, only its id.

Checked on every request of a node (:meth:`NodeTokens.still_valid`, after the signature):
an id this API server read as current less than `CACHE_SECONDS` ago passes without a
read; any other is looked up.  So a new token works on every API server at once, and
a revoked one stops on the API server that issued its successor at once, on the
others within `CACHE_SECONDS`.
"""
from __future__ import annotations

import base64
import hashlib
import secrets
import time
from typing import Any

from ..terms import NODE_TOKEN_SECRET_TYPE, Label
from . import errors
from .auth import NODE_TOKEN_PREFIX, NodeTokenRef, ServiceAccountTokens, User
from .registry import Registry
from .resources import by_plural

SECRET_TYPE = NODE_TOKEN_SECRET_TYPE
NAMESPACE = "kube-system"
CACHE_SECONDS = 5.0


def secret_name(node: str) -> str:
    return "kube32-node-token-" + hashlib.sha256(node.encode()).hexdigest()[:20]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class NodeTokens:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._checked: dict[str, tuple[str, float]] = {}  # node -> (current id, when read)

    async def issue(self, signer: ServiceAccountTokens | None, node: str) -> str:
        """A new token for `node`; its previous token stops working."""
        if signer is None:
            raise errors.service_unavailable("this API server has no key to sign node tokens")
        token_id = secrets.token_hex(16)
        res = by_plural("secrets")
        data = {"node": _b64(node), "id": _b64(token_id)}
        try:
            await self.registry.create(res, NAMESPACE, {
                "apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
                "metadata": {"name": secret_name(node), "namespace": NAMESPACE,
                             "labels": {Label.NODE_TOKEN: "true"}},
                "data": data})
        except errors.APIError as e:
            if e.code != 409:
                raise
            await self.registry.mutate(res, NAMESPACE, secret_name(node), lambda s: {**s, "data": data})
        self._checked[node] = (token_id, time.monotonic())
        return signer.sign(NODE_TOKEN_PREFIX, {"node": node, "id": token_id})

    async def still_valid(self, user: User) -> bool:
        ref = user.extra.get("node_token")
        if not isinstance(ref, NodeTokenRef):
            return True
        cached = self._checked.get(ref.node)
        if cached is not None and cached[0] == ref.id and time.monotonic() - cached[1] < CACHE_SECONDS:
            return True
        # Not known here as current (new from another API server, or revoked): the store says.
        secret = await self.registry.try_get(by_plural("secrets"), NAMESPACE, secret_name(ref.node))
        current = _decoded(secret, "id") if secret and _decoded(secret, "node") == ref.node else None
        if current is not None:
            self._checked[ref.node] = (current, time.monotonic())
        return current == ref.id


def _decoded(secret: dict[str, Any], key: str) -> str | None:
    try:
        return base64.b64decode((secret.get("data") or {}).get(key) or "").decode()
    except (ValueError, UnicodeDecodeError):
        return None
