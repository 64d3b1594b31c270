"""Events published while a pod moves reach it once it runs again, in order, at most 8,
the rest dropped and counted (spec: "Kubelet endpoints": "Events for the pod are held, at
most 8, and later ones are dropped and counted"; "What moves": "events that arrive
while the pod is frozen, delivered after the restore").

Real processes: a control plane and workers as ``kube32-sim`` processes, the source
with ``--fault slow-snapshots`` (a move's snapshot pauses 8 s halfway, after the pod's
state is written out), so the events are published while the bytes are on their way,
and, for the rollback, while the replacement is bound to a target that never starts it.
Publishes go through ``kube32-cli publish`` (the rest of a burst through the same API
from one client, so that it fits in the pause); the counter pod counts the events it
gets and keeps the last one.
"""
from __future__ import annotations

import asyncio
import io
import signal
import threading
import time
from typing import Iterator

import pytest

from kube32.client import Client
from kube32.snapshot import SnapshotReader
from tests.conftest import ROOT, wait_for
from tests.e2e.helpers import api_call, cli, get_json, push
from tests.e2e.test_faults import (FaultCluster, checkpoints_of, events_of, free_port, move_bg,
                                   serve_pod, the_checkpoint)
from tests.e2e.test_moves import running, state

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    data_dir = tmp_path_factory.mktemp("move-events")
    c = FaultCluster(data_dir, None, data_dir / "admin.kubeconfig", data_dir / "kubectl-cache")  # type: ignore[arg-type]
    c.port = free_port()
    c.start_control_plane()
    workers = [c.worker("slow", "--fault", "slow-snapshots"), c.worker("sim-2"),
               c.worker("stuck", "--fault", "hang-restores")]
    try:
        yield c
    finally:
        for w in workers:
            w.stop(signal.SIGKILL)
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: FaultCluster) -> str:
    return push(cluster, COUNTER)


def publish(cluster: FaultCluster, *payloads: str) -> None:
    for p in payloads:
        out = cli(cluster, "publish", "greet", p)
        assert out.returncode == 0 and out.stdout.decode().startswith("published"), out


def publish_burst(cluster: FaultCluster, *payloads: str) -> None:
    """As ``kube32-cli publish`` does, one after the other from one client."""
    async def go() -> None:
        async with Client.from_kubeconfig(cluster.kubeconfig) as c:
            for p in payloads:
                out = await c.post_bytes("/apis/kube32.io/v1/namespaces/default/topics/greet", p.encode(),
                                         "application/octet-stream", {"source": "user"})
                assert out["kind"] == "TopicEvent", out
    asyncio.run(go())


def snapshot_under_way(cluster: FaultCluster, pod: str) -> None:
    """The move's snapshot is being sent: its node pauses halfway for 8 s."""
    wait_for(lambda: any(c["status"].get("phase") == "Saving" and c["status"].get("nodeName") == "slow"
                         for c in checkpoints_of(cluster, pod)), 20, what="the snapshot to start")
    time.sleep(1.0)  # the pod's state went out before the events published now


def events_now(cluster: FaultCluster, pod: str, want: int) -> dict:
    return wait_for(lambda: (s := state(cluster, pod))["events"] >= want and s, 15,
                    what=f"{pod} to have heard {want} events")


def test_events_during_a_slow_snapshot_reach_the_replacement_eight_in_order_the_rest_counted(cluster, image):
    before = serve_pod(cluster, "hear", "slow", image)
    mover = move_bg(cluster, "hear", "--to", "sim-2")
    snapshot_under_way(cluster, "hear")
    publish(cluster, "e1", "e2", "e3")
    publish_burst(cluster, *(f"e{i}" for i in range(4, 12)))
    out = mover.communicate(timeout=90)[0].decode()
    assert mover.returncode == 0, out
    moved = running(cluster, "hear")
    assert moved["spec"]["nodeName"] == "sim-2"
    after = events_now(cluster, "hear", before["events"] + 8)
    assert after["restored_calls"] == 1 and after["requests"] == before["requests"] + 1
    assert after["events"] == before["events"] + 8 and after["last_event"] == "greet:e8", after
    dropped = wait_for(lambda: events_of(cluster, "hear", "EventsDropped"), 10, what="EventsDropped")
    assert [e["count"] for e in dropped] == [3], dropped
    assert dropped[0]["type"] == "Warning" and dropped[0]["involvedObject"]["uid"] == moved["metadata"]["uid"]
    assert "at most 8 wait for a pod while it is frozen or moving" in dropped[0]["message"]
    # Later events reach it as any, after the held ones.
    publish(cluster, "later")
    last = events_now(cluster, "hear", after["events"] + 1)
    assert last["events"] == after["events"] + 1 and last["last_event"] == "greet:later"
    cluster.kubectl("delete", "pod", "hear", "--wait=false")


