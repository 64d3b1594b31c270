"""kube32.apiserver.datafacts: what the data space's standings read, from the store's
watch; a look costs the same whatever the number of pods (issue 25: it listed and
decoded every pod of the cluster at every upload that did not fit)."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.apiserver.datafacts import DataFacts
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import SQLiteStore
from kube32.terms import Annotation

PODS, CKS = by_plural("pods"), by_plural("checkpoints")


def pod(name: str, restore: str | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default"}
    if restore:
        md["annotations"] = {Annotation.RESTORE_FROM: restore}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"containers": [{"name": "main", "image": "sha256:" + "0" * 64}]}}


def checkpoint(name: str, pod_name: str) -> dict[str, Any]:
    return {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name, "namespace": "default"},
            "spec": {"podName": pod_name, "action": "Save"}}


async def _facts(pods: int) -> tuple[Registry, DataFacts, SQLiteStore]:
    store = await SQLiteStore.open(":memory:")
    registry = Registry(store)
    await registry.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
    for i in range(pods):
        await registry.create(PODS, "default", pod(f"p{i}"))
    facts = DataFacts(registry)
    await facts.start()
    return registry, facts, store


def test_a_look_reads_no_pod_that_names_no_checkpoint() -> None:
    async def main() -> None:
        decoded = []
        for n in (10, 200):
            registry, facts, store = await _facts(n)
            try:
                await registry.create(PODS, "default", pod("r", restore="ck-1"))
                made = await registry.create(CKS, "default", checkpoint("ck-1", "r"))
                for i in range(n):   # pod writes that name no checkpoint: no decode each
                    await registry.patch(PODS, "default", f"p{i}", "application/merge-patch+json",
                                         {"metadata": {"labels": {"x": "y"}}})
                cks, pods = await facts.read()
                assert list(pods) == [{"metadata": {"uid": pods[0]["metadata"]["uid"], "name": "r",
                                                    "namespace": "default",
                                                    "annotations": {Annotation.RESTORE_FROM: "ck-1"}}}]
                assert set(cks) == {made["metadata"]["uid"]}
                decoded.append(facts.decoded)
            finally:
                await facts.close()
                await store.close()
        assert decoded[0] == decoded[1], decoded   # the same decodes with 10 or 200 other pods
    asyncio.run(main())


def test_the_facts_follow_writes_and_deletes_at_once() -> None:
    async def main() -> None:
        registry, facts, store = await _facts(3)
        calls = []
        real_list = registry.list

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(args[0].plural)
            return await real_list(*args, **kwargs)
        registry.list = counted  # type: ignore[method-assign]
        try:
            ck = await registry.create(CKS, "default", checkpoint("ck-1", "p0"))
            cks, _ = await facts.read()      # a write just before is seen
            assert ck["metadata"]["uid"] in cks
            await registry.patch(PODS, "default", "p1", "application/merge-patch+json",
                                 {"metadata": {"annotations": {Annotation.RESTORE_FROM: "ck-1"}}})
            _, pods = await facts.read()
            assert [p["metadata"]["name"] for p in pods] == ["p1"]
            await registry.patch(PODS, "default", "p1", "application/merge-patch+json",
                                 {"metadata": {"annotations": {Annotation.RESTORE_FROM: None}}})
            _, gone = await registry.delete(CKS, "default", "ck-1")
            if not gone:   # the Checkpoint controller's finalizer: as it would
                await registry.patch(CKS, "default", "ck-1", "application/merge-patch+json",
                                     {"metadata": {"finalizers": None}})
            cks, pods = await facts.read()
            assert pods == [] and cks == {}
            assert calls == []   # never a list once started
        finally:
            await facts.close()
            await store.close()
    asyncio.run(main())


def test_before_the_start_a_read_lists() -> None:
    async def main() -> None:
        store = await SQLiteStore.open(":memory:")
        registry = Registry(store)
        await registry.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        await registry.create(PODS, "default", pod("a"))
        try:
            cks, pods = await DataFacts(registry).read()
            assert list(cks) == [] and [p["metadata"]["name"] for p in pods] == ["a"]
        finally:
            await store.close()
    asyncio.run(main())
