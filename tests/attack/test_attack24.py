"""Outside attack on issue #24, "Moves nobody notices: Services hold requests through a move".

One cluster of separate processes for the module (tests/attack/a24lib.py): a control plane
(restartable alone, --move-rollback-timeout 25s) and five workers on addresses of their own
(127.24.0.x): w1, w2, and three with fault hooks, as docs/reliability.md describes them:
``slow`` (a move's snapshot pauses 8 s: the pod stays frozen that long, as a move between
boards does), ``hang`` (a replacement never runs: rolled back after 25 s) and ``bad`` (every
restore fails: rolled back at once).  The faulty nodes stay cordoned except while a test
moves a pod to one of them.

Clients are what users run: raw HTTP/1.1 (TLS + bearer token to the API server, plain to the
NodePorts), kubectl, kubectl proxy, curl, the ``kubernetes`` client and kube32-cli.  The
counter pod's ``requests`` count is the oracle for "no request lost or run twice".

Every test here held up (PASSING); the findings of the round are fixed and moved to
tests/e2e/test_service_hold_adversarial.py and test_service_hold_ha.py, the cluster to
tests/e2e/holdcluster.py.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

from tests.e2e.holdcluster import (CLI, COUNTER, ECHO, ADDR, FAULTY, ROOT, WORKERS, Api, Client, Cluster, Load,
                                  build_evil_pod, pod_manifest, summarize, counter, make_pod, make_service,
                                  wait_endpoints, start_move, end_move, phase_reached, requests_of, describe,
                                  namespace_with_editor, cp_rss_mib)


@pytest.fixture(scope="module")
def k(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("a24"), rollback_timeout="25s")
    try:
        c.start_control_plane()
        for n in WORKERS:
            c.start_worker(n)
        c.wait_nodes_ready(list(WORKERS))
        c.kubectl("cordon", *FAULTY)
        c.push(COUNTER)
        c.push(ECHO)
        yield c
    finally:
        c.stop()


def _echo_requests(c: Client, svc: str, np: int):
    big = bytes(range(256)) * 256  # 64 KiB exactly: the largest body the docs say is kept
    return {
        "svc POST with query": lambda: c.svc("default", svc, "/q?a=1&b=%20x", method="POST", body=b"hello held",
                                             headers={"X-T": "1"}),
        "svc chunked POST": lambda: c.svc("default", svc, "/c", method="POST", chunks=[b"ab", b"cd", b"ef"]),
        "svc slow chunked POST": lambda: c.svc("default", svc, "/s", method="POST", chunks=[b"x"] * 5,
                                               chunk_delay=0.3),
        "svc PUT 64 KiB": lambda: c.svc("default", svc, "/b64", method="PUT", body=big),
        "svc DELETE": lambda: c.svc("default", svc, "/d", method="DELETE"),
        "svc PATCH": lambda: c.svc("default", svc, "/p", method="PATCH", body=b"{}",
                                   headers={"Content-Type": "application/merge-patch+json"}),
        "NodePort POST": lambda: Client.nodeport(ADDR["w2"], np, "/q?a=1", method="POST", body=b"hello np"),
        "NodePort chunked POST": lambda: Client.nodeport(ADDR["w2"], np, "/c", method="POST", chunks=[b"ab", b"cd"]),
        "NodePort PUT 64 KiB": lambda: Client.nodeport(ADDR["w2"], np, "/b64", method="PUT", body=big),
    }


def test_passing_moves_back_and_forth_under_load_lose_no_request_and_run_none_twice(k):
    """PASSING.  Did: a counter pod behind a NodePort Service; 3 clients GET and 1 client POSTs
    (/work, non-idempotent: it counts) through the Service proxy, 2 clients GET through the
    NodePorts of two other nodes, without pause, while the pod moves w1 -> w2 -> w1, then
    w1 -> slow -> w2 (that move keeps it frozen 8 s).  Expected (issue: done when "zero failed
    requests through the Service proxy and a NodePort across moves"): every answer 200, and the
    pod's count goes up exactly once per answered request.  Happened: as expected."""
    make_pod(k, "lp", "w1")
    make_service(k, "lp", nodeport=True)
    np = k.nodeport("lp")
    api = k.api()
    c = Client(api)

    async def go():
        before = await requests_of(c, "lp")
        load = Load()
        tasks = [asyncio.create_task(load.run_client(lambda: c.svc("default", "lp"), i)) for i in range(3)]
        tasks.append(asyncio.create_task(load.run_client(
            lambda: c.svc("default", "lp", "/work?ms=1", method="POST", body=b"once"), 3)))
        tasks += [asyncio.create_task(load.run_client(lambda a=a: Client.nodeport(a, np), 10 + i))
                  for i, a in enumerate([ADDR["w2"], ADDR["hang"]])]
        await asyncio.sleep(1)
        outs = []
        for to in ["w2", "w1", "slow", "w2"]:
            outs.append(await end_move(k, await start_move(k, "lp", to), to))
            await asyncio.sleep(0.5)
        load.stop = True
        await asyncio.gather(*tasks)
        after = await requests_of(c, "lp")
        return before, after, load, outs

    before, after, load, outs = asyncio.run(go())
    assert all("moved lp" in o for o in outs), outs
    fails = load.failures()
    assert not fails, f"{len(fails)} of {len(load.answers)} failed: {summarize(load.answers)}; " + \
        "; ".join(describe(a) for a in fails[:5])
    ok = len(load.answers)
    assert after == before + ok + 1, f"count went {before} -> {after} for {ok} answered requests"
    events = k.kubectl("describe", "service", "lp").stdout
    assert "RequestsHeld" in events, events


def test_passing_drain_under_load_no_failed_request(k):
    """PASSING.  Did: a Deployment's pod behind a NodePort Service on w2, clients through the Service
    proxy (GET and POST) and the NodePorts of w1 and w2 (the node being drained), then
    ``kubectl drain w2``.  Expected: no failed request, each counted once.  Happened: as expected."""
    img = counter(k)
    k.apply(f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: dr}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: dr}}}}
  template:
    metadata: {{labels: {{app: dr}}}}
    spec:
      nodeName: w2
      containers: [{{name: main, image: "{img}"}}]
