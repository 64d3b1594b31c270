"""Authentication: bearer tokens, made at the control plane's first start.

``<data-dir>/tokens.json`` maps each token to a user (name, groups).  The first
start writes the admin token (``kubernetes-admin`` in ``system:masters``), the
API server's own identity, its controllers' (``system:kube-apiserver``) and a
node bootstrap token (group ``system:bootstrappers:kube32``), and writes
``admin.kubeconfig`` and ``node.kubeconfig`` for them.  Tokens are compared in
constant time; the file is created 0600.  ``/version`` (``/version/`` too), ``/healthz``,
``/readyz`` and ``/livez`` are public, as Kubernetes' ``system:public-info-viewer``
makes them.

More tokens:

* ``--token-auth-file``: kube-apiserver's static token file, CSV lines
  ``token,user,uid,"group1,group2"`` (read at start; ``#`` comments allowed).
* ServiceAccount tokens: ``POST .../serviceaccounts/<name>/token`` (TokenRequest,
  ``kubectl create token``) issues ``k32sa.<payload>.<hmac>``: namespace, name, uid
  and expiry signed with ``<data-dir>/sa.key``.  Such a token names
  ``system:serviceaccount:<ns>:<name>`` (groups ``system:serviceaccounts`` and
  ``system:serviceaccounts:<ns>``) only while it has not expired and a ServiceAccount
  of that name *and uid* exists (the server checks that part): deleting the
  ServiceAccount revokes its tokens.
* Kubelet client tokens ``k32kubelet.<payload>.<hmac>`` (user
  ``system:kube-apiserver-kubelet-client``, no groups): what the API server presents to
  a plain-HTTP kubelet, bound to that one Node (name and uid, in TokenReview's
  ``user.extra``), so worthless at any other kubelet (kube32.apiserver.kubeletcredentials).
* Node credentials: a node that joined with the bootstrap token gets its own
  token ``k32node.<payload>.<hmac>`` (user ``system:node:<name>``, group
  ``system:nodes``): node name and token id signed with ``sa.key``, the id of the
  node's current token kept in the object store (kube32.apiserver.nodetokens), so
  every API server sharing the store and the key accepts it; joining again replaces
  (revokes) the node's previous token.
"""
from __future__ import annotations

import base64
import csv
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..terms import NODE_NAME_EXTRA, NODE_UID_EXTRA

PUBLIC_PATHS = frozenset({"/version", "/version/", "/healthz", "/readyz", "/livez"})
ADMIN = "kubernetes-admin"
APISERVER = "system:kube-apiserver"
# Who the API server is to kubelets: its client certificate's CN, and the user of the
# node-bound tokens plain-HTTP kubelets get (kube32.apiserver.kubeletcredentials), a user
# with no permissions on the API.
KUBELET_CLIENT = "system:kube-apiserver-kubelet-client"
BOOTSTRAP_GROUP = "system:bootstrappers:kube32"
BOOTSTRAP_USER = "system:bootstrap:kube32"
NODES_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"


SA_PREFIX = "k32sa."
NODE_TOKEN_PREFIX = "k32node."
KUBELET_TOKEN_PREFIX = "k32kubelet."
SA_GROUP = "system:serviceaccounts"


class TokenFileError(ValueError):
    pass


@dataclass(frozen=True)
class ServiceAccountRef:
    namespace: str
    name: str
    uid: str


