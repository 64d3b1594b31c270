"""Round 25d: an outsider's attack on lists of pods by ``spec.nodeName`` answered from the
API server's watch-fed index (a consistent read from cache, as KEP-2340), and on informers
that resume their watch after a connection error.

Every test starts its own small cluster (``kube32-sim up --workers 2``) or a control plane
and a worker of its own, on free ports, and judges by what kube-apiserver does. The
reference answer for a list by node is always a full list at the same resourceVersion
(``resourceVersion=<rv>&resourceVersionMatch=Exact``), filtered on the client.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import pytest
import requests
import urllib3
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
IMAGE_FILE = REPO / "examples" / "pods" / "counter.wasm"

urllib3.disable_warnings()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """A raw HTTP client with a kubeconfig's token, verifying the cluster CA."""

    def __init__(self, kubeconfig: Path, token: str | None = None) -> None:
        d = yaml.safe_load(kubeconfig.read_text())
        self.server = d["clusters"][0]["cluster"]["server"]
        self.token = token or d["users"][0]["user"]["token"]
        self.ca_pem = base64.b64decode(d["clusters"][0]["cluster"]["certificate-authority-data"])
        f = tempfile.NamedTemporaryFile(delete=False, suffix=".crt")
        f.write(self.ca_pem)
        f.close()
        self.ca_file = f.name
        self.s = requests.Session()
        self.s.trust_env = False
        self.s.verify = f.name
        self.s.headers["Authorization"] = "Bearer " + self.token

    def req(self, method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 60)
        return self.s.request(method, self.server + path, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.req("GET", path, **kw)

    def patch(self, path: str, body: dict[str, Any]) -> requests.Response:
        return self.req("PATCH", path, data=json.dumps(body),
                        headers={"Content-Type": "application/merge-patch+json"})

    def exact(self, rv: str, ns: str | None = None) -> list[dict[str, Any]]:
        base = f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"
        r = self.get(f"{base}?resourceVersion={rv}&resourceVersionMatch=Exact")
        assert r.status_code == 200, r.text
        return list(r.json()["items"])


def keys(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["resourceVersion"])
                  for p in items)


