"""Several API servers on one etcd, attacked from outside (issue #26; attack rounds 26 and
26b, kept here once they held against the fixes).

One ``kube32-sim up --control-planes 3 --store etcd --workers 2`` cluster for the module
(short leader election, 4 s / 3 s / 1 s; a 12 s node monitor grace period; the
``hold-moving-status`` test hook), and a worker ``slow`` whose snapshots pause 8 s
(``--fault slow-snapshots``).  Each test leaves three API servers and an etcd quorum
behind.  Machines are lost with SIGKILL and hung with SIGSTOP; clients are kubectl
(a context per API server), the kubernetes Python client, kube32-cli, etcdctl and raw
HTTPS with the admin's token.  About 3 minutes on the 2-core machine.
"""
from __future__ import annotations

import datetime as dt
import http.client
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
import yaml

from kube32.sim.controlplane import PEER_CHECK_SECONDS
from tests.conftest import ROOT, ControlPlane, sim_command, start, start_cluster, wait_for
from tests.e2e.helpers import cli, push, worker_pid
from tests.e2e.test_ha import plane_pid
from tests.etcd import need_etcd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LE = ["--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s",
      "--leader-elect-retry-period", "1s"]
GRACE = 12  # s: --node-monitor-grace-period (nodes renew every 2 s)
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
CK = "/apis/kube32.io/v1/namespaces/default/checkpoints"
CM = "/api/v1/namespaces/{ns}/configmaps"
CM_LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube32-controller-manager"
MERGE = {"Content-Type": "application/merge-patch+json"}
MiB = 1 << 20
FAULTS = {"KUBE32_TEST_FAULTS": "hold-moving-status"}  # the module's control planes, and those started again


class HA:
    """The cluster as an operator sees it: API servers cp-1..cp-3 (1-based), their
    processes, the etcd members, and the admin's token."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.dir = cluster.data_dir
        kc = yaml.safe_load(cluster.kubeconfig.read_text())
        self.servers: list[str] = kc["clusters"][0]["cluster"]["extensions"][0]["extension"]["servers"]
        self.token: str = kc["users"][0]["user"]["token"]
        self.ca = str(self.dir / "cp-1" / "pki" / "ca.crt")
        self.restarted: list[subprocess.Popen] = []
        self._image = ""

    # --- clients ---------------------------------------------------------------------
    def api(self, i: int, method: str, path: str, body: Any = None, token: str | None = None,
            headers: dict | None = None, timeout: float = 30) -> requests.Response:
        h = {"Authorization": f"Bearer {token or self.token}", **(headers or {})}
        data = None
        if body is not None:
            h.setdefault("Content-Type", "application/json")
            data = json.dumps(body).encode()
        return requests.request(method, self.servers[i - 1] + path, data=data, headers=h, verify=self.ca,
                                timeout=timeout)

    def json(self, i: int, method: str, path: str, body: Any = None, **kw: Any) -> dict:
        r = self.api(i, method, path, body, **kw)
        assert r.status_code < 300, f"{method} {path} on cp-{i}: {r.status_code} {r.text[:400]}"
        return r.json()

    def kubectl(self, *args: str, context: int | None = None, **kw: Any) -> subprocess.CompletedProcess:
        extra = ["--context", f"admin@cp-{context}"] if context else []
        return self.cluster.kubectl(*extra, *args, **kw)

    def system_token(self) -> str:
        """The API servers' own token (system:kube-apiserver): what a control plane writes with."""
        tokens = json.loads((self.dir / "cp-1" / "tokens.json").read_text())
        return next(t for t, u in tokens.items() if u["username"] == "system:kube-apiserver")

    def ns(self, name: str) -> str:
        r = self.api(1, "POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        assert r.status_code in (201, 409), r.text
        return name

    # --- the control planes ------------------------------------------------------------
    def identity(self, i: int) -> str:
        return (self.dir / f"cp-{i}" / "controller-identity").read_text().strip()

    def leader(self, via: tuple[int, ...] = (1, 2, 3)) -> int | None:
        """The control plane holding the controllers' Lease, read through the first of ``via`` answering."""
        for i in via:
            try:
                r = self.api(i, "GET", CM_LEASE, timeout=3)
            except requests.RequestException:
                continue
            if r.status_code == 200:
                holder = r.json()["spec"].get("holderIdentity")
                return next((k for k in (1, 2, 3) if self.identity(k) == holder), None)
        return None

    def pid(self, i: int) -> int:
        return plane_pid(self.dir / f"cp-{i}")

    def kill(self, i: int) -> list[str]:
        """SIGKILLs cp-<i>; returns its command line, to start it again (restart)."""
        pid = self.pid(i)
        cmd = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive(pid), 10, what=f"cp-{i} gone")
        return cmd

    def restart(self, i: int, cmd: list[str]) -> None:
        """Starts cp-<i> again with ``cmd`` on the port it had (``up --port 0`` picked it)."""
        at = cmd.index("--port") + 1
        cmd = [*cmd[:at], self.servers[i - 1].rsplit(":", 1)[1], *cmd[at + 1:]]
        self.restarted.append(start(cmd, self.dir / f"cp-{i}-again.log", FAULTS).popen)
        wait_for(lambda: self.api(i, "GET", "/readyz", timeout=2).status_code == 200, 60, what=f"cp-{i} back")

    def etcd_pids(self) -> list[int]:
        return [int((self.dir / "etcd" / f"etcd-{m}.pid").read_text()) for m in range(3)]

    def etcdctl(self, *args: str) -> str:
        members = json.loads((self.dir / "etcd" / "cluster.json").read_text())["members"]
        eps = ",".join(f"127.0.0.1:{m['client_port']}" for m in members)
        out = subprocess.run(["etcdctl", f"--endpoints={eps}", *args], capture_output=True, text=True, timeout=30,
                             env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        return out.stdout

    # --- pods --------------------------------------------------------------------------
    def image(self) -> str:
        if not self._image:
            self._image = push(self.cluster, COUNTER)
        return self._image

    def counter_pod(self, name: str, node: str) -> None:
        self.json(1, "POST", "/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": self.image()}]}})
        wait_for(lambda: self.hit(name), 60, what=f"{name} answering")

    def hit(self, name: str, i: int = 1) -> dict | None:
        """One request to a counter pod through cp-<i>'s pod proxy (None unless 200)."""
        try:
            r = self.api(i, "GET", f"/api/v1/namespaces/default/pods/{name}/proxy/", timeout=5)
        except requests.RequestException:
            return None
        return r.json() if r.status_code == 200 else None

    def move(self, pod: str, to: str, timeout: int = 60) -> subprocess.CompletedProcess:
        out = cli(self.cluster, "move", pod, "--to", to, "--timeout", str(timeout))
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
        return out

    def data_holder(self, ck: str) -> int | None:
        """The API server holding a Checkpoint's data: it answers a GET that says it comes from
        a peer (so it asks nobody else) with 200."""
        for i in (1, 2, 3):
            r = self.api(i, "GET", f"{CK}/{ck}/data", headers={"X-Kube32-Peer": "1"}, timeout=5)
            if r.status_code == 200:
                return i
        return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HA]:
    need_etcd()
    root = tmp_path_factory.mktemp("ha-adv")
    cluster = start_cluster(root, 2, "--control-planes", "3", "--store", "etcd", "--backoff", "1",
                            "--interp-mops", "100", "--lease-interval", "2", "--node-monitor-grace-period",
                            f"{GRACE}s", *LE, env=FAULTS)
    h = HA(cluster)
    slow = start(sim_command("worker", "--kubeconfig", str(root / "node.kubeconfig"), "--name", "slow",
                             "--address", "127.0.0.26", "--port", "0", "--data-dir", str(root / "nodes" / "slow"),
                             "--interp-mops", "100", "--lease-interval", "2", "--backoff", "1",
                             "--fault", "slow-snapshots"), root / "slow.log")
    try:
        wait_for(lambda: h.kubectl("wait", "--for=condition=Ready", "node/slow", "--timeout=5s",
                                   check=False).returncode == 0, 60, what="node slow Ready")
        yield h
    finally:
        for pid in h.etcd_pids():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        slow.stop()
        for p in h.restarted:
            p.send_signal(signal.SIGTERM)
        for p in h.restarted:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.proc.stop(timeout=90)


