"""Adversarial bodies and slow clients against a real cluster (``kube32-sim up`` with one
worker, Leases renewed every second), through curl, kubectl and raw HTTPS.

While the bombs fly, a probe thread asks ``/healthz`` and renews a Lease of its own
every 0.2 s, and reads the worker's Lease: each answer must come within 1 s, and the
worker's renewals must keep landing.  Then:

* every writing endpoint gets decoder bombs (YAML aliases 9^8, 10^5 levels of JSON
  and YAML nesting, NaN) and oversized bodies: each is refused with a 4xx Status
  naming the reason, quickly, and nothing is stored;
* a JSON patch that doubles an object by copies, or nests it past the limit, is refused;
* 200 half-sent requests, silent connections and stalled bodies to the writing
  endpoints are answered 408 (or closed) at the deadlines, while a steady 16 MiB
  checkpoint data upload still succeeds;
* lesser validation: an apply patch without kind, a non-string kind, quantities past
  2^63-1, and a pod bound to a node it does not fit (the kubelet rejects it).
"""
from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.conftest import ControlPlane, start_cluster, wait_for
from tests.e2e.test_checkpoint_data import snapshot

pytestmark = pytest.mark.e2e

NS = "default"
WORKER = "sim-1"
LIMIT = 3 * 1024 * 1024
CM = f"/api/v1/namespaces/{NS}/configmaps"
PODS = f"/api/v1/namespaces/{NS}/pods"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


class Api:
    """Raw HTTPS to the API server with the admin token (one connection per call)."""

    def __init__(self, cluster: ControlPlane) -> None:
        doc = yaml.safe_load(cluster.kubeconfig.read_text())
        server = doc["clusters"][0]["cluster"]["server"]
        self.host, port = server.removeprefix("https://").split(":")
        self.port = int(port)
        self.token = doc["users"][0]["user"]["token"]
        self.ctx = ssl.create_default_context(
            cadata=base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
        self.ctx.check_hostname = False

    def call(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json",
             timeout: float = 60, auth: bool = True) -> tuple[int, Any, float]:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)
        headers = {"Content-Type": ctype}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        start = time.monotonic()
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        took = time.monotonic() - start
        try:
            return resp.status, json.loads(data), took
        except ValueError:
            return resp.status, data, took

    def connect(self) -> ssl.SSLSocket:
        sock = socket.create_connection((self.host, self.port), timeout=120)
        return self.ctx.wrap_socket(sock, server_hostname=self.host)


