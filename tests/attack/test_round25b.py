"""Round 25b, an outside tester's attack on stored-bytes serving, the raw value bound,
kubelet status-on-change and the join refusal of a held node name.

One cluster (`kube32-sim up --workers 2`, data dir /tmp/attack25b-t-*) serves the
module; every test says Did / Expected (with a quote) / Happened, and a real failure
fails.  Baseline for "pre-existing": the same probes against 18ce609 (the parent of
58073d6, "a GET answers the stored bytes") gave the same answers where marked.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SIM = str(REPO / ".venv" / "bin" / "kube32-sim")
PY313 = "/root/.pyenv/versions/3.13.0/bin/python3"
CTX = ssl._create_unverified_context()


class Cluster:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.kubeconfig = str(data / "admin.kubeconfig")
        self.node_kubeconfig = str(data / "node.kubeconfig")
        text = (data / "admin.kubeconfig").read_text()
        self.token = next(ln.split()[1] for ln in text.splitlines() if "token:" in ln)
        server = next(ln.split()[1] for ln in text.splitlines() if "server:" in ln)
        self.port = int(server.rsplit(":", 1)[1])

    def req(self, method: str, path: str, body: Any = None, ctype: str = "application/json",
            headers: dict[str, str] | None = None, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
        c = http.client.HTTPSConnection("127.0.0.1", self.port, context=CTX, timeout=60)
        h = {"Authorization": "Bearer " + (token or self.token), "Content-Type": ctype}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args],
                              capture_output=True, text=True, timeout=60, check=check)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    data = Path(tempfile.mkdtemp(prefix="attack25b-t-", dir="/tmp"))
    log = open(data.parent / (data.name + ".log"), "w")
    proc = subprocess.Popen([SIM, "up", "--workers", "2", "--port", "0", "--data-dir", str(data)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "cluster ready" not in Path(log.name).read_text():
            assert proc.poll() is None and time.time() < deadline, Path(log.name).read_text()[-2000:]
            time.sleep(0.5)
        yield Cluster(data)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def _name(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:8]


def _cm(name: str, **extra: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    o.update(extra)
    return o


CM = "/api/v1/namespaces/default/configmaps"


# --------------------------------------------------------------------------- reads

def test_get_list_watch_same_object_for_every_client(cluster: Cluster) -> None:
    """Did: created a ConfigMap, read it by raw GET, as an item of a LIST, as the ADDED
    event of a watch from rv 0, with `kubectl get -o json --show-managed-fields`, and with the
    `kubernetes` Python client (GET and LIST).
    Expected: one object everywhere ("a GET answers the stored bytes, neither decoded nor
    encoded again" must not change what a client decodes).
    Happened: identical (held)."""
    from kubernetes import client, config  # noqa: PLC0415

    name = _name("g")
    s, _, _ = cluster.req("POST", CM, _cm(name, data={"a": "b", "x": "{,[\"]}"}))
    assert s == 201
    _, _, b = cluster.req("GET", f"{CM}/{name}")
    got = json.loads(b)
    _, _, b = cluster.req("GET", f"{CM}?fieldSelector=metadata.name%3D{name}")
    assert json.loads(b)["items"] == [got]
    c = http.client.HTTPSConnection("127.0.0.1", cluster.port, context=CTX, timeout=10)
    c.request("GET", f"{CM}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}&timeoutSeconds=2",
              headers={"Authorization": "Bearer " + cluster.token})
    ev = [json.loads(ln) for ln in c.getresponse().read().splitlines() if ln.strip()]
    assert ev[0]["type"] == "ADDED" and ev[0]["object"] == got
    kc = json.loads(cluster.kubectl("get", "cm", name, "-o", "json", "--show-managed-fields").stdout)
    assert kc == got
    api = client.CoreV1Api(config.new_client_from_config(cluster.kubeconfig))
    py = api.api_client.sanitize_for_serialization(api.read_namespaced_config_map(name, "default"))
    assert py["data"] == got["data"] and py["metadata"]["resourceVersion"] == got["metadata"]["resourceVersion"]
    assert len(py["metadata"]["managedFields"]) == len(got["metadata"]["managedFields"])
    items = api.list_namespaced_config_map("default", field_selector=f"metadata.name={name}").items
    assert [i.metadata.uid for i in items if i.metadata is not None] == [got["metadata"]["uid"]]


def test_pretty_and_yaml_accept_are_ignored(cluster: Cluster) -> None:
    """Did: GET a ConfigMap with `?pretty=true`, with `Accept: application/yaml`, and with
    `Accept: application/vnd.kubernetes.protobuf` alone; `as=Table` as a control.
    Expected: as kube-apiserver, `pretty=true` indents the JSON, `Accept: application/yaml`
    answers YAML, and an Accept the server cannot meet is a 406 (kube-apiserver: "only the
    following media types are accepted").
    Happened: one-line JSON for pretty; JSON (Content-Type application/json) for the YAML
    Accept; 200 JSON for protobuf-only.  Same at 18ce609 (pre-existing, not from the
    stored-bytes change).  as=Table works."""
    name = _name("p")
    cluster.req("POST", CM, _cm(name, data={"a": "b"}))
    _, _, t = cluster.req("GET", f"{CM}/{name}", headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert json.loads(t)["kind"] == "Table"
    _, _, pretty = cluster.req("GET", f"{CM}/{name}?pretty=true")
    _, hy, _ = cluster.req("GET", f"{CM}/{name}", headers={"Accept": "application/yaml"})
    sp, _, _ = cluster.req("GET", f"{CM}/{name}", headers={"Accept": "application/vnd.kubernetes.protobuf"})
    problems = []
    if b"\n  " not in pretty:
        problems.append("pretty=true not indented")
    if "yaml" not in hy.get("Content-Type", ""):
        problems.append(f"Accept yaml answered {hy.get('Content-Type')}")
    if sp != 406:
        problems.append(f"protobuf-only Accept answered {sp}")
    assert not problems, problems


# --------------------------------------------------------------------------- patches

def test_patch_answers_equal_watch_events(cluster: Cluster) -> None:
    """Did: a Deployment (replicas 0, so defaults are filled in), watched by name, then a
    merge, a strategic, a JSON and an apply patch (fieldManager atk).
    Expected: each answer is exactly the stored object the watch's MODIFIED event of the
    same resourceVersion carries ("a patch's answer and a watch's line are made from the
    bytes just stored"), defaults and managedFields included.
    Happened: equal for all four; same as at 18ce609 after normalising uid/times (held)."""
    ns = "/apis/apps/v1/namespaces/default/deployments"
    name = _name("d")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {"a": "1"}},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "c", "image": "kube32.io/wasm-sha256:" + "0" * 64}]}}}}
    s, _, b = cluster.req("POST", ns, dep)
    assert s == 201, b
    rv = json.loads(b)["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []

    def watch() -> None:
        c = http.client.HTTPSConnection("127.0.0.1", cluster.port, context=CTX, timeout=20)
        c.request("GET", f"{ns}?watch=1&fieldSelector=metadata.name%3D{name}&resourceVersion={rv}&timeoutSeconds=6",
                  headers={"Authorization": "Bearer " + cluster.token})
        events.extend(json.loads(ln) for ln in c.getresponse().read().splitlines() if ln.strip())

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(1)
    answers = []
    for ct, body in [
        ("application/merge-patch+json", {"metadata": {"labels": {"b": "2"}}}),
        ("application/strategic-merge-patch+json",
         {"spec": {"template": {"spec": {"containers": [{"name": "c", "env": [{"name": "E", "value": "v"}]}]}}}}),
        ("application/json-patch+json", [{"op": "add", "path": "/metadata/labels/c", "value": "3"}]),
        ("application/apply-patch+yaml", f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  labels:\n    d: '4'\n"),
    ]:
        q = "?fieldManager=atk" + ("&force=true" if "apply" in ct else "")
        s, _, b = cluster.req("PATCH", f"{ns}/{name}{q}", body, ct)
        assert s == 200, b
        answers.append(json.loads(b))
    t.join()
    by_rv = {e["object"]["metadata"]["resourceVersion"]: e["object"] for e in events if e["type"] == "MODIFIED"}
    for a in answers:
        assert by_rv.get(a["metadata"]["resourceVersion"]) == a
    assert "atk" in [m["manager"] for m in answers[-1]["metadata"]["managedFields"]]
    assert answers[-1]["spec"]["strategy"]["type"] == "RollingUpdate"


# --------------------------------------------------------------------------- bodies

RAW_PROBE = textwrap.dedent(r'''
    import gzip, json, socket, ssl, sys, time, uuid
    port, tok = int(sys.argv[1]), sys.argv[2]
    ctx = ssl._create_unverified_context()
    def raw(parts, delay=0.0, timeout=20):
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
        for p in parts:
            s.sendall(p)
            if delay: time.sleep(delay)
        s.settimeout(timeout); out = b""
        try:
            while True:
                x = s.recv(65536)
                if not x: break
                out += x
        except socket.timeout:
            pass
        s.close(); return out.split(b"\r\n")[0].decode()
    def head(cl=None, te=None, ce=None, extra=b""):
        h = (b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
             + tok.encode() + b"\r\nContent-Type: application/json\r\nConnection: close\r\n")
        if te: h += b"Transfer-Encoding: " + te + b"\r\n"
        if cl is not None: h += b"Content-Length: %d\r\n" % cl
        if ce: h += b"Content-Encoding: " + ce + b"\r\n"
        return h + extra + b"\r\n"
    def body(): return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r" + uuid.uuid4().hex[:8]}, "data": {"k": "v,[{"}}).encode()
    r = {}
    b = body(); r["one_packet"] = raw([head(len(b)) + b])
    b = body(); r["header_then_body"] = raw([head(len(b)), b])
    b = body(); r["byte_by_byte"] = raw([head(len(b))] + [bytes([c]) for c in b], delay=0.005)
    b = body(); ch = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (20, b[:20], len(b) - 20, b[20:])
    r["chunked"] = raw([head(te=b"chunked") + ch])
    b = body(); ch = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (20, b[:20], len(b) - 20, b[20:])
    r["chunked_slow"] = raw([head(te=b"chunked")] + [ch[i:i + 3] for i in range(0, len(ch), 3)], delay=0.005)
    g = gzip.compress(body()); r["gzip"] = raw([head(len(g), ce=b"gzip") + g])
    b = body(); r["cl_short"] = raw([head(10) + b])
    b = body(); r["cl_and_te"] = raw([head(5, te=b"chunked") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(b), b)])
    print(json.dumps(r))
''')


def test_body_delivery_shapes_python313(cluster: Cluster) -> None:
    """Did (raw TLS sockets, Python 3.13): a create whose headers and body come in one
    packet, headers then body, the body byte by byte, chunked (fast and 3 bytes at a
    time), gzip; a Content-Length shorter than the body; Content-Length with chunked.
    Expected: "small bodies are read at once when they came with the headers" changes
    nothing a client sees: 201 for the first six, a 4xx for the two lies.
    Happened: 201 x6; 400 for the short Content-Length ("Data after `Connection: close`")
    and for CL+TE (held).  A Content-Length longer than the body is a 408 after 32 s
    ("no body stalled for 32 s (408)"), checked by hand, not here."""
    out = subprocess.run([PY313, "-c", RAW_PROBE, str(cluster.port), cluster.token],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    r = json.loads(out)
    for k in ("one_packet", "header_then_body", "byte_by_byte", "chunked", "chunked_slow", "gzip"):
        assert " 201 " in r[k], (k, r[k])
    for k in ("cl_short", "cl_and_te"):
        assert " 400 " in r[k], (k, r[k])


# --------------------------------------------------------------------------- value bound

def test_value_bound_not_fooled_by_strings(cluster: Cluster) -> None:
    """Did: ConfigMaps whose one string holds 600,000 commas, 300,000 `[{` pairs, 200,000
    `\\",` escapes, 200,000 `\\u002c`; a list of 199,990 zeros plus a 5,000-comma string;
    lists of 199,992 and 199,993 zeros; a 250,000-value merge/JSON/strategic patch.
    Expected: "holds at most 200,000 values (413)", refused only when over.
    Happened: all string tricks 201, 199,992 zeros 201, 199,993 413 ("about 200001
    values"), the big patches 413 with the count (held)."""
    cases = [({"k": "," * 600000}, 201), ({"k": "[{" * 300000}, 201), ({"k": '",' * 200000}, 201)]
    for data, want in cases:
        s, _, b = cluster.req("POST", CM, _cm(_name("b"), data=data))
        assert s == want, b[:200]
    body = json.dumps(_cm(_name("b"), data={"k": "x"})).replace('"x"', '"' + "\\u002c" * 200000 + '"')
    assert cluster.req("POST", CM, body)[0] == 201
    for n, extra, want in [(199_990, "," * 5000, 201), (199_992, "", 201), (199_993, "", 413)]:
        s, _, b = cluster.req("POST", CM, _cm(_name("b"), data={"k": extra}, x=[0] * n))
        assert s == want, (n, b[:200])
    name = _name("b")
    cluster.req("POST", CM, _cm(name, data={"a": "b"}))
    for ct, body2 in [("application/merge-patch+json", {"x": [0] * 250000}),
                      ("application/strategic-merge-patch+json", {"x": [0] * 250000}),
                      ("application/json-patch+json", [{"op": "add", "path": "/x", "value": [0] * 250000}])]:
        s, _, b = cluster.req("PATCH", f"{CM}/{name}", body2, ct)
        assert s == 413 and b"200000" in b, (ct, s, b[:200])


def test_value_bound_counts_an_empty_container_twice(cluster: Cluster) -> None:
    """Did: a ConfigMap with `"x": [[],[],...]` of 100,000 empty lists (about 100,010
    values), and one with 199,000 zeros plus 990 `{}` (about 199,998 values).
    Expected: accepted: "holds at most 200,000 values (413)".
    Happened: 413 "the body holds about 200008 values" and "about 200989 values": each
    empty `[]`/`{}` counts 2.  Same at 18ce609 (pre-existing)."""
    body = json.dumps(_cm(_name("e"))).rstrip("}") + ',"x":[' + ",".join(["[]"] * 100000) + "]}"
    s1, _, b1 = cluster.req("POST", CM, body)
    s2, _, b2 = cluster.req("POST", CM, _cm(_name("e"), x=[0] * 199_000, y=[{}] * 990))
    assert (s1, s2) == (201, 201), (b1[:160], b2[:160])


def test_yaml_body_bound_lower_than_json(cluster: Cluster) -> None:
    """Did: the same ConfigMap with a list of 199,990 zeros sent as JSON and as YAML
    (block `- 0` lines, and flow `[0,0,...]`).
    Expected: one bound for both: "holds at most 200,000 values (413)".
    Happened: JSON 201; both YAML forms 413 "the YAML body holds (its aliases and merge
    keys counted in full) more than 200000 values" (190,000 passes in YAML).  Same at
    18ce609 (pre-existing)."""
    json_status = cluster.req("POST", CM, _cm(_name("j"), x=[0] * 199_990))[0]
    y = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {_name('y')}\nx:\n" + "- 0\n" * 199_990
    yaml_status, _, b = cluster.req("POST", CM, y, "application/yaml")
    assert json_status == 201
    assert yaml_status == 201, b[:200]


# --------------------------------------------------------------------------- authz

def test_namespaced_token_cannot_reach_other_namespaces(cluster: Cluster) -> None:
    """Did: a ServiceAccount with `edit` in namespace atk25; with its token: GET/LIST/watch
    of default's configmaps, `..` and `%2F` path tricks (--path-as-is), a fieldSelector on
    metadata.namespace, nodes, a PATCH of default's object, a create naming another
    namespace in the body.
    Expected: 403 (or 400 for the body's namespace), as kube-apiserver.
    Happened: all refused; own namespace 200 (held)."""
    cluster.kubectl("create", "ns", "atk25", check=False)
    cluster.kubectl("-n", "atk25", "create", "sa", "bad", check=False)
    cluster.kubectl("-n", "atk25", "create", "rolebinding", "bad", "--clusterrole=edit",
                    "--serviceaccount=atk25:bad", check=False)
    tok = cluster.kubectl("-n", "atk25", "create", "token", "bad").stdout.strip()
    target = _name("secret")
    cluster.req("POST", CM, _cm(target, data={"s": "x"}))
    assert cluster.req("GET", "/api/v1/namespaces/atk25/configmaps", token=tok)[0] == 200
    for p in [f"{CM}/{target}", CM, "/api/v1/configmaps", f"/api/v1/namespaces/atk25/../default/configmaps/{target}",
              f"/api/v1/namespaces/atk25%2F..%2Fdefault/configmaps/{target}", f"{CM}?watch=1&timeoutSeconds=1",
              "/api/v1/nodes", "/api/v1/namespaces/default/secrets"]:
        out = subprocess.run(["curl", "-sk", "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}",
                              "-H", f"Authorization: Bearer {tok}", f"https://127.0.0.1:{cluster.port}{p}"],
                             capture_output=True, text=True, timeout=30).stdout
        assert out == "403", (p, out)
    s, _, b = cluster.req("GET", "/api/v1/namespaces/atk25/configmaps?fieldSelector=metadata.namespace%3Ddefault", token=tok)
    assert s == 200 and json.loads(b)["items"] == []
    assert cluster.req("PATCH", f"{CM}/{target}", {"data": {"x": "y"}}, "application/merge-patch+json", token=tok)[0] == 403
    assert cluster.req("POST", "/api/v1/namespaces/atk25/configmaps", _cm("z", data={}) | {"metadata": {"name": "z", "namespace": "default"}}, token=tok)[0] == 400


# --------------------------------------------------------------------------- node status

def _conditions(cluster: Cluster, node: str) -> dict[str, str]:
    n = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)
    return {c["type"]: c["status"] for c in n["status"]["conditions"]}


def test_kubelet_puts_its_status_back_fast_and_keeps_annotations(cluster: Cluster) -> None:
    """Did: `kubectl annotate`/`label` node sim-1, then `kubectl patch --subresource=status`
    Ready=False (reason Attack) and capacity.memory=1Gi.
    Expected: "a Node marked Unknown while its board is alive is put back within a
    second"; the admin's annotation and label stay.
    Happened: Ready=True and the real capacity back within ~0.5 s; annotation and label
    kept (held)."""
    cluster.kubectl("annotate", "node", "sim-1", "attack=1", "--overwrite")
    cluster.kubectl("label", "node", "sim-1", "atk=1", "--overwrite")
    cluster.kubectl("patch", "node", "sim-1", "--subresource=status", "--type=strategic", "-p", json.dumps(
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Attack"}], "capacity": {"memory": "1Gi"}}}))
    t0 = time.time()
    while _conditions(cluster, "sim-1").get("Ready") != "True":
        assert time.time() - t0 < 3, "Ready not put back within 3 s"
        time.sleep(0.2)
    n = json.loads(cluster.kubectl("get", "node", "sim-1", "-o", "json").stdout)
    assert n["status"]["capacity"]["memory"] != "1Gi"
    assert n["metadata"]["annotations"]["attack"] == "1" and n["metadata"]["labels"]["atk"] == "1"


def test_kubelet_write_drops_a_condition_it_does_not_own(cluster: Cluster) -> None:
    """Did: as node-problem-detector does, `kubectl patch --subresource=status` adds a
    condition `KernelDeadlock=False` to sim-1; then flips PIDPressure to True so the
    kubelet writes.
    Expected: Kubernetes' kubelet sets only its own condition types; another agent's stays
    (docs: status "as Kubernetes' kubelet with its nodeStatusReportFrequency").
    Happened: KernelDeadlock stays while the kubelet has nothing to write, then its first
    write (within a second) removes it.  The kubelet at 18ce609 dropped it too on its
    periodic write (pre-existing; now it lasts until the kubelet's next write)."""
    cond = {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock", "message": "npd",
            "lastHeartbeatTime": "2026-12-03T00:00:00Z", "lastTransitionTime": "2026-12-03T00:00:00Z"}
    cluster.kubectl("patch", "node", "sim-1", "--subresource=status", "--type=strategic", "-p",
                    json.dumps({"status": {"conditions": [cond]}}))
    time.sleep(2)
    assert "KernelDeadlock" in _conditions(cluster, "sim-1")
    cluster.kubectl("patch", "node", "sim-1", "--subresource=status", "--type=strategic", "-p",
                    json.dumps({"status": {"conditions": [{"type": "PIDPressure", "status": "True", "reason": "Attack"}]}}))
    time.sleep(3)
    c = _conditions(cluster, "sim-1")
    assert c.get("PIDPressure") == "False"
    assert "KernelDeadlock" in c, c


# --------------------------------------------------------------------------- joins

def _worker(cluster: Cluster, name: str, address: str, tag: str) -> subprocess.Popen[str]:
    d = tempfile.mkdtemp(prefix=f"attack25b-{tag}-", dir="/tmp")
    return subprocess.Popen([SIM, "worker", "--kubeconfig", cluster.node_kubeconfig, "--name", name,
                             "--address", address, "--data-dir", d],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)


def _stop(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(40)
        except subprocess.TimeoutExpired:
            p.kill()
    return p.communicate()[0] if p.stdout else ""


def _wait_joined(p: subprocess.Popen[str], timeout: float) -> tuple[bool, str]:
    assert p.stdout is not None
    out = ""
    t0 = time.time()
    while time.time() - t0 < timeout:
        line = p.stdout.readline()
        if not line:
            break
        out += line
        if " joined " in line:
            return True, out
    return False, out


def test_second_worker_same_name_refused_without_traceback(cluster: Cluster) -> None:
    """Did: `kube32-sim worker --name sim-2 --address 127.0.0.3` (sim-2's own address)
    while sim-2's kubelet runs.
    Expected: refused, 409, "with a clear cause" and no crash dump (a CLI error, as
    kubectl prints one line).
    Happened: refused, exit 1, the cause is clear ("node "sim-2" is held by a running
    kubelet: its Lease was renewed 9 s ago and its kubelet endpoint 127.0.0.3:... takes
    connections; stop that kubelet first ...") but it is the last line of a ~30-line Python
    traceback (kube32.client.rest.ApiError)."""
    p = _worker(cluster, "sim-2", "127.0.0.3", "dup")
    out = p.communicate(timeout=60)[0]
    assert p.returncode != 0 and "held by a running kubelet" in out, out[-800:]
    assert "Traceback" not in out, out[-600:]


def test_node_deleted_then_same_name_from_other_address_takes_running_kubelet_over(cluster: Cluster) -> None:
    """Did: `kubectl delete node sim-2` while its kubelet runs (it logs 404s and does not
    register again, as Kubernetes' kubelet); then `kube32-sim worker --name sim-2
    --address 127.0.0.61`.
    Expected: refused: `up`/`fleet` join "refuses a node name held by a running kubelet
    (409)" (the check: "Lease renewed within its duration, kubelet endpoint taking
    connections"); the first kubelet still runs and takes connections at 127.0.0.3.
    Happened: the second joins at once ("kube32 worker sim-2 ... joined"), the Node is
    re-created at 127.0.0.61, and the first kubelet gets 401 on every Lease renewal and
    status write from then on (its token revoked), without stopping or saying why."""
    cluster.kubectl("delete", "node", "sim-2")
    time.sleep(3)
    p = _worker(cluster, "sim-2", "127.0.0.61", "take")
    try:
        joined, out = _wait_joined(p, 40)
    finally:
        out2 = _stop(p)
    assert not joined, (out + out2)[-600:]


def test_sigkilled_worker_name_rejoins_at_once(cluster: Cluster) -> None:
    """Did: started `kube32-sim worker --name atk-k --address 127.0.0.62`, SIGKILLed it
    once joined, and at once started the same command again.
    Expected: joins at once (its kubelet endpoint no longer takes connections, so the name
    is not held).
    Happened: joined within ~3 s (held)."""
    p = _worker(cluster, "atk-k", "127.0.0.62", "k1")
    joined, out = _wait_joined(p, 60)
    assert joined, out
    time.sleep(2)
    p.kill()
    p.wait()
    t0 = time.time()
    q = _worker(cluster, "atk-k", "127.0.0.62", "k2")
    try:
        joined, out = _wait_joined(q, 40)
        took = time.time() - t0
    finally:
        _stop(q)
    cluster.kubectl("delete", "node", "atk-k", check=False)
    assert joined and took < 15, (took, out[-600:])



def _node_rv(cluster: Cluster, node: str) -> str:
    return json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)["metadata"]["resourceVersion"]


def test_fleet_status_at_rest_and_second_fleet_refused(cluster: Cluster) -> None:
    """Did: `kube32-sim fleet --nodes 3 --prefix atkf` beside the cluster; watched the
    Nodes' resourceVersions for 15 s at rest; patched atkf-2's Ready to False; started a
    second `fleet --nodes 3 --prefix atkf` on the same addresses (on other
    addresses it is a 403 "registered at 127.33.0.1 ... delete the Node first", checked by hand).
    Expected: "its Node status only when it changed (or every 5 minutes)": no Node write
    at rest; the patched Ready "put back within a second" (the fleet's shared watch);
    the second fleet refused, 409 naming the holder.
    Happened: no Node write in 15 s at rest; Ready back in under 2 s; the second fleet
    refused node by node, one WARNING line each, "no node joined" (held)."""
    d = tempfile.mkdtemp(prefix="attack25b-fleet-", dir="/tmp")
    f = subprocess.Popen([SIM, "fleet", "--kubeconfig", cluster.node_kubeconfig, "--nodes", "3", "--prefix", "atkf",
                          "--first-address", "127.33.0.1", "--data-dir", d],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        assert f.stdout is not None
        out = ""
        t0 = time.time()
        while "fleet ready" not in out and time.time() - t0 < 90:
            line = f.stdout.readline()
            if not line:
                break
            out += line
        assert "fleet ready" in out, out[-800:]
        time.sleep(3)
        before = {n: _node_rv(cluster, n) for n in ("atkf-1", "atkf-3")}
        time.sleep(15)
        after = {n: _node_rv(cluster, n) for n in ("atkf-1", "atkf-3")}
        cluster.kubectl("patch", "node", "atkf-2", "--subresource=status", "--type=strategic", "-p", json.dumps(
            {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Attack"}]}}))
        t1 = time.time()
        while _conditions(cluster, "atkf-2").get("Ready") != "True" and time.time() - t1 < 10:
            time.sleep(0.2)
        restored = time.time() - t1
        try:
            g = subprocess.run([SIM, "fleet", "--kubeconfig", cluster.node_kubeconfig, "--nodes", "3", "--prefix", "atkf",
                            "--first-address", "127.33.0.1", "--data-dir", tempfile.mkdtemp(prefix="attack25b-fleet2-", dir="/tmp")],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            second, code = g.stdout + g.stderr, g.returncode
        except subprocess.TimeoutExpired as e:
            second, code = str(e.output), 0
    finally:
        if f.poll() is None:
            f.send_signal(signal.SIGTERM)
            try:
                f.wait(40)
            except subprocess.TimeoutExpired:
                f.kill()
        for i in (1, 2, 3):
            cluster.kubectl("delete", "node", f"atkf-{i}", check=False)
    assert before == after, (before, after)
    assert restored < 2, restored
    assert code != 0 and "held by a running kubelet" in second, second[-800:]


def test_unknown_fields_and_odd_json_not_served_back(cluster: Cluster) -> None:
    """Did: created a ConfigMap with an unknown top-level field `x`, an unknown
    `metadata.zz`, keys with escapes (`"a\\u0062"`, `"\\/"`) and a number `1.0e0` inside an
    annotation-free object; merge-patched an unknown field `y`; GET, LIST, and the PATCH
    answer compared.
    Expected: as kube-apiserver, unknown fields are dropped (a warning) and never served
    back; the GET's stored bytes decode to the object the create answered.
    Happened: the create drops `x` and `metadata.zz` and GET equals its answer (held);
    but the merge patch's unknown `y` is stored and served back by GET, LIST and the
    answer, with `f:y` in managedFields (a JSON patch `add /w` too); a PUT drops them
    again.  Same at 18ce609 (pre-existing, not from the stored-bytes change)."""
    name = _name("u")
    raw = ('{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s","zz":1},'
           '"data":{"a\\u0062":"\\/","k":"v"},"x":[0,1.0e0]}' % name)
    s, _, b = cluster.req("POST", CM, raw)
    assert s == 201, b
    created = json.loads(b)
    _, _, g = cluster.req("GET", f"{CM}/{name}")
    got = json.loads(g)
    assert got == created
    assert "x" not in got and "zz" not in got["metadata"], got
    assert got["data"] == {"ab": "/", "k": "v"}
    s, _, p = cluster.req("PATCH", f"{CM}/{name}", {"y": {"z": 1}, "data": {"n": "1"}}, "application/merge-patch+json")
    assert s == 200, p
    patched = json.loads(p)
    _, _, g2 = cluster.req("GET", f"{CM}/{name}")
    after = json.loads(g2)
    diff = {k: (after.get(k), patched.get(k)) for k in set(after) | set(patched) if after.get(k) != patched.get(k)}
    assert not diff, diff
    assert "y" not in patched, patched


def _slow_post(cluster: Cluster, body: bytes, piece: int, delay: float) -> str:
    import socket  # noqa: PLC0415

    s = CTX.wrap_socket(socket.create_connection(("127.0.0.1", cluster.port)), server_hostname="localhost")
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (CM.encode(), cluster.token.encode(), len(body)))
    try:
        for i in range(0, len(body), piece):
            s.sendall(body[i:i + piece])
            time.sleep(delay)
    except OSError:
        pass  # the server may answer and close before the whole body came
    s.settimeout(30)
    out = b""
    try:
        while True:
            x = s.recv(65536)
            if not x:
                break
            out += x
    except (TimeoutError, OSError):
        pass
    s.close()
    return out.split(b"\r\n")[0].decode()


def test_value_bound_same_for_a_streamed_body(cluster: Cluster) -> None:
    """Did: bodies of 199,992 and 250,000 values (and a 600,000-comma string) sent in
    16 KiB pieces 5 ms apart, so they do not come with the headers.
    Expected: the same answers as in one packet: 201, 413, 201 ("checked on raw bytes
    first" must not depend on how the bytes arrive).
    Happened: 201, 413, 201 (held)."""
    a = json.dumps(_cm(_name("s"), x=[0] * 199_992)).encode()
    b = json.dumps(_cm(_name("s"), x=[0] * 250_000)).encode()
    c = json.dumps(_cm(_name("s"), data={"k": "," * 600_000})).encode()
    got = [_slow_post(cluster, body, 16384, 0.005) for body in (a, b, c)]
    assert [" 201 " in got[0], " 413 " in got[1], " 201 " in got[2]] == [True, True, True], got