def all_ready(ha: HA) -> None:
    for i in (1, 2, 3):
        wait_for(lambda i=i: ha.api(i, "GET", "/readyz", timeout=3).status_code == 200, 60, what=f"cp-{i} ready")


def names(listing: dict) -> list[str]:
    return sorted(x["metadata"]["name"] for x in listing["items"])


# --- one store under three API servers ---------------------------------------------------

def test_every_api_server_reads_the_writes_of_the_others_at_once(ha: HA) -> None:
    """Create through one API server, get through a second, list through the third; patch
    and read it back; delete and 404: every read sees the write before it, at its revision."""
    for i in (1, 2, 3):
        assert "node/sim-1" in ha.kubectl("get", "nodes", "-o", "name", context=i).stdout
    path = CM.format(ns="default")
    bad = []
    for k in range(15):
        w, r, lst = 1 + k % 3, 1 + (k + 1) % 3, 1 + (k + 2) % 3
        name = f"ryw-{k}"
        made = ha.json(w, "POST", path, {"metadata": {"name": name}, "data": {"n": "0"}})
        if ha.api(r, "GET", f"{path}/{name}").status_code != 200:
            bad.append((k, "get"))
        listed = ha.json(lst, "GET", path)
        if name not in names(listed) or \
                int(listed["metadata"]["resourceVersion"]) < int(made["metadata"]["resourceVersion"]):
            bad.append((k, "list"))
        upd = ha.json(w, "PATCH", f"{path}/{name}", {"data": {"n": "1"}}, headers=MERGE)
        got = ha.json(r, "GET", f"{path}/{name}")
        if (got["data"]["n"], got["metadata"]["resourceVersion"]) != ("1", upd["metadata"]["resourceVersion"]):
            bad.append((k, "stale read"))
        ha.json(w, "DELETE", f"{path}/{name}")
        if ha.api(r, "GET", f"{path}/{name}").status_code != 404:
            bad.append((k, "deleted, still read"))
    assert not bad, bad


