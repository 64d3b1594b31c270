"""Issue 24 (Services hold requests through a move) as an outside user attacks it: the
scenarios of attack round 24b whose findings are fixed (stalled uploads holding a
NodePort's slots, a hung target keeping a pod frozen for the image pull's 60 s, a huge
hold-requests value answered 500, held requests reaching their pod shuffled).

One cluster (``kube32-sim up --workers 2``) for the module; each test makes its own
pods and Services of examples/pods/recorder.c, a pod that records every call it runs
(so a request run twice, or out of order, shows).  A move is made to last with a call
in progress (``?ms=N``): the pod freezes once that call returns, and requests that
come meanwhile are refused by the kubelet, not begun: what the proxies must hold.
Tests that kill a node or restart the control plane come last or run a cluster of
their own."""
from __future__ import annotations

import asyncio
import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from . import holdsim as k24b
from .holdsim import Cluster, Load, calls_by, duplicates, wait_move

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROLLBACK = 6   # s: the cluster's --move-rollback-timeout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    k24b.build_rec()
    c = Cluster(str(tmp_path_factory.mktemp("h24b") / "c1"), workers=2, extra=["--port", "0", "--move-rollback-timeout", f"{ROLLBACK}s"]).start()
    c.image = c.push(k24b.REC_WASM)
    yield c
    c.stop()


def setup_pod(c: Cluster, name: str, node: str = "sim-1", ns: str = "default", svc_annotations=None,
              node_port: bool = False, labels: dict | None = None) -> None:
    labels = labels or {"app": name}
    objs = [c.pod(name, c.image, node=node, labels=labels, ns=ns),
            c.service(name, labels, ns=ns, annotations=svc_annotations, node_port=node_port)]
    c.apply(objs)
    c.wait_ready(name, ns=ns)


def other(node: str) -> str:
    return "sim-2" if node == "sim-1" else "sim-1"


def freeze_for(c: Cluster, pod: str, seconds: float, ns: str = "default") -> tuple[threading.Thread, subprocess.Popen]:
    """A move of ``pod`` that keeps it refusing requests for about ``seconds``: a call of that
    length is in progress when the move starts (sent straight to the pod), so the freeze waits
    for it.  Returns the call's thread and the move."""
    s = c.session()
    out: dict = {}

    def call() -> None:
        r = s.post(c.pod_url(pod, f"long?ms={int(seconds * 1000)}", ns), timeout=120)
        out["status"] = r.status_code
    t = threading.Thread(target=call, daemon=True)
    t.start()
    time.sleep(0.4)
    mv = c.move_async(pod, to=other(c.node_of(pod, ns)), ns=ns)
    c.wait_frozen(pod, ns)
    t.out = out   # type: ignore[attr-defined]
    return t, mv


def check_log(c: Cluster, pod: str, results, ns: str = "default", key: str = "c") -> list[str]:
    """Every 200 answer ran exactly once, in each client's order; nothing ran that got no 200."""
    log = c.rec_log(pod, ns)
    assert duplicates(log) == [], f"run twice: {duplicates(log)[:5]}"
    by = calls_by(log, key)
    for client, seq in by.items():
        assert seq == sorted(seq), f"{client} out of order: {seq}"
    got = {(r[0], r[1]) for r in results if r[2] == 200}
    ran = {(k, i) for k, v in by.items() for i in v}
    assert got - ran == set(), f"answered 200 but never ran: {sorted(got - ran)[:5]}"
    return log


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


# --- 1. A pod's own 503 is never sent again --------------------------------------------------------
def test_pod_own_503_with_kubelet_mark_is_not_resent(cluster):
    c = cluster
    setup_pod(c, "own503", node_port=True)
    s = c.session()
    r = s.post(c.svc_url("own503", "f?fake=1&c=0&i=1"), data=b"pay", timeout=60)
    assert r.status_code == 503 and r.headers.get("Retry-After") == "1"
    assert "X-Kube32-Not-Started" not in r.headers
    port = c.node_port("own503")
    conn = http.client.HTTPConnection("127.0.0.3", port, timeout=60)
    conn.request("POST", "/f?fake=1&c=1&i=1", body=b"pay")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 503
    log = c.rec_log("own503")
    assert len(log) == 2, log   # each ran once, none re-sent


# --- 2. Bodies during a move ------------------------------------------------------------------------
def _raw(host: str, port: int, data: bytes, tls: bool = False, read_timeout: float = 60) -> bytes:
    sock = socket.create_connection((host, port), timeout=read_timeout)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        sock = ctx.wrap_socket(sock)
    sock.sendall(data)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        out += chunk
        if b"\r\n\r\n" in out:
            head, _, rest = out.partition(b"\r\n\r\n")
            m = re.search(rb"content-length: *(\d+)", head, re.I)
            if m and len(rest) >= int(m.group(1)):
                break
    sock.close()
    return out


