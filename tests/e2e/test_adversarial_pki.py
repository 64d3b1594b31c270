"""Adversarial tests of the certificate policy (issue 19, node certificates), through
real processes: a control plane with its node ``devkit`` (127.0.0.1), a worker ``w1``
at 127.0.0.2, and openssl, curl and kubectl as an attacker and a user run them.

* The bootstrap token (join) and a node's own token (renewal) buy a certificate only
  for the node's own name and the address the request came from: never 127.0.0.1,
  ``localhost`` or ``apiserver`` from a worker at 127.0.0.2, never another node's.
* A node certificate, even one for 127.0.0.1, does not pass for the API server: a
  fake API server with it gets no token from kubectl (it trusts the API server CA
  only).
* Every certificate passes ``openssl verify -x509_strict`` with its own signer
  (key identifiers: what Python 3.13 checks) and fails with the other.
* The PKI of an older data directory, whose CA signed node certificates for anything,
  is replaced: such a certificate is no longer trusted.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import ControlPlane, sim_command, start, start_control_plane, wait_for
from tests.e2e.helpers import node_token

W1 = "127.0.0.2"
CREDS = "/apis/kube32.io/v1/nodecredentials"


class Cluster:
    def __init__(self, cp: ControlPlane, root: Path) -> None:
        self.cp, self.root = cp, root
        self.pki = cp.data_dir / "pki"
        node = yaml.safe_load((cp.data_dir / "node.kubeconfig").read_text())
        self.bootstrap = node["users"][0]["user"]["token"]
        self.server = node["clusters"][0]["cluster"]["server"]
        self._n = 0

    def token_of(self, user: str) -> str:
        if user.startswith("system:node:"):
            return node_token(self.cp, user[len("system:node:"):])
        tokens = json.loads((self.cp.data_dir / "tokens.json").read_text())
        return next(t for t, u in tokens.items() if u["username"] == user)

    def csr(self, cn: str, san: str) -> tuple[Path, str]:
        """A fresh key and a CSR for it, made by openssl as an attacker would."""
        self._n += 1
        key, csr = self.root / f"k{self._n}.key", self.root / f"k{self._n}.csr"
        subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={cn}", "-addext",
                        f"subjectAltName={san}"], check=True, capture_output=True)
        return key, csr.read_text()

    def curl(self, url: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["curl", "-sS", "--max-time", "20", *args, url], capture_output=True, text=True)

    def join(self, node: str, token: str, csr: str, source: str) -> tuple[int, dict]:
        """POST nodecredentials with curl from ``source`` (a loopback address of this machine)."""
        body = self.root / "body.json"
        body.write_text(json.dumps({"csr": csr}))
        out = self.curl(f"{self.server}{CREDS}/{node}", "--cacert", str(self.pki / "ca.crt"), "--interface", source,
                        "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
                        "--data-binary", f"@{body}", "-w", "\n%{http_code}")
        assert out.returncode == 0, out.stderr
        text, code = out.stdout.rsplit("\n", 1)
        return int(code), json.loads(text)

    def signed(self, node: str, token: str, csr: str, source: str) -> Path:
        code, body = self.join(node, token, csr, source)
        assert code == 201, body
        crt = self.root / f"{node}-{self._n}.crt"
        crt.write_text(body["certificate"])
        return crt


def openssl_verify(ca: Path, crt: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile", str(ca), str(crt)],
                          capture_output=True, text=True)


def sans(crt: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-issuer", "-in", str(crt)],
                         capture_output=True, text=True, check=True).stdout
    return " ".join(out.split())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("pki")
    cp = start_control_plane(root / "cp", "--interp-mops", "1", "--lease-interval", "1")
    worker = start(sim_command("worker", "--kubeconfig", str(root / "cp" / "node.kubeconfig"), "--name", "w1",
                               "--address", W1, "--port", "0", "--interp-mops", "1", "--lease-interval", "1"),
                   root / "w1.log")
    try:
        def ready() -> bool:
            nodes = json.loads(cp.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
                       for n in nodes) == 2
        wait_for(ready, 60, what="devkit and w1 Ready")
        yield Cluster(cp, root)
    finally:
        worker.stop()
        cp.proc.stop()


def test_the_bootstrap_token_buys_no_name_the_node_does_not_own(cluster: Cluster) -> None:
    """The issue's CSR, from a worker's address, is refused with the reason; so is each
    of its names alone; the node's own address is signed, by the kubelet signer only."""
    for san, why in (("IP:127.0.0.1,DNS:localhost,DNS:apiserver",
                      "names IP address 127.0.0.1; a node's certificate may name only the node's own address, "
                      "127.0.0.2 (the address this request came from)"),
                     ("DNS:localhost", "names DNS name localhost: localhost names are the loopback of whoever "
                      "resolves them, never a node's"),
                     ("DNS:apiserver", "names DNS name apiserver; a node's certificate may name only the node's "
                      "own name, evil"),
                     ("IP:127.0.0.3", "names IP address 127.0.0.3")):
        code, body = cluster.join("evil", cluster.bootstrap, cluster.csr("system:node:evil", san)[1], W1)
        assert code == 422 and body["reason"] == "Invalid", body
        assert why in body["details"]["causes"][0]["message"], body
    # A name that is not the node's in the subject is refused too.
    code, body = cluster.join("evil", cluster.bootstrap, cluster.csr("system:node:w1", f"IP:{W1}")[1], W1)
    assert code == 422 and "this node's must be CN=system:node:evil" in body["message"], body
    crt = cluster.signed("evil", cluster.bootstrap, cluster.csr("system:node:evil", f"IP:{W1},DNS:evil")[1], W1)
    assert sans(crt) == ("X509v3 Subject Alternative Name: IP Address:127.0.0.2, DNS:evil "
                         "issuer=CN = kube32-kubelet-serving-ca")
    assert openssl_verify(cluster.pki / "kubelet-ca.crt", crt).returncode == 0
    bad = openssl_verify(cluster.pki / "ca.crt", crt)
    assert bad.returncode != 0 and "unable to get local issuer certificate" in bad.stdout + bad.stderr