class Probe(threading.Thread):
    """Every 0.2 s: /healthz, a renewal of the probe's own Lease, the worker's Lease."""

    def __init__(self, api: Api) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.stop = threading.Event()
        self.slow: list[str] = []          # answers that took over 1 s (or failed)
        self.worst = 0.0
        self.renewals: set[str] = set()    # the worker's renewTimes seen
        self.oldest_renewal = 0.0          # the largest age of the worker's renewTime seen
        self.started = time.monotonic()

    def _timed(self, what: str, method: str, path: str, body: bytes | None = None,
               ctype: str = "application/json", auth: bool = True) -> Any:
        try:
            code, out, took = self.api.call(method, path, body, ctype, timeout=5, auth=auth)
        except OSError as e:
            self.slow.append(f"{what}: {e!r}")
            return None
        self.worst = max(self.worst, took)
        if took > 1.0 or code >= 300:
            self.slow.append(f"{what}: {code} in {took:.2f}s")
        return out

    def run(self) -> None:
        self.started = time.monotonic()
        while not self.stop.wait(0.2):
            self._timed("healthz", "GET", "/healthz", auth=False)
            now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            self._timed("lease renewal", "PATCH", f"{LEASES}/adversarial-probe",
                        json.dumps({"spec": {"renewTime": now}}).encode(), "application/merge-patch+json")
            lease = self._timed("worker lease", "GET", f"{LEASES}/{WORKER}")
            if isinstance(lease, dict):
                renew = lease["spec"]["renewTime"]
                self.renewals.add(renew)
                at = dt.datetime.strptime(renew, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
                age = (dt.datetime.now(dt.timezone.utc) - at).total_seconds()
                self.oldest_renewal = max(self.oldest_renewal, age)

    def check(self) -> None:
        """Asserts, after 3 s of probing at least (so renewals can be seen)."""
        time.sleep(max(0.0, self.started + 3.5 - time.monotonic()))
        self.stop.set()
        self.join(10)
        assert not self.slow, f"health or Lease answers were slow or failed: {self.slow[:10]}"
        assert len(self.renewals) >= 3, f"the worker's Lease was not renewed: {self.renewals}"
        assert self.oldest_renewal < 4.0, f"the worker's Lease went {self.oldest_renewal:.1f}s unrenewed"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("adversarial"), 1, "--lease-interval", "1")
    try:
        c.kubectl("create", "configmap", "target", "--from-literal=a=b")
        c.kubectl("create", "deployment", "target", "--image=example", "--replicas=0")
        c.kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: Pod\nmetadata: {name: target}\nspec:\n"
                  "  schedulerName: nobody\n  containers: [{name: main, image: example}]\n")
        c.kubectl("apply", "-f", "-", input="apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: "
                  "{name: adversarial-probe, namespace: kube-node-lease}\nspec: {holderIdentity: probe}\n")
        c.kubectl("apply", "-f", "-", input="apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                  "metadata: {name: ck}\nspec: {podName: target}\n")
        wait_for(lambda: c.kubectl("get", "lease", "-n", "kube-node-lease", WORKER, check=False).returncode == 0,
                 30, what="the worker's Lease")
        yield c
    finally:
        c.proc.stop(timeout=30)


@pytest.fixture
def api(cluster: ControlPlane) -> Api:
    return Api(cluster)


@pytest.fixture
def probe(api: Api) -> Iterator[Probe]:
    p = Probe(api)
    p.start()
    yield p
    p.stop.set()


# --- the bombs ---------------------------------------------------------------------------
def alias_bomb(levels: int = 8) -> bytes:
    """"Billion laughs": 9 aliases of 9 aliases ... of 9 strings, 9^(levels+1) when expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for prev, name in zip(names, names[1:levels + 1], strict=False):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    data = "\n".join("  " + line for line in lines)
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb\ndata:\n{data}\n".encode()


DEEP = 100_000
DEEP_JSON = b'{"metadata":{"name":"deep"},"data":{"a":' + b"[" * DEEP + b"]" * DEEP + b"}}"
DEEP_YAML = b"metadata: {name: deep}\nspec: " + b"[" * DEEP + b"]" * DEEP + b"\n"
DEEP_BLOCK_YAML = b"metadata: {name: deep}\nspec:\n" + b"".join(b" " * i + b"- \n" for i in range(0, 2000, 1))
NAN = b'{"metadata":{"name":"nan"},"data":{"a":"b"},"x":NaN}'
# Numbers past a 64-bit float: Python reads 1e999 as Infinity, stored as the non-JSON
# token Infinity that fails every Go client (issue 19, attack round 19).
INF = b'{"metadata":{"name":"inf"},"data":{"a":"b"},"x":1e999}'
HUGE_INT = b'{"metadata":{"name":"inf"},"data":{"a":"b"},"x":' + b"9" * 400 + b"}"
INF_YAML = b"metadata: {name: inf}\ndata: {a: b}\nx: -.inf\n"
BIG = b'{"metadata":{"name":"big"},"data":{"a":"' + b"x" * LIMIT + b'"}}'
# As costly as a body may be: just under the limit of 200,000 values, and past it.
WIDE_JSON = b'{"metadata":{"name":"wide"},"spec":[' + b",".join([b"1"] * 199_000) + b"]}"
WIDE_YAML = b"metadata: {name: wide}\nspec: [" + b",".join([b"1"] * 199_000) + b"]\n"
WIDER = b'{"metadata":{"name":"wide"},"spec":[' + b",".join([b"1"] * (LIMIT // 2 - 100)) + b"]}"
BOMBS = {
    "alias": (alias_bomb(), "application/yaml"),
    "deep-json": (DEEP_JSON, "application/json"),
    "deep-yaml": (DEEP_YAML, "application/yaml"),
    "deep-block-yaml": (DEEP_BLOCK_YAML, "application/yaml"),
    "nan": (NAN, "application/json"),
    "inf": (INF, "application/json"),
    "inf-json-as-yaml": (INF, "application/yaml"),
    "huge-int": (HUGE_INT, "application/json"),
    "inf-yaml": (INF_YAML, "application/yaml"),
    "oversized": (BIG, "application/json"),
    "too-many-values": (WIDER, "application/json"),
}
WIDE = {"wide-json": (WIDE_JSON, "application/json"), "wide-yaml": (WIDE_YAML, "application/yaml")}

WRITES = [  # (method, path, the content type a patch takes instead of the bomb's own)
    ("POST", CM, None),
    ("PUT", f"{CM}/target", None),
    ("PATCH", f"{CM}/target", "application/merge-patch+json"),
    ("PATCH", f"{CM}/target", "application/strategic-merge-patch+json"),
    ("PATCH", f"{CM}/target", "application/json-patch+json"),
    ("PATCH", f"{CM}/target?fieldManager=bomb", "application/apply-patch+yaml"),
    ("DELETE", f"{CM}/target", None),
    ("DELETE", CM, None),
    ("POST", PODS, None),
    ("PUT", f"{PODS}/target/status", None),
    ("PATCH", f"{PODS}/target/status", "application/merge-patch+json"),
    ("POST", f"{PODS}/target/binding", None),
    ("POST", f"{PODS}/target/eviction", None),
    ("POST", f"{PODS}/target/replacement?uid=x", None),
    ("PUT", f"/apis/apps/v1/namespaces/{NS}/deployments/target/scale", None),
    ("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/target/scale", "application/merge-patch+json"),
    ("PUT", f"/api/v1/namespaces/{NS}/finalize", None),
    ("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/default/token", None),
    ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", None),
    ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", None),
    ("POST", "/apis/kube32.io/v1/nodecredentials/bomb", None),
    ("POST", "/apis/kube32.io/v1/namespaces/default/checkpoints", None),
]


def test_decoder_bombs_at_every_writing_endpoint_are_refused_while_health_and_leases_answer(
        cluster: ControlPlane, api: Api, probe: Probe) -> None:
    failures = []
    for method, path, patch_type in WRITES:
        for name, (body, ctype) in BOMBS.items():
            ctype = patch_type or ctype
            code, out, took = api.call(method, path, body, ctype)
            message = out.get("message", "") if isinstance(out, dict) else str(out)[:200]
            if not (400 <= code < 500) or took > 10:
                failures.append(f"{method} {path} {name} ({ctype}): {code} in {took:.1f}s: {message[:200]}")
    # Bodies as costly as a body may be, decoded in full: whatever the endpoint makes of
    # them (some are valid), never a 500, and the loop keeps answering meanwhile (the
    # probe). A 199,000-value YAML body is about 1 s of PyYAML's C parser on a quiet core
    # and 3 s on a loaded one; CI runs two suites on two cores: 20 s bounds it with room.
    for method, path, patch_type in WRITES:
        for name, (body, ctype) in WIDE.items():
            if method == "DELETE":
                continue                     # a valid delete would take the targets away
            code, out, took = api.call(method, path, body, patch_type or ctype)
            if code >= 500 or took > 20:
                message = out.get("message", "") if isinstance(out, dict) else str(out)[:200]
                failures.append(f"{method} {path} {name}: {code} in {took:.1f}s: {message[:200]}")
    assert not failures, "\n".join(failures)
    probe.check()
    names = cluster.kubectl("get", "configmaps", "-o", "name").stdout.split()
    assert not {"configmap/bomb", "configmap/deep", "configmap/nan", "configmap/inf", "configmap/big"} & set(names), names


def test_yaml_alias_bomb_is_413_at_once_and_not_stored(cluster: ControlPlane, api: Api, probe: Probe,
                                                       tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_bytes(alias_bomb())
    assert len(bomb.read_bytes()) < 1024
    start = time.monotonic()
    out = subprocess.run(["curl", "-sk", "--max-time", "30", "-X", "POST", "-H", f"Authorization: Bearer {api.token}",
                          "-H", "Content-Type: application/yaml", "--data-binary", f"@{bomb}",
                          f"https://{api.host}:{api.port}{CM}"], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 5, "the bomb took the server seconds"
    status = json.loads(out.stdout)
    assert status["code"] == 413 and "aliases" in status["message"], status
    got = cluster.kubectl("get", "configmap", "bomb", check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr
    probe.check()


def test_deep_nesting_is_a_400_that_says_so(cluster: ControlPlane, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_bytes(DEEP_JSON)
    out = cluster.kubectl("create", "--raw", CM, "-f", str(deep), check=False)
    assert out.returncode != 0 and "BadRequest" in out.stderr and "nests 100002 levels deep" in out.stderr, out.stderr
    patch = '{"data":' + '{"a":' * 150 + '"x"' + "}" * 150 + "}"
    out = cluster.kubectl("patch", "configmap", "target", "--type", "merge", "-p", patch, check=False)
    assert out.returncode != 0 and "more than the limit of 100 levels" in out.stderr, out.stderr


def test_json_patch_bombs_are_refused(cluster: ControlPlane, tmp_path: Path) -> None:
    doubling = [{"op": "add", "path": "/metadata/annotations", "value": {"s": "y" * 4096}}]
    doubling += [{"op": "copy", "from": "/metadata/annotations", "path": f"/metadata/annotations/c{i}"}
                 for i in range(30)]
    out = cluster.kubectl("patch", "configmap", "target", "--type", "json", "-p", json.dumps(doubling), check=False)
    assert out.returncode != 0 and "RequestEntityTooLarge" in out.stderr and "copy operations" in out.stderr, out.stderr
    nesting = [{"op": "add", "path": "/metadata/annotations", "value": {}}]
    path = "/metadata/annotations"
    for _ in range(120):
        path += "/n"
        nesting.append({"op": "add", "path": path, "value": {}})
    out = cluster.kubectl("patch", "configmap", "target", "--type", "json", "-p", json.dumps(nesting), check=False)
    assert out.returncode != 0 and "levels deep" in out.stderr, out.stderr
    many = tmp_path / "many.json"
    many.write_text(json.dumps([{"op": "test", "path": "/kind", "value": "ConfigMap"}] * 10001))
    out = cluster.kubectl("patch", "configmap", "target", "--type", "json", "--patch-file", str(many), check=False)
    assert out.returncode != 0 and "is 10000, got 10001" in out.stderr, out.stderr


# --- slow clients ----------------------------------------------------------------------------
def _wait_answer(sock: ssl.SSLSocket, out: list, key: str) -> None:
    start = time.monotonic()
    try:
        data = sock.recv(4096)
    except OSError as e:
        data = repr(e).encode()
    out.append((key, time.monotonic() - start, data))


def test_slow_clients_are_cut_off_while_a_steady_upload_succeeds(cluster: ControlPlane, api: Api,
                                                                  probe: Probe) -> None:
    answers: list = []
    threads = []

    def hold(sock: ssl.SSLSocket, key: str) -> None:
        t = threading.Thread(target=_wait_answer, args=(sock, answers, key), daemon=True)
        t.start()
        threads.append(t)

    auth = f"Authorization: Bearer {api.token}\r\n".encode()
    for _ in range(200):                               # half-sent headers
        s = api.connect()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        hold(s, "headers")
    for _ in range(10):                                # connections that say nothing
        hold(api.connect(), "silent")
    for method, path, patch_type in WRITES:            # half-sent bodies at every writing endpoint
        s = api.connect()
        ctype = (patch_type or "application/json").encode()
        s.sendall(method.encode() + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Content-Type: " + ctype + b"\r\nContent-Length: 1000\r\n\r\n{\"metadata\":")
        hold(s, f"body {method} {path}")
    drip = api.connect()                               # a body that drips: a byte a second
    drip.sendall(b"POST " + CM.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth +
                 b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    hold(drip, "drip")

    snap = snapshot(b"\x05" * ((16 << 20) - 65536))       # a 16 MiB snapshot, sent at 4 MiB/s
    up = api.connect()
    data_path = f"/apis/kube32.io/v1/namespaces/{NS}/checkpoints/ck/data"
    up.sendall(b"PUT " + data_path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth +
               b"Content-Type: application/octet-stream\r\nContent-Length: " + str(len(snap)).encode() + b"\r\n\r\n")
    for i in range(0, len(snap), 1 << 20):
        up.sendall(snap[i:i + (1 << 20)])
        time.sleep(0.25)
    up.settimeout(30)
    head = up.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head[:300]

    deadline = time.monotonic() + 75
    while time.monotonic() < deadline and any(t.is_alive() for t in threads):
        try:
            drip.sendall(b" ")
        except OSError:
            pass
        time.sleep(1)
    assert not any(t.is_alive() for t in threads), "some slow connections were still open after 75 s"
    by_kind: dict[str, list] = {}
    for key, took, data in answers:
        by_kind.setdefault(key.split()[0], []).append((key, took, data))
    for _key, took, data in by_kind["headers"]:
        assert data.startswith(b"HTTP/1.1 408") and b"headers did not arrive" in data, data[:200]
        assert 25 < took < 45, took
    for _key, took, data in by_kind["silent"]:
        assert data == b"" and 25 < took < 45, (took, data)
    for key, took, data in by_kind["body"]:
        assert data.startswith(b"HTTP/1.1 408") and b"body stopped coming" in data, (key, data[:300])
        assert 25 < took < 45, (key, took)
    ((_, took, data),) = by_kind["drip"]
    assert data.startswith(b"HTTP/1.1 408") and b"did not arrive whole within 60s" in data, data[:300]
    assert 55 < took < 75, took
    probe.check()


def test_no_request_stores_a_number_json_cannot_hold(cluster: ControlPlane, api: Api) -> None:
    """docs/security.md: NaN, Infinity and numbers past a 64-bit float are 400s.  ``1e999``
    used to decode to Infinity and be stored as the non-JSON token ``Infinity``: one merge
    patch of a pod made every Go client's pod list fail (``kubectl get pods -A -o name``:
    "invalid character 'I' looking for beginning of value").  Attack round 19, moved here
    from tests/attack/test_attack19.py."""
    code, out, _ = api.call("POST", PODS, b'{"metadata":{"name":"inf"},"spec":{"schedulerName":"nobody",'
                            b'"containers":[{"name":"main","image":"example"}]}}')
    assert code == 201, out
    code, out, _ = api.call("POST", CM, INF)
    assert code == 400 and "the number 1e999 is out of the range of a 64-bit float" in out["message"], out
    patches = [(b'{"spec":{"activeDeadlineSeconds":1e999}}', "application/merge-patch+json"),
               (b'{"spec":{"activeDeadlineSeconds":-1E400}}', "application/strategic-merge-patch+json"),
               (b'[{"op":"add","path":"/spec/activeDeadlineSeconds","value":1e999}]', "application/json-patch+json"),
               (b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"inf"},"spec":{"activeDeadlineSeconds":1e999}}',
                "application/apply-patch+yaml"),
               (b"apiVersion: v1\nkind: Pod\nmetadata: {name: inf}\nspec: {activeDeadlineSeconds: .inf}\n",
                "application/apply-patch+yaml")]
    answers = []
    for body, ctype in patches:
        query = "?fieldManager=inf" if "apply" in ctype else ""
        code, out, _ = api.call("PATCH", f"{PODS}/inf{query}", body, ctype)
        answers.append((ctype, code, out.get("message") if isinstance(out, dict) else out))
    listed = cluster.kubectl("get", "pods", "-A", "-o", "name", check=False)
    cms = cluster.kubectl("get", "configmaps", "-o", "name", check=False)
    assert all(code == 400 for _, code, _ in answers), answers
    assert listed.returncode == 0 and "pod/inf" in listed.stdout, listed.stderr
    assert cms.returncode == 0 and "configmap/inf" not in cms.stdout, cms.stdout
    pod = json.loads(cluster.kubectl("get", "pod", "inf", "-o", "json").stdout)
    assert "activeDeadlineSeconds" not in pod["spec"], pod["spec"]


# --- lesser validation -----------------------------------------------------------------------
def test_apply_without_kind_and_non_string_kinds_are_400(cluster: ControlPlane, api: Api) -> None:
    code, out, _ = api.call("PATCH", f"{CM}/applied?fieldManager=me", b"metadata:\n  name: applied\ndata:\n  a: b\n",
                            "application/apply-patch+yaml")
    assert code == 400 and out["message"].startswith("invalid object type: /, Kind="), out
    code, out, _ = api.call("POST", CM, b'{"kind": 5, "metadata": {"name": "numbered"}}')
    assert code == 400 and "kind must be a string" in out["message"], out
    assert cluster.kubectl("get", "configmap", "applied", check=False).returncode != 0
    # As Kubernetes: a create that leaves kind and apiVersion out gets the URL's.
    code, out, _ = api.call("POST", CM, b'{"metadata": {"name": "kindless"}, "data": {"a": "b"}}')
    assert code == 201 and out["kind"] == "ConfigMap" and out["apiVersion"] == "v1", out


@pytest.mark.parametrize("memory", ["1e100", "99999999999999Ei", "9223372036854775808"])
def test_quantities_past_int64_are_refused(cluster: ControlPlane, memory: str) -> None:
    name = f"huge-{len(memory)}"
    pod = (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: main\n"
           f"    image: example\n    resources: {{requests: {{memory: '{memory}'}}}}\n")
    out = cluster.kubectl("apply", "-f", "-", input=pod, check=False)
    assert out.returncode != 0 and "must be no more than 9223372036854775807" in out.stderr, out.stderr
    assert cluster.kubectl("get", "pod", name, check=False).returncode != 0, "the pod was stored"


def test_kubelet_rejects_a_pod_that_does_not_fit(cluster: ControlPlane) -> None:
    pod = (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: too-big}}\nspec:\n  nodeName: {WORKER}\n"
           "  restartPolicy: Never\n  containers:\n  - name: main\n    image: example\n"
           "    resources: {requests: {memory: 1Pi}}\n")
    cluster.kubectl("apply", "-f", "-", input=pod)

    def failed() -> dict | None:
        status = json.loads(cluster.kubectl("get", "pod", "too-big", "-o", "json").stdout).get("status") or {}
        return status if status.get("phase") == "Failed" else None
    status = wait_for(failed, 30, what="the pod to be rejected")
    assert status["reason"] == "OutOfmemory", status
    assert status["message"] == ("Pod was rejected: Node didn't have enough resource: memory, requested: "
                                 f"{1 << 50}, used: 0, capacity: {512 << 20}"), status
    events = cluster.kubectl("get", "events").stdout
    assert any("OutOfmemory" in line and "too-big" in line for line in events.splitlines()), events
    assert "too-big" in cluster.kubectl("get", "pods").stdout
