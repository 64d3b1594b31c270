"""The cluster CA and serving certificates (TLS is on by default).

kubectl sends bearer tokens only over TLS, and snapshot data is as secret as a
Secret, so the control plane makes a cluster CA at its first start
(``<data-dir>/pki/ca.crt``, ``ca.key``, 0600) and serves with a certificate the CA
signs for ``127.0.0.1``, ``localhost`` and the host's name.  The kubeconfigs it
writes carry the CA, so clients verify the server.  Kubelets get serving
certificates from the same CA: a joining node sends a certificate signing
request for its own key (the key never leaves the node) and
:func:`sign_node_csr` signs it for ``system:node:<name>`` with the CSR's IP
addresses and DNS names as subject alternative names (server auth only).  The API
server then verifies a kubelet's certificate with the CA
(:func:`client_context`) and authenticates to it with a client certificate
(:func:`issue_client_cert`, ``CN=system:kube-apiserver-kubelet-client``), so no
bearer token of the control plane is ever handed to a node.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def ensure_ca(pki: Path) -> tuple[Path, Path]:
    pki.mkdir(parents=True, exist_ok=True)
    crt, key_path = pki / "ca.crt", pki / "ca.key"
    if crt.exists() and key_path.exists():
        return crt, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube32-ca")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(key_path, _key_pem(key), True)
    _write(crt, cert.public_bytes(serialization.Encoding.PEM), False)
    return crt, key_path


def issue_serving_cert(pki: Path, name: str, hosts: list[str]) -> tuple[Path, Path]:
    """A serving certificate for ``hosts`` (IPs or DNS names), signed by the cluster CA."""
    ca_crt, ca_key_path = ensure_ca(pki)
    crt, key_path = pki / f"{name}.crt", pki / f"{name}.key"
    ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    _write(key_path, _key_pem(key), True)
    _write(crt, cert.public_bytes(serialization.Encoding.PEM), False)
    return crt, key_path


KUBELET_CLIENT_CN = "system:kube-apiserver-kubelet-client"


def issue_client_cert(pki: Path, name: str, common_name: str) -> tuple[Path, Path]:
    """A client certificate (``CN=common_name``) signed by the cluster CA: the API server
    presents it to kubelets, which accept this CN only."""
    ca_crt, ca_key_path = ensure_ca(pki)
    crt, key_path = pki / f"{name}.crt", pki / f"{name}.key"
    ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=825))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    _write(key_path, _key_pem(key), True)
    _write(crt, cert.public_bytes(serialization.Encoding.PEM), False)
    return crt, key_path


def default_hosts(bind: str) -> list[str]:
    return [bind, "127.0.0.1", "localhost", socket.gethostname()]


def server_context(crt: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(crt, key)
    return ctx


def client_context(ca: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


MAX_CSR_SANS = 16


class CSRError(ValueError):
    pass


def sign_node_csr(pki: Path, csr_pem: bytes, node: str) -> bytes:
    """Sign a node's CSR: subject ``system:node:<node>``, the CSR's SANs, serving only."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        raise CSRError(f"the certificate signing request is not a PEM CSR: {e}") from None
    if not csr.is_signature_valid:
        raise CSRError("the certificate signing request's signature is not valid")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CSRError("the certificate signing request names no IP address or DNS name") from None
    names = [n for n in san if isinstance(n, (x509.IPAddress, x509.DNSName))]
    if not names or len(names) != len(list(san)) or len(names) > MAX_CSR_SANS:
        raise CSRError(f"the certificate signing request may name 1 to {MAX_CSR_SANS} IP addresses "
                       "and DNS names, and nothing else")
    ca_crt, ca_key_path = ensure_ca(pki)
    ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")]))
            .issuer_name(ca_cert.subject).public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM)
