"""The cluster's two certificate authorities (TLS is on by default).

kubectl sends bearer tokens only over TLS, and snapshot data is as secret as a
Secret, so the control plane makes its PKI at its first start in ``<data-dir>/pki``
(keys 0600).  As Kubernetes (the API server's CA apart from the kubelet-serving
signer), two signers with distinct trust:

* ``ca.crt`` / ``ca.key``, the **API server CA** (``CN=kube32-apiserver-ca``).  It
  signs the API server's serving certificate (``apiserver.crt``: the bind address,
  ``127.0.0.1``, ``localhost``, the host's name) and the client certificate the API
  server presents to kubelets (``apiserver-kubelet-client.crt``,
  ``CN=system:kube-apiserver-kubelet-client``, client auth only).  It never signs
  what a node asks for.  The kubeconfigs carry this CA alone, so a client trusts
  only the API server; kubelets get it at join to verify the API server and its
  client certificate.
* ``kubelet-ca.crt`` / ``kubelet-ca.key``, the **kubelet-serving signer**
  (``CN=kube32-kubelet-serving-ca``).  It signs node certificate signing requests
  only (:func:`sign_node_csr`: ``CN=system:node:<node>, O=system:nodes``, server
  auth only), and only for names the node owns: its own node name as DNS name and
  its own address as IP address, the address its request came from
  (:func:`node_csr_sans` refuses anything else with the reason).  Only the API
  server trusts it, to verify kubelets (:func:`client_context`).  So a node's
  certificate never passes for the API server: no client trusts its issuer, and
  it names no address but the node's.

Every certificate carries a Subject Key Identifier, an Authority Key Identifier,
critical basicConstraints and critical keyUsage (RFC 5280; Python 3.13's default
``VERIFY_X509_STRICT`` refuses a chain without them).  The keys are made here (the
CAs, the API server's) or on the node (its key never leaves it: only the CSR
travels).

Upgrade: the PKI of an older Kube32 (one CA for the API server and the nodes, no key
identifiers) signed node certificates for any name, the API server's included, so
keeping it would keep such certificates trusted.  :func:`ensure_pki` recognises it
(a CA without a Subject Key Identifier) and replaces it whole; nodes started before
must restart, as their ``node.kubeconfig`` (rewritten at every start) carries the
new CA.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("kube32.pki")

APISERVER_CA = "ca"              # file stem: ca.crt, ca.key
KUBELET_CA = "kubelet-ca"        # file stem: kubelet-ca.crt, kubelet-ca.key
_CA_COMMON_NAMES = {APISERVER_CA: "kube32-apiserver-ca", KUBELET_CA: "kube32-kubelet-serving-ca"}
KUBELET_CLIENT_CN = "system:kube-apiserver-kubelet-client"
APISERVER_SERVING = "apiserver"  # the API server's serving certificate: file stem and CN
CA_DAYS, SERVING_DAYS, NODE_DAYS = 3650, 825, 365
MAX_CSR_SANS = 16

PrivateKey = Union[ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey]
PublicKey = Union[ec.EllipticCurvePublicKey, rsa.RSAPublicKey, ed25519.Ed25519PublicKey]


class PKIError(RuntimeError):
    """The data directory's PKI cannot be used (unreadable, not ours)."""


class CSRError(ValueError):
    """A node's certificate signing request is refused; the message says why."""


@dataclass(frozen=True)
class Authorities:
    """Where the two CA certificates are (see the module docstring)."""
    apiserver: Path   # ca.crt: what clients and kubelets trust
    kubelet: Path     # kubelet-ca.crt: what the API server trusts for kubelets


@dataclass(frozen=True)
class _Signer:
    cert: x509.Certificate
    key: PrivateKey


# --- files ----------------------------------------------------------------------------
def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _save(pki: Path, stem: str, cert: x509.Certificate, key: PrivateKey) -> tuple[Path, Path]:
    crt, key_path = pki / f"{stem}.crt", pki / f"{stem}.key"
    _write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), True)
    _write(crt, cert.public_bytes(serialization.Encoding.PEM), False)
    return crt, key_path


def _load_signer(pki: Path, stem: str) -> _Signer:
    crt, key_path = pki / f"{stem}.crt", pki / f"{stem}.key"
    try:
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    except (OSError, ValueError, TypeError) as e:
        raise PKIError(f"cannot read the CA {crt} / {key_path}: {e}; move {pki} away to make a new PKI "
                       "(every node must then rejoin)") from None
    return _Signer(cert, key)  # type: ignore[arg-type]