def on_node(items: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [p for p in items if (p["spec"].get("nodeName") or "") == node]


class Cluster:
    def __init__(self, data_dir: Path, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.data_dir = data_dir
        self.port = port
        self.proc = proc
        self.log = log
        self.kubeconfig = data_dir / "admin.kubeconfig"
        self.api = Api(self.kubeconfig)
        self.image = ""

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["KUBECONFIG"] = str(self.kubeconfig)
        e["PATH"] = f"{BIN}:{e['PATH']}"
        return e

    def sh(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"
        return r

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.sh("kubectl", *args, check=check, timeout=timeout)


def start_up(data_dir: Path, port: int) -> Cluster:
    log = Path(str(data_dir) + ".log")
    start = log.stat().st_size if log.exists() else 0
    proc = subprocess.Popen(
        [str(BIN / "kube32-sim"), "up", "--workers", "2", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    t = time.time()
    while "cluster ready" not in log.read_bytes()[start:].decode(errors="replace"):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() - t < 120, log.read_text()[-3000:]
        time.sleep(0.3)
    return Cluster(data_dir, port, proc, log)


def stop_up(c: Cluster) -> None:
    if c.proc.poll() is None:
        c.proc.send_signal(signal.SIGINT)
        try:
            c.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait(10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    data_dir = Path(tempfile.mkdtemp(prefix="attack25d-", dir="/tmp"))
    c = start_up(data_dir, free_port())
    try:
        c.image = c.sh(str(BIN / "kube32-cli"), "image", "push", str(IMAGE_FILE)).stdout.strip()
        yield c
    finally:
        stop_up(c)


def pod_body(name: str, node: str | None, image: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}]}
    if node:
        spec["nodeName"] = node
    else:
        spec["nodeSelector"] = {"attack25d/nothing": "matches"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"v": "0"}}, "spec": spec}


def ensure_ns(api: Api, ns: str) -> None:
    r = api.req("POST", "/api/v1/namespaces",
                json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    assert r.status_code in (201, 409), r.text


def ensure_nodes(api: Api, names: list[str]) -> None:
    """Node objects with no kubelet: PodGC keeps their pods (it deletes pods of missing nodes)."""
    for n in names:
        r = api.req("POST", "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
        assert r.status_code in (201, 409), r.text


def check_by_node(api: Api, node: str, ns: str | None = None, extra: str = "") -> tuple[str, list[dict[str, Any]], list[str]]:
    """List by node and compare with a full list at the same resourceVersion."""
    base = f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"
    r = api.get(f"{base}?fieldSelector={quote('spec.nodeName=' + node)}{extra}")
    assert r.status_code == 200, r.text
    j = r.json()
    rv = j["metadata"]["resourceVersion"]
    full = on_node(api.exact(rv, ns), node)
    exp = keys(full)
    have = keys(j["items"])
    errs = []
    order = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in j["items"]]
    if exp == have and order != [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in full]:
        errs.append(f"list by node {node!r} ns={ns} at rv {rv}: not in the full list's (key) order: {order[:5]}")
    if exp != have:
        errs.append(f"list by node {node!r} ns={ns} at rv {rv}: extra {sorted(set(have) - set(exp))[:5]}"
                    f" missing {sorted(set(exp) - set(have))[:5]}")
    return rv, j["items"], errs


# ---------------------------------------------------------------- 1. read-your-writes


def test_read_your_writes_create_bind_label_delete(cluster: Cluster) -> None:
    """After each acknowledged write, every list by node (cluster-wide and namespaced, pending
    pods included) shows it, at a resourceVersion not older than the write, and equals a full
    list at its resourceVersion."""
    api = cluster.api
    nodes = ["ryw-a", "ryw-b", "ryw-c"]
    ensure_nodes(api, nodes)
    ns = "ryw"
    ensure_ns(api, ns)
    live: dict[str, str] = {}
    errs: list[str] = []
    rnd = random.Random(25)

    def verify(name: str, want_node: str, want_rv: str, labels: dict[str, str] | None = None, gone: bool = False) -> None:
        for n in nodes + [""]:
            for scope in (None, ns):
                rv, items, e = check_by_node(api, n, scope)
                errs.extend(e)
                got = {p["metadata"]["name"]: p for p in items}
                if int(rv) < int(want_rv):
                    errs.append(f"list rv {rv} older than the write {want_rv}")
                if not gone and n == want_node and name not in got:
                    errs.append(f"{name} missing under {n!r} (ns={scope}) at {rv}, write at {want_rv}")
                if (gone or n != want_node) and name in got:
                    errs.append(f"{name} under {n!r} (ns={scope}) at {rv}, but it is on {want_node!r}")
                if name in got and labels is not None and got[name]["metadata"].get("labels") != labels:
                    errs.append(f"{name} stale labels {got[name]['metadata'].get('labels')} != {labels}")

    i = 0
    for _ in range(70):
        op = rnd.choice(["create", "create", "pending", "bind", "label", "delete"])
        if op in ("create", "pending") or not live:
            i += 1
            name = f"p{i}"
            node = "" if op == "pending" else rnd.choice(nodes)
            r = api.req("POST", f"/api/v1/namespaces/{ns}/pods", json=pod_body(name, node, cluster.image))
            assert r.status_code == 201, r.text
            live[name] = node
            verify(name, node, r.json()["metadata"]["resourceVersion"], {"v": "0"})
        elif op == "bind":
            pending = [n for n, v in live.items() if v == ""]
            if not pending:
                continue
            name = rnd.choice(pending)
            node = rnd.choice(nodes)
            r = api.req("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding",
                        json={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                              "target": {"kind": "Node", "name": node}})
            assert r.status_code == 201, r.text
            g = api.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
            live[name] = node
            verify(name, node, g["metadata"]["resourceVersion"])
        elif op == "label":
            name = rnd.choice(list(live))
            v = str(rnd.randint(1, 1000))
            r = api.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"labels": {"v": v}}})
            assert r.status_code == 200, r.text
            verify(name, live[name], r.json()["metadata"]["resourceVersion"], {"v": v})
        else:
            name = rnd.choice(list(live))
            r = api.req("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
            assert r.status_code == 200, r.text
            if api.get(f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 404:
                del live[name]
                verify(name, "", r.json()["metadata"]["resourceVersion"], gone=True)
    assert not errs, "\n".join(errs[:20])


def test_concurrent_writers_lists_equal_full_list(cluster: Cluster) -> None:
    """Three writers churn pods on three nodes while lists by node run: every answer equals a
    full list at its resourceVersion (never a pod under two nodes, never one missing)."""
    api = cluster.api
    nodes = ["cw-a", "cw-b", "cw-c"]
    ensure_nodes(api, nodes)
    ensure_ns(api, "cw")
    stop = threading.Event()

    def writer(k: int) -> None:
        w = Api(cluster.kubeconfig)
        rnd = random.Random(k)
        while not stop.is_set():
            name = f"w{k}-{rnd.randint(0, 30)}"
            op = rnd.random()
            if op < 0.4:
                w.req("POST", "/api/v1/namespaces/cw/pods", json=pod_body(name, rnd.choice(nodes + [""]), cluster.image))
            elif op < 0.6:
                w.req("POST", f"/api/v1/namespaces/cw/pods/{name}/binding",
                      json={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                            "target": {"kind": "Node", "name": rnd.choice(nodes)}})
            elif op < 0.8:
                w.patch(f"/api/v1/namespaces/cw/pods/{name}", {"metadata": {"labels": {"v": str(rnd.random())}}})
            else:
                w.req("DELETE", f"/api/v1/namespaces/cw/pods/{name}?gracePeriodSeconds=0")

    ths = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in ths:
        t.start()
    errs: list[str] = []
    try:
        t0 = time.time()
        n = 0
        while time.time() - t0 < 25:
            for node in nodes + [""]:
                for scope in (None, "cw"):
                    errs.extend(check_by_node(api, node, scope)[2])
                    n += 1
    finally:
        stop.set()
        for t in ths:
            t.join()
    assert n > 20
    assert not errs, "\n".join(errs[:20])


# ---------------------------------------------------------------- moves and drains


def _list_names(cluster: Cluster, node: str) -> list[str]:
    r = cluster.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "json")
    return sorted(p["metadata"]["name"] for p in json.loads(r.stdout)["items"])


def _apply_event(state: dict[tuple[str, str], dict[str, Any]], errs: list[str], node: str,
                 t: str, o: dict[str, Any], rv: int) -> None:
    k = (o["metadata"]["namespace"], o["metadata"]["name"])
    if t != "DELETED" and o["spec"].get("nodeName") != node:
        errs.append(f"{t} of {k} on {o['spec'].get('nodeName')} in the watch of {node}")
    if t == "ADDED":
        if k in state:
            errs.append(f"ADDED twice {k} at {rv}")
        state[k] = o
    elif t == "MODIFIED":
        if k not in state:
            errs.append(f"MODIFIED of unknown {k} at {rv}")
        state[k] = o
    elif t == "DELETED":
        if k not in state:
            errs.append(f"DELETED of unknown {k} at {rv}")
        state.pop(k, None)


def _watch_by_node(api: Api, node: str, params: str, seconds: int, out: dict[str, Any]) -> None:
    """Reads a watch by node and keeps its state; checks it against full lists."""
    r = api.s.get(api.server + f"/api/v1/pods?watch=true&fieldSelector={quote('spec.nodeName=' + node)}"
                  f"{params}&timeoutSeconds={seconds}", stream=True, timeout=seconds + 30)
    assert r.status_code == 200, r.text
    state: dict[tuple[str, str], dict[str, Any]] = {}
    errs: list[str] = []
    last = 0
    initial = "sendInitialEvents" in params
    init_done = not initial
    live = False
    for line in r.iter_lines():
        if not line:
            continue
        ev = json.loads(line)
        t, o = ev["type"], ev["object"]
        rv = int(o["metadata"]["resourceVersion"])
        if t == "BOOKMARK":
            if o["metadata"].get("annotations", {}).get("k8s.io/initial-events-end") == "true":
                init_done = True
                exp = keys(on_node(api.exact(str(rv)), node))
                if keys(list(state.values())) != exp:
                    errs.append(f"initial events of {node} != full list at {rv}: "
                                f"{keys(list(state.values()))} vs {exp}")
            continue
        if t == "ERROR":
            errs.append(f"ERROR event {o}")
            continue
        _apply_event(state, errs, node, t, o, rv)
        # with resourceVersion=0 the synthetic ADDED events carry their objects' own
        # revisions (in key order); the changes begin with the first other event
        live = live or t != "ADDED"
        if init_done and (initial or live):
            last = max(last, rv)
    if last:
        exp = keys(on_node(api.exact(str(last)), node))
        if keys(list(state.values())) != exp:
            errs.append(f"watch state of {node} != full list at {last}: {keys(list(state.values()))} vs {exp}")
    out[node + params] = errs


def test_moves_and_drain_lists_and_watches_by_node(cluster: Cluster) -> None:
    """kube32-cli move back and forth and kubectl drain: after each, the pod is under its new
    node only; watches by node (WatchList and resourceVersion=0) stay equal to full lists."""
    api = cluster.api
    for i in (1, 2):
        cluster.kubectl("run", f"mv{i}", f"--image={cluster.image}", "--restart=Never",
                        "--overrides", json.dumps({"spec": {"nodeName": "sim-1"}}))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/mv1", "pod/mv2", "--timeout=90s")
    out: dict[str, Any] = {}
    watchers = [threading.Thread(target=_watch_by_node, args=(api, n, p, 45, out))
                for n in ("sim-1", "sim-2")
                for p in ("&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
                          "&resourceVersion=0")]
    for t in watchers:
        t.start()
    time.sleep(2)
    errs: list[str] = []
    for target in ("sim-2", "sim-1", "sim-2"):
        cluster.sh(str(BIN / "kube32-cli"), "move", "mv1", "--to", target)
        for n in ("sim-1", "sim-2"):
            names = _list_names(cluster, n)
            if ("mv1" in names) != (n == target):
                errs.append(f"after the move to {target}: {n} lists {names}")
            errs.extend(check_by_node(api, n)[2])
    cluster.kubectl("drain", "sim-2", "--ignore-daemonsets", "--force", "--timeout=60s", timeout=90)
    try:
        s2 = _list_names(cluster, "sim-2")
        if s2:
            errs.append(f"drained sim-2 still lists {s2}")
        for n in ("sim-1", "sim-2", "devkit"):
            errs.extend(check_by_node(api, n)[2])
    finally:
        cluster.kubectl("uncordon", "sim-2")
    for t in watchers:
        t.join()
    for k, v in out.items():
        errs.extend(f"watch {k}: {e}" for e in v)
    assert len(out) == 4
    assert not errs, "\n".join(errs[:20])


# ---------------------------------------------------------------- 2. odd selectors


def test_odd_selectors_equal_full_list(cluster: Cluster) -> None:
    """Every selector on spec.nodeName combined with others answers as a full list filtered by
    kube-apiserver's rules would, on the index path and on the paged (scan) path."""
    api = cluster.api
    ensure_nodes(api, ["odd-1", "odd-2"])
    ensure_ns(api, "odd")
    for i in range(12):
        node = ["odd-1", "odd-2", ""][i % 3]
        r = api.req("POST", "/api/v1/namespaces/odd/pods",
                    json=pod_body(f"o{i}", node, cluster.image, {"g": str(i % 4)}))
        assert r.status_code == 201, r.text
    r = api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("odd-default", "odd-1", cluster.image, {"g": "1"}))
    assert r.status_code in (201, 409)

    def field_ok(p: dict[str, Any], fs: str) -> bool:
        for term in fs.split(","):
            if "!=" in term:
                k, v = term.split("!=", 1)
                neg = True
            else:
                k, v = term.replace("==", "=", 1).split("=", 1)
                neg = False
            val = {"spec.nodeName": p["spec"].get("nodeName") or "", "metadata.namespace": p["metadata"]["namespace"],
                   "metadata.name": p["metadata"]["name"], "status.phase": p.get("status", {}).get("phase", "")}[k]
            if (val == v) == neg:
                return False
        return True

    def label_ok(p: dict[str, Any], ls: str) -> bool:
        g = p["metadata"].get("labels", {}).get("g")
        return {"": True, "g=1": g == "1", "g!=1": g != "1", "g in (1,2)": g in ("1", "2"), "!g": g is None}[ls]

    cases = [("spec.nodeName=odd-1", ""), ("spec.nodeName==odd-1", ""), ("spec.nodeName!=odd-1", ""),
             ("spec.nodeName=odd-1,spec.nodeName=odd-2", ""), ("spec.nodeName=odd-1,spec.nodeName=odd-1", ""),
             ("spec.nodeName=", ""), ("spec.nodeName=,metadata.namespace=odd", ""),
             ("spec.nodeName=odd-1,metadata.namespace=odd", ""), ("metadata.namespace=default,spec.nodeName=odd-1", ""),
             ("spec.nodeName=odd-1,status.phase=Running", ""), ("spec.nodeName=odd-1,status.phase=Pending", ""),
             ("spec.nodeName=odd-1", "g=1"), ("spec.nodeName=odd-1", "g!=1"), ("spec.nodeName=odd-2", "g in (1,2)"),
             ("spec.nodeName=odd-1", "!g"), ("spec.nodeName=nope", ""), ("spec.nodeName=odd-1,metadata.name=o0", ""),
             ("spec.nodeName=odd-1,spec.nodeName!=odd-1", ""), ("spec.nodeName!=odd-2,spec.nodeName=odd-1", "")]
    errs = []
    for fs, ls in cases:
        for base, ns in (("/api/v1/pods", None), ("/api/v1/namespaces/odd/pods", "odd")):
            for extra in ("", "&resourceVersion=0", "&limit=2"):
                q = f"fieldSelector={quote(fs)}" + (f"&labelSelector={quote(ls)}" if ls else "") + extra
                items: list[dict[str, Any]] = []
                r = api.get(f"{base}?{q}")
                assert r.status_code == 200, (q, r.text)
                rv = r.json()["metadata"]["resourceVersion"]
                items += r.json()["items"]
                cont = r.json()["metadata"].get("continue")
                while cont:
                    r = api.get(f"{base}?fieldSelector={quote(fs)}" + (f"&labelSelector={quote(ls)}" if ls else "")
                                + f"&limit=2&continue={cont}")
                    assert r.status_code == 200, r.text
                    items += r.json()["items"]
                    cont = r.json()["metadata"].get("continue")
                exp = keys([p for p in api.exact(rv, ns) if field_ok(p, fs) and label_ok(p, ls)])
                if keys(items) != exp:
                    errs.append(f"{base}?{q} at {rv}: {keys(items)} != {exp}")
    assert not errs, "\n".join(errs[:20])


