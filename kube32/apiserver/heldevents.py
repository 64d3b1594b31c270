"""Events for a pod under a move, held by the control plane until the pod runs again.

Spec: events for a frozen pod "are held, at most 8, and later ones are dropped and
counted", and they are "delivered after the restore".  A node can hold them only while
the pod is frozen there; a move's snapshot is written early, and between the source and
the target (replacement bound, not yet running) no node has the pod.  So the control
plane holds them for the whole move, wherever the pod is (:class:`~.eventbus.Hold`).

A move's snapshot is taken by the API server itself (``PUT .../data?fromNode=...&
leave=frozen``, kube32.apiserver.checkpointdata).  Before it asks the node,
:meth:`HeldEvents.begin` starts the hold and gives the bus's latest line number; the
node takes the snapshot only once it has read that line (``eventsSeq``).  Every event
published before it reached the pod: it is in the snapshot, or the node dropped and
counted it.  Every event after it is held here.  None is in both or in neither, and the
order is kept: the snapshot's events first (the restore or the thaw delivers them), then
these.  The node's answer says how many the snapshot holds (``X-Kube32-Held-Events``);
the hold keeps what is left of the 8 and drops and counts the rest.

The hold ends when a pod of that name runs (phase Running, its containers running) and
either its uid is not the one frozen (the replacement on the target, or the pod rolled
back to its source) or the Checkpoint is finished or gone (the source thawed, or never
frozen).  Its events then go to that pod, and its node records EventsDropped with the
count of those dropped.  A pod deleted meanwhile takes them with it.  A hold lasts
:data:`HOLD_SECONDS` at most: then its events go to the pod of that name if it runs, or
nowhere.  A move tried again while a hold of its pod lasts lets that hold's events go to
the pod first, before the new hold and the new snapshot, so they are in it.

Bounded: 8 events a pod, of 64 KiB at most each.  Holds live in memory; a control plane
restart loses them, as it loses the snapshot data.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import movability, objects, timing
from ..aio import wait_set
from ..wasm.abi import MAX_HELD_EVENTS
from ..terms import CheckpointPhase, PodPhase
from .eventbus import EventBus, Hold
from .registry import Registry
from .resources import Resource, by_plural
from .selectors import FieldSelector

log = logging.getLogger("kube32.apiserver.heldevents")

HOLD_SECONDS = timing.EVENT_HOLD_SECONDS   # longer than any move (timing says why)
CHECK_SECONDS = 1.0    # a look without a watch event, in case a watch broke
FINISHED = CheckpointPhase.FINISHED


def runs(pod: dict[str, Any]) -> bool:
    """The pod's containers run: each one its node reports (a node runs a pod's first
    container only), where a replacement restoring is Running with its container waiting."""
    status = objects.status(pod)
    statuses = status.get("containerStatuses") or []
    return (status.get("phase") == PodPhase.RUNNING and bool(statuses)
            and all("running" in (cs.get("state") or {}) for cs in statuses))


class HeldEvents:
    def __init__(self, registry: Registry, bus: EventBus) -> None:
        self.registry = registry
        self.bus = bus
        self._pods = by_plural("pods")
        self._checkpoints = by_plural("checkpoints")
        self._tasks: set[asyncio.Task] = set()

    async def begin(self, namespace: str, pod_name: str, checkpoint: dict[str, Any]) -> tuple[Hold | None, int]:
        """Hold the pod's events from now on; returns the hold (None for a pod that hears
        no topic, or no such pod: the node answers 404) and the bus's latest line number,
        for the node.  A hold of the pod from a try before is let go to the pod first."""
        pod = await self.registry.try_get(self._pods, namespace, pod_name)
        topics = frozenset(movability.topics(pod or {}))
        if pod is None or not topics:
            return None, self.bus.seq
        # No await from here to the return: the line number is the one the hold began after.
        md = checkpoint["metadata"]
        hold = self.bus.hold(namespace, pod_name, pod["metadata"]["uid"], topics,
                             MAX_HELD_EVENTS, md["name"], md["uid"])
        task = asyncio.create_task(self._follow(hold), name=f"held events {namespace}/{pod_name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return hold, self.bus.seq

    def let_go(self, hold: Hold) -> None:
        """The node refused the snapshot (the pod runs on where it is, never frozen): the
        events held for it go to it now, not once the Checkpoint ends."""
        self.bus.release(hold, hold.pod_uid)

    async def close(self) -> None:
        """Stop following the holds (the API server stops; the holds go with it)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self, hold: Hold) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HOLD_SECONDS
        changed = asyncio.Event()
        watches = [asyncio.create_task(self._changes(res, hold.namespace, name, changed))
                   for res, name in ((self._pods, hold.pod), (self._checkpoints, hold.checkpoint))]
        try:
            while self.bus.holding(hold):
                changed.clear()
                if await self._settle(hold, loop.time() >= deadline):
                    return
                await wait_set(changed, max(0.0, min(CHECK_SECONDS, deadline - loop.time())))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a hold must end, whatever a read raised
            log.exception("held events of %s/%s", hold.namespace, hold.pod)
            self.bus.discard(hold)
        finally:
            for task in watches:
                task.cancel()

    async def _changes(self, res: Resource, namespace: str, name: str, changed: asyncio.Event) -> None:
        fields = FieldSelector((("metadata.name", "=", name),))
        try:
            async for _ in self.registry.watch(res, namespace, None, fields, None):
                changed.set()
        except Exception as e:  # noqa: BLE001 - the periodic look covers a broken watch
            log.debug("watch of %s %s/%s for held events: %s", res.plural, namespace, name, e)

    async def _settle(self, hold: Hold, expired: bool) -> bool:
        """Release or drop the hold if its time has come; True when it ended."""
        pod = await self.registry.try_get(self._pods, hold.namespace, hold.pod)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            self.bus.discard(hold)
            return True
        if not runs(pod):
            if expired:
                self.bus.discard(hold)
            return expired
        uid = pod["metadata"]["uid"]
        if uid == hold.pod_uid and not expired:
            ck = await self.registry.try_get(self._checkpoints, hold.namespace, hold.checkpoint)
            if ck is not None and ck["metadata"]["uid"] == hold.checkpoint_uid \
                    and objects.phase(ck) not in FINISHED:
                return False
        self.bus.release(hold, uid)
        return True
