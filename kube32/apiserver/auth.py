"""Authentication: bearer tokens, made at the control plane's first start.

``<data-dir>/tokens.json`` maps each token to a user (name, groups).  The first
start writes the admin token (``kubernetes-admin`` in ``system:masters``), the
API server's own identity for calling kubelets (``system:kube-apiserver``) and a
node bootstrap token (group ``system:bootstrappers:kube32``), and writes
``admin.kubeconfig`` and ``node.kubeconfig`` for them.  Tokens are compared in
constant time; the file is created 0600.  ``/version``, ``/healthz``,
``/readyz`` and ``/livez`` are public, as Kubernetes' ``system:public-info-viewer``
makes them.
"""
from __future__ import annotations

import base64
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PUBLIC_PATHS = frozenset({"/version", "/healthz", "/readyz", "/livez"})
ADMIN = "kubernetes-admin"
APISERVER = "system:kube-apiserver"
BOOTSTRAP_GROUP = "system:bootstrappers:kube32"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def as_user_info(self) -> dict[str, Any]:
        return {"username": self.name, "uid": self.uid,
                "groups": list(self.groups) + ["system:authenticated"]}


class TokenAuthenticator:
    def __init__(self, tokens: dict[str, User]) -> None:
        self._tokens = tokens

    def authenticate(self, header: str | None) -> User | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        presented = header[7:].strip().encode()
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
            secrets.token_hex(24): {"username": "system:bootstrap:kube32", "groups": [BOOTSTRAP_GROUP]},
        }
        _write_private(path, json.dumps(raw, indent=2))
    return TokenAuthenticator({t: User(u["username"], tuple(u.get("groups", ())), u.get("uid", ""))
                               for t, u in raw.items()})


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
                   kubeconfig(server, auth.token_for("system:bootstrap:kube32"), "node-bootstrap", ca_pem))
    return admin