FAKE_APISERVER = r"""
import http.server, ssl, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("REQUEST", self.path, "AUTHORIZATION", self.headers.get("Authorization", "-"), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"kind": "PodList", "apiVersion": "v1", "items": []}')
srv = http.server.HTTPServer((sys.argv[1], 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[2], sys.argv[3])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("PORT", srv.server_address[1], flush=True)
srv.serve_forever()
"""


def test_a_node_certificate_for_127_0_0_1_gets_no_token_from_kubectl(cluster: Cluster) -> None:
    """The issue's attack with a certificate the policy does allow: a node that truly is
    127.0.0.1 gets IP:127.0.0.1, and serves a fake API server there.  kubectl (the admin's
    kubeconfig) refuses it before sending anything: it trusts the API server CA only."""
    key, csr = cluster.csr("system:node:evil1", "IP:127.0.0.1")
    crt = cluster.signed("evil1", cluster.bootstrap, csr, "127.0.0.1")
    fake = start([sys.executable, "-c", FAKE_APISERVER, "127.0.0.1", str(crt), str(key)], cluster.root / "fake.log")
    try:
        port = wait_for(lambda: re.search(r"PORT (\d+)", fake.output()), 10, what="the fake API server").group(1)
        out = cluster.cp.kubectl("--server", f"https://127.0.0.1:{port}", "--request-timeout", "10s", "get", "pods",
                                 check=False)
        assert out.returncode != 0 and "x509: certificate signed by unknown authority" in out.stderr, \
            (out.stderr, fake.output())
        curl = cluster.curl(f"https://127.0.0.1:{port}/api/v1/pods", "--cacert", str(cluster.pki / "ca.crt"),
                            "-H", "Authorization: Bearer secret")
        assert curl.returncode == 60, curl      # curl: the peer's certificate cannot be verified
        assert "REQUEST" not in fake.output() and cluster.token_of("kubernetes-admin") not in fake.output()
    finally:
        fake.stop()
    assert "IP Address:127.0.0.1 issuer=CN = kube32-kubelet-serving-ca" in sans(crt)


def test_renewal_with_the_nodes_own_token_is_held_to_the_same_policy(cluster: Cluster) -> None:
    w1 = cluster.token_of("system:node:w1")
    for san, why in (("IP:127.0.0.1", "may name only the node's own address, 127.0.0.2"),
                     ("DNS:localhost", "localhost names are the loopback of whoever resolves them"),
                     ("DNS:apiserver", "may name only the node's own name, w1"),
                     (f"IP:{W1},DNS:devkit", "names DNS name devkit")):
        code, body = cluster.join("w1", w1, cluster.csr("system:node:w1", san)[1], W1)
        assert code == 422 and why in body["message"], (san, body)
    # Another node's name: forbidden to w1's token, and to the bootstrap token from
    # an address that is not that node's (which also keeps the node's token valid).
    code, body = cluster.join("devkit", w1, cluster.csr("system:node:devkit", f"IP:{W1}")[1], W1)
    assert code == 403, body
    for node, source, registered in (("devkit", W1, "127.0.0.1"), ("w1", "127.0.0.3", W1)):
        code, body = cluster.join(node, cluster.bootstrap, cluster.csr(f"system:node:{node}", f"IP:{source}")[1],
                                  source)
        assert code == 403 and (f'node "{node}" is registered at {registered}, and its credentials are issued only '
                                f"to a request from that address (this one came from {source})") in body["message"]
    # w1 kept its credentials: its token still reads its Node, the API server still
    # reaches its kubelet (through the kubelet signer's certificate).
    out = cluster.curl(f"{cluster.server}/api/v1/nodes/w1", "--cacert", str(cluster.pki / "ca.crt"),
                       "-H", f"Authorization: Bearer {w1}", "-o", "/dev/null", "-w", "%{http_code}")
    assert out.stdout == "200"
    assert cluster.cp.kubectl("get", "--raw", "/api/v1/nodes/w1/proxy/healthz").stdout.strip() == "ok"
    # A renewal within the policy is signed (a node of its own, to keep w1's token).
    first = cluster.join("r1", cluster.bootstrap, cluster.csr("system:node:r1", "IP:127.0.0.4")[1], "127.0.0.4")
    assert first[0] == 201
    crt = cluster.signed("r1", first[1]["token"], cluster.csr("system:node:r1", "IP:127.0.0.4")[1], "127.0.0.4")
    assert "IP Address:127.0.0.4 issuer=CN = kube32-kubelet-serving-ca" in sans(crt)