def test_a_list_continue_token_from_one_api_server_goes_on_through_the_others(ha: HA) -> None:
    """A list's pages, each through another API server: the token carries etcd's revision,
    so the pages together are the state when the first was read (an object created
    between them is not in it), and every page says that revision.  Once etcd compacted
    past it, the token is 410 Expired on every API server, with a token that goes on from
    the current state (kube-apiserver's answer), which a third API server takes."""
    ns = ha.ns("pages")
    path = CM.format(ns=ns)
    for k in range(7):
        ha.json(1 + k % 3, "POST", path, {"metadata": {"name": f"p{k}"}})
    first = ha.json(1, "GET", f"{path}?limit=3")
    rv, token = first["metadata"]["resourceVersion"], first["metadata"]["continue"]
    assert names(first) == ["p0", "p1", "p2"] and first["metadata"]["remainingItemCount"] == 4
    ha.json(2, "POST", path, {"metadata": {"name": "p-late"}})
    second = ha.json(2, "GET", f"{path}?limit=3&continue={token}")
    third = ha.json(3, "GET", f"{path}?limit=3&continue={second['metadata']['continue']}")
    assert names(second) == ["p3", "p4", "p5"] and names(third) == ["p6"], (names(second), names(third))
    assert "continue" not in third["metadata"]
    assert {p["metadata"]["resourceVersion"] for p in (first, second, third)} == {rv}

    again = ha.json(3, "GET", f"{path}?limit=2")
    ha.json(3, "POST", path, {"metadata": {"name": "p-later"}})  # the token's revision is history now
    status = json.loads(ha.etcdctl("endpoint", "status", "-w", "json"))[0]
    ha.etcdctl("compact", str(status["Status"]["header"]["revision"]))
    for i in (1, 2, 3):
        r = ha.api(i, "GET", f"{path}?limit=2&continue={again['metadata']['continue']}")
        assert r.status_code == 410 and r.json()["reason"] == "Expired", (i, r.status_code, r.text[:300])
        fresh = r.json()["metadata"]["continue"]
    rest = ha.json(1, "GET", f"{path}?limit=10&continue={fresh}")
    assert names(again) == ["p-late", "p0"] and names(rest) == [f"p{k}" for k in range(1, 7)], names(rest)
    bogus = ha.api(2, "GET", f"{path}?limit=2&continue=bm90LWEtdG9rZW4")
    assert bogus.status_code == 400 and "continue key is not valid" in bogus.text