# --- certificates -----------------------------------------------------------------------
def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _key_usage(public_key: PublicKey, *, ca: bool) -> x509.KeyUsage:
    # RSA keys also encipher (TLS 1.2's RSA key exchange); EC and Ed25519 keys only sign.
    return x509.KeyUsage(digital_signature=True, key_encipherment=not ca and isinstance(public_key, rsa.RSAPublicKey),
                         content_commitment=False, data_encipherment=False, key_agreement=False,
                         key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False)


def _ski(cert: x509.Certificate) -> x509.SubjectKeyIdentifier | None:
    try:
        return cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return None


def _new_ca(pki: Path, stem: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _CA_COMMON_NAMES[stem])])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
            # path_length=0: a CA of Kube32 signs end certificates only, never another CA.
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(key.public_key(), ca=True), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(key, hashes.SHA256()))
    _save(pki, stem, cert, key)


def _sign(signer: _Signer, subject: x509.Name, public_key: PublicKey, usage: x509.ObjectIdentifier,
          sans: list[x509.GeneralName], days: int) -> x509.Certificate:
    """An end certificate for one purpose (server or client auth), with key identifiers."""
    ski = _ski(signer.cert)
    assert ski is not None, "ensure_pki replaces a CA without a Subject Key Identifier"
    now = _now()
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(signer.cert.subject)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(_key_usage(public_key, ca=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer.key, hashes.SHA256())  # our CAs' keys are EC


def _names(hosts: list[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    return sans


def _cn(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


# --- the PKI ----------------------------------------------------------------------------
def _is_legacy(pki: Path) -> bool:
    """A PKI of Kube32 before the two signers: its CA has no Subject Key Identifier."""
    crt = pki / f"{APISERVER_CA}.crt"
    if not crt.exists():
        return False
    try:
        return _ski(x509.load_pem_x509_certificate(crt.read_bytes())) is None
    except ValueError as e:
        raise PKIError(f"cannot read the CA {crt}: {e}; move {pki} away to make a new PKI "
                       "(every node must then rejoin)") from None


def ensure_pki(pki: Path) -> Authorities:
    """Both CAs: loaded, made at the first start, or replaced when an older Kube32 made them."""
    pki.mkdir(mode=0o700, parents=True, exist_ok=True)
    if _is_legacy(pki):
        log.warning("%s holds the PKI of an older Kube32 (one CA for the API server and the nodes, which "
                    "signed node certificates for any name): replacing it with two new CAs; restart every "
                    "node that joined before (its node.kubeconfig carries the new CA)", pki)
        for old in pki.iterdir():
            if old.suffix in (".crt", ".key"):
                old.unlink()
    for stem in (APISERVER_CA, KUBELET_CA):
        if not ((pki / f"{stem}.crt").exists() and (pki / f"{stem}.key").exists()):
            _new_ca(pki, stem)
    return Authorities(pki / f"{APISERVER_CA}.crt", pki / f"{KUBELET_CA}.crt")


def issue_serving_cert(pki: Path, name: str, hosts: list[str]) -> tuple[Path, Path]:
    """The API server's serving certificate for ``hosts`` (IPs or DNS names): API server CA, server auth."""
    ensure_pki(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(_load_signer(pki, APISERVER_CA), _cn(name), key.public_key(), ExtendedKeyUsageOID.SERVER_AUTH,
                 _names(hosts), SERVING_DAYS)
    return _save(pki, name, cert, key)


def apiserver_cert_problem(der: bytes) -> str | None:
    """Why a certificate (DER, already verified to chain to the API server CA) is not an
    API server's serving certificate, or None when it is one: ``CN=apiserver``, server
    auth, not a node's (``O=system:nodes``, ``CN=system:node:...``), not a client's."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as e:
        return f"the certificate cannot be read: {e}"
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    if cns != [APISERVER_SERVING] or "system:nodes" in orgs:
        return f"its subject is {cert.subject.rfc4514_string()}, not CN={APISERVER_SERVING}"
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "it names no extended key usage"
    if list(usages) != [ExtendedKeyUsageOID.SERVER_AUTH]:
        return "it is not a serving certificate (extended key usage other than server auth alone)"
    return None


def issue_client_cert(pki: Path, name: str, common_name: str) -> tuple[Path, Path]:
    """A client certificate (``CN=common_name``) from the API server CA: the API server
    presents it to kubelets, which accept this CN only."""
    ensure_pki(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(_load_signer(pki, APISERVER_CA), _cn(common_name), key.public_key(),
                 ExtendedKeyUsageOID.CLIENT_AUTH, [], SERVING_DAYS)
    return _save(pki, name, cert, key)


def default_hosts(bind: str) -> list[str]:
    return [bind, "127.0.0.1", "localhost", socket.gethostname()]


def server_context(crt: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(crt, key)
    return ctx


def client_context(ca: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """Verify servers with ``ca`` alone (the API server CA, or for kubelets the kubelet signer)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


# --- node certificates ------------------------------------------------------------------
def _is_loopback_name(name: str) -> bool:
    # RFC 6761: localhost and every name under it is the loopback of whoever resolves it.
    name = name.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def _check_key(public_key: object) -> None:
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        if public_key.curve.name not in ("secp256r1", "secp384r1", "secp521r1"):
            raise CSRError(f"the certificate signing request's key is on curve {public_key.curve.name}; "
                           "use P-256, P-384 or P-521")
    elif isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size < 2048:
            raise CSRError(f"the certificate signing request's RSA key has {public_key.key_size} bits; "
                           "at least 2048 are needed")
    elif not isinstance(public_key, ed25519.Ed25519PublicKey):
        raise CSRError(f"the certificate signing request's key is a {type(public_key).__name__}; "
                       "use an EC (P-256, P-384, P-521), RSA (2048 bits or more) or Ed25519 key")


def node_csr_sans(csr: x509.CertificateSigningRequest, node: str,
                  address: str | None) -> list[x509.GeneralName]:
    """The names a node's certificate gets, or :class:`CSRError` saying why not.

    A node may name only what it owns: DNS name ``node`` (never a localhost name) and
    IP address ``address``, the address its request came from (None: not over IP, so
    no IP address at all).  The CSR's subject must be ``CN=system:node:<node>``.
    """
    if not csr.is_signature_valid:
        raise CSRError("the certificate signing request's signature is not valid")
    _check_key(csr.public_key())
    want = f"system:node:{node}"
    cns = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if cns != [want]:
        raise CSRError(f"the certificate signing request's subject is {csr.subject.rfc4514_string() or 'empty'}; "
                       f"this node's must be CN={want}")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CSRError("the certificate signing request names no IP address or DNS name") from None
    names = list(san)
    if not names or len(names) > MAX_CSR_SANS or any(not isinstance(n, (x509.IPAddress, x509.DNSName)) for n in names):
        raise CSRError(f"the certificate signing request may name 1 to {MAX_CSR_SANS} IP addresses "
                       "and DNS names, and nothing else")
    own_ip = ipaddress.ip_address(address) if address else None
    for n in names:
        if isinstance(n, x509.IPAddress):
            if own_ip is None:
                raise CSRError(f"the certificate signing request names IP address {n.value}, but this request "
                               "did not come over IP, so the node's own address is not known")
            if n.value != own_ip:
                raise CSRError(f"the certificate signing request names IP address {n.value}; a node's "
                               f"certificate may name only the node's own address, {own_ip} (the address "
                               "this request came from)")
        elif _is_loopback_name(n.value):
            raise CSRError(f"the certificate signing request names DNS name {n.value}: localhost names are "
                           "the loopback of whoever resolves them, never a node's")
        elif n.value.lower().rstrip(".") != node:
            raise CSRError(f"the certificate signing request names DNS name {n.value}; a node's certificate "
                           f"may name only the node's own name, {node}")
    return list(dict.fromkeys(names))


def sign_node_csr(pki: Path, csr_pem: bytes, node: str, address: str | None) -> bytes:
    """Sign a node's CSR with the kubelet-serving signer: ``CN=system:node:<node>,
    O=system:nodes``, server auth only, the names :func:`node_csr_sans` allows."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        raise CSRError(f"the certificate signing request is not a PEM CSR: {e}") from None
    sans = node_csr_sans(csr, node, address)
    ensure_pki(pki)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")])
    cert = _sign(_load_signer(pki, KUBELET_CA), subject, csr.public_key(),  # type: ignore[arg-type]
                 ExtendedKeyUsageOID.SERVER_AUTH, sans, NODE_DAYS)
    return cert.public_bytes(serialization.Encoding.PEM)
