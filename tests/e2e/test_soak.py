"""Load and soak, bounded in time and on loopback (spec: "Moves", "Limits"):

* the counter pod moved back and forth while a client sends requests through its
  Service: its request count continues exactly (every 200 the client got is one
  request the pod counted, none lost, none repeated), and the client gets nothing but
  200, or 503 with Retry-After.  KUBE32_SOAK_MOVES sets the number of moves (10 in the
  default suite; 200 for the full soak, see docs/reliability.md).
* ten moves requested at once: all complete, each pod with its state.
"""
from __future__ import annotations

import asyncio
import os
import threading
from typing import Iterator

import pytest
import yaml

from kube32.client import Client
from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import cli, get_json, push
from tests.e2e.test_moves import counter_pod, running, state

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
MOVES = int(os.environ.get("KUBE32_SOAK_MOVES", "10"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("soak"), 2, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: ControlPlane) -> str:
    return push(cluster, COUNTER)


class Client_:
    """Sends GET / through the Service until stopped; counts what it got."""

    def __init__(self, cluster: ControlPlane, service: str) -> None:
        self.cluster, self.path = cluster, f"/api/v1/namespaces/default/services/{service}:80/proxy/"
        self.ok = 0
        self.other: list[tuple[int, str | None, str]] = []   # anything but 200 / 503+Retry-After
        self.retries = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()))

    async def _run(self) -> None:
        async with Client.from_kubeconfig(self.cluster.kubeconfig) as c:
            while not self.stop.is_set():
                async with c.request("GET", self.path) as r:
                    body = await r.text()
                    if r.status == 200:
                        self.ok += 1
                    elif r.status == 503 and r.headers.get("Retry-After"):
                        self.retries += 1
                        await asyncio.sleep(0.05)
                    else:
                        self.other.append((r.status, r.headers.get("Retry-After"), body[:200]))


def test_moves_back_and_forth_under_load_lose_no_request(cluster: ControlPlane, image: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=counter_pod("soak", "sim-1", image))
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "soak"},
        "spec": {"selector": {"app": "soak"}, "ports": [{"port": 80}]}}))
    running(cluster, "soak")
    start = state(cluster, "soak")["requests"]
    load = Client_(cluster, "soak")
    load.thread.start()
    try:
        for i in range(MOVES):
            out = cli(cluster, "move", "soak", "--to", "sim-2" if i % 2 == 0 else "sim-1")
            assert out.returncode == 0, f"move {i + 1}: {out.stdout.decode()}"
    finally:
        load.stop.set()
        load.thread.join(30)
    running(cluster, "soak")
    end = state(cluster, "soak")
    assert load.other == [], load.other[:5]
    assert end["requests"] == start + load.ok + 1, (start, load.ok, end)
    assert end["init_calls"] == 1 and end["restored_calls"] == MOVES
    assert load.ok > MOVES, "the client was answered between the moves"
    cluster.kubectl("delete", "pod", "soak", "--wait=false")
    cluster.kubectl("delete", "service", "soak")


def test_ten_moves_at_once_all_complete(cluster: ControlPlane, image: str) -> None:
    names = [f"ten-{i}" for i in range(10)]
    for n in names:
        cluster.kubectl("apply", "-f", "-", input=counter_pod(n, "sim-1", image))
    before = {n: (running(cluster, n), state(cluster, n))[1] for n in names}
    cks = [{"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": f"{n}-move"},
            "spec": {"podName": n, "action": "Move", "target": {"nodeName": "sim-2"}}} for n in names]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(cks))

    def phases() -> dict[str, str]:
        return {c["metadata"]["name"]: c["status"].get("phase", "")
                for c in get_json(cluster, "checkpoints")["items"] if c["metadata"]["name"].endswith("-move")}
    done = wait_for(lambda: (p := phases()) and all(v in ("Completed", "Failed") for v in p.values())
                    and len(p) == 10 and p, 120, interval=0.5, what="ten moves to finish")
    assert set(done.values()) == {"Completed"}, done
    windows = sorted((c["status"]["snapshotStartMs"], c["status"]["snapshotEndMs"])
                     for c in get_json(cluster, "checkpoints")["items"] if c["metadata"]["name"].endswith("-move"))
    assert len(windows) == 10
    for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
        assert end <= start, f"two snapshots at once: {windows}"   # one snapshot at a time
    for n in names:
        pod = running(cluster, n)
        assert pod["spec"]["nodeName"] == "sim-2"
        after = state(cluster, n)
        assert after["requests"] == before[n]["requests"] + 1 and after["restored_calls"] == 1
    cluster.kubectl("delete", "pod", *names, "--wait=false")


def test_drain_of_fifty_pods_while_a_node_joins(cluster: ControlPlane, image: str) -> None:
    """kubectl drain of a node with 50 pods while another node is being added: every pod
    moves (new uid, off the node) with its state, the drain completes."""
    from tests.conftest import sim_command, start
    names = [f"fifty-{i}" for i in range(50)]
    docs = [yaml.safe_load(counter_pod(n, "sim-1", image)) for n in names]
    for d in docs:  # no ticks: fifty pods ticking every 100 ms would only add noise
        d["metadata"]["annotations"].pop("kube32.io/tick-interval")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def all_ready() -> list[dict] | None:
        items = [p for p in get_json(cluster, "pods")["items"] if p["metadata"]["name"] in names]
        ok = [p for p in items if (p["status"].get("containerStatuses") or [{}])[0].get("ready")]
        return items if len(ok) == len(names) else None
    pods = wait_for(all_ready, 120, interval=0.5, what="fifty pods ready")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    before = {n: state(cluster, n)["requests"] for n in names}
    joiner = start(sim_command("worker", "--kubeconfig", str(cluster.data_dir / "node.kubeconfig"),
                               "--name", "joiner", "--address", "127.0.0.9", "--interp-mops", "100"),
                   cluster.data_dir / "joiner.log")
    try:
        out = cluster.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=300s", timeout=330)
        assert "node/sim-1 drained" in out.stdout, out.stdout + out.stderr
        after = {p["metadata"]["name"]: p for p in get_json(cluster, "pods")["items"] if p["metadata"]["name"] in names}
        assert set(after) == set(names), "no pod lost"
        for n, p in after.items():
            assert p["spec"]["nodeName"] != "sim-1" and p["metadata"]["uid"] != uids[n], n
        for n in names:
            s = wait_for(lambda: state(cluster, n), 15, what=f"{n} answering")
            # State kept (one request more than before, never started afresh).  A move that
            # rolled back on a loaded machine and went again on the drain's retry restored
            # twice, as the spec allows: at least one restore, not exactly one.
            assert s["requests"] == before[n] + 1 and s["init_calls"] == 1 and s["restored_calls"] >= 1, (n, s)
        assert get_json(cluster, "node", "joiner")["metadata"]["name"] == "joiner"
    finally:
        cluster.kubectl("uncordon", "sim-1")
        cluster.kubectl("delete", "pod", *names, "--wait=false")
        joiner.stop()
        cluster.kubectl("delete", "node", "joiner", "--wait=false", check=False)
