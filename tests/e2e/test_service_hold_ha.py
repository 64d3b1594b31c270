"""Service holds with several API servers (issue 24, attack round 24): ``kube32-sim up
--control-planes 3 --store etcd --workers 1`` as docs/high-availability.md starts it, plus a
worker ``slow`` (slow-snapshots) on an address of its own; skipped without etcd.  Moved from
tests/attack/test_attack24.py once fixed (the round's other findings:
tests/e2e/test_service_hold_adversarial.py).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest

from tests.e2e.holdcluster import (COUNTER, Client, Cluster, describe, end_move, phase_reached, pod_manifest,
                                  requests_of, service_manifest, start_move, wait_endpoints, wait_for)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ha(tmp_path_factory):
    """``kube32-sim up --control-planes 3 --store etcd --workers 1`` as docs/high-availability.md
    starts it, plus a worker ``slow`` (slow-snapshots) on an address of its own."""
    import shutil
    if not shutil.which("etcd"):
        pytest.skip("etcd is not installed")
    root = tmp_path_factory.mktemp("a24ha")
    from tests.e2e.holdcluster import sim_args, start_process, stop_process
    up = start_process(sim_args("up", "--control-planes", "3", "--store", "etcd", "--workers", "1", "--data-dir",
                     str(root / "c"), "--port", "0", "--interp-mops", "100"), root / "up.log")
    slow = None
    try:
        wait_for(lambda: "cluster ready" in (root / "up.log").read_text() or up.poll() is not None, 150, 0.5,
                 what="the HA cluster")
        assert up.poll() is None, (root / "up.log").read_text()[-3000:]
        k = Cluster(root)
        k.cp_dir = root / "c"
        k.kubeconfig = k.cp_dir / "admin.kubeconfig"
        slow = start_process(sim_args("worker", "--kubeconfig", str(k.cp_dir / "node.kubeconfig"), "--name", "slow",
                           "--address", "127.24.1.13", "--data-dir", str(root / "slow"), "--interp-mops", "100",
                           "--fault", "slow-snapshots"), root / "slow.log")
        k.wait_nodes_ready(["sim-1", "slow"])
        yield k
    finally:
        if slow:
            stop_process(slow)
        stop_process(up, timeout=60)


def test_ha_nodeports_fail_over_when_an_api_server_dies_mid_hold(ha):
    """Was a finding of attack round 24; fixed: the NodePort forwarder is a sibling of the node client
    with all its API servers and fails over (kube32/kubelet/nodeports.py).
    Did: three control planes on etcd (docs/high-availability.md); a counter pod on
    ``slow`` behind a NodePort Service moves to sim-1 (8 s frozen); two GETs and a POST are held
    through slow's NodePort; then the API server the workers use (cp-2: "The workers go to cp-2
    first") is SIGKILLed; cp-1 and cp-3 run on.  Then three more GETs to the NodePort.
    Expected (docs: kube32's clients "fail over: a request that never reached a server goes to
    the next, a GET that broke too"; issue: zero failed requests through a NodePort; held
    requests are ones "the pod never started", safe to send again): the held requests go on
    through another API server (or at worst get 503 with Retry-After: 1), and the NodePort keeps
    answering through cp-1 or cp-3.  Happened before the fix: every held request gets ``502 cannot reach
    service default/hp: Server disconnected`` / ``Cannot connect to host ...`` at once, without
    Retry-After (the pod ran none of them), and every later request to the NodePort is a 502
    for as long as cp-2 is down.
    Root cause guess: the NodePort forwarder keeps one API server address (the node's first)
    and has none of the failover of the node's own client."""
    image = ha.push(COUNTER)
    ha.apply(pod_manifest("hp", image, "slow"))
    ha.kubectl("wait", "--for=condition=Ready", "pod/hp", "--timeout=60s")
    ha.apply(service_manifest("hp", {"app": "hp"}, nodeport=True))
    np = ha.nodeport("hp")
    wait_endpoints(ha, "hp")
    api = ha.api()  # cp-1, the kubeconfig's current context
    c = Client(api)
    cp2 = [int(x) for x in subprocess.run(["pgrep", "-f", f"control-plane --data-dir {ha.cp_dir}/cp-2 "],
                                          capture_output=True, text=True).stdout.split()]
    assert len(cp2) == 1, cp2

    async def go():
        before = await requests_of(c, "hp")
        p = await start_move(ha, "hp", "sim-1")
        await phase_reached(ha, "hp")
        held = [asyncio.create_task(Client.nodeport("127.24.1.13", np, timeout=60)),
                asyncio.create_task(Client.nodeport("127.24.1.13", np, timeout=60)),
                asyncio.create_task(Client.nodeport("127.24.1.13", np, "/work?ms=0", method="POST", body=b"x",
                                                    timeout=60))]
        await asyncio.sleep(1)
        os.kill(cp2[0], signal.SIGKILL)
        res = [await t for t in held]
        await end_move(ha, p, "sim-1")
        await asyncio.sleep(3)
        later = [await Client.nodeport("127.24.1.13", np, timeout=30) for _ in range(3)]
        return before, res, later, await requests_of(c, "hp")

    before, res, later, after = asyncio.run(go())
    problems = [f"held: {describe(a)}" for a in res
                if not (a.status == 200 or (a.status == 503 and a.headers.get("retry-after") == "1"))]
    problems += [f"after cp-2 died: {describe(a)}" for a in later if a.status != 200]
    assert not problems, f"{problems} (the pod ran {after - before - 1} of them)"