def test_events_during_the_snapshot_and_while_the_replacement_is_bound_reach_the_pod_rolled_back(cluster, image):
    """Published while the bytes are on their way, and while the replacement is bound to a
    target that never starts it: the pod rolled back to its source gets them all, in order."""
    before = serve_pod(cluster, "back", "slow", image)
    mover = move_bg(cluster, "back", "--to", "stuck")
    snapshot_under_way(cluster, "back")
    publish(cluster, "s1", "s2")
    the_checkpoint(cluster, "back", "Moving", 60)
    publish(cluster, "m1", "m2", "m3")
    out = mover.communicate(timeout=90)[0].decode()
    assert mover.returncode == 1 and "rolled back to slow" in out, out
    back = running(cluster, "back")
    assert back["spec"]["nodeName"] == "slow"
    after = events_now(cluster, "back", before["events"] + 5)
    assert after["events"] == before["events"] + 5 and after["last_event"] == "greet:m3", after
    assert after["restored_calls"] == 1
    assert not events_of(cluster, "back", "EventsDropped")
    cluster.kubectl("delete", "pod", "back", "--wait=false")


def test_events_held_for_a_move_that_fails_before_the_replacement_reach_the_thawed_pod_once(cluster, image):
    """The Checkpoint deleted while its snapshot is on the way: the move fails before the
    replacement, the pod thaws where it runs and gets the events published meanwhile,
    each once."""
    before = serve_pod(cluster, "stay", "slow", image)
    uid = get_json(cluster, "pod", "stay")["metadata"]["uid"]
    mover = move_bg(cluster, "stay", "--to", "sim-2")
    snapshot_under_way(cluster, "stay")
    ck = next(c for c in checkpoints_of(cluster, "stay") if c["status"].get("phase") == "Saving")
    # Published and deleted within the node's 8 s pause, from one client each (three CLI
    # processes and a waiting kubectl took that long on a loaded machine).
    publish_burst(cluster, "t1", "t2", "t3")
    cluster.kubectl("delete", "checkpoint", ck["metadata"]["name"], "--wait=false")
    mover.communicate(timeout=90)
    pod = wait_for(lambda: (p := get_json(cluster, "pod", "stay"))["status"]["containerStatuses"][0]["ready"] and p,
                   60, what="stay to thaw (Ready again)")
    assert pod["spec"]["nodeName"] == "slow" and pod["metadata"]["uid"] == uid
    after = events_now(cluster, "stay", before["events"] + 3)
    assert after["events"] == before["events"] + 3 and after["last_event"] == "greet:t3", after
    assert after["restored_calls"] == 0 and after["requests"] == before["requests"] + 1
    cluster.kubectl("delete", "pod", "stay", "--wait=false")



def test_the_events_a_running_pod_had_queued_before_its_move_all_go_with_it(cluster, image):
    """Spec: a move loses nothing of the pod's state, and only events for a *frozen* pod are
    held at most 8.  Twelve events published to a running pod (queued behind a 6 s call: a
    running pod queues up to 1024) before a move that completes: the freeze drops none, the
    snapshot carries all twelve and the replacement gets them, in order, none counted dropped
    - as the pod would have had it stayed."""
    before = serve_pod(cluster, "queued", "sim-2", image)
    work = threading.Thread(target=lambda: api_call(
        cluster, "POST", "/api/v1/namespaces/default/pods/queued/proxy/work?ms=6000"))
    work.start()
    time.sleep(0.5)
    publish_burst(cluster, *(f"q{i}" for i in range(1, 13)))
    out = cli(cluster, "move", "queued", "--to", "slow").stdout.decode()   # asked while the call runs
    work.join(30)
    assert "moved queued from sim-2 to slow" in out, out
    ck = next(c for c in checkpoints_of(cluster, "queued") if c["status"].get("phase") == "Completed")
    data = api_call(cluster, "GET", f"/apis/kube32.io/v1/namespaces/default/checkpoints/{ck['metadata']['name']}"
                                    "/data")[2]
    held = SnapshotReader(total_size=len(data)).read_from(io.BytesIO(data)).state.events
    assert [e.payload for e in held] == [f"q{i}".encode() for i in range(1, 13)], held
    events_now(cluster, "queued", before["events"] + 12)
    time.sleep(1)   # no more come
    after = state(cluster, "queued")
    assert after["events"] == before["events"] + 12 and after["last_event"] == "greet:q12", after
    assert after["restored_calls"] == 1 and after["init_calls"] == 1, after
    assert not events_of(cluster, "queued", "EventsDropped")
    cluster.kubectl("delete", "pod", "queued", "--wait=false")
