"""A pod's image changes: the replacement refuses a spec that is not the pod's, and a move
refuses a target whose module is not the snapshot's (kube32.controllers.imagecheck)."""
from __future__ import annotations

import asyncio

from kube32.apiserver.podreplacement import carry_metadata, spec_changed
from kube32.controllers.imagecheck import TargetImageError, drop, image_of, snapshot_mismatch

POD = {"metadata": {"name": "p"},
       "spec": {"nodeName": "sim-1", "restartPolicy": "Always",
                "containers": [{"name": "main", "image": "kube32.io/wasm-sha256:" + "a" * 64}]}}


def test_a_replacement_may_change_the_node_only() -> None:
    elsewhere = {**POD, "spec": {**POD["spec"], "nodeName": "sim-2"}}
    assert spec_changed(POD, elsewhere) is None
    assert spec_changed(POD, {**POD, "spec": {k: v for k, v in POD["spec"].items() if k != "nodeName"}}) is None
    patched = {**POD, "spec": {**POD["spec"], "containers": [{"name": "main", "image": "wasm://h/b.wasm"}]}}
    assert spec_changed(patched, elsewhere) == (
        "the pod's spec changed since the replacement was made from it (spec.containers): "
        "a replacement carries the pod's spec as it is")


def test_a_replacement_takes_the_metadata_as_stored_and_only_restore_from_from_the_body() -> None:
    stored = {"metadata": {"name": "p", "labels": {"during": "saving"}, "finalizers": ["f"],
                           "annotations": {"example.com/note": "saving", "kube32.io/restore-from": "old"}}}
    body = {"metadata": {"name": "p", "labels": {"a": "b"}, "annotations": {"kube32.io/restore-from": "mv"}}}
    carry_metadata(stored, body)
    assert body["metadata"] == {"name": "p", "labels": {"during": "saving"}, "finalizers": ["f"],
                                "annotations": {"example.com/note": "saving", "kube32.io/restore-from": "mv"}}
    afresh = {"metadata": {"name": "p", "annotations": {}}}
    carry_metadata(stored, afresh)
    assert afresh["metadata"]["annotations"] == {"example.com/note": "saving"}


def test_the_snapshot_goes_only_to_its_own_module() -> None:
    assert image_of(POD, "main") == POD["spec"]["containers"][0]["image"]
    assert snapshot_mismatch("sim-2", "wasm://h/a.wasm", "AB" * 32, "ab" * 32) is None
    assert snapshot_mismatch("sim-2", "wasm://h/a.wasm", "ab" * 32, None) is None
    assert snapshot_mismatch("sim-2", "wasm://h/a.wasm", "cd" * 32, "ab" * 32) == (
        f"image wasm://h/a.wasm is module sha256:{'cd' * 32} on sim-2, not the module the snapshot was taken "
        f"from (sha256:{'ab' * 32}): the image changed since the container started")


def test_a_pull_nobody_waits_for_is_dropped_quietly() -> None:
    async def go() -> None:
        async def fails() -> str:
            raise TargetImageError("no")
        done = asyncio.ensure_future(fails())
        await asyncio.sleep(0)
        drop(done)  # its exception is seen: no "never retrieved" warning
        waiting = asyncio.ensure_future(asyncio.sleep(10))
        drop(waiting)
        await asyncio.sleep(0)
        assert waiting.cancelled()
        drop(None)
    asyncio.run(go())
