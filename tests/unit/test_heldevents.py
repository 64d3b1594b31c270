"""The control plane's hold of a moving pod's events (kube32.apiserver.heldevents) on a
real registry and bus: what it holds, how much, and to which pod it lets them go.
End to end, with real processes: tests/e2e/test_move_events.py."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from kube32.apiserver.eventbus import EventBus
from kube32.apiserver.heldevents import HeldEvents
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import SQLiteStore

PODS, CHECKPOINTS = by_plural("pods"), by_plural("checkpoints")
RUNNING = {"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {}}}]}


def _pod(name: str = "p") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"kube32.io/events": "greet, news"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}]}}


def _lines(q: asyncio.Queue) -> list[dict]:
    out = []
    while not q.empty():
        out.append(json.loads(q.get_nowait()))
    return out


async def _setup(tmp_path: Path):
    store = await SQLiteStore.open(tmp_path / "s.db")
    reg = Registry(store)
    await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
    pod = await reg.create(PODS, "default", _pod())
    pod = await reg.mutate(PODS, "default", "p", lambda o: {**o, "status": RUNNING}, subresource="status")
    ck = await reg.create(CHECKPOINTS, "default", {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                                  "metadata": {"name": "c"},
                                                  "spec": {"podName": "p", "action": "Move"}})
    ck = await reg.mutate(CHECKPOINTS, "default", "c", lambda o: {**o, "status": {"phase": "Saving"}},
                          subresource="status")
    bus = EventBus()
    return store, reg, bus, HeldEvents(reg, bus), pod, ck


async def _until(predicate, timeout: float = 0.5) -> None:
    """Sooner than the periodic look (1 s): the watches woke it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.01)


def test_held_from_the_hold_on_at_most_8_with_the_snapshots_then_to_the_replacement(tmp_path: Path) -> None:
    async def go() -> None:
        store, reg, bus, held, pod, ck = await _setup(tmp_path)
        try:
            q = bus.subscribe()
            bus.publish("default", "greet", b"before")
            hold, seq = await held.begin("default", "p", ck)
            assert hold is not None and seq == 1
            for i in range(1, 8):
                bus.publish("default", "greet", f"e{i}".encode())
            bus.publish("default", "other", b"not heard")
            bus.publish("other-ns", "greet", b"not its namespace")
            bus.publish("default", "news", b"own", source=f"pod/{pod['metadata']['uid']}")
            hold.in_snapshot(3)  # 5 of the 7 fit beside the snapshot's 3
            lines = _lines(q)
            assert [ln["seq"] for ln in lines] == list(range(1, 12))
            assert "held" not in lines[0] and all(ln["held"] == ["p"] for ln in lines[1:8])
            assert all("held" not in ln for ln in lines[8:])

            # The replacement bound elsewhere is not running yet: nothing moves.
            new = await reg.replace(PODS, "default", "p", _pod(), expected_uid=pod["metadata"]["uid"])
            await asyncio.sleep(0.2)
            assert bus.holding(hold) and not _lines(q)
            await reg.mutate(PODS, "default", "p", lambda o: {**o, "status": RUNNING}, subresource="status")
            await _until(lambda: not bus.holding(hold))
            released = _lines(q)
            to = new["metadata"]["uid"]
            assert [(ln.get("topic"), ln.get("to")) for ln in released[:5]] == [("greet", to)] * 5
            assert [ln["payload"] for ln in released[:5]] == [ln["payload"] for ln in lines[1:6]]  # e1..e5
            assert released[5] == {"seq": 17, "type": "DROPPED", "namespace": "default", "to": to, "count": 2}
            bus.publish("default", "greet", b"after")
            assert "held" not in _lines(q)[0]
        finally:
            await store.close()
    asyncio.run(go())


def test_the_source_thawed_gets_them_when_the_move_failed_and_a_deleted_pod_takes_them(tmp_path: Path) -> None:
    async def go() -> None:
        store, reg, bus, held, pod, ck = await _setup(tmp_path)
        try:
            q = bus.subscribe()
            hold, _ = await held.begin("default", "p", ck)
            assert hold is not None
            bus.publish("default", "greet", b"t1")
            await asyncio.sleep(0.2)
            assert bus.holding(hold)  # the source runs, but its move is not over
            await reg.mutate(CHECKPOINTS, "default", "c", lambda o: {**o, "status": {"phase": "Failed"}},
                             subresource="status")
            await _until(lambda: not bus.holding(hold))
            assert _lines(q)[-1]["to"] == pod["metadata"]["uid"]

            hold, _ = await held.begin("default", "p", ck)  # Failed already: let go at once
            await _until(lambda: not bus.holding(hold))
            await reg.mutate(CHECKPOINTS, "default", "c", lambda o: {**o, "status": {"phase": "Saving"}},
                             subresource="status")
            hold, _ = await held.begin("default", "p", ck)
            bus.publish("default", "greet", b"lost with the pod")
            await reg.delete(PODS, "default", "p", options={"gracePeriodSeconds": 0})
            await _until(lambda: not bus.holding(hold))
            assert all("to" not in ln for ln in _lines(q)[-1:])
        finally:
            await store.close()
    asyncio.run(go())


def test_a_move_tried_again_lets_the_last_holds_events_go_first(tmp_path: Path) -> None:
    async def go() -> None:
        store, reg, bus, held, pod, ck = await _setup(tmp_path)
        try:
            q = bus.subscribe()
            first, _ = await held.begin("default", "p", ck)
            bus.publish("default", "greet", b"r1")
            second, seq = await held.begin("default", "p", ck)
            assert not bus.holding(first) and bus.holding(second)
            lines = _lines(q)
            assert lines[-1]["to"] == pod["metadata"]["uid"] and lines[-1]["seq"] == seq  # before the new snapshot
            await reg.mutate(CHECKPOINTS, "default", "c", lambda o: {**o, "status": {"phase": "Failed"}},
                             subresource="status")
            await _until(lambda: not bus.holding(second))
        finally:
            await store.close()
    asyncio.run(go())
