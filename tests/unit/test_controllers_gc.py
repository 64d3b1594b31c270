"""The garbage collector's graph and decisions against fakes (the API is a dict of objects)."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.client import CONFIGMAPS, PODS
from kube32.controllers.base import ControllerContext, ControllerOptions
from kube32.controllers.garbagecollector import GarbageCollector


class FakeInformer:
    def __init__(self, kind) -> None:
        self.kind = kind
        self.cache: dict[str, dict] = {}
        self.handlers: list = []

    def add_handler(self, h) -> None:
        self.handlers.append(h)

    def get(self, key: str) -> dict | None:
        return self.cache.get(key)

    def list(self) -> list[dict]:
        return list(self.cache.values())

    def emit(self, etype: str, obj: dict) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if etype == "DELETED":
            self.cache.pop(key, None)
        else:
            self.cache[key] = obj
        for h in self.handlers:
            h(etype, obj, None)


class FakeInformers:
    def __init__(self) -> None:
        self.by_plural: dict[str, FakeInformer] = {}

    def get(self, kind) -> FakeInformer:
        return self.by_plural.setdefault(kind.plural, FakeInformer(kind))


class FakeClient:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}   # (plural, name) -> object, what the API holds
        self.deleted: list[tuple[str, str, str | None]] = []
        self.patches: list[tuple[str, str, dict]] = []

    async def try_get(self, kind, name: str, namespace: str | None = None) -> dict | None:
        return self.objects.get((kind.plural, name))

    async def delete(self, kind, name: str, namespace: str | None = None, *, uid: str | None = None,
                     propagation: str | None = None, grace_period: int | None = None) -> dict:
        self.deleted.append((kind.plural, name, propagation))
        return {}

    async def patch(self, kind, name: str, patch: Any, namespace: str | None = None, **kw) -> dict:
        self.patches.append((kind.plural, name, patch))
        return {}


def obj(plural_kind: str, name: str, uid: str, *owners: dict, deleting: list[str] | None = None) -> dict:
    md: dict = {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "1"}
    if owners:
        md["ownerReferences"] = list(owners)
    if deleting is not None:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        md["finalizers"] = deleting
    return {"kind": plural_kind, "metadata": md}


def ref(name: str, uid: str, kind: str = "ConfigMap", block: bool = False) -> dict:
    return {"apiVersion": "v1" if kind == "ConfigMap" else "apps/v1", "kind": kind, "name": name, "uid": uid,
            **({"blockOwnerDeletion": True} if block else {})}


def make() -> tuple[GarbageCollector, FakeInformers, FakeClient]:
    client = FakeClient()
    informers = FakeInformers()
    gc = GarbageCollector(ControllerContext(client, informers, ControllerOptions(), None))  # type: ignore[arg-type]
    gc.setup()
    return gc, informers, client


def drain(gc: GarbageCollector) -> None:
    async def run() -> None:
        while len(gc.queue):
            key = await gc.queue.get()
            try:
                await gc.sync(key)
            finally:
                gc.queue.done(key)
    asyncio.run(run())


def test_dependents_of_a_gone_owner_are_deleted_and_live_owners_kept() -> None:
    gc, inf, client = make()
    cms = inf.get(CONFIGMAPS)
    owner = obj("ConfigMap", "owner", "u1")
    client.objects[("configmaps", "owner")] = owner
    cms.emit("ADDED", owner)
    cms.emit("ADDED", obj("ConfigMap", "dep", "u2", ref("owner", "u1")))
    drain(gc)
    assert client.deleted == []                                 # the owner is there
    assert gc.dependents["u1"] == {("configmaps", "default/dep")}

    del client.objects[("configmaps", "owner")]
    cms.emit("DELETED", owner)
    drain(gc)
    assert client.deleted == [("configmaps", "dep", "Background")]


def test_an_owner_missing_from_the_cache_is_checked_by_uid() -> None:
    gc, inf, client = make()
    pods = inf.get(PODS)
    # The ReplicaSet exists in the API but not (yet) in the cache: the pod stays.
    client.objects[("replicasets", "rs")] = obj("ReplicaSet", "rs", "rs-1")
    pods.emit("ADDED", obj("Pod", "p", "p-1", ref("rs", "rs-1", "ReplicaSet")))
    drain(gc)
    assert client.deleted == []
    # A same-name replacement with another uid is not the owner.
    client.objects[("replicasets", "rs")] = obj("ReplicaSet", "rs", "rs-2")
    pods.emit("MODIFIED", obj("Pod", "p", "p-1", ref("rs", "rs-1", "ReplicaSet")))
    drain(gc)
    assert client.deleted == [("pods", "p", "Background")]


def test_one_owner_gone_drops_only_that_reference() -> None:
    gc, inf, client = make()
    cms = inf.get(CONFIGMAPS)
    alive = obj("ConfigMap", "alive", "a")
    cms.emit("ADDED", alive)
    cms.emit("ADDED", obj("ConfigMap", "dep", "d", ref("alive", "a"), ref("gone", "g")))
    drain(gc)
    assert client.deleted == []
    plural, name, patch = client.patches[-1]
    assert (plural, name) == ("configmaps", "dep")
    assert [r["uid"] for r in patch["metadata"]["ownerReferences"]] == ["a"]


def test_orphan_and_foreground_finalizers() -> None:
    gc, inf, client = make()
    cms = inf.get(CONFIGMAPS)
    cms.emit("ADDED", obj("ConfigMap", "o", "o1", deleting=["orphan"]))
    cms.emit("ADDED", obj("ConfigMap", "child", "c1", ref("o", "o1")))
    drain(gc)
    assert ("configmaps", "child", {"metadata": {"resourceVersion": "1", "ownerReferences": None}}) in client.patches
    assert ("configmaps", "o", {"metadata": {"resourceVersion": "1", "finalizers": None}}) in client.patches

    gc, inf, client = make()
    cms = inf.get(CONFIGMAPS)
    cms.emit("ADDED", obj("ConfigMap", "f", "f1", deleting=["foregroundDeletion"]))
    cms.emit("ADDED", obj("ConfigMap", "blocker", "b1", ref("f", "f1", block=True)))
    drain(gc)
    assert client.deleted == [("configmaps", "blocker", "Background")]
    assert not any(name == "f" for _, name, _ in client.patches)   # waits for the blocking dependent
    cms.emit("DELETED", obj("ConfigMap", "blocker", "b1", ref("f", "f1", block=True)))
    drain(gc)
    assert ("configmaps", "f", {"metadata": {"resourceVersion": "1", "finalizers": None}}) in client.patches