def test_invalid_field_selector_values_are_400_as_kube_apiserver(cluster: Cluster) -> None:
    """kube-apiserver's field selector parser (apimachinery fields.ParseSelector) does not trim
    blanks and refuses an invalid escape: `spec.nodeName=dev\\kit` is a 400 (invalid escape
    sequence), so is an unescaped `=` in a value (`spec.nodeName===devkit`), and
    `spec.nodeName=inv-1 ` (trailing blank) matches no pod."""
    api = cluster.api
    errs = []
    for fs in ("spec.nodeName=dev\\kit", "spec.nodeName===devkit", "spec.nodeName=dev,kit=x"):
        r = api.get("/api/v1/pods?fieldSelector=" + quote(fs))
        if r.status_code != 400:
            errs.append(f"{fs!r}: {r.status_code} {r.text[:120]}")
    ensure_nodes(api, ["inv-1"])
    api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("inv", "inv-1", cluster.image))
    r = api.get("/api/v1/pods?fieldSelector=" + quote("spec.nodeName=inv-1 "))
    if r.status_code != 200 or r.json()["items"]:
        errs.append(f"'spec.nodeName=inv-1 ' (trailing blank): {r.status_code}, "
                    f"{[p['metadata']['name'] for p in r.json().get('items', [])]}")
    assert not errs, "\n".join(errs)


