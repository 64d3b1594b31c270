"""Writes of one object that overlap in one API server queue in the key's turn
(kube32/apiserver/keylocks.py) instead of failing each other's compare-and-swap: a write
that names no resourceVersion is always carried out, as kube-apiserver's are (attack
round 23: a dozen concurrent patches of one ConfigMap answered 409 nine times in ten,
and a kubelet whose status patch got one left its pod Pending)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from kube32.apiserver.keylocks import KeyLocks
from kube32.apiserver.registry import PATCH_MERGE, PATCH_JSON, PATCH_STRATEGIC, Registry
from kube32.apiserver.resources import by_plural
from kube32.store import SQLiteStore

CONFIGMAPS = by_plural("configmaps")


async def _registry(tmp_path: Path) -> tuple[SQLiteStore, Registry]:
    store = await SQLiteStore.open(tmp_path / "s.db")
    reg = Registry(store)
    await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
    await reg.create(CONFIGMAPS, "default", {"metadata": {"name": "c"}, "data": {}})
    return store, reg


def test_sixty_concurrent_patches_of_one_object_all_land(tmp_path: Path) -> None:
    async def go() -> None:
        store, reg = await _registry(tmp_path)
        try:
            def patch(i: int):
                kind = (PATCH_MERGE, PATCH_STRATEGIC, PATCH_JSON)[i % 3]
                body = [{"op": "add", "path": f"/data/k{i}", "value": "v"}] if kind == PATCH_JSON \
                    else {"data": {f"k{i}": "v"}}
                return reg.patch(CONFIGMAPS, "default", "c", kind, body, manager=f"m{i}")
            await asyncio.gather(*(patch(i) for i in range(60)))
            await asyncio.gather(*(reg.mutate(CONFIGMAPS, "default", "c",
                                              lambda o, i=i: {**o, "data": {**o["data"], f"u{i}": "v"}})
                                   for i in range(20)))
            got = await reg.get(CONFIGMAPS, "default", "c")
            assert set(got["data"]) == {f"k{i}" for i in range(60)} | {f"u{i}" for i in range(20)}
            assert len(reg.turns) == 0   # nothing left behind
        finally:
            await store.close()

    asyncio.run(go())


def test_key_locks_serialize_one_key_and_not_two() -> None:
    async def go() -> None:
        locks, order = KeyLocks(), []

        async def hold(key: str, tag: str) -> None:
            async with locks.hold(key):
                order.append(f"{tag}+")
                await asyncio.sleep(0.01)
                order.append(f"{tag}-")
        await asyncio.gather(hold("a", "1"), hold("a", "2"), hold("b", "3"))
        assert order.index("1-") < order.index("2+")      # one key: one at a time
        assert order.index("3+") < order.index("1-")      # another key: alongside
        assert len(locks) == 0

    asyncio.run(go())