def test_bodies_during_freeze_each_run_once(cluster):
    """POSTs with a fixed body, a chunked body, Expect: 100-continue, and a body of exactly
    64 KiB, through the Service proxy while the pod is frozen: each gets the pod's 200 and
    runs once with its whole body."""
    c = cluster
    setup_pod(c, "bodies")
    t, mv = freeze_for(c, "bodies", 3)
    s = c.session()
    out: dict = {}
    body64 = bytes([i % 251 for i in range(64 << 10)])
    small = b"a" * 1000

    def gen():
        for _ in range(10):
            yield b"b" * 100
            time.sleep(0.05)

    def run(key, **kw):
        try:
            r = s.post(c.svc_url("bodies", f"b?k={key}"), timeout=60, **kw)
            out[key] = (r.status_code, r.text)
        except Exception as e:  # noqa: BLE001
            out[key] = (0, repr(e))
    jobs = {
        "fixed": dict(data=small),
        "chunked": dict(data=gen()),
        "expect": dict(data=small, headers={"Expect": "100-continue"}),
        "b64k": dict(data=body64),
    }
    threads = [threading.Thread(target=run, args=(k,), kwargs=kw) for k, kw in jobs.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wait_move(mv)
    t.join()
    for k, (status, text) in out.items():
        assert status == 200, (k, status, text)
    log = c.rec_log("bodies")
    want = {"fixed": (1000, 97 * 1000), "chunked": (1000, 98 * 1000), "expect": (1000, 97 * 1000),
            "b64k": (64 << 10, sum(body64))}
    for k, (n, total) in want.items():
        lines = [line for line in log if f"k={k} " in line]
        assert len(lines) == 1, (k, lines)
        assert f"got={n} sum={total}" in lines[0], (k, lines[0])


def test_body_over_64k_not_held_gets_503_once(cluster):
    """A body over 64 KiB is not held: during a freeze it gets the 503 with Retry-After: 1,
    and the pod never ran it; it counts as not holdable."""
    c = cluster
    setup_pod(c, "bigbody")
    m0 = c.metrics()
    t, mv = freeze_for(c, "bigbody", 3)
    r = c.session().post(c.svc_url("bigbody", "b?k=big"), data=b"z" * ((64 << 10) + 1), timeout=60)
    wait_move(mv)
    t.join()
    assert r.status_code == 503, r.text
    assert r.headers.get("Retry-After") == "1"
    assert not [line for line in c.rec_log("bigbody") if "k=big" in line]
    assert delta(m0, c.metrics()).get(("Service", "not_holdable"), 0) >= 1


# --- 3. Hundreds of held requests ------------------------------------------------------------------
def test_300_concurrent_held_requests_one_service(cluster):
    """300 keep-alive clients (aiohttp) at once while the pod is frozen: every one gets the
    pod's answer, each ran once; /metrics counts them held and sent."""
    import aiohttp
    c = cluster
    setup_pod(c, "many")

    async def main():
        ssl_ctx = ssl.create_default_context(cafile=str(c.ca))
        ssl_ctx.check_hostname = False
        conn = aiohttp.TCPConnector(limit=0, ssl=ssl_ctx)
        async with aiohttp.ClientSession(connector=conn, headers={"Authorization": f"Bearer {c.token}"}) as s:
            async def warm(i):
                async with s.get(c.svc_url("many", f"warm?w={i}&i=1"), timeout=aiohttp.ClientTimeout(total=60)) as r:
                    await r.read()

            async def one(i):
                async with s.post(c.svc_url("many", f"m?c={i}&i=1"), data=b"x" * 10,
                                  timeout=aiohttp.ClientTimeout(total=60)) as r:
                    return ("c" + str(i), 1, r.status, await r.text(), 0, dict(r.headers))
            # The 300 connections and their TLS handshakes first (seconds on a loaded machine),
            # so that every request of the test arrives while the pod is frozen.
            await asyncio.gather(*[warm(i) for i in range(300)])
            m0 = c.metrics()
            t, mv = await asyncio.to_thread(freeze_for, c, "many", 4)
            return m0, t, mv, await asyncio.gather(*[one(i) for i in range(300)], return_exceptions=True)
    m0, t, mv, results = asyncio.run(main())
    wait_move(mv)
    t.join()
    bad = [r for r in results if isinstance(r, BaseException) or r[2] != 200]
    assert not bad, bad[:5]
    check_log(c, "many", results)
    d = delta(m0, c.metrics())
    assert d.get(("Service", "held"), 0) >= 100, d
    assert d.get(("Service", "held"), 0) == d.get(("Service", "sent"), 0), d


def test_1100_held_requests_past_the_per_service_bound(cluster):
    """1100 clients at once while the pod is frozen for 10 s (bound 20 s): at most 1024 wait
    (per Service); the others get the 503 with Retry-After: 1 at once; every request is
    answered, none runs twice, and what /metrics counts adds up."""
    import aiohttp
    c = cluster
    setup_pod(c, "flood", svc_annotations={"kube32.io/hold-requests": "20s"})
    m0 = c.metrics()
    t, mv = freeze_for(c, "flood", 10)

    async def main():
        ssl_ctx = ssl.create_default_context(cafile=str(c.ca))
        ssl_ctx.check_hostname = False
        conn = aiohttp.TCPConnector(limit=0, ssl=ssl_ctx)
        async with aiohttp.ClientSession(connector=conn, headers={"Authorization": f"Bearer {c.token}"}) as s:
            async def one(i):
                t0 = time.time()
                async with s.post(c.svc_url("flood", f"f?c={i}&i=1"), data=b"f",
                                  timeout=aiohttp.ClientTimeout(total=90)) as r:
                    text = (await r.read()).decode(errors="replace")[:300]
                    return ("c" + str(i), 1, r.status, text, time.time() - t0, dict(r.headers))
            return await asyncio.gather(*[one(i) for i in range(1100)], return_exceptions=True)
    results = asyncio.run(main())
    wait_move(mv, timeout=120)
    t.join()
    errs = [r for r in results if isinstance(r, BaseException)]
    assert not errs, errs[:3]
    codes = {}
    for r in results:
        codes[r[2]] = codes.get(r[2], 0) + 1
    assert set(codes) <= {200, 503}, codes
    for r in results:
        if r[2] == 503:
            assert r[5].get("Retry-After") == "1", (r[3], round(r[4], 2), codes)
    check_log(c, "flood", results)
    d = delta(m0, c.metrics())
    assert d.get(("Service", "held"), 0) <= 1024, d
    assert d.get(("Service", "held"), 0) == d.get(("Service", "sent"), 0) + d.get(("Service", "timed_out"), 0) \
        + d.get(("Service", "gone"), 0), d
    assert codes.get(503, 0) == d.get(("Service", "not_holdable"), 0) + d.get(("Service", "timed_out"), 0), (codes, d)


# --- 4. Other clients --------------------------------------------------------------------------------
def test_http10_pipelined_and_expect_to_nodeport_during_freeze(cluster):
    """A plain-socket client to a NodePort (not kube32, not curl): HTTP/1.0, HTTP/1.1 with
    three pipelined requests, and Expect: 100-continue, while the pod is frozen."""
    c = cluster
    setup_pod(c, "raw", node_port=True)
    port = c.node_port("raw")
    t, mv = freeze_for(c, "raw", 3)
    out: dict = {}

    def h10():
        out["h10"] = _raw("127.0.0.2", port, b"GET /r?c=10&i=1 HTTP/1.0\r\n\r\n")

    def pipelined():
        reqs = b"".join(b"POST /r?c=11&i=%d HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" % i
                        for i in (1, 2, 3))
        sock = socket.create_connection(("127.0.0.3", port), timeout=60)
        sock.sendall(reqs + b"GET /r?c=11&i=4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        out["pipe"] = data

    def expect():
        sock = socket.create_connection(("127.0.0.2", port), timeout=60)
        sock.sendall(b"POST /r?c=12&i=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n"
                     b"Connection: close\r\n\r\n")
        first = sock.recv(65536)
        out["expect100"] = first
        sock.sendall(b"hello")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        out["expect"] = first + data
    threads = [threading.Thread(target=f) for f in (h10, pipelined, expect)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    wait_move(mv)
    t.join()
    assert out["h10"].startswith(b"HTTP/1.") and b" 200 " in out["h10"].split(b"\r\n")[0], out["h10"][:300]
    assert out["pipe"].count(b"HTTP/1.1 200") == 4, out["pipe"][:1000]
    assert b" 200 " in out["expect"], out["expect"][:500]
    log = c.rec_log("raw")
    by = calls_by(log)
    assert by.get("c11") == [1, 2, 3, 4], by
    assert by.get("c10") == [1] and by.get("c12") == [1], by
    assert "got=5 sum=532" in [line for line in log if "c=12" in line][0]


def test_kubernetes_python_client_and_httpx_during_freeze(cluster):
    """The kubernetes client's Service proxy call and httpx (HTTP/1.1 keep-alive) while the
    pod is frozen: the pod's answers."""
    import httpx
    import kubernetes
    c = cluster
    setup_pod(c, "clients")
    kubernetes.config.load_kube_config(config_file=str(c.kubeconfig))
    api = kubernetes.client.CoreV1Api()
    t, mv = freeze_for(c, "clients", 3)
    out: dict = {}

    def k8s():
        try:
            out["k8s"] = api.connect_get_namespaced_service_proxy_with_path(
                "clients", "default", "k20", path2="k20", _request_timeout=60)
        except Exception as e:  # noqa: BLE001
            out["k8s"] = e

    def hx():
        with httpx.Client(verify=False, headers={"Authorization": f"Bearer {c.token}"}, timeout=60) as h:
            out["httpx"] = [h.post(c.svc_url("clients", f"h?c=21&i={i}"), content=b"q" * 10).status_code
                            for i in range(1, 6)]
    threads = [threading.Thread(target=f) for f in (k8s, hx)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    wait_move(mv)
    t.join()
    assert isinstance(out["k8s"], str) and "GET" in out["k8s"], out["k8s"]
    assert out["httpx"] == [200] * 5
    log = c.rec_log("clients")
    by = calls_by(log)
    assert by.get("c21") == [1, 2, 3, 4, 5], by
    assert len([line for line in log if " GET /k20" in line]) == 1, log


def test_kubectl_proxy_pod_proxy_switch(cluster):
    """The pod proxy: 503 + Retry-After while frozen without Prefer; with Prefer: wait=10
    through kubectl proxy, the pod's answer."""
    import requests
    c = cluster
    setup_pod(c, "kproxy")
    port = 18000 + os.getpid() % 1000
    kp = subprocess.Popen(["kubectl", "proxy", f"--port={port}"], env=c.env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    try:
        time.sleep(2)
        base = f"http://127.0.0.1:{port}/api/v1/namespaces/default/pods/kproxy/proxy"
        t, mv = freeze_for(c, "kproxy", 4)
        plain = requests.get(f"{base}/p?c=30&i=1", timeout=60)
        waited = requests.get(f"{base}/p?c=31&i=1", headers={"Prefer": "wait=10"}, timeout=60)
        wait_move(mv)
        t.join()
        assert plain.status_code == 503 and plain.headers.get("Retry-After") == "1", plain.text
        assert waited.status_code == 200, waited.text
        by = calls_by(c.rec_log("kproxy"))
        assert "c30" not in by and by.get("c31") == [1], by
    finally:
        kp.terminate()
        kp.wait()


# --- 5. The bound --------------------------------------------------------------------------------
def test_bound_then_503_retry_after_event_and_metrics(cluster):
    """hold-requests "1s" and a 5 s freeze: held requests get 503 with Retry-After: 1 after
    about 1 s, never run; a Warning RequestsHeld event on the Service and timed_out counts."""
    c = cluster
    setup_pod(c, "bound", svc_annotations={"kube32.io/hold-requests": "1s"})
    m0 = c.metrics()
    t, mv = freeze_for(c, "bound", 5)
    time.sleep(0.3)
    results = []

    def one(key, headers=None):
        t0 = time.time()
        r = c.session().post(c.svc_url("bound", f"b?{key}&i=1"), data=b"x", timeout=60, headers=headers or {})
        results.append((r.status_code, r.headers.get("Retry-After"), time.time() - t0))
    # three plain clients, and one asking for more than the bound, which it does not get
    threads = [threading.Thread(target=one, args=(f"c=4{i}",)) for i in range(3)]
    threads.append(threading.Thread(target=one, args=("c=49", {"Prefer": "wait=30"})))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wait_move(mv)
    t.join()
    for status, ra, secs in results:
        assert status == 503 and ra == "1", results
        assert 0.7 <= secs <= 2.5, results
    by = calls_by(c.rec_log("bound"))
    assert not {"c40", "c41", "c42", "c49"} & set(by), by
    d = delta(m0, c.metrics())
    assert d.get(("Service", "timed_out"), 0) >= 4, d
    deadline = time.time() + 20
    while time.time() < deadline:
        ev = c.events(reason="RequestsHeld", name="bound")
        if ev:
            break
        time.sleep(1)
    assert ev and ev[0]["type"] == "Warning", ev
    assert "answered 503" in ev[0]["message"]
    desc = c.kubectl("describe", "service", "bound").stdout
    assert "RequestsHeld" in desc, desc


def test_hold_zero_passes_503_on(cluster):
    c = cluster
    setup_pod(c, "zero", svc_annotations={"kube32.io/hold-requests": "0"})
    t, mv = freeze_for(c, "zero", 5)   # margin: the move reaches Saving after the target's pull
    time.sleep(0.3)
    t0 = time.time()
    r = c.session().get(c.svc_url("zero", "z?c=50&i=1"), timeout=60)
    secs = time.time() - t0
    wait_move(mv)
    t.join()
    assert r.status_code == 503 and r.headers.get("Retry-After") == "1" and secs < 1.0, (r.status_code, secs)


@pytest.mark.parametrize("value", ["-1", "abc", "61s", "1e3", "inf", "nan", "-0", "9" * 400, "9" * 400 + "ms"])
def test_malformed_annotation_is_refused_with_422(cluster, value):
    """A malformed, negative, too long or huge hold-requests value is refused as invalid (422)
    when the Service is written, never a 500 (400 nines were a 500 OverflowError: fixed,
    one bounded parser, kube32.holding.parse_hold)."""
    c = cluster
    svc = c.service("badann", {"app": "badann"}, annotations={"kube32.io/hold-requests": value})
    r = c.session().post(c.url("/api/v1/namespaces/default/services"), json=svc, timeout=30)
    assert r.status_code == 422, (r.status_code, r.text[:300])


# --- 6. A hostile user in another namespace ----------------------------------------------------------
def test_other_namespace_cannot_aim_a_hold_at_our_pods(cluster):
    """A user with full proxy rights in namespace mallory24: their Service selecting our pods'
    labels holds nothing and reaches nothing, even while our pod moves; our pod and Service
    proxies are forbidden to them, with or without Prefer: wait."""
    c = cluster
    setup_pod(c, "victim")
    token = c.user_token("mallory24", "mallory", [
        {"apiGroups": [""], "resources": ["pods", "pods/proxy", "services", "services/proxy"],
         "verbs": ["*"]}])
    evil = c.session(token)
    svc = c.service("victim", {"app": "victim"}, ns="mallory24", annotations={"kube32.io/hold-requests": "30s"})
    r = evil.post(c.url("/api/v1/namespaces/mallory24/services"), json=svc, timeout=30)
    assert r.status_code == 201, r.text
    t, mv = freeze_for(c, "victim", 4)
    time.sleep(0.3)
    t0 = time.time()
    a = evil.post(c.url("/api/v1/namespaces/mallory24/services/victim/proxy/x?c=60&i=1"), data=b"x", timeout=60)
    secs = time.time() - t0
    b = evil.post(c.pod_url("victim", "x?c=61&i=1"), data=b"x", headers={"Prefer": "wait=30"}, timeout=60)
    d = evil.post(c.svc_url("victim", "x?c=62&i=1"), data=b"x", timeout=60)
    wait_move(mv)
    t.join()
    assert a.status_code == 503 and secs < 3, (a.status_code, secs, a.text)
    assert b.status_code == 403 and d.status_code == 403, (b.status_code, d.status_code)
    by = calls_by(c.rec_log("victim"))
    assert not {"c60", "c61", "c62"} & set(by), by


# --- 7. Many Services through a drain -----------------------------------------------------------------
def test_drain_with_load_on_six_services(cluster):
    """Six pods on sim-1, one Service each, a client on each (Service proxy and NodePort
    alternately); kubectl drain sim-1: every answer the pod's, each ran once, in order."""
    c = cluster
    names = [f"dr{i}" for i in range(6)]
    for n in names:
        c.apply([c.pod(n, c.image, node="sim-1", labels={"app": n}),
                 c.service(n, {"app": n}, node_port=True)])
    c.wait_ready(*names)
    loads = []
    for i, n in enumerate(names):
        if i % 2:
            url = f"http://127.0.0.3:{c.node_port(n)}/d"
            loads.append(Load(c, url, clients=1, method="POST", body=b"dd", pause=0.02,
                              session_factory=lambda: __import__("requests").Session()).start())
        else:
            loads.append(Load(c, c.svc_url(n, "d"), clients=1, method="POST", body=b"dd", pause=0.02).start())
    time.sleep(1)
    try:
        r = c.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=120s", timeout=180)
        assert r.returncode == 0
        time.sleep(1)
    finally:
        for ld in loads:
            ld.stop()
        c.kubectl("uncordon", "sim-1", check=False)
    for n, ld in zip(names, loads, strict=False):
        assert c.node_of(n) != "sim-1"
        assert ld.failed() == [], (n, ld.failed()[:5])
        check_log(c, n, ld.results)


# --- 8. A rollback --------------------------------------------------------------------------------
def test_rollback_held_requests_go_to_restored_source(cluster):
    """The target node is stopped (SIGSTOP) during the move: the replacement does not run
    within the rollback timeout and the pod restores on its source.  A Service bound of 20 s
    holds the requests meanwhile; they get the pod's answer there, each run once.
    Was a finding of round 24b (passed alone, failed after other tests: the image pull
    on the stopped target went over a kept-alive connection and waited its 60 s with the
    pod frozen, where a fresh one failed within 5 s); fixed: the target's answer is
    needed before the freeze, within the rollback timeout (kube32/controllers/imagecheck.py)."""
    c = cluster
    setup_pod(c, "rb", svc_annotations={"kube32.io/hold-requests": "20s"})
    src = c.node_of("rb")
    target_pid = c.children()[other(src)]
    # A pause between requests: the recorder pod keeps its log in 200 kB, and a move that
    # fails before the freeze (the stopped target answers no pull) leaves the load unhindered.
    load = Load(c, c.svc_url("rb", "r"), clients=3, method="POST", body=b"rr", pause=0.05).start()
    time.sleep(0.5)
    os.kill(target_pid, signal.SIGSTOP)
    try:
        mv = c.move_async("rb", to=other(src))
        out = wait_move(mv, timeout=120)
        time.sleep(1)
    finally:
        os.kill(target_pid, signal.SIGCONT)
    load.stop()
    assert "Failed" in out or "rolled back" in out.lower() or "back" in out, out
    assert c.node_of("rb") == src, out
    assert load.failed() == [], (out, [f[:4] + (round(f[4], 1),) for f in load.failed()[:5]],
                                 [e["message"] for e in c.events() if e["involvedObject"]["name"] == "rb"])
    check_log(c, "rb", load.results)


# --- 9. A slow client --------------------------------------------------------------------------------
def test_clients_that_never_read_do_not_stall_others(cluster):
    """40 connections ask for 300 kB answers and never read them; meanwhile a normal client
    through the Service and its NodePort keeps getting answers across a move."""
    c = cluster
    setup_pod(c, "slow", node_port=True)
    port = c.node_port("slow")
    socks = []
    for _i in range(20):
        s = socket.create_connection(("127.0.0.2", port))
        s.sendall(b"GET /big?big=300000 HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        socks.append(s)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for _i in range(20):
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(c.server.rsplit(":", 1)[1]))))
        s.sendall(b"GET /api/v1/namespaces/default/services/slow/proxy/big?big=300000 HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer " + c.token.encode() + b"\r\n\r\n")
        socks.append(s)
    try:
        load = Load(c, c.svc_url("slow", "n"), clients=2, tag="c").start()
        load2 = Load(c, f"http://127.0.0.3:{port}/n", clients=1, tag="k",
                     session_factory=lambda: __import__("requests").Session()).start()
        time.sleep(1)
        out = wait_move(c.move_async("slow", to=other(c.node_of("slow"))))
        time.sleep(1)
        load.stop()
        load2.stop()
        assert "Completed" in out, out
        assert load.failed() == [] and load2.failed() == [], (load.failed()[:3], load2.failed()[:3])
        assert len(load.results) > 10 and len(load2.results) > 5
    finally:
        for s in socks:
            s.close()


def test_stalled_uploads_do_not_take_a_nodeport_down(cluster):
    """An outsider opens 130 connections to a NodePort and sends headers with
    Content-Length: 10 but no body.  Another client of that NodePort must still be
    answered by the pod (at worst a stalled upload should time out).
    Was a finding of round 24b (each stalled upload held one of the Service's 128
    forwarding slots; so did a byte every 8 s); fixed: a request takes a slot only once
    its body (up to 64 KiB) came, within 10 s (kube32/kubelet/nodeports.py)."""
    import requests
    c = cluster
    setup_pod(c, "stall", node_port=True)
    port = c.node_port("stall")
    socks = []
    try:
        for _ in range(130):
            s = socket.create_connection(("127.0.0.2", port))
            s.sendall(b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            socks.append(s)
        time.sleep(2)
        codes = []
        for i in range(3):
            codes.append(requests.get(f"http://127.0.0.2:{port}/ok?c=70&i={i}", timeout=60).status_code)
            time.sleep(5)
        assert codes == [200, 200, 200], codes
    finally:
        for s in socks:
            s.close()


def test_stalled_uploads_through_the_service_proxy_hold_nothing(cluster):
    """The same as an authenticated user, through the API server's Service proxy: 130 TLS
    connections send headers with Content-Length: 10 and no body.  They take no room for
    held requests (the body is read before), so another client is answered at once, and
    across a move."""
    c = cluster
    setup_pod(c, "stallp")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    port = int(c.server.rsplit(":", 1)[1])
    socks = []
    try:
        for _i in range(130):
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)))
            s.sendall(b"POST /api/v1/namespaces/default/services/stallp/proxy/s HTTP/1.1\r\nHost: x\r\n"
                      b"Authorization: Bearer " + c.token.encode() + b"\r\nContent-Length: 10\r\n\r\n")
            socks.append(s)
        time.sleep(1)
        s = c.session()
        t0 = time.time()
        codes = [s.post(c.svc_url("stallp", f"ok?c=71&i={i}"), data=b"q", timeout=60).status_code for i in (1, 2)]
        assert codes == [200, 200] and time.time() - t0 < 5, codes
        t, mv = freeze_for(c, "stallp", 2)
        r = s.post(c.svc_url("stallp", "ok?c=71&i=3"), data=b"q", timeout=60)
        wait_move(mv)
        t.join()
        assert r.status_code == 200, r.text
        assert calls_by(c.rec_log("stallp")).get("c71") == [1, 2, 3]
    finally:
        for s in socks:
            s.close()


# --- 10. Events and /metrics after a held episode ------------------------------------------------------
def test_requests_held_event_counts_match(cluster):
    c = cluster
    setup_pod(c, "evt")
    m0 = c.metrics()
    t, mv = freeze_for(c, "evt", 3)
    load = Load(c, c.svc_url("evt", "e"), clients=5, method="POST", body=b"e").start()
    wait_move(mv)
    t.join()
    time.sleep(0.5)
    load.stop()
    assert load.failed() == []
    d = delta(m0, c.metrics())
    held = d.get(("Service", "held"), 0)
    assert held >= 5 and d.get(("Service", "sent"), 0) == held, d
    deadline = time.time() + 20
    ev = []
    while time.time() < deadline and not ev:
        ev = c.events(reason="RequestsHeld", name="evt")
        time.sleep(1)
    assert ev, "no RequestsHeld event"
    total = 0
    for e in ev:
        m = re.match(r"Held (\d+) requests?", e["message"])
        total += int(m.group(1)) * int(e.get("count") or 1)
        assert e["type"] == "Normal", e
    assert total == held, ([e["message"] for e in ev], d)


# --- 10b. Order of requests for one pod ---------------------------------------------------------------
def test_held_requests_reach_the_pod_in_arrival_order(cluster):
    """Issue 24: "Requests for the same pod keep their order".  One client sends 40 requests,
    one every 120 ms, each on a connection of its own (without waiting for the answers), while
    the pod is frozen: the pod runs them in the order they were sent.
    Was a finding of round 24b: first newer requests went straight to the replacement while
    older ones were in flight to the refusing source (fixed by the queue's barrier and probe);
    then the held window, handed out in order, reached the replacement shuffled, each request
    on a connection of its own (seen ``[1, 9, 10, 7, 8, 11, ..., 2, ...]``).  Fixed: the hold
    numbers what it sends each pod and the kubelet lets them in by number
    (kube32/kubelet/ordering.py)."""
    c = cluster
    setup_pod(c, "order")
    # Every request sent well inside the freeze, and far enough apart that a loaded machine's
    # thread scheduling cannot make two arrive out of the order they were sent (at 30 ms two
    # did, on CI beside three suites): what is tested is the order kept, not a race of sends.
    t, mv = freeze_for(c, "order", 8)
    results = []

    def one(i):
        r = c.session().post(c.svc_url("order", f"o?c=90&i={i}"), data=b"o", timeout=60)
        results.append(("c90", i, r.status_code, r.text, 0, {}))
    threads = []
    for i in range(1, 41):
        th = threading.Thread(target=one, args=(i,))
        th.start()
        threads.append(th)
        time.sleep(0.12)
    for th in threads:
        th.join()
    wait_move(mv)
    t.join()
    assert all(r[2] == 200 for r in results), [r for r in results if r[2] != 200][:3]
    log = c.rec_log("order")
    assert duplicates(log) == []
    ran = calls_by(log)["c90"]
    assert ran == sorted(ran) and len(ran) == 40, f"run order: {ran}"


# --- 11. A node killed while requests are held (destructive: near the end) ---------------------------
def test_source_node_sigkill_while_requests_held(cluster):
    """The source node is SIGKILLed while the pod is in a long call and a move waits on it,
    with requests held (bound 40 s).  Nothing is left to wait for once the move fails, so
    held requests get 503 + Retry-After well before the bound, and none hangs."""
    c = cluster
    setup_pod(c, "kill", node="sim-2", svc_annotations={"kube32.io/hold-requests": "40s"})
    t, mv = freeze_for(c, "kill", 8)
    load = Load(c, c.svc_url("kill", "k"), clients=5, method="POST", body=b"k", timeout=90).start()
    time.sleep(1)
    pid = c.children()["sim-2"]
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    time.sleep(2)
    load._stop.set()
    load.stop()
    try:
        wait_move(mv, timeout=150)
    except subprocess.TimeoutExpired:
        mv.kill()
    slowest_after_kill = max((r[4] for r in load.results), default=0)
    codes = {r[2] for r in load.results}
    assert load.errors == [], load.errors[:3]
    assert codes <= {200, 503}, codes
    for r in load.results:
        if r[2] == 503:
            assert r[5].get("Retry-After") == "1", r
    # every held request ended within a few seconds of the kill, not at the 40 s bound
    assert time.time() - t_kill < 35, slowest_after_kill


def test_request_begun_on_a_killed_node_is_not_sent_to_another_replica(cluster):
    """A POST the pod began (a 12 s call) when its node is SIGKILLed: the connection breaks
    after the request went out, so it must not be sent again to the Service's other Ready
    pod (it may have had its effect)."""
    c = cluster
    c.apply([c.pod("dupa", c.image, node="sim-1", labels={"app": "dup"}),
             c.service("dup", {"app": "dup"}, annotations={"kube32.io/hold-requests": "30s"})])
    c.wait_ready("dupa")
    out: dict = {}

    def call():
        try:
            r = c.session().post(c.svc_url("dup", "once?ms=12000&c=95&i=1"), data=b"pay", timeout=90)
            out["r"] = (r.status_code, r.text[:200])
        except Exception as e:  # noqa: BLE001
            out["r"] = (0, repr(e))
    th = threading.Thread(target=call)
    th.start()
    time.sleep(1)
    c.apply(c.pod("dupb", c.image, node="devkit", labels={"app": "dup"}))
    c.wait_ready("dupb")
    os.kill(c.children()["sim-1"], signal.SIGKILL)
    th.join(90)
    assert out["r"][0] != 200, out
    log = c.rec_log("dupb")
    assert not [line for line in log if "c=95" in line], log


# --- 12. The control plane restarted while requests are held (a cluster of its own) -----------------
def test_control_plane_restart_while_requests_held(cluster):
    """Requests held at the API server (Service proxy and NodePort) when the control plane is
    stopped (SIGTERM) get 503 with Retry-After: 1, not a broken connection; a NodePort
    request sent while it is down is sent again until the Service's bound (30 s), so it
    gets the pod's answer once the control plane is back."""
    import requests
    cluster.stop()   # one cluster at a time
    c = k24b.ManualCluster(str(cluster.dir.parent / "c3"), workers=2).start()
    try:
        c.image = c.push(k24b.REC_WASM)
        setup_pod(c, "cp", svc_annotations={"kube32.io/hold-requests": "30s"}, node_port=True)
        port = c.node_port("cp")
        t, mv = freeze_for(c, "cp", 8)
        held: dict = {}

        def via_proxy(i):
            try:
                r = c.session().post(c.svc_url("cp", f"h?c=80&i={i}"), data=b"p", timeout=90)
                held[f"proxy{i}"] = (r.status_code, r.headers.get("Retry-After"), r.text[:200])
            except Exception as e:  # noqa: BLE001
                held[f"proxy{i}"] = (0, None, repr(e))

        def via_nodeport(i):
            try:
                r = requests.post(f"http://127.0.0.3:{port}/h?c=81&i={i}", data=b"n", timeout=90)
                held[f"np{i}"] = (r.status_code, r.headers.get("Retry-After"), r.text[:200])
            except Exception as e:  # noqa: BLE001
                held[f"np{i}"] = (0, None, repr(e))
        threads = [threading.Thread(target=f, args=(i,)) for i in range(3) for f in (via_proxy, via_nodeport)]
        for th in threads:
            th.start()
        time.sleep(1.5)
        c.stop_control_plane(signal.SIGTERM)
        for th in threads:
            th.join(30)
        mv.kill()
        # while it is down, a NodePort request waits for it (no API server could be reached)
        late: dict = {}

        def late_np():
            t0 = time.time()
            try:
                r = requests.post(f"http://127.0.0.2:{port}/l?c=82&i=1", data=b"l", timeout=90)
                late["r"] = (r.status_code, r.text[:200], time.time() - t0)
            except Exception as e:  # noqa: BLE001
                late["r"] = (0, repr(e), time.time() - t0)
        lt = threading.Thread(target=late_np)
        lt.start()
        time.sleep(2)
        c.start_control_plane()
        lt.join(60)
        for k, (status, ra, text) in held.items():
            assert status == 503 and ra == "1", (k, status, text, held)
        assert late["r"][0] == 200, late
        log = c.rec_log("cp")
        assert duplicates(log) == [], log
        by = calls_by(log)
        assert "c80" not in by and "c81" not in by, by
        assert by.get("c82") == [1], by
    finally:
        c.stop()