def test_kubectl_chunked_lists_by_node_are_one_consistent_list(cluster: Cluster) -> None:
    """Pages of a list by node (limit/continue) are read at the first page's revision: pods
    written in between do not show, pods deleted in between still do."""
    api = cluster.api
    ensure_nodes(api, ["pg-1"])
    ensure_ns(api, "pg")
    for i in range(30):
        assert api.req("POST", "/api/v1/namespaces/pg/pods", json=pod_body(f"pg{i:02d}", "pg-1", cluster.image)).status_code == 201
    r = api.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dpg-1&limit=5")
    first = r.json()
    rv = first["metadata"]["resourceVersion"]
    items = list(first["items"])
    cont = first["metadata"]["continue"]
    k = 100
    while cont:
        # between pages: delete one not yet read, add one, relabel one
        api.req("DELETE", f"/api/v1/namespaces/pg/pods/pg{29 - len(items) // 5:02d}?gracePeriodSeconds=0")
        api.req("POST", "/api/v1/namespaces/pg/pods", json=pod_body(f"pg{k}", "pg-1", cluster.image))
        k += 1
        j = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3Dpg-1&limit=5&continue={cont}").json()
        assert j["metadata"]["resourceVersion"] == rv
        items += j["items"]
        cont = j["metadata"].get("continue")
    assert keys(items) == keys(on_node(api.exact(rv), "pg-1"))
    # kubectl --chunk-size=1 and the default 500 agree with each other now that writes stopped
    one = cluster.kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=pg-1", "--chunk-size=1", "-o", "name").stdout.split()
    many = cluster.kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=pg-1", "-o", "name").stdout.split()
    assert sorted(one) == sorted(many) and len(one) == 30


def test_future_resource_version_is_504_with_retry_after(cluster: Cluster) -> None:
    """kube-apiserver answers a list at a revision it has not reached with 504 Timeout
    `Too large resource version`, cause ResourceVersionTooLarge, retryAfterSeconds 1 and the
    header `Retry-After: 1` (responsewriters.ErrorNegotiated sets it from the Status), which
    client-go's request retry reads."""
    api = cluster.api
    cur = int(api.get("/api/v1/pods?limit=1").json()["metadata"]["resourceVersion"])
    fut = cur + 10_000_000
    for q in (f"fieldSelector=spec.nodeName%3Ddevkit&resourceVersion={fut}&resourceVersionMatch=NotOlderThan",
              f"fieldSelector=spec.nodeName%3Ddevkit&resourceVersion={fut}",
              f"resourceVersion={fut}&resourceVersionMatch=NotOlderThan"):
        r = api.get(f"/api/v1/pods?{q}")
        assert r.status_code == 504, (q, r.status_code, r.text)
        st = r.json()
        assert st["reason"] == "Timeout" and "Too large resource version" in st["message"]
        assert st["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
        assert r.headers.get("Retry-After") == "1", (q, dict(r.headers))


def test_old_resource_version_lists_by_node(cluster: Cluster) -> None:
    """resourceVersion=<old> without a match (NotOlderThan) gives a state at least that new
    and equal to a full list at its revision; with Exact it is the list as it was at <old>."""
    api = cluster.api
    ensure_nodes(api, ["old-1"])
    r = api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("old-a", "old-1", cluster.image))
    rv_a = r.json()["metadata"]["resourceVersion"]
    api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("old-b", "old-1", cluster.image))
    api.req("DELETE", "/api/v1/namespaces/default/pods/old-a?gracePeriodSeconds=0")
    j = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3Dold-1&resourceVersion={rv_a}").json()
    assert int(j["metadata"]["resourceVersion"]) >= int(rv_a)
    assert [p["metadata"]["name"] for p in j["items"]] == ["old-b"]
    j = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3Dold-1&resourceVersion={rv_a}&resourceVersionMatch=Exact").json()
    assert j["metadata"]["resourceVersion"] == rv_a
    assert [p["metadata"]["name"] for p in j["items"]] == ["old-a"]


# ---------------------------------------------------------------- 3. RBAC and the node authorizer


def _join_node(data_dir: Path, node: str, addr: str) -> str:
    """Joins as a node with the bootstrap token of node.kubeconfig, as docs/security.md says."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    import aiohttp

    d = yaml.safe_load((data_dir / "node.kubeconfig").read_text())
    server = d["clusters"][0]["cluster"]["server"]
    tok = d["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cadata=base64.b64decode(d["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
                                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes")]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName(node), x509.IPAddress(ipaddress.ip_address(addr))]),
                          critical=False)
           .sign(key, hashes.SHA256()))

    async def go() -> str:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, local_addr=(addr, 0))) as s:
            async with s.post(server + f"/apis/kube32.io/v1/nodecredentials/{node}",
                              json={"csr": csr.public_bytes(serialization.Encoding.PEM).decode()},
                              headers={"Authorization": "Bearer " + tok}) as r:
                body = await r.json()
                assert r.status == 201, (r.status, body)
                return str(body["token"])
    return asyncio.run(go())


def test_node_credential_lists_only_its_own_pods(cluster: Cluster) -> None:
    """A joined node lists and watches only with spec.nodeName=<itself>; a selector naming it
    and another node answers the AND (nothing), never the other node's pods."""
    api = cluster.api
    ensure_nodes(api, ["spy-other"])
    token = _join_node(cluster.data_dir, "spy", "127.0.0.77")
    node = Api(cluster.kubeconfig, token)
    for n, where in (("spied", "spy"), ("secret", "spy-other")):
        api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body(n, where, cluster.image))
    ok = node.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dspy")
    assert ok.status_code == 200 and [p["metadata"]["name"] for p in ok.json()["items"]] == ["spied"]
    for fs in ("spec.nodeName=spy-other", "", "spec.nodeName!=spy", "metadata.namespace=default"):
        r = node.get(f"/api/v1/pods?fieldSelector={quote(fs)}")
        assert r.status_code == 403, (fs, r.status_code)
    for fs in ("spec.nodeName=spy,spec.nodeName=spy-other", "spec.nodeName=spy-other,spec.nodeName=spy",
               "spec.nodeName=spy,spec.nodeName!=spy"):
        for q in ("", "&resourceVersion=0", "&limit=1"):
            r = node.get(f"/api/v1/pods?fieldSelector={quote(fs)}{q}")
            assert r.status_code in (200, 403), r.text
            if r.status_code == 200:
                assert r.json()["items"] == [], (fs, q, [p["metadata"]["name"] for p in r.json()["items"]])
    # a watch naming both nodes: its initial events and its changes never show spy-other's pod
    got: list[str] = []

    def watch() -> None:
        r = node.s.get(node.server + "/api/v1/pods?watch=true&fieldSelector="
                       + quote("spec.nodeName=spy,spec.nodeName=spy-other")
                       + "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=4",
                       stream=True, timeout=30)
        for line in r.iter_lines():
            if line:
                ev = json.loads(line)
                if ev["type"] != "BOOKMARK":
                    got.append(ev["object"]["metadata"].get("name", "?"))
    t = threading.Thread(target=watch)
    t.start()
    time.sleep(1)
    for i in range(3):
        api.patch("/api/v1/namespaces/default/pods/secret", {"metadata": {"labels": {"x": str(i)}}})
        api.patch("/api/v1/namespaces/default/pods/spied", {"metadata": {"labels": {"x": str(i)}}})
    t.join()
    assert got == [], got