""")
    make_service(k, "dr", nodeport=True)
    k.kubectl("rollout", "status", "deploy/dr", "--timeout=60s")
    pod = k.json("get", "pods", "-l", "app=dr")["items"][0]["metadata"]["name"]
    np = k.nodeport("dr")
    c = Client(k.api())

    async def go():
        before = await requests_of(c, pod)
        load = Load()
        tasks = [asyncio.create_task(load.run_client(lambda: c.svc("default", "dr"), i)) for i in range(2)]
        tasks.append(asyncio.create_task(load.run_client(
            lambda: c.svc("default", "dr", "/work?ms=1", method="POST", body=b"x"), 2)))
        tasks += [asyncio.create_task(load.run_client(lambda a=a: Client.nodeport(a, np), 10 + i))
                  for i, a in enumerate([ADDR["w1"], ADDR["w2"]])]
        await asyncio.sleep(1)
        p = await asyncio.create_subprocess_exec("kubectl", "--kubeconfig", str(k.kubeconfig), "drain", "w2",
                                                 "--ignore-daemonsets", "--force", "--timeout=60s",
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out = (await p.communicate())[0].decode()
        await asyncio.sleep(1.5)
        load.stop = True
        await asyncio.gather(*tasks)
        return before, await requests_of(c, pod), load, out

    try:
        before, after, load, out = asyncio.run(go())
    finally:
        k.kubectl("uncordon", "w2")
    assert "drained" in out, out
    assert k.node_of(pod) == "w1"
    fails = load.failures()
    assert not fails, f"{summarize(load.answers)}; " + "; ".join(describe(a) for a in fails[:5])
    assert after == before + len(load.answers) + 1


def test_passing_rollback_after_a_failed_restore_sends_held_requests_to_the_pod_on_its_source(k):
    """PASSING.  Did: a counter pod on w1 behind a NodePort Service under load (Service proxy
    GET/POST, NodePort of w2), moved to ``bad`` whose restores fail.  Expected (issue: "a
    rollback (the replacement fails to restore: held requests go to the pod restored on its
    source)"): the move rolls back to w1, no client sees a failure, each request counted once.
    Happened: as expected."""
    make_pod(k, "rb", "w1")
    make_service(k, "rb", nodeport=True)
    np = k.nodeport("rb")
    c = Client(k.api())

    async def go():
        before = await requests_of(c, "rb")
        load = Load()
        tasks = [asyncio.create_task(load.run_client(lambda: c.svc("default", "rb"), i)) for i in range(2)]
        tasks.append(asyncio.create_task(load.run_client(
            lambda: c.svc("default", "rb", "/work?ms=1", method="POST", body=b"x"), 2)))
        tasks.append(asyncio.create_task(load.run_client(lambda: Client.nodeport(ADDR["w2"], np), 3)))
        await asyncio.sleep(1)
        out = await end_move(k, await start_move(k, "rb", "bad"), "bad")
        await asyncio.sleep(1)
        load.stop = True
        await asyncio.gather(*tasks)
        return before, await requests_of(c, "rb"), load, out

    before, after, load, out = asyncio.run(go())
    assert "rolled back to w1" in out, out
    fails = load.failures()
    assert not fails, f"{summarize(load.answers)}; " + "; ".join(describe(a) for a in fails[:5])
    assert after == before + len(load.answers) + 1


def test_passing_held_requests_reach_the_pod_exactly_as_sent(k):
    """PASSING.  Did: the echo pod (answers method, path, query, headers, body) on ``slow`` behind a
    NodePort Service; sent a set of requests (POST with query, chunked and slowly chunked bodies,
    a 64 KiB PUT, DELETE, PATCH, through the Service proxy and a NodePort) once while it runs,
    then again while it is frozen by a move (slow -> w1, 8 s frozen); and a 64 KiB + 1 body.
    Expected (docs/moving-pods.md "What is held"): each held request answers what it answered
    when not held (the same bytes reach the pod); the body over 64 KiB is not held and gets a 503
    with Retry-After: 1 at once.  Happened: as expected."""
    make_pod(k, "ep", "slow", image=k.push(ECHO))
    make_service(k, "ep", nodeport=True)
    np = k.nodeport("ep")
    c = Client(k.api())
    reqs = _echo_requests(c, "ep", np)

    async def go():
        base = dict(zip(reqs, await asyncio.gather(*[f() for f in reqs.values()]), strict=True))
        p = await start_move(k, "ep", "w1")
        await phase_reached(k, "ep")
        held_t = [asyncio.create_task(f()) for f in reqs.values()]
        over = await c.svc("default", "ep", "/big", method="PUT", body=bytes(65537))
        held = dict(zip(reqs, await asyncio.gather(*held_t), strict=True))
        return base, held, over, await end_move(k, p, "w1")

    base, held, over, out = asyncio.run(go())
    assert "moved ep from slow to w1" in out, out
    for name in reqs:
        assert base[name].status == 200, (name, describe(base[name]))
        assert (held[name].status, held[name].body) == (base[name].status, base[name].body), \
            f"{name}: held {describe(held[name])} vs not held {describe(base[name])}"
    assert held["svc PUT 64 KiB"].ended - held["svc PUT 64 KiB"].started > 3, "was it held at all?"
    assert over.status == 503 and over.headers.get("retry-after") == "1", describe(over)
    assert over.ended - over.started < 2, describe(over)


def test_passing_timeout_path_answers_503_with_retry_after_and_never_runs_the_request_later(k):
    """PASSING.  Did: a counter pod on ``slow`` behind a Service with ``kube32.io/hold-requests: 2s``
    (and NodePort); during its 8 s move freeze sent GET and POST through the Service proxy and a
    NodePort, and a POST whose client goes away after 0.5 s.  Expected (issue: "a timeout path
    (503 with Retry-After as today)"; only requests the pod never started are sent, so a request
    answered 503 is never run): the held ones answer 503 with Retry-After: 1 after about 2 s; the
    pod's count after the move shows none of them ran; ``kubectl describe service`` shows a
    Warning RequestsHeld.  Happened: as expected."""
    make_pod(k, "tp", "slow")
    make_service(k, "tp", hold="2s", nodeport=True)
    np = k.nodeport("tp")
    c = Client(k.api())

    async def go():
        before = await requests_of(c, "tp")
        p = await start_move(k, "tp", "w1")
        await phase_reached(k, "tp")
        gone = asyncio.create_task(c.svc("default", "tp", "/work?ms=0", method="POST", body=b"x", timeout=0.5))
        res = await asyncio.gather(c.svc("default", "tp"),
                                   c.svc("default", "tp", "/work?ms=0", method="POST", body=b"x"),
                                   Client.nodeport(ADDR["w2"], np),
                                   Client.nodeport(ADDR["w2"], np, "/work?ms=0", method="POST", body=b"x"))
        await gone
        out = await end_move(k, p, "w1")
        await asyncio.sleep(1)
        return before, res, out, await requests_of(c, "tp")

    before, res, out, after = asyncio.run(go())
    assert "moved tp from slow to w1" in out, out
    for a in res:
        assert a.status == 503 and a.headers.get("retry-after") == "1", describe(a)
        assert 1.5 < a.ended - a.started < 4, describe(a)
    assert after == before + 1, f"requests answered 503 (or abandoned) ran anyway: {before} -> {after}"
    ev = k.kubectl("describe", "service", "tp").stdout
    assert "Warning" in ev and "RequestsHeld" in ev, ev


def test_passing_slow_body_and_a_client_that_leaves_do_not_hold_up_the_others(k):
    """PASSING.  Did: during an 8 s move freeze, a client starts a POST through the Service proxy
    whose 30-byte body comes one byte every 0.4 s (slowloris), then 5 GETs arrive.  Another POST
    client gives up after 1 s.  Expected: the GETs are not stuck behind the trickling body (they
    are answered once the pod runs again), the slow POST is answered when its body is complete,
    the abandoned POST never runs.  Happened: as expected."""
    make_pod(k, "sl", "slow")
    make_service(k, "sl")
    api = k.api()
    c = Client(api)

    async def slowloris(t0):
        r, w = await asyncio.open_connection(api.host, api.port, ssl=c.tls, server_hostname=api.host)
        w.write((f"POST {api.svc_path('default', 'sl', '/work?ms=1')} HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {api.token}\r\nContent-Length: 30\r\nConnection: close\r\n\r\n").encode())
        for _ in range(30):
            w.write(b"a")
            await w.drain()
            await asyncio.sleep(0.4)
        data = await r.read(-1)
        w.close()
        return data, time.monotonic() - t0

    async def go():
        before = await requests_of(c, "sl")
        p = await start_move(k, "sl", "w1")
        await phase_reached(k, "sl")
        t0 = time.monotonic()
        gone = asyncio.create_task(c.svc("default", "sl", "/work?ms=1", method="POST", body=b"x", timeout=1.0))
        slow = asyncio.create_task(slowloris(t0))
        await asyncio.sleep(0.3)
        gets = await asyncio.gather(*[c.svc("default", "sl") for _ in range(5)])
        g = await gone
        s = await slow
        out = await end_move(k, p, "w1")
        await asyncio.sleep(1)
        return before, gets, g, s, out, await requests_of(c, "sl")

    before, gets, gone, (sdata, st), out, after = asyncio.run(go())
    assert "moved sl from slow to w1" in out, out
    assert all(a.status == 200 for a in gets), [describe(a) for a in gets]
    assert max(a.ended - a.started for a in gets) < 10, [describe(a) for a in gets]
    assert sdata.startswith(b"HTTP/1.1 200"), sdata[:200]
    assert gone.error, describe(gone)
    assert after == before + 5 + 1 + 1, f"{before} -> {after}: expected the 5 GETs and the slow POST only"


def test_passing_held_requests_keep_their_order(k):
    """PASSING.  Did: during an 8 s move freeze, 48 requests one after another (50 ms apart, each on a
    connection of its own), alternating Service proxy and NodePort.  Expected (docs: "Held requests
    go on in the order they came ... up to 16 in flight to a pod at once"): all 200, and a later
    request never gets a lower count than one sent 16 or more places before it.  Happened: as
    expected."""
    make_pod(k, "or", "slow")
    make_service(k, "or", nodeport=True)
    np = k.nodeport("or")
    c = Client(k.api())

    async def go():
        p = await start_move(k, "or", "w1")
        await phase_reached(k, "or")
        tasks = []
        for i in range(48):
            tasks.append(asyncio.create_task(Client.nodeport(ADDR["w2"], np) if i % 2 else c.svc("default", "or")))
            await asyncio.sleep(0.05)
        res = await asyncio.gather(*tasks)
        return res, await end_move(k, p, "w1")

    res, out = asyncio.run(go())
    assert all(a.status == 200 for a in res), summarize(res)
    counts = [a.json()["requests"] for a in res]
    far = [(i, j) for i in range(len(counts)) for j in range(i + 16, len(counts)) if counts[i] > counts[j]]
    assert not far, (far, counts)


def test_passing_no_pods_or_no_schedulable_pod_answers_503_at_once(k):
    """PASSING.  Did: Services with no matching pod, with only an unschedulable pod, and a missing
    Service.  Expected (docs: "A Service with no Ready pod and no move under way answers 503 at
    once"): 503 with Retry-After: 1 within a second (404 for the missing Service), no hold.
    Happened: as expected."""
    make_service(k, "nothing")
    k.apply(f"""
apiVersion: v1
kind: Pod
metadata: {{name: unsched, labels: {{app: unsched}}}}
spec:
  nodeSelector: {{no-such: label}}
  containers: [{{name: main, image: "{counter(k)}"}}]
""")
    make_service(k, "unsched", hold="60s")
    c = Client(k.api())

    async def go():
        return await asyncio.gather(c.svc("default", "nothing"), c.svc("default", "unsched"),
                                    c.svc("default", "no-such-service"))

    a, b, m = asyncio.run(go())
    for x in (a, b):
        assert x.status == 503 and x.headers.get("retry-after") == "1", describe(x)
        assert x.ended - x.started < 1, describe(x)
    assert m.status == 404, describe(m)


def test_passing_absurd_hold_annotations_are_refused(k):
    """PASSING.  Did: ``kubectl annotate`` a Service's kube32.io/hold-requests with absurd values.
    Expected (docs: "at most 60 s; "0" holds nothing"): each refused with a message, valid ones
    kept.  Happened: as expected."""
    make_service(k, "ann")
    bad = ["61s", "1h", "1e9", "-5", "-1s", "NaN", "inf", "", "abc", "10S", "0x10", "1d",
           "99999999999999999999", "100000000000000000000000s", "+5", "\u0663"]
    for v in bad:
        cp = k.kubectl("annotate", "svc", "ann", "--overwrite", f"kube32.io/hold-requests={v}", check=False)
        assert cp.returncode != 0 and "invalid" in cp.stderr.lower(), (v, cp.stdout, cp.stderr)
    for v in ["0", "500ms", "30", "60s", "1m", "1.5"]:
        k.kubectl("annotate", "svc", "ann", "--overwrite", f"kube32.io/hold-requests={v}")


def test_passing_pods_own_503_and_a_trapped_call_are_never_sent_again(k, tmp_path):
    """PASSING.  Did: a pod written to attack the proxies: it answers its own 503 with Retry-After and
    the kubelet's marker X-Kube32-Not-Started (in two spellings), and on POST /trap publishes an
    event and then traps; two replicas behind a Service, a subscriber pod counting the events.
    Expected (docs: "the kubelet drops X-Kube32-Not-Started from every answer of a pod"; "a
    request the pod began is never sent twice"): the pod's 503 reaches the client as it is and
    runs once; the trapped POST is answered with an error and its effect (the event) happens once.
    Happened: as expected."""
    wasm = build_evil_pod(tmp_path / "evil.wasm")
    if wasm is None:
        pytest.skip("clang is needed to build the attacking pod")
    img = k.push(wasm)
    make_pod(k, "ev1", "w1", image=img, labels={"app": "ev", "one": "yes"})
    make_pod(k, "ev2", "w2", image=img, labels={"app": "ev"})
    make_service(k, "ev")
    make_service(k, "ev-one", selector={"one": "yes"})
    k.apply(pod_manifest("trapsub", counter(k), "w1", {"app": "trapsub"}, {"kube32.io/events": "trapped"}))
    k.kubectl("wait", "--for=condition=Ready", "pod/trapsub", "--timeout=60s")
    wait_endpoints(k, "ev")
    c = Client(k.api())

    async def go():
        r0 = json.loads((await c.pod("default", "ev1")).body)["requests"]
        f1 = await c.svc("default", "ev-one", "/fake503")
        f2 = await c.svc("default", "ev-one", "/fake503-lower")
        r1 = json.loads((await c.pod("default", "ev1")).body)["requests"]
        trap = await c.svc("default", "ev", "/trap", method="POST", body=b"")
        await asyncio.sleep(4)
        sub = (await c.pod("default", "trapsub")).json()
        return r0, f1, f2, r1, trap, sub

    r0, f1, f2, r1, trap, sub = asyncio.run(go())
    for f in (f1, f2):
        assert f.status == 503 and f.body == b"own 503\n", describe(f)
        assert "x-kube32-not-started" not in f.headers, f.headers
    assert r1 == r0 + 3, f"the pod's own 503s ran {r1 - r0 - 1} times for 2 requests"
    assert trap.status >= 500, describe(trap)
    assert sub["events"] == 1, f"the trapped request's effect happened {sub['events']} times"


def test_passing_docs_example_kubectl_get_raw_and_kubernetes_client_through_a_move(k):
    """PASSING.  Did: docs/moving-pods.md's example, with the counter pod on ``slow`` so the move
    takes 8 s: ``kube32-cli move`` in the background and ``kubectl get --raw
    .../services/NAME/proxy/`` ten times, plus the ``kubernetes`` client's
    connect_get_namespaced_service_proxy.  Expected: "Every request answers 200, and the
    counts go up one by one: no request was lost or run twice".  Happened: as expected."""
    make_pod(k, "dx", "slow")
    make_service(k, "dx", hold="10s")
    from kubernetes import client as kclient
    from kubernetes import config as kconfig
    core = kclient.CoreV1Api(kconfig.new_client_from_config(str(k.kubeconfig)))
    p = subprocess.Popen([*CLI, "move", "dx", "--to", "w1"], env={**os.environ, "KUBECONFIG": str(k.kubeconfig)},
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    counts = []
    try:
        asyncio.run(phase_reached(k, "dx"))
        counts.append(json.loads(core.connect_get_namespaced_service_proxy("dx", "default", _preload_content=False).data)
                      ["requests"])
        for _ in range(10):
            out = k.kubectl("get", "--raw", "/api/v1/namespaces/default/services/dx/proxy/").stdout
            counts.append(json.loads(out)["requests"])
    finally:
        out = p.communicate(timeout=60)[0]
    assert "moved dx from slow to w1" in out, out
    assert counts == list(range(counts[0], counts[0] + 11)), counts


def test_passing_a_new_replica_takes_requests_held_for_a_move_that_hangs(k):
    """PASSING.  Did: a counter pod moved to ``hang`` (the replacement never runs; rolled back after
    25 s) behind a Service holding 30 s; a GET is held; then a second pod with the Service's label
    starts on w2.  Expected (issue: "send it once a Ready endpoint exists (the replacement, or
    another replica)"): the held GET and a later one are answered by the new pod within seconds.
    Happened: as expected."""
    make_pod(k, "nr", "w1")
    make_service(k, "nr", hold="30s")
    c = Client(k.api())

    async def go():
        p = await start_move(k, "nr", "hang")
        await phase_reached(k, "nr", ("Moving",))
        first = asyncio.create_task(c.svc("default", "nr", timeout=60))
        await asyncio.sleep(1)
        t_extra = time.monotonic()
        make_pod(k, "nr-extra", "w2", labels={"app": "nr"})
        await asyncio.sleep(1)
        later = await c.svc("default", "nr", timeout=60)
        a = await first
        out = await end_move(k, p, "hang")
        return a, later, t_extra, out

    a, later, t_extra, out = asyncio.run(go())
    assert "rolled back" in out, out
    for x in (a, later):
        assert x.status == 200, describe(x)
        assert x.ended - t_extra < 8, describe(x)


def test_passing_a_held_request_whose_pod_is_deleted_is_answered_at_once(k):
    """PASSING.  Did: a pod on ``slow`` moving to w1 (8 s frozen) behind a Service holding 12 s; a GET
    is held; ``kubectl delete pod`` 1 s later.  Expected: nothing is left to wait for, so the
    held GET is answered (503 with Retry-After) within a couple of seconds, not after 12 s.
    Happened: as expected (503 about 0.2 s after the delete; the move fails "pods not found")."""
    make_pod(k, "pd", "slow")
    make_service(k, "pd", hold="12s")
    c = Client(k.api())

    async def go():
        p = await start_move(k, "pd", "w1")
        await phase_reached(k, "pd")
        first = asyncio.create_task(c.svc("default", "pd", timeout=40))
        await asyncio.sleep(1)
        t_del = time.monotonic()
        k.kubectl("delete", "pod", "pd", "--wait=false")
        a = await first
        return a, t_del, await end_move(k, p, "w1")

    a, t_del, out = asyncio.run(go())
    assert a.status == 503 and a.headers.get("retry-after") == "1", describe(a)
    assert a.ended - t_del < 3, describe(a)


def test_passing_another_replica_takes_the_requests_of_a_frozen_one(k):
    """PASSING.  Did: two replicas behind a NodePort Service (and a second Service over them with
    ``kube32.io/hold-requests: "0"``); one replica moves slow -> w1 (8 s frozen) while 3 clients
    load the Service proxy, one the NodePort and one the hold-0 Service; during the freeze also
    the name forms ``http:rp:80``, ``rp:80`` and ``https:rp:``.  Expected (issue: "send it once a
    Ready endpoint exists (the replacement, or another replica)"): every answer of the holding
    Service 200, none slow; the hold-0 Service may pass the frozen pod's 503 with Retry-After.
    Happened: as expected (every answer within 0.4 s; the hold-0 Service once passed on
    ``503 pod "default/rp1" is frozen``, with the kubelet's X-Kube32-Not-Started header)."""
    make_pod(k, "rp1", "slow", labels={"app": "rp"})
    make_pod(k, "rp2", "w2", labels={"app": "rp"})
    make_service(k, "rp", nodeport=True)
    make_service(k, "rp0", selector={"app": "rp"}, hold="0")
    wait_endpoints(k, "rp")
    np = k.nodeport("rp")
    c = Client(k.api())

    async def go():
        load = Load()
        tasks = [asyncio.create_task(load.run_client(lambda: c.svc("default", "rp"), i)) for i in range(3)]
        tasks += [asyncio.create_task(load.run_client(lambda: Client.nodeport(ADDR["w1"], np), 5))]
        tasks += [asyncio.create_task(load.run_client(lambda: c.svc("default", "rp0"), 6))]
        await asyncio.sleep(1)
        p = await start_move(k, "rp1", "w1")
        await phase_reached(k, "rp1")
        forms = await asyncio.gather(c.svc("default", "http:rp:80"), c.svc("default", "rp:80"),
                                     c.svc("default", "https:rp:"))
        out = await end_move(k, p, "w1")
        load.stop = True
        await asyncio.gather(*tasks)
        return load, forms, out

    load, forms, out = asyncio.run(go())
    assert "moved rp1 from slow to w1" in out, out
    held = [a for a in load.answers if a.client != 6]
    bare = [a for a in load.answers if a.client == 6]
    assert not [a for a in held if a.status != 200], summarize(held)
    assert max(a.ended - a.started for a in held) < 3, "a request waited for the frozen replica"
    # hold "0" holds nothing: a 503 may show, but only the kubelet's, with Retry-After
    assert all(a.status == 200 or (a.status == 503 and a.headers.get("retry-after") == "1") for a in bare), \
        summarize(bare)
    assert all(a.status == 200 for a in forms), [describe(a) for a in forms]


def test_passing_another_namespace_neither_shares_nor_reaches_my_holds(k):
    """PASSING.  Did: user ``bot`` with ``edit`` in namespace ``mirror`` only makes a Service
    ``shared`` and a pod labelled ``app: shared`` (the same names and labels as the admin's in
    ``default``) and moves that pod to ``hang``, so requests to mirror/shared are held.  The
    admin's pod in ``default`` moves too (slow -> w1, frozen 8 s).  During both: bot asks the
    admin's Service and pod proxies (``Prefer: wait=10``), and the admin's and bot's clients use
    their own Services.  Expected: bot's requests to default are refused 403 at once, never held;
    bot's held requests never reach default's pod; the admin's requests are answered by the
    admin's pod.  Happened: as expected."""
    token = namespace_with_editor(k, "mirror")
    make_pod(k, "shared", "w2", ns="mirror", token=token)
    make_service(k, "shared", hold="20s", ns="mirror", token=token)
    make_pod(k, "shared", "slow")
    make_service(k, "shared")
    api = k.api()
    c = Client(api)
    bot = Client(Api(api.server, token, api.ca_file))

    async def go():
        before = await requests_of(c, "shared")
        pm = await start_move(k, "shared", "hang", ns="mirror")
        await phase_reached(k, "shared", ("Moving",), ns="mirror", settle=0.2)
        bots = [asyncio.create_task(bot.svc("mirror", "shared", timeout=40)) for _ in range(5)]
        p = await start_move(k, "shared", "w1")
        await phase_reached(k, "shared")
        stranger = await asyncio.gather(bot.svc("default", "shared", headers={"Prefer": "wait=10"}),
                                        bot.pod("default", "shared", headers={"Prefer": "wait=10"}))
        mine = await asyncio.gather(*[c.svc("default", "shared") for _ in range(3)])
        out = await end_move(k, p, "w1")
        after = await requests_of(c, "shared")
        theirs = await asyncio.gather(*bots)
        return before, after, stranger, mine, theirs, out, await end_move(k, pm, "hang")

    before, after, stranger, mine, theirs, out, out_m = asyncio.run(go())
    assert "moved shared from slow to w1" in out, out
    for a in stranger:
        assert a.status == 403 and a.ended - a.started < 1, describe(a)
    assert all(a.status == 200 and a.json()["hostname"] == "shared" for a in mine), [describe(a) for a in mine]
    assert after == before + 3 + 1, f"default/shared counted {after - before - 1} requests for the admin's 3"
    assert all(a.status in (200, 503) for a in theirs), [describe(a) for a in theirs]


def test_passing_large_bodies_stream_and_a_trickling_one_holds_up_nobody(k):
    """PASSING.  Did: six 12 MiB POSTs at once through the Service proxy to the echo pod (reading the
    API server's RSS from /proc), then a 200 KB POST whose body trickles at 10 KB/s while other
    clients POST 100 KB and 1 KB bodies to another Service.  Expected (issue: "the hold costs no
    extra copy of large bodies beyond a bound"; docs: a body over 64 KiB "streams to the pod as
    it comes"): all answered, the API server's memory grows far less than the 72 MiB sent, and
    the trickling body delays nobody else.  Happened: as expected (RSS +12 MiB; others in 50 ms)."""
    make_pod(k, "bb", "w1", image=k.push(ECHO))
    make_service(k, "bb")
    make_pod(k, "bb2", "w2", image=k.push(ECHO))
    make_service(k, "bb2")
    api = k.api()
    c = Client(api)

    async def trickle():
        r, w = await asyncio.open_connection(api.host, api.port, ssl=c.tls, server_hostname=api.host)
        w.write((f"POST {api.svc_path('default', 'bb', '/slow')} HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {api.token}\r\nContent-Length: 200000\r\nConnection: close\r\n\r\n"
                 ).encode())
        while True:
            w.write(b"a" * 1000)
            await w.drain()
            await asyncio.sleep(0.1)

    async def go():
        r0 = cp_rss_mib(k)
        big = [asyncio.create_task(c.svc("default", "bb", "/big", method="POST", body=b"z" * (12 << 20), timeout=60))
               for _ in range(6)]
        peak = r0
        while not all(t.done() for t in big):
            peak = max(peak, cp_rss_mib(k))
            await asyncio.sleep(0.1)
        res = [t.result() for t in big]
        tr = asyncio.create_task(trickle())
        await asyncio.sleep(2)
        others = []
        for _ in range(3):
            others.append(await c.svc("default", "bb2", "/o", method="POST", body=b"q" * 100000))
            others.append(await c.svc("default", "bb2", "/o", method="POST", body=b"q" * 1000))
        tr.cancel()
        await asyncio.gather(tr, return_exceptions=True)
        return r0, peak, res, others

    r0, peak, res, others = asyncio.run(go())
    assert all(a.status == 200 for a in res), summarize(res)
    assert peak - r0 < 48, f"API server RSS {r0:.0f} -> {peak:.0f} MiB for 72 MiB of bodies"
    assert all(a.status == 200 and a.ended - a.started < 2 for a in others), [describe(a) for a in others]


def test_passing_pipelined_requests_on_one_connection_keep_their_order_through_a_hold(k):
    """PASSING.  Did: during an 8 s move freeze, one client writes 4 GETs at once on one keep-alive
    connection (HTTP/1.1 pipelining) to the NodePort of w2 and to the Service proxy.  Expected
    (docs: "one client's requests on a connection keep theirs"): 4 answers 200 on each, in order
    (counts increasing), the 8 counts consecutive (none lost or run twice).  Happened: as expected."""
    make_pod(k, "pl", "slow")
    make_service(k, "pl", nodeport=True)
    np = k.nodeport("pl")
    api = k.api()
    c = Client(api)

    async def pipelined(host, port, path, tls, extra):
        r, w = await asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls else None)
        reqs = b""
        for i in range(4):
            conn = "close" if i == 3 else "keep-alive"
            reqs += f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: {conn}\r\n\r\n".encode()
        w.write(reqs)
        await w.drain()
        data = await asyncio.wait_for(r.read(-1), 60)
        w.close()
        return data

    def parse(data: bytes):
        out = []
        while data:
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            h = {ln.split(":", 1)[0].lower(): ln.split(":", 1)[1].strip() for ln in lines[1:] if ":" in ln}
            if "content-length" in h:
                n = int(h["content-length"])
                body, data = rest[:n], rest[n:]
            else:  # chunked
                body = b""
                while True:
                    size, _, rest = rest.partition(b"\r\n")
                    n = int(size, 16)
                    if n == 0:
                        data = rest[2:]
                        break
                    body += rest[:n]
                    rest = rest[n + 2:]
            out.append((status, body))
        return out

    async def go():
        p = await start_move(k, "pl", "w1")
        await phase_reached(k, "pl")
        a, b = await asyncio.gather(
            pipelined(ADDR["w2"], np, "/", None, ""),
            pipelined(api.host, api.port, api.svc_path("default", "pl", "/"), c.tls,
                      f"Authorization: Bearer {api.token}\r\n"))
        return a, b, await end_move(k, p, "w1")

    a, b, out = asyncio.run(go())
    assert "moved pl from slow to w1" in out, out
    every = []
    for data in (a, b):
        answers = parse(data)
        assert [s for s, _ in answers] == [200] * 4, answers
        counts = [json.loads(body)["requests"] for _, body in answers]
        assert counts == sorted(counts), counts
        every += counts
    assert sorted(every) == list(range(min(every), min(every) + 8)), every