def test_lists_at_an_exact_revision_and_watches_from_a_compacted_one(ha: HA) -> None:
    """resourceVersionMatch=Exact lists the state at that revision on every API server;
    after ``etcdctl compact`` past it, that list is 410 on every API server, and a watch
    from it is 410 (an HTTP 410 or a watch ERROR event of code 410) or, served from what
    the API server still holds (as kube-apiserver's watch cache), exactly what came after."""
    ns = ha.ns("exact")
    path = CM.format(ns=ns)
    ha.json(1, "POST", path, {"metadata": {"name": "rv-a"}})
    rv = ha.json(1, "GET", path)["metadata"]["resourceVersion"]
    ha.json(2, "POST", path, {"metadata": {"name": "rv-b"}})
    for i in (1, 2, 3):
        got = ha.json(i, "GET", f"{path}?resourceVersion={rv}&resourceVersionMatch=Exact")
        assert (got["metadata"]["resourceVersion"], names(got)) == (rv, ["rv-a"]), (i, got["metadata"], names(got))
    status = json.loads(ha.etcdctl("endpoint", "status", "-w", "json"))[0]
    ha.etcdctl("compact", str(status["Status"]["header"]["revision"]))
    for i in (1, 2, 3):
        listed = ha.api(i, "GET", f"{path}?resourceVersion={rv}&resourceVersionMatch=Exact")
        assert listed.status_code == 410, (i, listed.status_code, listed.text[:300])
        r = ha.api(i, "GET", f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=2", timeout=20)
        evs = [json.loads(line) for line in r.text.splitlines() if line.strip()] if r.status_code == 200 else []
        gone = r.status_code == 410 or (evs and evs[0]["type"] == "ERROR" and evs[0]["object"]["code"] == 410)
        # or served from what the API server still holds, as kube-apiserver's watch cache does
        assert gone or [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", "rv-b")], \
            (i, r.status_code, r.text[:300])


def test_big_objects_meet_the_api_limits_and_lists_of_six_mib_answer_everywhere(ha: HA) -> None:
    """A 1.4 MiB ConfigMap is 422 (the 1 MiB data limit), a 3 MiB one 413 (the body limit),
    neither stored; six of 0.95 MiB list and replay in a watch on every API server (no
    gRPC receive limit of 4 MiB in the way)."""
    ns = ha.ns("bigs")
    path = CM.format(ns=ns)

    def cm(name: str, size: int) -> dict:
        return {"metadata": {"name": name}, "data": {"k": "x" * size}}
    r = ha.api(1, "POST", path, cm("c14", int(1.4 * MiB)))
    assert r.status_code == 422 and "1048576" in r.text, r.text[:300]
    assert ha.api(2, "POST", path, cm("c3", 3 * MiB)).status_code == 413
    first = None
    for k in range(6):
        made = ha.json(1 + k % 3, "POST", path, cm(f"m{k}", int(0.95 * MiB)))
        first = first or int(made["metadata"]["resourceVersion"])
    for i in (1, 2, 3):
        assert names(ha.json(i, "GET", path)) == [f"m{k}" for k in range(6)]
    r = ha.api(3, "GET", f"{path}?watch=1&resourceVersion={first - 1}&timeoutSeconds=3", timeout=30)
    events = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"] == [f"m{k}" for k in range(6)]
    ha.kubectl("delete", "ns", ns, "--wait=false")


# --- watches across deaths ---------------------------------------------------------------

def test_a_python_client_watch_resumes_on_another_api_server_after_a_sigkill(ha: HA) -> None:
    """The kubernetes client watches through cp-1 while 40 ConfigMaps are written through
    cp-2; cp-1 is SIGKILLed after 15 events; the watch goes on through cp-3 from the last
    resourceVersion it delivered: every create exactly once, in order."""
    from kubernetes import client, config, watch

    ns = ha.ns("resume")
    apis = {i: client.CoreV1Api(config.new_client_from_config(str(ha.cluster.kubeconfig), context=f"admin@cp-{i}"))
            for i in (1, 3)}
    rv = apis[1].list_namespaced_config_map(ns).metadata.resource_version
    seen: list[tuple[str, int]] = []

    def writer() -> None:
        for k in range(40):
            ha.json(2, "POST", CM.format(ns=ns), {"metadata": {"name": f"c{k:02d}"}})
            time.sleep(0.05)
    t = threading.Thread(target=writer)
    t.start()
    cmd = None
    try:
        try:
            for ev in watch.Watch().stream(apis[1].list_namespaced_config_map, ns, resource_version=rv,
                                           timeout_seconds=30, _request_timeout=30):
                seen.append((ev["object"].metadata.name, int(ev["object"].metadata.resource_version)))
                if len(seen) == 15:
                    cmd = ha.kill(1)
                    break
        except Exception:  # noqa: BLE001 - the server died under the stream
            pass
        assert cmd, seen
        w = watch.Watch()
        for ev in w.stream(apis[3].list_namespaced_config_map, ns, resource_version=str(seen[-1][1]),
                           timeout_seconds=15, _request_timeout=30):
            seen.append((ev["object"].metadata.name, int(ev["object"].metadata.resource_version)))
            if len(seen) >= 40:
                w.stop()
    finally:
        t.join(60)
        if cmd:
            ha.restart(1, cmd)
    assert [n for n, _ in seen] == [f"c{k:02d}" for k in range(40)], seen
    assert [r for _, r in seen] == sorted({r for _, r in seen})


def test_kubectl_watches_on_every_api_server_survive_an_etcd_member_killed(ha: HA) -> None:
    """``kubectl get -w`` against each API server; etcd's first member SIGKILLed; 9
    ConfigMaps created through the API servers in turn (a 503, outcome unknown, tried
    again; a 409 means it landed); the member started again.  Every create is stored once
    and each kubectl printed each exactly once."""
    ns = ha.ns("kwatch")
    procs = {i: ha.cluster.kubectl_bg("--context", f"admin@cp-{i}", "-n", ns, "get", "configmaps", "-w",
                                      "--output-watch-events", "-o",
                                      "custom-columns=E:.type,N:.object.metadata.name", "--no-headers")
             for i in (1, 2, 3)}
    time.sleep(2)
    pid = ha.etcd_pids()[0]
    cmd = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    os.kill(pid, signal.SIGKILL)
    codes = []
    try:
        for k in range(9):
            for _ in range(5):
                r = ha.api(1 + k % 3, "POST", CM.format(ns=ns), {"metadata": {"name": f"kw-{k}"}})
                codes.append(r.status_code)
                if r.status_code in (201, 409):
                    break
                time.sleep(1)
    finally:
        member = start(cmd, ha.dir / "etcd-0-again.log").popen
        ha.restarted.append(member)
        (ha.dir / "etcd" / "etcd-0.pid").write_text(str(member.pid))
    time.sleep(3)
    outs = {}
    for i, p in procs.items():
        p.terminate()
        out, _ = p.communicate(timeout=10)
        outs[i] = [line.split()[1] for line in out.splitlines() if line.startswith("ADDED")]
    want = [f"kw-{k}" for k in range(9)]
    assert set(codes) <= {201, 409, 503}, codes
    assert names(ha.json(1, "GET", CM.format(ns=ns))) == want
    assert outs == {1: want, 2: want, 3: want}, outs
    wait_for(lambda: ha.api(1, "GET", "/readyz").status_code == 200, 30, what="etcd-0 back")


# --- credentials on every API server -------------------------------------------------------

def test_a_deleted_serviceaccounts_token_stops_working_on_every_api_server(ha: HA) -> None:
    """A token made through cp-1 works on all three; its ServiceAccount deleted through cp-1,
    it is 401 at once on every API server, and stays so when one of that name is made again."""
    ha.kubectl("apply", "-f", "-", input="""
apiVersion: v1
kind: ServiceAccount
metadata: {name: bot26}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bot26-view}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: bot26, namespace: default}]
""")
    tok = ha.kubectl("create", "token", "bot26", context=1).stdout.strip()
    path = CM.format(ns="default")
    assert [ha.api(i, "GET", path, token=tok).status_code for i in (1, 2, 3)] == [200, 200, 200]
    ha.kubectl("delete", "sa", "bot26", context=1)
    assert [ha.api(i, "GET", path, token=tok).status_code for i in (2, 3, 1)] == [401, 401, 401]
    ha.kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: bot26}\n",
               context=2)
    time.sleep(1)
    assert [ha.api(i, "GET", path, token=tok).status_code for i in (1, 2, 3)] == [401, 401, 401]


