"""The PKI (kube32.apiserver.pki): two signers, key identifiers on every certificate, the
node certificate policy, an unreadable CA.  The upgrade of an older data directory's PKI
is tested through a real control plane (tests/e2e/test_adversarial_pki.py)."""
from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from kube32.apiserver import pki
from kube32.kubelet.join import make_csr


def _csr(cn: str, sans: list[x509.GeneralName], key=None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _ip(text: str) -> x509.IPAddress:
    import ipaddress
    return x509.IPAddress(ipaddress.ip_address(text))


def _strict(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT   # Python 3.13's default, on every Python here
    return ctx


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> None:
    """A TLS handshake in memory; raises ssl.SSLError where either side refuses."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done: set[int] = set()
    for _ in range(20):
        for i, end in enumerate((c, s)):
            if i not in done:
                try:
                    end.do_handshake()
                    done.add(i)
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) == 2:
            break
    else:
        raise AssertionError("the handshake did not finish")
    c.write(b"x")                      # TLS 1.3: the server judges the client's certificate here
    s_in.write(c_out.read())
    assert s.read(1) == b"x"


def _node_cert(tmp_path: Path, node: str, address: str) -> tuple[Path, Path]:
    key_pem, csr = make_csr(node, [address])
    crt, key = tmp_path / f"{node}.crt", tmp_path / f"{node}.key"
    crt.write_bytes(pki.sign_node_csr(tmp_path / "pki", csr, node, address))
    key.write_bytes(key_pem)
    return crt, key


def test_every_certificate_has_key_identifiers_and_constraints(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    cas = pki.ensure_pki(d)
    crt, _ = pki.issue_serving_cert(d, "apiserver", ["127.0.0.1", "localhost"])
    client, _ = pki.issue_client_cert(d, "client", pki.KUBELET_CLIENT_CN)
    node, _ = _node_cert(tmp_path, "w1", "127.0.0.2")
    issuers = {"ca": cas.apiserver, "kubelet-ca": cas.kubelet}
    for path, issuer in ((cas.apiserver, cas.apiserver), (cas.kubelet, cas.kubelet), (crt, cas.apiserver),
                         (client, cas.apiserver), (node, cas.kubelet)):
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        ca = x509.load_pem_x509_certificate(issuer.read_bytes())
        ext = cert.extensions
        ski = ext.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = ext.get_extension_for_class(x509.AuthorityKeyIdentifier).value
        assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key()), path
        assert aki.key_identifier == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
        bc = ext.get_extension_for_class(x509.BasicConstraints)
        ku = ext.get_extension_for_class(x509.KeyUsage)
        assert bc.critical and ku.critical, path
        is_ca = path in issuers.values()
        assert bc.value.ca is is_ca and ku.value.key_cert_sign is is_ca and ku.value.digital_signature
        assert cert.issuer == ca.subject
    assert {x509.load_pem_x509_certificate(p.read_bytes()).subject.rfc4514_string() for p in issuers.values()} == \
        {"CN=kube32-apiserver-ca", "CN=kube32-kubelet-serving-ca"}


def test_strict_verification_accepts_each_signer_for_its_own_certificates_only(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    cas = pki.ensure_pki(d)
    apiserver = pki.server_context(*pki.issue_serving_cert(d, "apiserver", ["127.0.0.1", "localhost"]))
    _handshake(apiserver, _strict(pki.client_context(cas.apiserver)), "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(apiserver, _strict(pki.client_context(cas.kubelet)), "127.0.0.1")
    # A node's certificate, even one for 127.0.0.1 (the node there truly is 127.0.0.1),
    # never passes for the API server: the API server CA did not sign it.
    kubelet = pki.server_context(*_node_cert(tmp_path, "devkit", "127.0.0.1"))
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(kubelet, _strict(pki.client_context(cas.apiserver)), "127.0.0.1")
    client = pki.issue_client_cert(d, "apiserver-kubelet-client", pki.KUBELET_CLIENT_CN)
    kubelet.load_verify_locations(cas.apiserver)           # as kube32.kubelet.server.server_ssl
    kubelet.verify_mode = ssl.CERT_REQUIRED
    _strict(kubelet)
    _handshake(kubelet, _strict(pki.client_context(cas.kubelet, client)), "127.0.0.1")


def test_a_node_certificate_names_only_the_node_and_its_own_address(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    pem = pki.sign_node_csr(d, _csr("system:node:w1", [_ip("127.0.0.2"), x509.DNSName("w1")]), "w1", "127.0.0.2")
    cert = x509.load_pem_x509_certificate(pem)
    assert cert.subject.rfc4514_string() == "CN=system:node:w1,O=system:nodes"
    assert cert.issuer.rfc4514_string() == "CN=kube32-kubelet-serving-ca"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(v) for v in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.2"]
    assert sans.get_values_for_type(x509.DNSName) == ["w1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    # The control plane's own node at 127.0.0.1 gets 127.0.0.1: that is its address.
    pki.sign_node_csr(d, _csr("system:node:devkit", [_ip("127.0.0.1")]), "devkit", "127.0.0.1")


@pytest.mark.parametrize("cn, sans, address, why", [
    ("system:node:w1", [_ip("127.0.0.1")], "127.0.0.2", "names IP address 127.0.0.1; a node's certificate may "
     "name only the node's own address, 127.0.0.2"),
    ("system:node:w1", [_ip("127.0.0.2"), x509.DNSName("localhost")], "127.0.0.2", "names DNS name localhost: "
     "localhost names"),
    ("system:node:w1", [x509.DNSName("app.localhost")], "127.0.0.2", "names DNS name app.localhost"),
    ("system:node:w1", [x509.DNSName("apiserver")], "127.0.0.2", "names DNS name apiserver; a node's certificate "
     "may name only the node's own name, w1"),
    ("system:node:w1", [x509.DNSName("w2")], "127.0.0.2", "names DNS name w2"),
    ("system:node:w1", [_ip("::1")], "127.0.0.2", "names IP address ::1"),
    ("system:node:w2", [_ip("127.0.0.2")], "127.0.0.2", "subject is CN=system:node:w2; this node's must be "
     "CN=system:node:w1"),
    ("kube32-apiserver", [_ip("127.0.0.2")], "127.0.0.2", "subject is CN=kube32-apiserver"),
    ("system:node:w1", [], "127.0.0.2", "names no IP address or DNS name"),
    ("system:node:w1", [x509.UniformResourceIdentifier("https://x")], "127.0.0.2", "and nothing else"),
    ("system:node:w1", [_ip("127.0.0.1")], None, "did not come over IP"),
])
def test_a_node_certificate_for_names_it_does_not_own_is_refused(tmp_path: Path, cn, sans, address, why) -> None:
    with pytest.raises(pki.CSRError, match=why.replace(".", r"\.")):
        pki.sign_node_csr(tmp_path, _csr(cn, sans), "w1", address)


def test_a_weak_or_broken_csr_is_refused(tmp_path: Path) -> None:
    weak = rsa.generate_private_key(65537, 1024)
    with pytest.raises(pki.CSRError, match="RSA key has 1024 bits; at least 2048"):
        pki.sign_node_csr(tmp_path, _csr("system:node:w1", [_ip("127.0.0.2")], weak), "w1", "127.0.0.2")
    with pytest.raises(pki.CSRError, match="not a PEM CSR"):
        pki.sign_node_csr(tmp_path, b"garbage", "w1", "127.0.0.2")


def test_an_unreadable_ca_is_a_clear_error(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    d.mkdir()
    (d / "ca.crt").write_text("not a certificate")
    with pytest.raises(pki.PKIError, match=r"cannot read the CA .*ca\.crt.*move .* away to make a new PKI"):
        pki.ensure_pki(d)