class ServiceAccountTokens:
    """Signed tokens (HMAC-SHA256 with a key of the control plane, ``sa.key``): expiring
    ServiceAccount tokens, and node tokens (kube32.apiserver.nodetokens). Every API server
    with the same key accepts them: several control planes share ``sa.key``."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, payload: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, payload, "sha256").digest()).decode().rstrip("=")

    def sign(self, prefix: str, claims: dict[str, Any]) -> str:
        payload = json.dumps(claims, separators=(",", ":")).encode()
        body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        return f"{prefix}{body}.{self._mac(payload)}"

    def claims(self, prefix: str, token: str) -> dict[str, Any] | None:
        """The claims of a token this key signed under `prefix`, else None."""
        if not token.startswith(prefix) or token.count(".") != 2:
            return None
        body, mac = token[len(prefix):].split(".")
        try:
            payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            claims = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return None
        if not hmac.compare_digest(self._mac(payload), mac) or not isinstance(claims, dict):
            return None
        return claims

    def issue(self, namespace: str, name: str, uid: str, expires_unix: int) -> str:
        return self.sign(SA_PREFIX, {"ns": namespace, "name": name, "uid": uid, "exp": expires_unix})

    def verify(self, token: str, now_unix: float) -> ServiceAccountRef | None:
        claims = self.claims(SA_PREFIX, token)
        if claims is None or not isinstance(claims.get("exp"), int) or claims["exp"] <= now_unix:
            return None
        return ServiceAccountRef(str(claims.get("ns", "")), str(claims.get("name", "")), str(claims.get("uid", "")))


@dataclass(frozen=True)
class NodeTokenRef:
    """What a node token names: its node and the id of the one token the node holds now."""
    node: str
    id: str


@dataclass(frozen=True)
class KubeletTokenRef:
    """What a kubelet client token is bound to: one Node, by name and uid."""
    node: str
    uid: str


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def as_user_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"username": self.name, "uid": self.uid,
                                "groups": list(self.groups) + ["system:authenticated"]}
        bound = self.extra.get("kubelet_node")
        if isinstance(bound, KubeletTokenRef):
            info["extra"] = {NODE_NAME_EXTRA: [bound.node], NODE_UID_EXTRA: [bound.uid]}
        return info


class TokenAuthenticator:
    def __init__(self, tokens: dict[str, User], service_accounts: ServiceAccountTokens | None = None) -> None:
        self._tokens = tokens
        self.service_accounts = service_accounts

    def authenticate(self, header: str | None) -> User | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        presented = header[7:].strip().encode()
        if presented.startswith(SA_PREFIX.encode()) and self.service_accounts is not None:
            ref = self.service_accounts.verify(presented.decode(errors="replace"), time.time())
            if ref is None:
                return None
            # The caller must still check that the ServiceAccount exists with this uid.
            return User(f"system:serviceaccount:{ref.namespace}:{ref.name}",
                        (SA_GROUP, f"{SA_GROUP}:{ref.namespace}"), ref.uid, {"serviceaccount": ref})
        if presented.startswith(NODE_TOKEN_PREFIX.encode()) and self.service_accounts is not None:
            claims = self.service_accounts.claims(NODE_TOKEN_PREFIX, presented.decode(errors="replace"))
            if claims is None or not isinstance(claims.get("node"), str) or not isinstance(claims.get("id"), str):
                return None
            # The caller must still check that this is the node's current token (nodetokens).
            return User(NODE_PREFIX + claims["node"], (NODES_GROUP,), "",
                        {"node_token": NodeTokenRef(claims["node"], claims["id"])})
        if presented.startswith(KUBELET_TOKEN_PREFIX.encode()) and self.service_accounts is not None:
            claims = self.service_accounts.claims(KUBELET_TOKEN_PREFIX, presented.decode(errors="replace"))
            if claims is None or not isinstance(claims.get("node"), str) or not isinstance(claims.get("uid"), str):
                return None
            # The caller must still check that the Node exists with this uid (kubeletcredentials).
            return User(KUBELET_CLIENT, (), "", {"kubelet_node": KubeletTokenRef(claims["node"], claims["uid"])})
        for token, user in self._tokens.items():
            if hmac.compare_digest(token.encode(), presented):
                return user
        return None

    def token_for(self, username: str) -> str:
        for token, user in self._tokens.items():
            if user.name == username:
                return token
        raise KeyError(username)

    def add(self, token: str, user: User) -> None:
        self._tokens[token] = user

    def add_static(self, tokens: dict[str, User]) -> None:
        """--token-auth-file's tokens (kept in memory only)."""
        self._tokens.update(tokens)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def load_or_create_tokens(data_dir: Path) -> TokenAuthenticator:
    path = data_dir / "tokens.json"
    if path.exists():
        raw = json.loads(path.read_text())
    else:
        raw = {
            secrets.token_hex(24): {"username": ADMIN, "groups": ["system:masters"]},
            secrets.token_hex(24): {"username": APISERVER, "groups": ["system:masters"]},
            secrets.token_hex(24): {"username": BOOTSTRAP_USER, "groups": [BOOTSTRAP_GROUP]},
        }
        _write_private(path, json.dumps(raw, indent=2))
    # Older Kube32 kept one token of KUBELET_CLIENT for every plain-HTTP kubelet; no
    # kubelet accepts a token not bound to itself now, so it goes.
    shared = [t for t, u in raw.items() if u.get("username") == KUBELET_CLIENT]
    if shared:
        for t in shared:
            del raw[t]
        _write_private(path, json.dumps(raw, indent=2))
    key_path = data_dir / "sa.key"
    if not key_path.exists():
        _write_private(key_path, secrets.token_hex(32))
    sa = ServiceAccountTokens(key_path.read_text().strip().encode())
    return TokenAuthenticator({t: User(u["username"], tuple(u.get("groups", ())), u.get("uid", ""))
                               for t, u in raw.items()}, sa)


def read_token_file(path: Path) -> dict[str, User]:
    """kube-apiserver's ``--token-auth-file``: ``token,user,uid[,"group1,group2"]`` per line."""
    out: dict[str, User] = {}
    try:
        text = path.read_text()
    except OSError as e:
        raise TokenFileError(f"cannot read the token file {path}: {e.strerror}") from None
    for n, row in enumerate(csv.reader(text.splitlines()), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 3 or not row[0].strip() or not row[1].strip():
            raise TokenFileError(f"{path}:{n}: expected token,user,uid[,\"group1,group2\"]")
        groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) > 3 else ()
        out[row[0].strip()] = User(row[1].strip(), groups, row[2].strip())
    return out


def kubeconfig(server: str, token: str, user: str, ca_pem: bytes | None,
               cluster: str = "kube32") -> str:
    cluster_doc: dict[str, Any] = {"server": server}
    if ca_pem:
        cluster_doc["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    doc = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": cluster, "cluster": cluster_doc}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": f"{user}@{cluster}", "context": {"cluster": cluster, "user": user,
                                                               "namespace": "default"}}],
        "current-context": f"{user}@{cluster}",
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_kubeconfigs(data_dir: Path, server: str, auth: TokenAuthenticator,
                      ca_pem: bytes | None) -> Path:
    admin = data_dir / "admin.kubeconfig"
    _write_private(admin, kubeconfig(server, auth.token_for(ADMIN), "admin", ca_pem))
    _write_private(data_dir / "node.kubeconfig",
                   kubeconfig(server, auth.token_for(BOOTSTRAP_USER), "node-bootstrap", ca_pem))
    return admin