def node_join(ha: HA, i: int, node: str, source: str) -> str:
    """A node's join through cp-<i>: the bootstrap token and its own CSR, from its own address."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    boot = yaml.safe_load((ha.dir / "node.kubeconfig").read_text())["users"][0]["user"]["token"]
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName(node),
                                                       x509.IPAddress(ipaddress.ip_address(source))]), critical=False)
           .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256()))
    host, port = ha.servers[i - 1].split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=ha.ca),
                                       source_address=(source, 0), timeout=20)
    conn.request("POST", f"/apis/kube32.io/v1/nodecredentials/{node}",
                 body=json.dumps({"csr": csr.public_bytes(serialization.Encoding.PEM).decode()}),
                 headers={"Authorization": f"Bearer {boot}", "Content-Type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    assert r.status in (200, 201), (r.status, body[:300])
    return json.loads(body)["token"]


def test_a_rejoined_nodes_old_token_is_refused_everywhere_even_by_a_server_stopped_meanwhile(ha: HA) -> None:
    """A node joins through cp-1 (its token works on all three), then again through cp-2
    while cp-3 is SIGSTOPped: the first token is 401 at once on cp-2, and within 5 s of
    cp-3 waking on every API server; the second works everywhere."""
    t1 = node_join(ha, 1, "ghost26", "127.0.0.55")
    assert [ha.api(i, "GET", "/api/v1/nodes", token=t1).status_code for i in (1, 2, 3)] == [200, 200, 200]
    pid3 = ha.pid(3)
    os.kill(pid3, signal.SIGSTOP)
    try:
        t2 = node_join(ha, 2, "ghost26", "127.0.0.55")
        assert ha.api(2, "GET", "/api/v1/nodes", token=t1).status_code == 401
        time.sleep(2)
    finally:
        os.kill(pid3, signal.SIGCONT)
    time.sleep(5.5)
    assert [ha.api(i, "GET", "/api/v1/nodes", token=t1).status_code for i in (1, 2, 3)] == [401, 401, 401]
    assert [ha.api(i, "GET", "/api/v1/nodes", token=t2).status_code for i in (1, 2, 3)] == [200, 200, 200]
    ha.kubectl("delete", "node", "ghost26", "--wait=false", check=False)


def test_the_peer_header_grants_nothing_and_checkpoint_data_stays_behind_rbac(ha: HA) -> None:
    """A Save's data lives on one API server.  A viewer in its namespace and an editor of
    another GET it through each API server, with and without the header the API servers
    send each other (``X-Kube32-Peer``), anonymous with it too: 403 (401) everywhere; the
    admin gets it through every API server."""
    ha.counter_pod("peerpod", "sim-1")
    out = cli(ha.cluster, "checkpoint", "peerpod")
    assert out.returncode == 0, out.stderr.decode()
    ck = out.stdout.decode().split("checkpoint ")[-1].strip()
    ha.kubectl("create", "ns", "other26")
    ha.kubectl("apply", "-f", "-", input="""