def test_namespaced_service_account_cannot_list_by_node_cluster_wide(cluster: Cluster) -> None:
    ensure_ns(cluster.api, "team")
    cluster.kubectl("-n", "team", "create", "sa", "lister", check=False)
    cluster.kubectl("-n", "team", "create", "rolebinding", "lister", "--clusterrole=view",
                    "--serviceaccount=team:lister", check=False)
    token = cluster.kubectl("-n", "team", "create", "token", "lister").stdout.strip()
    sa = Api(cluster.kubeconfig, token)
    ensure_nodes(cluster.api, ["team-node"])
    cluster.api.req("POST", "/api/v1/namespaces/team/pods", json=pod_body("t1", "team-node", cluster.image))
    cluster.api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("t-default", "team-node", cluster.image))
    for q in ("", "&resourceVersion=0", "&watch=true&timeoutSeconds=1",
              "&watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"):
        assert sa.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3Dteam-node{q}").status_code == 403, q
        assert sa.get(f"/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3Dteam-node{q}").status_code == 403, q
    r = sa.get("/api/v1/namespaces/team/pods?fieldSelector=spec.nodeName%3Dteam-node")
    assert r.status_code == 200 and [p["metadata"]["name"] for p in r.json()["items"]] == ["t1"]


# ---------------------------------------------------------------- 4. faults and load


def test_slow_client_big_list_by_node_consistent_while_written(cluster: Cluster) -> None:
    """A client that reads a 1,500-pod list by node slowly (4 KiB receive buffer) gets the state
    at the list's resourceVersion although the node's pods are deleted, recreated and
    relabelled meanwhile; /healthz answers within 1 s throughout."""
    api = cluster.api
    ensure_nodes(api, ["big-1"])
    ensure_ns(api, "big")
    _create_many(cluster, "big", [f"b{i}" for i in range(1500)], lambda i: "big-1")
    tok = api.token
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", cluster.port))
    ctx = ssl.create_default_context(cadata=api.ca_pem.decode())
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    s.sendall(f"GET /api/v1/pods?fieldSelector=spec.nodeName%3Dbig-1 HTTP/1.1\r\nHost: x\r\n"
              f"Authorization: Bearer {tok}\r\nConnection: close\r\n\r\n".encode())
    buf = s.recv(2048)
    stop = threading.Event()
    nwrites = [0]

    def churn() -> None:
        w = Api(cluster.kubeconfig)
        rnd = random.Random(7)
        while not stop.is_set():
            n = f"b{rnd.randint(0, 1499)}"
            op = rnd.random()
            if op < 0.4:
                w.req("DELETE", f"/api/v1/namespaces/big/pods/{n}?gracePeriodSeconds=0")
            elif op < 0.7:
                w.req("POST", "/api/v1/namespaces/big/pods", json=pod_body(n, "big-1", cluster.image))
            else:
                w.patch(f"/api/v1/namespaces/big/pods/{n}", {"metadata": {"labels": {"slow": str(rnd.random())}}})
            nwrites[0] += 1
    th = threading.Thread(target=churn)
    th.start()
    hz: list[float] = []
    t0 = time.time()
    try:
        while True:
            time.sleep(0.03)
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
            if int((time.time() - t0) * 2) > len(hz):
                t = time.time()
                api.get("/healthz", timeout=30)
                hz.append(time.time() - t)
            assert time.time() - t0 < 240
    finally:
        stop.set()
        th.join()
    head, body = buf.split(b"\r\n\r\n", 1)
    if b"chunked" in head.lower():
        out, rest = b"", body
        while True:
            ln, rest = rest.split(b"\r\n", 1)
            n = int(ln, 16)
            if n == 0:
                break
            out += rest[:n]
            rest = rest[n + 2:]
        body = out
    j = json.loads(body)
    rv = j["metadata"]["resourceVersion"]
    assert nwrites[0] > 50
    assert keys(j["items"]) == keys(on_node(api.exact(rv), "big-1"))
    assert max(hz) < 1.0, hz


def _create_many(cluster: Cluster, ns: str, names: list[str], node_of: Any) -> None:
    import aiohttp

    api = cluster.api
    ctx = ssl.create_default_context(cadata=api.ca_pem.decode())

    async def go() -> None:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer " + api.token},
                                         connector=aiohttp.TCPConnector(ssl=ctx, limit=16)) as s:
            sem = asyncio.Semaphore(16)

            async def one(i: int, n: str) -> None:
                async with sem:
                    async with s.post(api.server + f"/api/v1/namespaces/{ns}/pods",
                                      json=pod_body(n, node_of(i), cluster.image, {"g": str(i % 7)})) as r:
                        assert r.status in (201, 409), await r.text()
            await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    asyncio.run(go())


def test_many_pods_lists_by_node_fast_and_right(cluster: Cluster) -> None:
    """2,000 pods on 10 nodes: each list by node (kubectl -A, -n, -o json, --chunk-size=1) is
    right, and a list of one node's 200 pods takes well under the full list's time."""
    api = cluster.api
    nodes = [f"many-{i}" for i in range(1, 11)]
    ensure_nodes(api, nodes)
    ensure_ns(api, "many")
    _create_many(cluster, "many", [f"m-{i}" for i in range(2000)], lambda i: nodes[i % 10])
    errs = []
    times = []
    for n in nodes:
        t = time.time()
        rv, items, e = check_by_node(api, n)
        times.append(time.time() - t)
        errs += e
        assert len(items) == 200, (n, len(items))
        errs += check_by_node(api, n, "many")[2]
    t = time.time()
    api.get("/api/v1/namespaces/many/pods?fieldSelector=spec.nodeName%3Dmany-3")
    by_node = time.time() - t
    t = time.time()
    api.get("/api/v1/namespaces/many/pods")
    full = time.time() - t
    assert by_node < 0.5 and by_node < full, (by_node, full)
    out = cluster.kubectl("get", "pods", "-n", "many", "--field-selector", "spec.nodeName=many-3", "-o", "json").stdout
    assert len(json.loads(out)["items"]) == 200
    out = cluster.kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=many-3", "--chunk-size=50", "-o", "name").stdout
    assert len(out.split()) == 200
    assert not errs, "\n".join(errs[:20])


