"""Registry watches on one object (fieldSelector metadata.name=<name>): they see that object
only - not the others whose names it begins - and subscribe to its key alone."""
from __future__ import annotations

import asyncio
from pathlib import Path

from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.apiserver.selectors import parse_field_selector
from kube32.store import SQLiteStore

CONFIGMAPS = by_plural("configmaps")


def _cm(name: str, value: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}


def test_a_watch_on_one_name_subscribes_to_its_key() -> None:
    one = parse_field_selector("metadata.name=h1")
    assert Registry._watch_prefix(CONFIGMAPS, "default", one) == CONFIGMAPS.key("default", "h1")
    assert Registry._watch_prefix(CONFIGMAPS, None, one) == CONFIGMAPS.prefix(None)  # all namespaces
    assert Registry._watch_prefix(CONFIGMAPS, "default", parse_field_selector("metadata.name!=h1")) == \
        CONFIGMAPS.prefix("default")
    assert Registry._watch_prefix(CONFIGMAPS, "default", None) == CONFIGMAPS.prefix("default")


def test_a_watch_on_one_name_sees_that_object_only(tmp_path: Path) -> None:
    async def go() -> None:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            start = await reg.create(CONFIGMAPS, "default", _cm("h1", "0"))
            await reg.create(CONFIGMAPS, "default", _cm("h10", "0"))
            seen: list[tuple[str, str, str]] = []

            async def watch() -> None:
                async for kind, obj in reg.watch(CONFIGMAPS, "default", None, parse_field_selector("metadata.name=h1"),
                                                 start["metadata"]["resourceVersion"]):
                    seen.append((kind, obj["metadata"]["name"], obj["data"]["v"]))
                    if kind == "DELETED":
                        return
            task = asyncio.create_task(watch())
            for name, value in (("h10", "1"), ("h1", "1"), ("h10", "2"), ("h1", "2")):
                await reg.mutate(CONFIGMAPS, "default", name, lambda o, v=value: {**o, "data": {"v": v}})
            await reg.delete(CONFIGMAPS, "default", "h10")
            await reg.delete(CONFIGMAPS, "default", "h1")
            await asyncio.wait_for(task, 5)
            assert seen == [("MODIFIED", "h1", "1"), ("MODIFIED", "h1", "2"), ("DELETED", "h1", "2")]
        finally:
            await store.close()
    asyncio.run(go())
