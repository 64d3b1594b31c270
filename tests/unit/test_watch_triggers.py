"""Triggered watches (issue 25): a pod write wakes the watches of the nodes it concerns
(``spec.nodeName=<node>``), not every node's, as Kubernetes' watch cache indexes its
watchers; each still sees what it saw before."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.apiserver.selectors import parse_field_selector
from kube32.store import SQLiteStore

PODS = by_plural("pods")
MERGE = "application/merge-patch+json"


def pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "sha256:" + "0" * 64}]}}


def test_a_write_reaches_its_nodes_watches_only() -> None:
    async def main() -> None:
        store = await SQLiteStore.open(":memory:")
        registry = Registry(store)
        await registry.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        seen: dict[str, list[tuple[str, str]]] = {}

        async def follow(node: str) -> None:
            fields = parse_field_selector(f"spec.nodeName={node}")
            async for etype, obj in registry.watch(PODS, None, None, fields, str(store.current_revision)):
                seen.setdefault(node, []).append((etype, obj["metadata"]["name"]))
        tasks = [asyncio.create_task(follow(f"n{i}")) for i in range(100)]
        await asyncio.sleep(0.05)
        try:
            before = store.pushed
            await registry.create(PODS, "default", pod("a", "n1"))
            for i in range(20):
                await registry.patch(PODS, "default", "a", MERGE, {"metadata": {"labels": {"i": str(i)}}})
            await registry.delete(PODS, "default", "a", options={"gracePeriodSeconds": 0})
            await asyncio.sleep(0.1)
            pushed = store.pushed - before
            # 22 writes, each to n1's watch; a PROGRESS mark to each of the 100 at most once a second.
            assert pushed <= 22 + 100 * 2, pushed
            assert seen["n1"][0] == ("ADDED", "a") and seen["n1"][-1][0] == "DELETED"
            assert len(seen["n1"]) == 22 and set(seen) == {"n1"}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await store.close()
    asyncio.run(main())


def test_a_quiet_kinds_watch_learns_the_stores_revision(monkeypatch) -> None:
    # Issue 25: the controllers' pods informer, its watch quiet at rest, resumed after its
    # timeout from a revision long compacted (a fleet writes 200 times a second) and
    # listed 10,000 pods again.
    import kube32.store.sqlite as sq
    from kube32.apiserver.registry import PROGRESS
    monkeypatch.setattr(sq, "PROGRESS_SECONDS", 0.0)

    async def main() -> None:
        store = await SQLiteStore.open(":memory:")
        registry = Registry(store)
        await registry.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        marks: list[int] = []

        async def follow() -> None:
            items = registry.watch_items(PODS, None, None, None, str(store.current_revision), False)
            async for item in items:
                if item.type == PROGRESS:
                    marks.append(item.revision)
        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        try:
            for i in range(3):   # writes of another kind only
                await registry.create(by_plural("configmaps"), "default",
                                      {"metadata": {"name": f"c{i}"}, "data": {}})
            await asyncio.sleep(0.05)
            assert marks and marks[-1] == store.current_revision
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await store.close()
    asyncio.run(main())


def test_a_resumed_node_watch_replays_its_own_writes_only() -> None:
    # Issue 25: a thousand kubelets' watches resumed from a bookmark a few seconds back
    # each decoded every pod write since (thousands), to drop all but their own.
    async def main() -> None:
        store = await SQLiteStore.open(":memory:")
        registry = Registry(store)
        await registry.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        fields = parse_field_selector("spec.nodeName=n2")
        live = registry.watch(PODS, None, None, fields, str(store.current_revision))   # the trigger is set
        first = asyncio.create_task(live.__anext__())
        await asyncio.sleep(0.01)
        since = store.current_revision
        for i in range(50):
            await registry.create(PODS, "default", pod(f"a{i}", "n1"))
        await registry.create(PODS, "default", pod("b", "n2"))
        await asyncio.wait_for(first, 5)
        decoded = []
        real = registry._shared_decode

        def counting(kv):  # type: ignore[no-untyped-def]
            decoded.append(kv.key)
            return real(kv)
        registry._shared_decode = counting  # type: ignore[method-assign]
        got = []
        async for etype, obj in registry.watch(PODS, None, None, fields, str(since)):
            got.append((etype, obj["metadata"]["name"]))
            break
        assert got == [("ADDED", "b")]
        assert len(decoded) <= 2, decoded        # b alone, not the 50 pods of n1
        await live.aclose()
        await store.close()
    asyncio.run(main())