def test_healthz_responsive_under_hundreds_of_lists_by_node(cluster: Cluster) -> None:
    """200 concurrent lists by node (about 200 pods each) while writes go on: /healthz, timed
    from a separate curl, answers within 1 s, and every list answers 200."""
    api = cluster.api
    nodes = [f"many-{i}" for i in range(1, 11)]
    ensure_nodes(api, nodes)
    ensure_ns(api, "many")
    if len(api.get("/api/v1/namespaces/many/pods?fieldSelector=spec.nodeName%3Dmany-1").json()["items"]) < 200:
        _create_many(cluster, "many", [f"m-{i}" for i in range(2000)], lambda i: nodes[i % 10])
    code = f"""
import asyncio, aiohttp, ssl, json, random, time, sys
ctx = ssl.create_default_context(cadata={api.ca_pem.decode()!r})
async def main():
    codes = {{}}
    stop = time.time() + 20
    async with aiohttp.ClientSession(headers={{"Authorization": "Bearer {api.token}"}}, connector=aiohttp.TCPConnector(ssl=ctx, limit=0)) as s:
        async def lister():
            while time.time() < stop:
                try:
                    async with s.get("{api.server}/api/v1/pods?fieldSelector=spec.nodeName%3Dmany-" + str(random.randint(1, 10))) as r:
                        await r.read(); codes[r.status] = codes.get(r.status, 0) + 1
                except Exception as e:
                    codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1
        async def writer():
            while time.time() < stop:
                try:
                    async with s.patch("{api.server}/api/v1/namespaces/many/pods/m-" + str(random.randint(0, 1999)), data=json.dumps({{"metadata": {{"labels": {{"w": str(random.random())}}}}}}), headers={{"Content-Type": "application/merge-patch+json"}}) as r:
                        await r.read()
                except Exception:
                    pass
        await asyncio.gather(*([lister() for _ in range(200)] + [writer()]))
    print(json.dumps(codes))
asyncio.run(main())
"""
    load = subprocess.Popen([str(BIN / "python"), "-c", code], stdout=subprocess.PIPE, text=True)
    time.sleep(3)
    lat = []
    try:
        while load.poll() is None:
            r = subprocess.run(["curl", "-s", "-o", "/dev/null", "--cacert", api.ca_file, "-H", f"Authorization: Bearer {api.token}",
                                "-m", "30", "-w", "%{time_total}", api.server + "/healthz"], capture_output=True, text=True)
            if load.poll() is None:
                lat.append(float(r.stdout or 30))
            time.sleep(0.3)
    finally:
        if load.poll() is None:
            load.kill()
    codes = json.loads((load.stdout.read() if load.stdout else "") or "{}")
    assert set(codes) == {"200"}, codes
    assert lat and max(lat) < 1.0, f"/healthz took {sorted(lat)[-5:]} s (of {len(lat)} probes) under 200 lists by node"


def test_sigstop_mid_list_then_list_at_once(cluster: Cluster) -> None:
    """SIGSTOP the control plane while a list by node streams, SIGCONT it: the list completes
    and is right, and a write acknowledged right after shows in the next list by node."""
    api = cluster.api
    ensure_nodes(api, ["many-1"])
    cp = subprocess.run(["pgrep", "-f", f"control-plane --data-dir {cluster.data_dir}"], capture_output=True, text=True).stdout.split()
    assert len(cp) == 1, cp
    pid = int(cp[0])
    res: dict[str, Any] = {}

    def lister() -> None:
        r = api.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dmany-1", timeout=120)
        res["r"] = r
    t = threading.Thread(target=lister)
    t.start()
    time.sleep(0.02)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(4)
    os.kill(pid, signal.SIGCONT)
    t.join()
    r = res["r"]
    assert r.status_code == 200
    rv = r.json()["metadata"]["resourceVersion"]
    assert keys(r.json()["items"]) == keys(on_node(api.exact(rv), "many-1"))
    w = api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("after-stop", "many-1", cluster.image))
    assert w.status_code == 201
    j = api.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dmany-1").json()
    assert "after-stop" in [p["metadata"]["name"] for p in j["items"]]
    # the workers' informers resume: a pod bound to sim-1 now runs
    cluster.kubectl("run", "after-stop-run", f"--image={cluster.image}", "--restart=Never",
                    "--overrides", json.dumps({"spec": {"nodeName": "sim-1"}}))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/after-stop-run", "--timeout=60s")


def test_restart_then_list_at_once() -> None:
    """kube32-sim up again on the same data dir: the first lists by node answer what a full
    list at their resourceVersion holds, and writes made just before the stop are there."""
    data_dir = Path(tempfile.mkdtemp(prefix="attack25d-rs-", dir="/tmp"))
    port = free_port()
    c = start_up(data_dir, port)
    try:
        api = c.api
        ensure_nodes(api, ["rs-1", "rs-2"])
        last = ""
        for i in range(40):
            last = api.req("POST", "/api/v1/namespaces/default/pods",
                           json=pod_body(f"rs{i}", ["rs-1", "rs-2"][i % 2], "x")).json()["metadata"]["resourceVersion"]
        api.req("DELETE", "/api/v1/namespaces/default/pods/rs0?gracePeriodSeconds=0")
        api.patch("/api/v1/namespaces/default/pods/rs1", {"metadata": {"labels": {"last": "write"}}})
    finally:
        stop_up(c)
    c = start_up(data_dir, port)
    try:
        api = c.api
        errs = []
        for _ in range(10):
            for n in ("rs-1", "rs-2", "devkit", "sim-1"):
                rv, items, e = check_by_node(api, n)
                errs += e
                assert int(rv) >= int(last)
                if n == "rs-1":
                    names = [p["metadata"]["name"] for p in items]
                    assert "rs0" not in names and "rs2" in names
                if n == "rs-2":
                    rs1 = [p for p in items if p["metadata"]["name"] == "rs1"]
                    assert rs1 and rs1[0]["metadata"]["labels"].get("last") == "write"
        assert not errs, errs
    finally:
        stop_up(c)


