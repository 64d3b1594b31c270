"""Registry.replace (a pod move's one write of the new incarnation): a write of the same
incarnation in between (the kubelet's status) does not refuse it; another uid does."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kube32.apiserver import errors
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import KeyValue, SQLiteStore

CONFIGMAPS = by_plural("configmaps")


class StatusWriteInBetween(SQLiteStore):
    """The first compare-and-swap finds the key written a moment before it (as a kubelet's
    status write lands between the replacement's read and its write)."""

    interleave = 1

    async def update(self, key: str, value: bytes, expected_mod_revision: int | None) -> KeyValue:
        if self.interleave and expected_mod_revision is not None:
            self.interleave -= 1
            current = await self.get(key)
            assert current is not None
            await super().update(key, current.value, None)
        return await super().update(key, value, expected_mod_revision)


def test_replace_goes_on_after_a_write_of_the_same_incarnation(tmp_path: Path) -> None:
    async def go() -> None:
        store = StatusWriteInBetween(tmp_path / "s.db")
        try:
            reg = Registry(store)
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            old = await reg.create(CONFIGMAPS, "default", {"metadata": {"name": "c"}, "data": {"v": "1"}})
            new = await reg.replace(CONFIGMAPS, "default", "c", {"metadata": {"name": "c"}, "data": {"v": "2"}},
                                    expected_uid=old["metadata"]["uid"])
            assert new["data"] == {"v": "2"} and new["metadata"]["uid"] != old["metadata"]["uid"]
            with pytest.raises(errors.APIError, match="Precondition failed: UID"):
                await reg.replace(CONFIGMAPS, "default", "c", {"metadata": {"name": "c"}},
                                  expected_uid=old["metadata"]["uid"])
        finally:
            await store.close()

    asyncio.run(go())


def test_a_moves_replacement_is_refused_once_its_saving_checkpoint_is_being_deleted(tmp_path: Path) -> None:
    """A Checkpoint carries kube32.io/checkpoint-protection from its creation, so a delete
    marks it; a delete before the move replaced the pod (still Saving) refuses the move's
    replacement, a rollback's (Moving, then Failed) is taken."""
    from kube32.apiserver.podreplacement import checkpoint_refusal

    async def go() -> None:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            cks = by_plural("checkpoints")
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            ck = await reg.create(cks, "default", {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                                   "metadata": {"name": "mv"},
                                                   "spec": {"podName": "p", "action": "Move"}})
            assert ck["metadata"]["finalizers"] == ["kube32.io/checkpoint-protection"]

            def phase(name: str):
                def set_phase(obj: dict) -> dict:
                    obj["status"]["phase"] = name
                    return obj
                return set_phase
            await reg.mutate(cks, "default", "mv", phase("Saving"), subresource="status")
            pod = {"metadata": {"name": "p", "annotations": {"kube32.io/restore-from": "mv"}}}
            assert await checkpoint_refusal(reg, "default", pod) is None
            marked, gone = await reg.delete(cks, "default", "mv")
            assert not gone and marked["metadata"]["deletionTimestamp"]
            assert await checkpoint_refusal(reg, "default", pod) == \
                "checkpoint mv was deleted before the move replaced the pod"
            await reg.mutate(cks, "default", "mv", phase("Moving"), subresource="status")
            assert await checkpoint_refusal(reg, "default", pod) is None
        finally:
            await store.close()
    asyncio.run(go())


def test_a_watch_resumed_at_a_replacements_deleted_still_gets_its_added(tmp_path: Path) -> None:
    """A replacement is DELETED (annotated kube32.io/replaced-by) one revision before its
    ADDED: a client resuming at the DELETED's resourceVersion (client-go's reflector) is
    still sent the ADDED; a watch whose selector the new object no longer matches
    gets the annotated DELETED alone (attack round 23)."""
    from kube32.apiserver.selectors import parse_label_selector

    async def events(reg: Registry, rv: str, labels: str | None, count: int) -> list[tuple[str, dict]]:
        got: list[tuple[str, dict]] = []

        async def watch() -> None:
            async for kind, obj in reg.watch(CONFIGMAPS, "default", parse_label_selector(labels) if labels else None,
                                             None, rv):
                got.append((kind, obj))
                if len(got) == count:
                    return
        await asyncio.wait_for(watch(), 5)
        return got

    async def go() -> None:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            old = await reg.create(CONFIGMAPS, "default", {"metadata": {"name": "c", "labels": {"at": "a"}}})
            new = await reg.replace(CONFIGMAPS, "default", "c", {"metadata": {"name": "c", "labels": {"at": "b"}}},
                                    expected_uid=old["metadata"]["uid"])
            rv = int(new["metadata"]["resourceVersion"])
            (d, gone), (a, added) = await events(reg, old["metadata"]["resourceVersion"], None, 2)
            assert (d, a) == ("DELETED", "ADDED")
            assert gone["metadata"]["uid"] == old["metadata"]["uid"]
            assert gone["metadata"]["annotations"]["kube32.io/replaced-by"] == new["metadata"]["uid"]
            assert int(gone["metadata"]["resourceVersion"]) == rv - 1
            assert added["metadata"]["uid"] == new["metadata"]["uid"]
            # resumed from the DELETED's resourceVersion: the ADDED comes (and the DELETED
            # again, harmless to a store that has already dropped the old object)
            resumed = await events(reg, gone["metadata"]["resourceVersion"], None, 2)
            assert [k for k, _ in resumed] == ["DELETED", "ADDED"]
            assert resumed[1][1]["metadata"]["uid"] == new["metadata"]["uid"]
            (only, left), = await events(reg, old["metadata"]["resourceVersion"], "at=a", 1)
            assert only == "DELETED" and int(left["metadata"]["resourceVersion"]) == rv
            assert left["metadata"]["annotations"]["kube32.io/replaced-by"] == new["metadata"]["uid"]
        finally:
            await store.close()

    asyncio.run(go())
