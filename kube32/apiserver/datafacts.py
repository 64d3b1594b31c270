"""What the checkpoint data space's standings read (kube32.apiserver.dataspace.standings),
kept up to date from the store's watch instead of read again at every look.

A look of the data space (``Room.look``) judges each stored data by its Checkpoint
(phase, ``rollbackPodUID``, trigger, pod) and by the pods that name a checkpoint in
``kube32.io/restore-from``.  It used to list and decode every Checkpoint and every pod
of the cluster, at every upload that did not fit as it was: at a fleet's size (10,000
pods, a thousand periodic checkpoints every 15 s) that was O(pods) per upload and most
of the control plane's time (bench/notes.md, "Fleets").  Now :class:`DataFacts` lists
both kinds once at the start, then follows one store watch of each: per write of a
Checkpoint one decode, per write of a pod one search of its bytes for the annotation's
name (a decode only when it is there, or when the pod was known to name one), so a look
costs O(stored data + pods that restore), whatever the number of pods.

Invariants:

* :attr:`DataFacts.checkpoints` holds every Checkpoint of the store by uid (only the
  fields the standings read), :attr:`DataFacts.restoring` every pod whose
  ``kube32.io/restore-from`` is set (the same), as of the last event read.
* :meth:`DataFacts.read` is as fresh as a list was with the SQLite store: it first lets
  the watches read what the store published, :data:`FRESH_TURNS` turns of the event loop
  (the store feeds its watchers in the write itself, and a watch reads all that is queued
  in one turn).  With etcd it is as fresh as etcd's watch (milliseconds): another API
  server's write is no fresher in a list.
* A watch that fails or ends (compaction, the store closing) starts again from a new
  list after :data:`RESTART_PAUSE`; until :meth:`start` ran, or while a relist is under
  way, :meth:`read` falls back to listing (what it did before), so the facts are never
  older than a list would be.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..store import KeyValue, WatchEvent
from ..terms import Annotation
from .resources import by_plural

if TYPE_CHECKING:
    from .registry import Registry

log = logging.getLogger("kube32.apiserver.datafacts")
Obj = dict[str, Any]

RESTART_PAUSE = 1.0   # seconds before a failed watch starts again from a list
FRESH_TURNS = 2       # event-loop turns read() lets the watches take to read what is published
_RESTORE_KEY = f'"{Annotation.RESTORE_FROM}"'.encode()


def slim_checkpoint(ck: Obj) -> Obj:
    """What the standings and a look read of a Checkpoint."""
    md, status = ck.get("metadata") or {}, ck.get("status") or {}
    return {"metadata": {k: md[k] for k in ("uid", "name", "namespace", "labels") if k in md},
            "spec": {"podName": (ck.get("spec") or {}).get("podName")},
            "status": {k: status[k] for k in ("phase", "rollbackPodUID") if k in status}}


def slim_pod(pod: Obj) -> Obj | None:
    """What the standings read of a pod: None when it names no checkpoint to restore from."""
    md = pod.get("metadata") or {}
    name = (md.get("annotations") or {}).get(Annotation.RESTORE_FROM)
    if not name:
        return None
    return {"metadata": {"uid": md.get("uid", ""), "name": md.get("name", ""),
                         "namespace": md.get("namespace", ""), "annotations": {Annotation.RESTORE_FROM: name}}}


class DataFacts:
    """Every Checkpoint and the pods that restore, from a list and then the store's watch."""

    def __init__(self, registry: "Registry", decode: Callable[[KeyValue], Obj] | None = None) -> None:
        from .registry import decode as plain_decode
        self.registry = registry
        self._decode = decode or plain_decode
        self.checkpoints: dict[str, Obj] = {}   # uid -> slim Checkpoint
        self._ck_uid: dict[str, str] = {}        # store key -> uid
        self.restoring: dict[str, Obj] = {}      # store key -> slim pod
        self.decoded = 0                         # objects decoded since the start (a test reads it)
        self._tasks: list[asyncio.Task[None]] = []
        self._synced = {"checkpoints": False, "pods": False}

    @property
    def synced(self) -> bool:
        return all(self._synced.values())

    async def start(self) -> None:
        for plural in ("checkpoints", "pods"):
            rev = await self._relist(plural)
            self._tasks.append(asyncio.create_task(self._follow(plural, rev), name=f"datafacts-{plural}"))

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._synced = dict.fromkeys(self._synced, False)

    async def read(self) -> tuple[Mapping[str, Obj] | list[Obj], list[Obj]]:
        """(every Checkpoint by uid, read-only, the pods that restore), as fresh as a list
        (module docstring)."""
        if not self.synced:
            return await self._listed()
        for _ in range(FRESH_TURNS):
            await asyncio.sleep(0)
        return self.checkpoints, list(self.restoring.values())

    async def _listed(self) -> tuple[list[Obj], list[Obj]]:
        checkpoints, _ = await self.registry.list(by_plural("checkpoints"), None)
        pods, _ = await self.registry.list(by_plural("pods"), None)
        return checkpoints, pods

    async def _relist(self, plural: str) -> int:
        self._synced[plural] = False
        kvs, rev = await self.registry.store.list(by_plural(plural).prefix(None))
        if plural == "checkpoints":
            self.checkpoints.clear()
            self._ck_uid.clear()
        else:
            self.restoring.clear()
        for kv in kvs:
            self._put(plural, kv)
        self._synced[plural] = True
        return rev

    async def _follow(self, plural: str, rev: int) -> None:
        prefix = by_plural(plural).prefix(None)
        while True:
            try:
                stream = self.registry.store.watch(prefix, rev)
                try:
                    async for ev in stream:
                        self._apply(plural, ev)
                        rev = ev.revision
                finally:
                    await stream.aclose()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - compaction or a store fault: list again
                log.warning("the data space's watch of %s failed (%s); listing again", plural, e or type(e).__name__)
            self._synced[plural] = False   # read() lists meanwhile
            await asyncio.sleep(RESTART_PAUSE)
            try:
                rev = await self._relist(plural)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - tried again after the next pause
                log.warning("cannot list %s for the data space: %s", plural, e or type(e).__name__)

    def _apply(self, plural: str, ev: WatchEvent) -> None:
        if ev.type == "DELETE":
            if plural == "checkpoints":
                uid = self._ck_uid.pop(ev.kv.key, None)
                if uid is not None:
                    self.checkpoints.pop(uid, None)
            else:
                self.restoring.pop(ev.kv.key, None)
        else:
            self._put(plural, ev.kv)

    def _put(self, plural: str, kv: KeyValue) -> None:
        if plural == "checkpoints":
            ck = slim_checkpoint(self._object(kv))
            uid = ck["metadata"].get("uid", "")
            old = self._ck_uid.get(kv.key)
            if old is not None and old != uid:
                self.checkpoints.pop(old, None)
            self._ck_uid[kv.key] = uid
            self.checkpoints[uid] = ck
            return
        # A pod: decoded only when its bytes name the annotation, or it named one before.
        if _RESTORE_KEY not in kv.value:
            self.restoring.pop(kv.key, None)
            return
        pod = slim_pod(self._object(kv))
        if pod is None:
            self.restoring.pop(kv.key, None)
        else:
            self.restoring[kv.key] = pod

    def _object(self, kv: KeyValue) -> Obj:
        self.decoded += 1
        return self._decode(kv)
