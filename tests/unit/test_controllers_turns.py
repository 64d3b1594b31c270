"""Walks over what grows with the cluster give the event loop turns (issue 25: the API server
and the controllers share one loop, and one walk of 10,000 pods delayed every watch event
behind it); PodGC's scan looks only at the pods of nodes that are missing or not Ready."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.client import CHECKPOINTS, NODES, PODS, Informer
from kube32.controllers.base import WALK_TURN, ControllerContext, ControllerOptions, in_turns, taking_turns
from kube32.controllers.podgc import PodGC
from kube32.controllers.scheduler import Scheduler


async def _interleaved(walk: Any) -> tuple[list[int], int]:
    """Run ``walk(seen)`` beside a task that counts its own turns; the count it had reached
    at each item the walk saw, and the total."""
    turns = 0
    stop = False

    async def other() -> None:
        nonlocal turns
        while not stop:
            turns += 1
            await asyncio.sleep(0)
    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    seen: list[int] = []
    await walk(lambda: seen.append(turns))
    stop = True
    await task
    return seen, turns


def test_a_walk_of_10000_items_lets_another_task_run_every_few_hundred() -> None:
    async def main() -> None:
        async def walk(note) -> None:
            async for _ in in_turns(range(10_000)):
                note()
        seen, _ = await _interleaved(walk)
        assert len(seen) == 10_000
        # The other task ran between the walk's turns: about 10,000 / WALK_TURN times, and
        # never more than WALK_TURN items went by without it.
        changes = sum(1 for a, b in zip(seen, seen[1:], strict=False) if b != a)
        assert changes >= 10_000 // WALK_TURN - 1
        runs = [0]
        for a, b in zip(seen, seen[1:], strict=False):
            runs[-1] += 1
            if b != a:
                runs.append(0)
        assert max(runs) <= WALK_TURN
    asyncio.run(main())


def test_syncs_that_never_wait_take_turns_with_other_tasks() -> None:
    async def main() -> None:
        async def walk(note) -> None:
            async def sync(_key: Any) -> None:
                note()
            in_turn = taking_turns(sync, every=32)
            for i in range(1000):
                await in_turn(i)
        seen, _ = await _interleaved(walk)
        assert sum(1 for a, b in zip(seen, seen[1:], strict=False) if b != a) >= 1000 // 32 - 1
    asyncio.run(main())


class _Informers:
    def __init__(self) -> None:
        self.by_kind = {k: Informer(None, k) for k in (PODS, NODES, CHECKPOINTS)}  # type: ignore[arg-type]

    def get(self, kind: Any) -> Informer:
        return self.by_kind[kind]


def _node(name: str, ready: str = "True") -> dict:
    return {"metadata": {"name": name}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def _pod(name: str, node: str, deleting: bool = False) -> dict:
    md: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"u-{name}"}
    if deleting:
        md.update(deletionTimestamp="2020-01-01T00:00:00Z", deletionGracePeriodSeconds=1)
    return {"metadata": md, "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def _context(informers: _Informers) -> ControllerContext:
    return ControllerContext(None, informers, ControllerOptions(node_monitor_grace_seconds=0.0), None)  # type: ignore[arg-type]


def test_podgc_looks_only_at_the_pods_of_missing_and_not_ready_nodes() -> None:
    async def main() -> None:
        informers = _Informers()
        pods, nodes = informers.get(PODS), informers.get(NODES)
        for i in range(100):
            nodes.cache[f"n{i}"] = _node(f"n{i}", "Unknown" if i == 7 else "True")
            for j in range(10):
                pods.cache[f"default/p{i}-{j}"] = _pod(f"p{i}-{j}", f"n{i}", deleting=(i == 7 and j < 3))
        for j in range(2):
            pods.cache[f"default/gone-{j}"] = _pod(f"gone-{j}", "gone")
        gc = PodGC(_context(informers))
        looked: list[str] = []
        real = gc._candidate  # noqa: SLF001 - counting what the scan visits

        def counted(pod: dict, now: float) -> bool:
            looked.append(pod["metadata"]["name"])
            return real(pod, now)
        gc._candidate = counted  # type: ignore[method-assign]  # noqa: SLF001
        await gc.scan_once()   # the missing node is noted (grace 0 s) ...
        looked.clear()
        await gc.scan_once()   # ... and its pods are candidates now
        # 1,002 pods: only the 10 of the node not Ready and the 2 of the missing node are looked at.
        assert sorted(looked) == sorted([f"p7-{j}" for j in range(10)] + ["gone-0", "gone-1"])
        queued = set()
        while len(gc.queue):
            key = await gc.queue.get()
            queued.add(key)
            gc.queue.done(key)
        assert queued == {"default/p7-0", "default/p7-1", "default/p7-2", "default/gone-0", "default/gone-1"}
    asyncio.run(main())


def test_the_schedulers_resync_in_turns_keeps_what_events_did_between_turns() -> None:
    """A pod bound (an event) while the resync walks is counted where it is now, and a pod
    deleted meanwhile is not put back."""
    async def main() -> None:
        informers = _Informers()
        pods, nodes = informers.get(PODS), informers.get(NODES)
        nodes.cache["n1"] = _node("n1")
        for i in range(3 * WALK_TURN):
            pods.cache[f"default/p{i}"] = _pod(f"p{i}", "n1")
        pending = _pod("late", "")
        pending["spec"].pop("nodeName")
        pods.cache["default/late"] = pending
        sched = Scheduler(_context(informers))
        sched.setup()

        def event(etype: str, obj: dict, old: dict | None) -> None:   # as the informer calls its handlers
            for h in pods.handlers:
                h(etype, obj, old)

        async def meanwhile() -> None:
            await asyncio.sleep(0)
            bound = _pod("late", "n1")
            old = pods.cache["default/late"]
            pods.cache["default/late"] = bound
            event("MODIFIED", bound, old)
            gone = pods.cache.pop("default/p1")
            event("DELETED", gone, gone)
        await asyncio.gather(sched.resync(), meanwhile())
        assert "default/late" not in sched._pending  # noqa: SLF001 - the scheduler's state after the walk
        keys = set(sched.by_node.keys())
        assert "default/late" in keys and "default/p1" not in keys and len(keys) == 3 * WALK_TURN
    asyncio.run(main())
