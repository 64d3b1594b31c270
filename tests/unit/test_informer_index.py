"""Informer indexes (issue 25): a node's pods read without a walk over every pod, kept
through watch events and relists."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.client import PODS, Informer
from kube32.client.informer import by_node_name


def pod(name: str, node: str | None, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"u-{name}", "resourceVersion": str(rv)},
            "spec": {"nodeName": node} if node else {}}


class FakeClient:
    def __init__(self, items: list[dict], events: list[tuple[str, dict]]) -> None:
        self.items, self.events = items, events
        self.done = asyncio.Event()

    async def list(self, *_a: Any, **_k: Any) -> tuple[list[dict], str]:
        return list(self.items), "100"

    async def watch(self, *_a: Any, **_k: Any):
        for e in self.events:
            yield e
        self.events = []
        self.done.set()
        await asyncio.sleep(3600)


def names(objs: list[dict]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_the_index_follows_events_and_relists() -> None:
    async def main() -> None:
        items = [pod(f"p{i}", f"n{i % 50}", i) for i in range(1000)] + [pod("pending", None, 1)]
        events = [("MODIFIED", pod("pending", "n1", 101)),   # bound
                  ("MODIFIED", pod("p1", "n2", 102)),        # replaced elsewhere under its name
                  ("DELETED", pod("p51", "n1", 103))]
        client = FakeClient(items, events)
        inf = Informer(client, PODS)  # type: ignore[arg-type]
        inf.add_index("node", by_node_name)
        task = inf.start()
        await asyncio.wait_for(client.done.wait(), 5)
        on_n1 = inf.by_index("node", "n1")
        assert len(on_n1) == 19   # 20 of the 1000, p1 and p51 gone, "pending" come
        assert "pending" in names(on_n1) and "p1" not in names(on_n1) and "p51" not in names(on_n1)
        assert "p1" in names(inf.by_index("node", "n2"))
        # A relist reports the differences and the index follows them.
        client.items = [pod("p1", "n3", 200)]
        await inf._relist()
        assert inf.by_index("node", "n1") == [] and names(inf.by_index("node", "n3")) == ["p1"]
        # An index added later files what is cached already.
        inf.add_index("again", by_node_name)
        assert names(inf.by_index("again", "n3")) == ["p1"]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(main())


class Informers:
    def __init__(self) -> None:
        self.made: dict[str, Informer] = {}

    def get(self, kind: Any) -> Informer:
        if kind.plural not in self.made:
            self.made[kind.plural] = Informer(None, kind)  # type: ignore[arg-type] - never started
        return self.made[kind.plural]


def _no_walk(inf: Informer) -> None:
    def refuse() -> list[dict]:
        raise AssertionError(f"a walk over every {inf.kind.plural}")
    inf.list = refuse  # type: ignore[method-assign]


def test_a_lost_node_and_a_periodic_pod_read_their_own_objects_only() -> None:
    from kube32.controllers.base import ControllerContext, ControllerOptions
    from kube32.controllers.nodelifecycle import NodeLifecycle
    from kube32.controllers.periodic import PeriodicCheckpoints
    from kube32.terms import Annotation, Label, Trigger
    informers = Informers()
    ctx = ControllerContext(None, informers, ControllerOptions(), None)  # type: ignore[arg-type]
    lifecycle, periodic = NodeLifecycle(ctx), PeriodicCheckpoints(ctx)
    pods, cks = informers.get(PODS), informers.made["checkpoints"]
    for i in range(2000):
        p = pod(f"p{i}", f"n{i % 100}", i)
        p["metadata"]["annotations"] = {Annotation.CHECKPOINT_INTERVAL: "60s"}
        pods._put(f"default/p{i}", p)
        cks._put(f"default/c{i}", {"metadata": {"name": f"c{i}", "namespace": "default", "uid": f"c{i}",
                                                "labels": {Label.TRIGGER: Trigger.PERIODIC},
                                                "creationTimestamp": "2999-01-01T00:00:00Z"},
                                   "spec": {"podName": f"p{i}"}, "status": {"phase": "Saved", "sizeBytes": 1}})
    _no_walk(pods)
    _no_walk(cks)
    lost = {"metadata": {"name": "n7"}, "spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2999-01-01T00:00:00Z"}]}}
    asyncio.run(lifecycle._evict_pods(lost))             # 20 pods, all within their toleration: none goes
    assert len(pods.by_index("spec.nodeName", "n7")) == 20
    asyncio.run(periodic.sync("default/p7"))             # its one checkpoint is not due: nothing written
    assert [c["metadata"]["name"] for c in cks.by_index("periodic-of", "default/p7")] == ["c7"]


def test_watches_ask_for_bookmarks_and_end_at_different_times() -> None:
    # Issue 25: 300 nodes' watches opened together all ended after 300 s, resumed from a
    # compacted revision and listed again together, while the control plane was busiest.
    class Recording(FakeClient):
        def __init__(self) -> None:
            super().__init__([pod("a", "n1", 1)], [("BOOKMARK", {"metadata": {"resourceVersion": "250"}})])
            self.asked: list[dict] = []

        async def watch(self, *a: Any, **k: Any):
            self.asked.append(k)
            async for e in super().watch(*a, **k):
                yield e

    async def main() -> None:
        timeouts = set()
        for _ in range(5):
            client = Recording()
            inf = Informer(client, PODS)  # type: ignore[arg-type]
            task = inf.start()
            await asyncio.wait_for(client.done.wait(), 5)
            assert client.asked[0]["bookmarks"] is True
            assert 300 <= client.asked[0]["timeout_seconds"] <= 600
            timeouts.add(client.asked[0]["timeout_seconds"])
            assert inf._rv == "250" and names(inf.list()) == ["a"]   # a bookmark moves the revision only
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert len(timeouts) > 1
    asyncio.run(main())


def test_a_watch_cut_by_no_answer_or_429_resumes_and_a_refusal_lists_again() -> None:
    # Issue 25: at 1,000 nodes one moment without an answer from the API server had every
    # kubelet list its pods again, on a loop already held by lists.  As client-go's
    # reflector: no answer or 429 resumes from the revision seen; a 410 or a 403 lists.
    from kube32.client.rest import ApiError

    class Cut(FakeClient):
        def __init__(self, failures: list[ApiError]) -> None:
            super().__init__([pod("a", "n1", 1)], [])
            self.failures = failures
            self.lists = 0
            self.resumed_from: list[str | None] = []

        async def list(self, *a: Any, **k: Any) -> tuple[list[dict], str]:
            self.lists += 1
            return await super().list(*a, **k)

        async def watch(self, *_a: Any, **k: Any):
            self.resumed_from.append(k.get("resource_version"))
            if self.failures:
                yield "MODIFIED", pod("a", "n1", 100 + len(self.resumed_from))
                raise self.failures.pop(0)
            self.done.set()
            await asyncio.sleep(3600)
            yield "MODIFIED", pod("never", None, 0)

    async def run(failures: list[ApiError]) -> Cut:
        client = Cut(failures)
        inf = Informer(client, PODS)  # type: ignore[arg-type]
        task = inf.start()
        await asyncio.wait_for(client.done.wait(), 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return client

    async def main() -> None:
        cut = await run([ApiError(0, "ConnectionError", "stream ended"), ApiError(429, "TooManyRequests", "")])
        assert cut.lists == 1 and cut.resumed_from == ["100", "101", "102"]
        for code in (410, 403, 500):
            again = await run([ApiError(code, "", "")])
            assert again.lists == 2 and again.resumed_from == ["100", "100"], code
    asyncio.run(main())