def test_worker_informer_resumes_after_control_plane_restart() -> None:
    """A worker keeps running while its control plane is killed and started again on the same
    data dir and port: its informer resumes its watch and must see what was written after the
    restart (a pod bound to it runs, a pod deleted stops), and what the node lists by its own
    name equals the full list."""
    data_dir = Path(tempfile.mkdtemp(prefix="attack25d-inf-", dir="/tmp"))
    port = free_port()
    log = Path(str(data_dir) + ".log")

    def start_cp() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([str(BIN / "kube32-sim"), "control-plane", "--data-dir", str(data_dir), "--port", str(port),
                              "--no-kubelet"], stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        t = time.time()
        while True:
            try:
                if (data_dir / "admin.kubeconfig").exists() and Api(data_dir / "admin.kubeconfig").get("/readyz", timeout=2).status_code == 200:
                    return p
            except requests.RequestException:
                pass
            assert p.poll() is None, log.read_text()[-2000:]
            assert time.time() - t < 90, log.read_text()[-2000:]
            time.sleep(0.3)

    cp = start_cp()
    wlog = Path(str(data_dir) + "-worker.log")
    worker = subprocess.Popen([str(BIN / "kube32-sim"), "worker", "--kubeconfig", str(data_dir / "node.kubeconfig"),
                               "--name", "w1", "--address", "127.0.0.44", "--port", "0", "--data-dir", str(data_dir) + "-w1"],
                              stdout=wlog.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        env = dict(os.environ, KUBECONFIG=str(data_dir / "admin.kubeconfig"), PATH=f"{BIN}:{os.environ['PATH']}")

        def k(*a: str, check: bool = True) -> str:
            r = subprocess.run(["kubectl", *a], env=env, capture_output=True, text=True, timeout=120)
            assert not check or r.returncode == 0, (a, r.stdout, r.stderr)
            return r.stdout
        t = time.time()
        while "Ready" not in k("get", "node", "w1", "--no-headers", check=False).split():
            assert time.time() - t < 90, wlog.read_text()[-2000:]
            time.sleep(1)
        image = subprocess.run([str(BIN / "kube32-cli"), "image", "push", str(IMAGE_FILE)], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        k("run", "before", f"--image={image}", "--restart=Never", "--overrides", json.dumps({"spec": {"nodeName": "w1"}}))
        k("wait", "--for=condition=Ready", "pod/before", "--timeout=60s")
        cp.send_signal(signal.SIGKILL)
        cp.wait(10)
        time.sleep(3)
        cp = start_cp()
        k("run", "after", f"--image={image}", "--restart=Never", "--overrides", json.dumps({"spec": {"nodeName": "w1"}}))
        k("delete", "pod", "before", "--wait=false")
        k("wait", "--for=condition=Ready", "pod/after", "--timeout=60s")
        k("wait", "--for=delete", "pod/before", "--timeout=60s")
        api = Api(data_dir / "admin.kubeconfig")
        _, items, errs = check_by_node(api, "w1")
        assert not errs and [p["metadata"]["name"] for p in items] == ["after"]
    finally:
        for p in (worker, cp):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(40)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)


def test_worker_informer_after_outage_past_compaction() -> None:
    """The worker is frozen (SIGSTOP) while a pod is bound to it, its control plane is killed
    and started again, and more than 10,000 revisions are written (the SQLite store keeps
    10,000): the worker's informer, resuming its watch from a compacted revision, must get
    410 and list again (as client-go's reflector), so the pod bound during the outage runs,
    a pod deleted after it stops, and a pod bound after it runs."""
    data_dir = Path(tempfile.mkdtemp(prefix="attack25d-cmp-", dir="/tmp"))
    port = free_port()
    log = Path(str(data_dir) + ".log")

    def start_cp() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([str(BIN / "kube32-sim"), "control-plane", "--data-dir", str(data_dir), "--port", str(port),
                              "--no-kubelet"], stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        t = time.time()
        while True:
            try:
                if (data_dir / "admin.kubeconfig").exists() and Api(data_dir / "admin.kubeconfig").get("/readyz", timeout=2).status_code == 200:
                    return p
            except requests.RequestException:
                pass
            assert p.poll() is None, log.read_text()[-2000:]
            assert time.time() - t < 90, log.read_text()[-2000:]
            time.sleep(0.3)

    cp = start_cp()
    wlog = Path(str(data_dir) + "-worker.log")
    worker = subprocess.Popen([str(BIN / "kube32-sim"), "worker", "--kubeconfig", str(data_dir / "node.kubeconfig"),
                               "--name", "w1", "--address", "127.0.0.45", "--port", "0", "--data-dir", str(data_dir) + "-w1"],
                              stdout=wlog.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    stopped = False
    try:
        env = dict(os.environ, KUBECONFIG=str(data_dir / "admin.kubeconfig"), PATH=f"{BIN}:{os.environ['PATH']}")

        def k(*a: str, check: bool = True) -> str:
            r = subprocess.run(["kubectl", *a], env=env, capture_output=True, text=True, timeout=120)
            assert not check or r.returncode == 0, (a, r.stdout, r.stderr)
            return r.stdout
        t = time.time()
        while "Ready" not in k("get", "node", "w1", "--no-headers", check=False).split():
            assert time.time() - t < 90, wlog.read_text()[-2000:]
            time.sleep(1)
        image = subprocess.run([str(BIN / "kube32-cli"), "image", "push", str(IMAGE_FILE)], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        k("run", "before", f"--image={image}", "--restart=Never", "--overrides", json.dumps({"spec": {"nodeName": "w1"}}))
        k("wait", "--for=condition=Ready", "pod/before", "--timeout=60s")
        os.killpg(worker.pid, signal.SIGSTOP)
        stopped = True
        k("run", "during", f"--image={image}", "--restart=Never", "--overrides", json.dumps({"spec": {"nodeName": "w1"}}))
        rv_during = k("get", "pod", "during", "-o", "jsonpath={.metadata.resourceVersion}")
        cp.send_signal(signal.SIGKILL)
        cp.wait(10)
        cp = start_cp()
        api = Api(data_dir / "admin.kubeconfig")
        assert api.req("POST", "/api/v1/namespaces/default/configmaps",
                       json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "churn"}, "data": {"v": "0"}}).status_code == 201
        import aiohttp

        async def churn() -> None:
            ctx = ssl.create_default_context(cadata=api.ca_pem.decode())
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer " + api.token},
                                             connector=aiohttp.TCPConnector(ssl=ctx, limit=8)) as s:
                sem = asyncio.Semaphore(8)

                async def one(i: int) -> None:
                    async with sem:
                        async with s.patch(api.server + "/api/v1/namespaces/default/configmaps/churn",
                                           data=json.dumps({"data": {"v": str(i)}}),
                                           headers={"Content-Type": "application/merge-patch+json"}) as r:
                            await r.read()
                            codes[r.status] = codes.get(r.status, 0) + 1
                await asyncio.gather(*(one(i) for i in range(12000)))
        codes: dict[int, int] = {}
        asyncio.run(churn())
        assert codes == {200: 12000}, codes
        # whether the revisions the worker saw last are compacted by now is not asserted here:
        # the store did not compact within the run (test_sqlite_store_compacts_as_documented)
        del rv_during
        os.killpg(worker.pid, signal.SIGCONT)
        stopped = False
        k("delete", "pod", "before", "--wait=false")
        k("run", "after", f"--image={image}", "--restart=Never", "--overrides", json.dumps({"spec": {"nodeName": "w1"}}))
        k("wait", "--for=condition=Ready", "pod/during", "pod/after", "--timeout=90s")
        k("wait", "--for=delete", "pod/before", "--timeout=90s")
        _, items, errs = check_by_node(api, "w1")
        assert not errs and sorted(p["metadata"]["name"] for p in items) == ["after", "during"]
    finally:
        if stopped:
            os.killpg(worker.pid, signal.SIGCONT)
        for p in (worker, cp):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(40)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)


@pytest.mark.skip(reason="answered by the docs: docs/high-availability.md now says the store keeps at least "
                         "the last 5 minutes of history too (kube32.store.sqlite HISTORY_SECONDS), so 12,000 "
                         "writes in a minute compact nothing yet")
def test_sqlite_store_compacts_as_documented(cluster: Cluster) -> None:
    """docs/high-availability.md: the SQLite store compacts "every 1000 writes, keeping 10000
    revisions". After 12,000 writes a list at the first of them must be 410 Expired (and
    the informers' resumed watches from before it too)."""
    api = cluster.api
    r = api.req("POST", "/api/v1/namespaces/default/configmaps",
                json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "compact"}, "data": {"v": "0"}})
    assert r.status_code == 201, r.text
    first = r.json()["metadata"]["resourceVersion"]
    import aiohttp

    async def churn() -> None:
        ctx = ssl.create_default_context(cadata=api.ca_pem.decode())
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer " + api.token},
                                         connector=aiohttp.TCPConnector(ssl=ctx, limit=8)) as s:
            sem = asyncio.Semaphore(8)

            async def one(i: int) -> None:
                async with sem:
                    async with s.patch(api.server + "/api/v1/namespaces/default/configmaps/compact",
                                       data=json.dumps({"data": {"v": str(i)}}),
                                       headers={"Content-Type": "application/merge-patch+json"}) as r:
                        assert r.status == 200
            await asyncio.gather(*(one(i) for i in range(12000)))
    asyncio.run(churn())
    t = time.time()
    while True:
        r = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3Ddevkit&resourceVersion={first}&resourceVersionMatch=Exact")
        if r.status_code == 410:
            break
        assert time.time() - t < 15, (f"a list at {first} still answers {r.status_code} after 12,000 writes",
                                      api.get("/api/v1/pods?limit=1").json()["metadata"]["resourceVersion"])
        time.sleep(1)


