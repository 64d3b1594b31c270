"""The API servers' trust in each other (issue #26, attack round 26, finding 1).

API servers on etcd find their peers in Leases (kube32/apiserver/peers.py) and ask them
with the ``system:kube-apiserver`` token.  Real processes: one ``kube32-sim control-plane
--store etcd://...`` on the session's etcd, kubectl, raw HTTPS, and fake "API servers" on
127.0.0.9 (plain HTTP, a self-signed certificate, and a certificate of the cluster's own CA
that is not an API server's) that record every request.
"""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from kube32.apiserver import pki
from kube32.apiserver.peers import lease_name
from kube32.sim.etcd import EtcdCluster
from tests.conftest import ControlPlane, start_control_plane

pytestmark = pytest.mark.e2e

ADDON = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: addon, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: addon-leases, namespace: kube-system}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: ["*"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: addon, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: addon-leases}
subjects: [{kind: ServiceAccount, name: addon, namespace: kube-system}]
"""


def recording_servers(tmp: Path, cp_pki: Path) -> tuple[dict[str, str], list[dict[str, Any]], list]:
    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            got.append({"path": self.path, "authorization": self.headers.get("Authorization")})
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    self_signed = tmp / "self-signed"
    self_signed.mkdir()
    pki.ensure_pki(self_signed)  # another cluster's CA: chains to nothing this one trusts
    certs = {"tls-other-ca": pki.issue_serving_cert(self_signed, "apiserver", ["127.0.0.9"]),
             # the cluster's own CA, but not an API server's serving certificate
             "tls-not-apiserver": pki.issue_serving_cert(cp_pki, "evil", ["127.0.0.9"])}
    urls, servers = {}, []
    for tag in ("plain", *certs):
        srv = http.server.ThreadingHTTPServer(("127.0.0.9", 0), Handler)
        if tag in certs:
            srv.socket = pki.server_context(*certs[tag]).wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        urls[tag] = f"{'http' if tag == 'plain' else 'https'}://127.0.0.9:{srv.server_port}"
    return urls, got, servers


def api(cp: ControlPlane, method: str, path: str, token: str, body: Any = None) -> requests.Response:
    ca = cp.data_dir / "pki" / "ca.crt"
    return requests.request(method, cp.server + path, json=body, headers={"Authorization": f"Bearer {token}"},
                            verify=str(ca), timeout=30)


def apiserver_token(cp: ControlPlane) -> str:
    tokens = json.loads((cp.data_dir / "tokens.json").read_text())
    return next(t for t, u in tokens.items() if u["username"] == "system:kube-apiserver")


def test_a_lease_posing_as_an_api_server_gets_no_credentials(tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    cp = start_control_plane(tmp_path / "cp", "--store", etcd_cluster.store_url, "--no-kubelet")
    servers: list = []
    try:
        urls, got, servers = recording_servers(tmp_path, cp.data_dir / "pki")
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        admin = yaml.safe_load(cp.kubeconfig.read_text())["users"][0]["user"]["token"]

        def lease(url: str) -> dict[str, Any]:
            return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": lease_name(url), "labels": {"kube32.io/apiserver": "true"}},
                    "spec": {"holderIdentity": url, "leaseDurationSeconds": 3600,
                             "renewTime": "2099-01-01T00:00:00.000000Z"}}

        # Leader-election rights on Leases in kube-system, and even the admin, cannot write them.
        cp.kubectl("apply", "-f", "-", input=ADDON)
        addon = cp.kubectl("-n", "kube-system", "create", "token", "addon").stdout.strip()
        for who in (addon, admin):
            r = api(cp, "POST", leases, who, lease(urls["plain"]))
            assert r.status_code == 403 and "only system:kube-apiserver writes them" in r.text, r.text
        assert api(cp, "POST", leases, addon, {**lease(urls["plain"]), "metadata": {
            "generateName": "kube32-apiserver-"}}).status_code == 403
        own = lease_name(cp.server)
        assert api(cp, "PATCH", f"{leases}/{own}", addon, {"spec": {"holderIdentity": urls["plain"]}}
                   ).status_code == 403
        # Nor the controllers' leader Lease (attack round 26b: naming a holder that is no
        # control plane, for a day, stopped every controller of the cluster).
        for who in (addon, admin):
            r = api(cp, "PATCH", f"{leases}/kube32-controller-manager", who,
                    {"spec": {"holderIdentity": "nobody", "leaseDurationSeconds": 86400}})
            assert r.status_code == 403 and "elects the control planes' controllers" in r.text, r.text
        holder = json.loads(cp.kubectl("-n", "kube-system", "get", "lease", "kube32-controller-manager", "-o",
                                       "json").stdout)["spec"]["holderIdentity"]
        assert holder and holder != "nobody"

        # Leases written past RBAC (with the API server's own token): still no peer.
        system = apiserver_token(cp)
        for url in urls.values():
            assert api(cp, "POST", leases, system, lease(url)).status_code == 201
        ck = "/apis/kube32.io/v1/namespaces/default/checkpoints"
        api(cp, "POST", ck, admin, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                    "metadata": {"name": "nodata"}, "spec": {"podName": "none", "action": "Save"}})
        assert api(cp, "GET", f"{ck}/nodata/data", admin).status_code == 404
        assert not [g for g in got if g["authorization"]], got
        log = (cp.data_dir / "control-plane.log").read_text()
        assert "not an https://HOST:PORT URL" in log and "CN=evil, not CN=apiserver" in log
        assert "certificate verify failed" in log
    finally:
        for srv in servers:
            srv.shutdown()
        cp.proc.stop()
