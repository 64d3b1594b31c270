"""Joining a cluster: the bootstrap token buys the node its own identity.

At start the kubelet makes a key pair for its endpoint, sends a certificate
signing request to ``POST /apis/kube32.io/v1/nodecredentials/<node>`` with the
client it was given (the bootstrap token), and receives its own token (user
``system:node:<node>``, group ``system:nodes``) and a serving certificate signed
by the kubelet-serving signer for the node's own address and name only (the CSR
names just those; the API server takes the address from the connection, so the
client connects from it: :func:`own_address`; and it verifies a kubelet by its node's
name, so the name is what makes the kubelet the node's).  From then on the client carries the
node's token, so the node authorizer limits what this kubelet can read and write;
the key never leaves the node.  Without a CSR (``--kubelet-insecure-http``) the
node still gets its token but serves plain HTTP.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..client import ApiError, Client
from ..urlpath import group_path

log = logging.getLogger("kube32.kubelet")

CN_PREFIX = "system:node:"
# X.509 bounds a common name at 64 characters (ub-common-name) and cryptography holds
# to it, so a node with a serving certificate has a name of at most 52.
MAX_CERTIFIED_NAME = 64 - len(CN_PREFIX)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def node_name_problem(name: str, serving_cert: bool = True) -> str | None:
    """Why ``name`` cannot be a node's name (None when it can): a DNS subdomain of at
    most 253 characters, labels of at most 63, and of at most `MAX_CERTIFIED_NAME` when the
    node gets a serving certificate (its CN is ``system:node:<name>``)."""
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name) or any(len(label) > 63 for label in name.split(".")):
        return (f'"{name}" is not a valid node name: lower-case letters, digits, "-" and ".", at most 253 '
                "characters, 63 between dots, starting and ending with a letter or digit")
    if serving_cert and len(name) > MAX_CERTIFIED_NAME:
        return (f'node name "{name}" has {len(name)} characters: a node with a serving certificate has at most '
                f"{MAX_CERTIFIED_NAME} (its certificate's common name {CN_PREFIX}<name> holds at most 64)")
    return None


@dataclass(frozen=True)
class NodeCredentials:
    user: str
    token: str
    certificate: bytes   # PEM, empty without a CSR
    key: bytes           # PEM, the private key of the certificate
    ca: bytes


def own_address(host: str) -> str | None:
    """The address a node connects from: ``host`` when it is one IP address (not a
    wildcard such as 0.0.0.0 nor a name), else None (the system picks)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if ip.is_unspecified else str(ip)


def make_csr(node: str, hosts: list[str]) -> tuple[bytes, bytes]:
    """(key PEM, CSR PEM) for the node's endpoint at ``hosts``."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys(h for h in hosts if h):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{CN_PREFIX}{node}")]))
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


async def join(client: Client, node: str, hosts: list[str], *, serving_cert: bool = True) -> NodeCredentials:
    """Trade the client's (bootstrap) token for the node's credentials; the client
    carries the node's token afterwards."""
    key_pem, csr_pem = make_csr(node, hosts) if serving_cert else (b"", b"")
    body = {"csr": csr_pem.decode()} if serving_cert else {}
    try:
        out = await client.post_json(group_path("nodecredentials", node), body)
    except ApiError as e:
        raise ApiError(e.code, e.reason, f"node {node} could not join the cluster: {e.message}") from None
    for warning in out.get("warnings") or []:   # e.g. another running node has this address
        log.warning("node %s joined, but: %s", node, warning)
    await client.close()            # the next session carries the node's own token
    client.token = out["token"]
    return NodeCredentials(out.get("user", f"system:node:{node}"), out["token"],
                           (out.get("certificate") or "").encode(), key_pem, (out.get("ca") or "").encode())


def server_context(creds: NodeCredentials, directory: Path | None = None) -> ssl.SSLContext:
    """A TLS server context with the node's certificate (files written 0600, as ssl needs paths)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        crt, key = Path(tmp) / "kubelet.crt", Path(tmp) / "kubelet.key"
        for path, data in ((crt, creds.certificate), (key, creds.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(crt, key)
    return ctx