def test_huge_selector_answered_as_kube_apiserver(cluster: Cluster) -> None:
    """kube-apiserver reads request lines up to Go's MaxHeaderBytes (1 MiB): a 20 KB field
    selector (e.g. 500 `spec.nodeName!=` terms, as a client excluding nodes sends) is a list,
    not a plain-text 400 from the HTTP layer."""
    api = cluster.api
    fs = ",".join(f"spec.nodeName!=excluded-node-{i:04d}" for i in range(500))
    r = api.get("/api/v1/pods?fieldSelector=" + quote(fs) + "&limit=1")
    assert r.status_code == 200, (r.status_code, r.headers.get("Content-Type"), r.text[:150])


def test_python_client_list_and_watch_by_node(cluster: Cluster) -> None:
    """The kubernetes Python client: list by node with limit/_continue, then a watch from the
    list's resourceVersion sees a pod bound to the node, a label change and its deletion."""
    from kubernetes import client, config, watch

    api = cluster.api
    ensure_nodes(api, ["py-1"])
    for i in range(7):
        api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body(f"py{i}", "py-1", cluster.image))
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    v1 = client.CoreV1Api(client.ApiClient(cfg))
    names: list[str] = []
    cont = None
    first_rv = None
    while True:
        lst = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=py-1", limit=3, _continue=cont)
        first_rv = first_rv or lst.metadata.resource_version
        names += [p.metadata.name for p in lst.items]
        cont = lst.metadata._continue
        if not cont:
            break
    assert sorted(names) == [f"py{i}" for i in range(7)]
    events: list[tuple[str, str]] = []

    def run() -> None:
        w = watch.Watch()
        for ev in w.stream(v1.list_pod_for_all_namespaces, field_selector="spec.nodeName=py-1",
                           resource_version=first_rv, timeout_seconds=6):
            events.append((ev["type"], ev["object"].metadata.name))
    t = threading.Thread(target=run)
    t.start()
    time.sleep(1)
    api.req("POST", "/api/v1/namespaces/default/pods", json=pod_body("py-new", None, cluster.image))
    api.req("POST", "/api/v1/namespaces/default/pods/py-new/binding",
            json={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "py-new"}, "target": {"kind": "Node", "name": "py-1"}})
    api.patch("/api/v1/namespaces/default/pods/py-new", {"metadata": {"labels": {"x": "y"}}})
    api.req("DELETE", "/api/v1/namespaces/default/pods/py-new?gracePeriodSeconds=0")
    t.join()
    mine = [e for e in events if e[1] == "py-new"]
    assert [e[0] for e in mine][:1] == ["ADDED"] and mine[-1][0] == "DELETED", events
    assert all(e[1] == "py-new" for e in events), events


def test_namespace_prefix_and_key_order(cluster: Cluster) -> None:
    """A namespaced list by node in `a` holds none of `aa`, `a-b`, `ab`'s pods (on the index,
    rv=0, paged and WatchList paths), and a cluster-wide one is in key order (the key
    `<namespace>/<name>` byte by byte), as etcd and the watch cache give it."""
    api = cluster.api
    ensure_nodes(api, ["pre-1"])
    for ns in ("a", "aa", "a-b", "ab"):
        ensure_ns(api, ns)
        for n in ("p5", "p1", "p10", "p2"):
            api.req("POST", f"/api/v1/namespaces/{ns}/pods", json=pod_body(n, "pre-1", cluster.image))
    for q in ("", "&resourceVersion=0", "&limit=100", "&labelSelector=x%21%3Dy"):
        j = api.get(f"/api/v1/namespaces/a/pods?fieldSelector=spec.nodeName%3Dpre-1{q}").json()
        assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in j["items"]] == \
            [("a", "p1"), ("a", "p10"), ("a", "p2"), ("a", "p5")], q
    r = api.s.get(api.server + "/api/v1/namespaces/a/pods?watch=true&fieldSelector=spec.nodeName%3Dpre-1"
                  "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
                  stream=True, timeout=30)
    got = [json.loads(line)["object"]["metadata"] for line in r.iter_lines() if line]
    assert sorted(m["name"] for m in got if "name" in m) == ["p1", "p10", "p2", "p5"]
    assert {m.get("namespace") for m in got if "name" in m} == {"a"}
    j = api.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dpre-1").json()
    order = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in j["items"]]
    # etcd's and the watch cache's order: the key `<namespace>/<name>` byte by byte ("a-b/" < "a/")
    assert order == sorted(order, key=lambda k: f"{k[0]}/{k[1]}".encode()), order
    assert not check_by_node(api, "pre-1")[2]
