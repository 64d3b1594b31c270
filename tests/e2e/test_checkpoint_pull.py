"""`PUT checkpoints/<name>/data?fromNode=...`: the API server takes a pod's snapshot from
its node itself (one pass through the control plane), on a real cluster with the
counter pod."""
from __future__ import annotations

import asyncio
import hashlib
import json

from kube32.client import Client
from tests.conftest import ROOT, ControlPlane
from tests.e2e.helpers import push
from tests.e2e.test_moves import counter_pod, running, state

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
CK = "/apis/kube32.io/v1/namespaces/default/checkpoints/pulled"


def call(cluster: ControlPlane, method: str, path: str, params: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    async def go() -> tuple[int, dict[str, str], bytes]:
        async with Client.from_kubeconfig(cluster.kubeconfig) as c:
            async with c.request(method, path, params=params) as r:
                return r.status, dict(r.headers), await r.read()
    return asyncio.run(go())


def test_the_api_server_pulls_a_snapshot_from_the_node(sim_cluster: ControlPlane) -> None:
    cluster = sim_cluster
    image = push(cluster, COUNTER)
    cluster.kubectl("apply", "-f", "-", input=counter_pod("pullme", "sim-1", image))
    running(cluster, "pullme")
    before = state(cluster, "pullme")
    # A Checkpoint the controller leaves alone (its pod does not exist), so the only
    # snapshot stored is the one this test pulls.
    cluster.kubectl("apply", "-f", "-", input="apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                    "metadata: {name: pulled}\nspec: {podName: no-such-pod}\n")
    try:
        pull = {"fromNode": "sim-1", "pod": "pullme", "container": "main", "leave": "running"}
        status, headers, body = call(cluster, "PUT", f"{CK}/data", pull)
        assert status == 200, body
        st = json.loads(body)["status"]
        assert st["sizeBytes"] > 65536 and st["imageSha256"] == image.split(":")[1]
        assert int(headers["X-Kube32-Frozen-At-Ms"]) > 0
        assert headers["X-Kube32-Snapshot-Sha256"] == st["snapshotSha256"]
        # The facts come back, not written (the caller writes them with its next status
        # write); the data's GET answers their headers from the data itself.
        stored = json.loads(cluster.kubectl("get", "ckpt", "pulled", "-o", "json").stdout).get("status") or {}
        assert "snapshotSha256" not in stored and "sizeBytes" not in stored
        status, headers, data = call(cluster, "GET", f"{CK}/data")
        assert status == 200 and len(data) == st["sizeBytes"] and data[-32:].hex() == st["snapshotSha256"]
        assert headers["X-Kube32-Snapshot-Sha256"] == st["snapshotSha256"]
        assert headers["X-Kube32-Image-Sha256"] == st["imageSha256"]
        assert headers["X-Kube32-Pod-Time-Ms"] == str(st["podTimeMs"])
        assert state(cluster, "pullme")["requests"] == before["requests"] + 1, "left running, and answers"

        # The kubelet's own answer: the digest header up front by default; with sha256=trailer
        # (what the pull asks) none, the hash running beside the send, the trailer the same.
        proxy = "/api/v1/nodes/sim-1/proxy/checkpoint/default/pullme/main"
        status, headers, body = call(cluster, "POST", proxy, {"leave": "running"})
        assert status == 200 and headers["X-Kube32-Snapshot-Sha256"] == body[-32:].hex()
        status, headers, plain = call(cluster, "POST", proxy, {"leave": "running", "sha256": "trailer"})
        assert status == 200 and "X-Kube32-Snapshot-Sha256" not in headers
        assert plain[-32:] == hashlib.sha256(plain[:-32]).digest() and len(plain) == len(body)

        # The kubelet's refusal comes back as it answered, marked as the node's.
        status, headers, body = call(cluster, "PUT", f"{CK}/data", {**pull, "pod": "nope"})
        assert status == 404 and headers["X-Kube32-From-Node"] == "sim-1"
        assert "is not running on node" in json.loads(body)["message"]
        status, headers, body = call(cluster, "PUT", f"{CK}/data", {**pull, "leave": "later"})
        assert status == 400 and headers["X-Kube32-From-Node"] == "sim-1"

        # The API server's own refusals are not.
        status, headers, body = call(cluster, "PUT", f"{CK}/data", {**pull, "fromNode": "nowhere"})
        assert status == 404 and "X-Kube32-From-Node" not in headers and "nowhere" in json.loads(body)["message"]
        status, _, body = call(cluster, "PUT", f"{CK}/data", {"fromNode": "sim-1", "pod": "pullme"})
        assert status == 400 and "fromNode needs pod and container" in json.loads(body)["message"]
    finally:
        cluster.kubectl("delete", "pod", "pullme", "--wait=false")
        cluster.kubectl("delete", "checkpoint", "pulled", "--wait=false")
