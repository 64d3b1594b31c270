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
