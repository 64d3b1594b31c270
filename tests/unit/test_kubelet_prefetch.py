"""The prefetch of a move's restore (kube32.kubelet.prefetch.Prefetcher) on a fake node,
with a real counter pod and a real PodWorker: a failed preparation leaves the restore to
the worker's own fetch; at most MAX_PREPARING restores are begun at once, the next one as
an earlier one ends; a prepared restore nobody takes is swept after UNCLAIMED_SECONDS."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from kube32.client import ApiError
from kube32.kubelet import prefetch
from kube32.kubelet.prefetch import MAX_PREPARING, Prefetcher
from kube32.terms import CheckpointAction, CheckpointPhase
from tests.unit.test_kubelet_restores import (CHECKPOINT, DATA_PATH, IMAGE, FakeClient, FakeNode, assert_restored,
                                              pod_object, restored_worker, run, snapshot_of_a_counter, until)

Handler = Callable[..., Any]


class FakeInformer:
    """The Checkpoints that name the node, as its informer holds them."""

    def __init__(self) -> None:
        self.items: dict[str, dict] = {}
        self.handlers: list[Handler] = []

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    def get(self, key: str) -> dict | None:
        return self.items.get(key)

    def list(self) -> list[dict]:
        return list(self.items.values())

    def start(self) -> asyncio.Task:
        return asyncio.ensure_future(asyncio.sleep(0))

    async def stop(self) -> None:
        pass

    def put(self, ck: dict) -> None:
        md = ck["metadata"]
        self.items[f"{md['namespace']}/{md['name']}"] = ck
        for handler in self.handlers:
            handler("MODIFIED", ck)


class PodsClient(FakeClient):
    """... and the pod being moved: there (after ``gate``, when set), or gone."""

    def __init__(self, node: FakeNode, data: bytes | None, pod_there: bool = True) -> None:
        super().__init__(node, data)
        self.pod_there = pod_there
        self.gate: asyncio.Event | None = None

    async def get(self, kind: Any, name: str, namespace: str | None = None, **kw: Any) -> dict:
        self.node.calls.append(f"GET pod {name}")
        if self.gate is not None:
            await self.gate.wait()
        if not self.pod_there:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return pod_object()


def move(name: str = CHECKPOINT, uid: str = "ck-1", phase: str = CheckpointPhase.SAVING, at: int = 0) -> dict:
    return {"metadata": {"namespace": "default", "name": name, "uid": uid,
                         "creationTimestamp": f"2025-01-01T00:00:{at:02d}Z"},
            "spec": {"action": CheckpointAction.MOVE, "podName": "counter"},
            "status": {"phase": phase, "targetNode": "fake", "podUID": "uid-1"}}


def node_with(data: bool = True, pod_there: bool = True) -> FakeNode:
    node = FakeNode()
    node.client = PodsClient(node, None, pod_there)
    if data:
        node.client.data = snapshot_of_a_counter(node)
    return node


@run
async def test_a_failed_preparation_leaves_the_restore_to_the_workers_own_fetch() -> None:
    node = node_with(pod_there=False)     # the prefetch cannot read the pod: it prepares nothing
    informer = FakeInformer()
    source = Prefetcher(node, informer)   # type: ignore[arg-type]   # a fake informer
    informer.put(move())
    await until(lambda: "GET pod counter" in node.calls, "the prefetch's try")
    await asyncio.sleep(0.05)
    assert not source.instances()
    informer.put(move())                  # one try per Checkpoint uid: not made again
    await asyncio.sleep(0.05)
    assert node.calls.count("GET pod counter") == 1
    node.calls.clear()
    worker = await restored_worker(node, source)   # type: ignore[arg-type]
    try:
        assert node.calls == [f"load {IMAGE}", f"GET {DATA_PATH}"]   # the plan fetched the data itself
        assert_restored(node, worker)
    finally:
        await worker.stop()
        await source.stop()


@run
async def test_at_most_max_preparing_restores_are_begun_at_once() -> None:
    node = node_with(data=False)
    node.client.gate = asyncio.Event()    # every preparation waits on its pod
    informer = FakeInformer()
    source = Prefetcher(node, informer)   # type: ignore[arg-type]
    for i in range(MAX_PREPARING + 2):
        informer.put(move(name=f"move-{i}", uid=f"ck-{i}", at=i))
    await until(lambda: len(node.calls) >= MAX_PREPARING, "the first preparations")
    await asyncio.sleep(0.05)
    assert len(node.calls) == MAX_PREPARING               # the oldest ones first
    informer.put(move(name="move-0", uid="ck-0", phase=CheckpointPhase.COMPLETED))   # one ends
    await until(lambda: len(node.calls) == MAX_PREPARING + 1, "the next preparation")
    await asyncio.sleep(0.05)
    assert len(node.calls) == MAX_PREPARING + 1
    node.client.pod_there = False
    node.client.gate.set()
    await source.stop()
    assert not source.instances()


@run
async def test_a_prepared_restore_nobody_takes_is_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "UNCLAIMED_SECONDS", 0.3)
    monkeypatch.setattr(prefetch, "SWEEP_SECONDS", 0.05)
    node = node_with()
    informer = FakeInformer()
    source = Prefetcher(node, informer)   # type: ignore[arg-type]
    tasks = source.start()
    informer.put(move())
    try:
        prepared = await until(lambda: source.instances(), "the prepared instance")
        await until(lambda: f"GET {DATA_PATH}" in node.calls, "the data streamed in")
        instance = prepared[0]
        await until(lambda: not source.instances(), "the sweep", timeout=5)
        await until(lambda: instance.state == "stopped", "the swept instance stopped")
    finally:
        await source.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