apiVersion: v1
kind: ServiceAccount
metadata: {name: viewer26}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer26}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: viewer26, namespace: default}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: editor26, namespace: other26}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: editor26, namespace: other26}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: ServiceAccount, name: editor26, namespace: other26}]
""")
    who = {"viewer": ha.kubectl("create", "token", "viewer26").stdout.strip(),
           "other-ns-editor": ha.kubectl("-n", "other26", "create", "token", "editor26").stdout.strip()}
    seen = {}
    for i in (1, 2, 3):
        for name, tok in who.items():
            for hdr in ({}, {"X-Kube32-Peer": "1"}):
                seen[(i, name, bool(hdr))] = ha.api(i, "GET", f"{CK}/{ck}/data", token=tok, headers=hdr).status_code
        seen[(i, "anonymous", True)] = requests.get(ha.servers[i - 1] + f"{CK}/{ck}/data", verify=ha.ca,
                                                    headers={"X-Kube32-Peer": "1"}, timeout=10).status_code
        assert ha.api(i, "GET", f"{CK}/{ck}/data").status_code == 200
    assert {k: v for k, v in seen.items() if v not in (401, 403)} == {}
    ha.kubectl("delete", "pod", "peerpod", "--wait=false")


def api_server_of(ha: HA, node: str) -> int | None:
    """The API server ``node``'s worker talks to, as ``ss`` shows an operator: the one it
    holds the most connections to."""
    pid = worker_pid(ha.cluster, node)
    ports = {int(u.rsplit(":", 1)[1]): i for i, u in enumerate(ha.servers, 1)}
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True).stdout
    count: dict[int, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if f"pid={pid}," in line and len(parts) >= 4:
            i = ports.get(int(parts[3].rsplit(":", 1)[1]))
            if i:
                count[i] = count.get(i, 0) + 1
    return max(count, key=lambda i: count[i]) if count else None


def test_a_move_restores_through_another_api_server_than_the_one_holding_its_snapshot(ha: HA) -> None:
    """cp-2 leads, so its controllers store snapshots on another API server, while the
    workers talk to cp-2: a move's target fetches the snapshot through cp-2, which streams
    it from the peer holding it.  The pod moves with its state; the data stays on the peer."""
    ensure_leader(ha, 2)
    ha.counter_pod("viapeer", "sim-1")
    before = ha.hit("viapeer")
    assert before
    target = wait_for(lambda: api_server_of(ha, "sim-2"), 10, what="sim-2's API server")
    out = ha.move("viapeer", "sim-2")
    ck = next(c for c in ha.json(1, "GET", CK)["items"]
              if c["spec"]["podName"] == "viapeer" and c["spec"].get("action") == "Move")
    holder = ha.data_holder(ck["metadata"]["name"])
    assert holder and holder != target, (
        f"the snapshot is on cp-{holder} and sim-2 talks to cp-{target}: no peer was needed\n{out.stdout!r}")
    after = ha.hit("viapeer")
    assert after and after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, after
    ha.kubectl("delete", "pod", "viapeer", "--wait=false")


# --- the controllers' leader ----------------------------------------------------------------

def ensure_leader(ha: HA, target: int) -> None:
    """Makes cp-<target> the controllers' leader: the others SIGSTOPped a little longer than
    the lease (4 s), so only it can take the Lease, then woken."""
    if ha.leader() == target:
        return
    pids = [ha.pid(i) for i in (1, 2, 3) if i != target]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        try:
            # The lease (4 s) and a retry; more on a loaded CI machine, where a control
            # plane restarted by the test before is still warming up.
            wait_for(lambda: ha.leader((target,)) == target, 45, what=f"cp-{target} leading")
        except AssertionError as e:
            lease = ha.api(target, "GET", CM_LEASE, timeout=3)
            log = (ha.dir / "logs" / f"cp-{target}.log")
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(f"{e}\nthe Lease through cp-{target}: {lease.status_code} {lease.text[:600]}"
                                 f"\ncp-{target}'s log:\n{tail}") from None
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    time.sleep(3)  # the woken ones see that they lost it
    assert ha.leader() == target


def test_a_lease_written_with_a_skewed_clock_neither_blocks_nor_steals_leadership(ha: HA) -> None:
    """The controllers' Lease as a control plane with a wrong clock writes it (its token,
    system:kube-apiserver, the only one that may): (1) a holder whose renewTime is an hour
    ahead, then gone: a real control plane leads again after the lease duration (judged by
    when a change was observed, as client-go, not by renewTime); (2) a holder renewing every
    0.7 s with a renewTime an hour behind: nobody takes the Lease while it renews."""
    system = ha.system_token()
    stamp = lambda d: (dt.datetime.now(dt.timezone.utc) + d).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
    ahead = stamp(dt.timedelta(hours=1))
    ha.json(2, "PATCH", CM_LEASE, {"spec": {"holderIdentity": "ghost-fast-clock", "renewTime": ahead,
                                            "acquireTime": ahead}}, token=system, headers=MERGE)
    t0 = time.monotonic()
    wait_for(lambda: ha.leader() is not None, 20, what="a real leader after a renewTime in the future")
    assert time.monotonic() - t0 < 15
    stolen = []
    for k in range(12):
        if k:
            holder = ha.json(2, "GET", CM_LEASE)["spec"].get("holderIdentity")
            if holder != "ghost-slow-clock":
                stolen.append((k, holder))
        ha.json(2, "PATCH", CM_LEASE, {"spec": {"holderIdentity": "ghost-slow-clock",
                                                "renewTime": stamp(-dt.timedelta(hours=1))}},
                token=system, headers=MERGE)
        time.sleep(0.7)
    assert not stolen, f"the Lease was taken while its holder renewed it: {stolen}"
    wait_for(lambda: ha.leader() is not None, 20, what="a real leader after the slow-clock holder stopped")


def test_the_leader_killed_between_the_replacement_and_the_moving_status(ha: HA) -> None:
    """A move labelled with the test hook ``hold-moving-status`` (its Moving status written
    30 s after the replacement); the leader SIGKILLed once the replacement exists while the
    Checkpoint still says Saving: the new leader completes the move, one pod, state kept."""
    ensure_leader(ha, 1)
    ha.counter_pod("heldmv", "sim-1")
    ha.hit("heldmv", 2)
    uid0 = ha.json(2, "GET", "/api/v1/namespaces/default/pods/heldmv")["metadata"]["uid"]
    ha.json(2, "POST", CK, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                            "metadata": {"name": "heldmv-move", "labels": {"kube32.io/test-fault": "hold-moving-status"}},
                            "spec": {"podName": "heldmv", "action": "Move", "target": {"nodeName": "sim-2"}}})
    wait_for(lambda: ha.json(2, "GET", "/api/v1/namespaces/default/pods/heldmv")["metadata"]["uid"] != uid0, 30,
             what="the replacement")
    assert ha.json(2, "GET", f"{CK}/heldmv-move")["status"].get("phase") == "Saving"
    cmd = ha.kill(1)
    try:
        wait_for(lambda: ha.json(2, "GET", f"{CK}/heldmv-move")["status"].get("phase") == "Completed", 40,
                 what="the move completed by the new leader")
        pods = [p for p in ha.json(2, "GET", "/api/v1/namespaces/default/pods")["items"]
                if p["metadata"]["name"].startswith("heldmv")]
        assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "sim-2"
        st = ha.hit("heldmv", 2)
        assert st and st["requests"] == 3 and st["restored_calls"] == 1, st
    finally:
        ha.restart(1, cmd)
        ha.kubectl("delete", "pod", "heldmv", "--wait=false")


def test_a_sigkilled_leader_is_replaced_within_seconds_and_kubectl_and_moves_go_on(ha: HA) -> None:
    """The leader (cp-1, the kubeconfig's first API server) SIGKILLed: another leads within
    lease + retry, kubectl answers through both others, and kube32-cli moves a pod with its
    state, leaving the dead first server."""
    ensure_leader(ha, 1)
    ha.counter_pod("afterkill", "sim-1")
    before = ha.hit("afterkill", 2)
    assert before
    cmd = ha.kill(1)
    t0 = time.monotonic()
    try:
        new = wait_for(lambda: ha.leader((2, 3)) in (2, 3) and ha.leader((2, 3)), 15, what="a new leader")
        assert time.monotonic() - t0 < 10, f"cp-{new} led {time.monotonic() - t0:.1f}s after the kill"
        for i in (2, 3):
            assert "sim-1" in ha.kubectl("get", "nodes", "-o", "name", context=i).stdout
        ha.move("afterkill", "sim-2", 40)
        st = ha.hit("afterkill", 2)
        assert st and st["requests"] == before["requests"] + 1 and st["restored_calls"] == 1, st
    finally:
        ha.restart(1, cmd)
        ha.kubectl("delete", "pod", "afterkill", "--wait=false")


# --- checkpoint data when its API server goes ------------------------------------------------

def test_an_api_server_restarted_within_its_lease_marks_the_checkpoints_it_lost(ha: HA) -> None:
    """A Save's data API server SIGKILLed and started again at once (a crash loop, an OOM
    kill), well within its Lease's term: every API server answers the data 404, and the
    Checkpoint says DataStored=False with its size gone (attack 26b: Saved, 64Ki, for good)."""
    ha.counter_pod("hold1", "sim-1")
    out = cli(ha.cluster, "checkpoint", "hold1")
    assert out.returncode == 0, out.stderr.decode()
    name = out.stdout.decode().split("checkpoint ")[-1].strip()
    holder = ha.data_holder(name)
    assert holder, "nobody holds the data"
    ha.restart(holder, ha.kill(holder))
    for i in (1, 2, 3):
        assert ha.api(i, "GET", f"{CK}/{name}/data").status_code == 404, i

    def marked() -> bool:
        st = ha.json(1, "GET", f"{CK}/{name}")["status"]
        conds = {c["type"]: c for c in st.get("conditions") or []}
        return conds.get("DataStored", {}).get("status") == "False" and "sizeBytes" not in st
    wait_for(marked, 30, interval=1, what=f"{name} saying its data is gone")
    # The same clean fallback as after a control plane restart: a pod asked to restore from
    # it fails to, and is replaced to start afresh.
    ha.json(2, "POST", "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "phoenix26", "annotations": {
            "kube32.io/restore-from": name}},
        "spec": {"nodeName": "sim-2", "containers": [{"name": "c", "image": ha.image()}]}})
    fresh = wait_for(lambda: (s := ha.hit("phoenix26", 3)) and s["init_calls"] == 1 and s, 40,
                     what="phoenix26 to start afresh")
    assert fresh["restored_calls"] == 0, fresh
    ha.kubectl("delete", "pod", "hold1", "phoenix26", "--wait=false")


def test_the_api_servers_pulling_a_moves_snapshot_die_mid_transfer_and_the_pod_thaws(ha: HA) -> None:
    """A pod on ``slow`` (its snapshot pauses 8 s halfway) is moved; while the Checkpoint
    says Saving, both API servers other than the leader's are SIGKILLed: the one streaming
    the snapshot from the node is among them (the leader's controllers use the other API
    servers first).  The move fails, and the pod thaws where it runs with its state, through
    the API server left (attack 26b: it stayed frozen, every request 503 "is frozen")."""
    ha.counter_pod("sl1", "slow")
    for _ in range(3):
        before = ha.hit("sl1")
    assert before and before["requests"] >= 3
    lead = wait_for(ha.leader, 30, what="a leader")
    others = [i for i in (1, 2, 3) if i != lead]
    # Earlier tests killed and restarted API servers: a leader whose controllers' client
    # failed over onto its own API server moves them back to a peer within
    # PEER_CHECK_SECONDS of one running again (kube32/sim/controlplane.py).
    time.sleep(3 * PEER_CHECK_SECONDS)
    mover = cli_bg(ha, "move", "sl1", "--to", "sim-1", "--timeout", "90")

    def saving() -> bool:
        return any(c["spec"]["podName"] == "sl1" and c.get("status", {}).get("phase") == "Saving"
                   for c in ha.json(lead, "GET", CK)["items"])
    cmds: dict[int, list[str]] = {}
    try:
        wait_for(saving, 30, interval=0.1, what="the move Saving")
        time.sleep(1.5)  # the snapshot is being streamed (it pauses 8 s halfway)
        cmds = {i: ha.kill(i) for i in others}
        out, _ = mover.communicate(timeout=150)
        assert mover.returncode != 0, f"the move did not fail, so no transfer was cut:\n{out}"
        after = wait_for(lambda: ha.hit("sl1", lead), 60, what="sl1 answering on its source")
        assert after["requests"] > before["requests"], (out, before, after)
        pods = [p for p in ha.json(lead, "GET", "/api/v1/namespaces/default/pods")["items"]
                if p["metadata"]["name"] == "sl1"]
        assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "slow", pods
    finally:
        if mover.poll() is None:
            mover.kill()
        for i, cmd in cmds.items():
            ha.restart(i, cmd)
        ha.kubectl("delete", "pod", "sl1", "--wait=false")


def cli_bg(ha: HA, *args: str) -> subprocess.Popen:
    import sys
    return subprocess.Popen([sys.executable, "-m", "kube32.cli.main", *args, "--kubeconfig", str(ha.cluster.kubeconfig)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def test_the_workers_api_server_dies_and_every_node_stays_ready_and_runs_new_pods(ha: HA) -> None:
    """The workers' first API server (cp-2) SIGKILLed: they go on through another, so for
    longer than the node monitor grace period every node stays Ready, and a pod created
    meanwhile runs."""
    cmd = ha.kill(2)
    try:
        deadline = time.monotonic() + GRACE + 4
        while time.monotonic() < deadline:
            for n in ha.json(1, "GET", "/api/v1/nodes")["items"]:
                if n["metadata"]["name"] in ("sim-1", "sim-2", "slow"):
                    ready = [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"]
                    assert ready == ["True"], (n["metadata"]["name"], n["status"]["conditions"])
            time.sleep(2)
        ha.counter_pod("nocp2", "sim-1")
        assert ha.hit("nocp2", 3)
        assert ha.cluster.proc.popen.poll() is None, "kube32-sim up stopped the cluster"
    finally:
        ha.restart(2, cmd)
        ha.kubectl("delete", "pod", "nocp2", "--wait=false", check=False)


# --- etcd quorum loss ------------------------------------------------------------------------

def test_a_quorum_loss_longer_than_the_node_grace_period_loses_no_node_and_no_pod(ha: HA) -> None:
    """Two etcd members of three SIGSTOPped for longer than the node monitor grace period:
    every API server's /readyz and /livez fail (500, their etcd check, as kube-apiserver's);
    once the members wake, no node turns NotReady, the pods run on with their state, a
    leader holds the controllers' Lease and a move completes."""
    ha.counter_pod("q1", "sim-1")
    before = ha.hit("q1")
    assert before
    pids = ha.etcd_pids()[:2]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    t0 = time.monotonic()
    bad = []
    try:
        time.sleep(4)
        while time.monotonic() - t0 < GRACE + 4:
            for i in (1, 2, 3):
                codes = tuple(ha.api(i, "GET", f"/{p}?verbose", timeout=5).status_code for p in ("readyz", "livez"))
                if codes != (500, 500):
                    bad.append((round(time.monotonic() - t0), i, codes))
            time.sleep(2)
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    assert not bad, bad
    all_ready(ha)
    wait_for(ha.leader, 40, what="a leader")
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        for n in ha.json(1, "GET", "/api/v1/nodes")["items"]:
            if n["metadata"]["name"] in ("sim-1", "sim-2", "slow"):
                ready = [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"]
                assert ready == ["True"], (n["metadata"]["name"], n["status"]["conditions"])
        time.sleep(2)
    after = ha.hit("q1")
    assert after and after["requests"] > before["requests"]
    ha.move("q1", "sim-2")
    assert ha.hit("q1")["requests"] > after["requests"]
    ha.kubectl("delete", "pod", "q1", "--wait=false")