def test_every_certificate_verifies_strictly_with_its_own_signer_only(cluster: Cluster) -> None:
    """What Python 3.13 refuses (no Authority Key Identifier), openssl's -x509_strict
    refuses too; and the kubelet serves a certificate for its own address and name alone
    (the API server verifies a kubelet by its node's name)."""
    port = json.loads(cluster.cp.kubectl("get", "node", "w1", "-o", "json").stdout)[
        "status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    shown = subprocess.run(["openssl", "s_client", "-connect", f"{W1}:{port}"], input="", capture_output=True,
                           text=True, timeout=20).stdout
    kubelet = cluster.root / "kubelet.crt"
    kubelet.write_text(re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", shown, re.S).group(0))
    assert sans(kubelet) == ("X509v3 Subject Alternative Name: IP Address:127.0.0.2, DNS:w1 "
                             "issuer=CN = kube32-kubelet-serving-ca")
    ca, kubelet_ca = cluster.pki / "ca.crt", cluster.pki / "kubelet-ca.crt"
    for crt, own, other in ((cluster.pki / "apiserver.crt", ca, kubelet_ca), (kubelet, kubelet_ca, ca)):
        good = openssl_verify(own, crt)
        assert good.returncode == 0, good.stdout + good.stderr
        assert openssl_verify(other, crt).returncode != 0
    client = subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", "sslclient", "-CAfile", str(ca),
                             str(cluster.pki / "apiserver-kubelet-client.crt")], capture_output=True, text=True)
    assert client.returncode == 0, client.stdout + client.stderr
    for ca_file in (ca, kubelet_ca):   # CAs: self-signed, key identifiers, for signing only
        text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(ca_file)], capture_output=True,
                              text=True, check=True).stdout
        assert "Subject Key Identifier" in text and "Authority Key Identifier" in text
        assert re.search(r"Basic Constraints: critical\s+CA:TRUE, pathlen:0", text)
        assert re.search(r"Key Usage: critical\s+Digital Signature, Certificate Sign, CRL Sign", text)
    # curl trusts the kubelet with the kubelet signer, not with the API server CA.
    assert cluster.curl(f"https://{W1}:{port}/healthz", "--cacert", str(ca)).returncode == 60
    assert cluster.curl(f"https://{W1}:{port}/healthz", "--cacert", str(kubelet_ca)).stdout.strip() == "ok"


def _legacy_pki(pki: Path) -> Path:
    """What an older Kube32 left: one CA (no key identifiers) and a node certificate it
    signed for the API server's names; returns that certificate."""
    pki.mkdir(parents=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube32-ca")])
    now = dt.datetime.now(dt.timezone.utc)
    window = dict(not_valid_before=now - dt.timedelta(minutes=5), not_valid_after=now + dt.timedelta(days=30))
    ca = (x509.CertificateBuilder(issuer_name=name, subject_name=name, public_key=key.public_key(),
                                  serial_number=1, **window)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(key, hashes.SHA256()))
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder(issuer_name=name, public_key=leaf_key.public_key(), serial_number=2, **window,
                                    subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                                               "system:node:evil")]))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (pki / "ca.crt").write_bytes(ca.public_bytes(pem))
    (pki / "ca.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    forged = pki.parent / "forged.crt"
    forged.write_bytes(leaf.public_bytes(pem))
    return forged


def test_an_older_data_dirs_pki_is_replaced(tmp_path: Path) -> None:
    data = tmp_path / "cp"
    forged = _legacy_pki(data / "pki")
    assert subprocess.run(["openssl", "verify", "-CAfile", str(data / "pki" / "ca.crt"), str(forged)],
                          capture_output=True).returncode == 0    # what the old CA still vouches for
    cp = start_control_plane(data, "--no-kubelet")
    try:
        assert "holds the PKI of an older Kube32" in cp.proc.output()
        assert openssl_verify(data / "pki" / "ca.crt", forged).returncode != 0
        assert cp.kubectl("get", "namespaces", "default", "-o", "name").stdout.strip() == "namespace/default"
    finally:
        cp.proc.stop()
    cp = start_control_plane(data, "--no-kubelet")   # made once: the next start keeps it
    try:
        assert "older Kube32" not in cp.proc.output()
        assert cp.kubectl("get", "namespaces", "default", "-o", "name").returncode == 0
    finally:
        cp.proc.stop()
