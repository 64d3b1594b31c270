"""The controller framework: shared informers, a work queue per controller, workers.

Controllers are level-triggered, as Kubernetes' ``replica_set.go``: informer
handlers only enqueue keys; ``sync(key)`` reads the current state (from the
informer caches, or the API when it must be exact), compares it with the
desired state, acts through the API, and raises to be retried with back-off.
The work queue guarantees one key is never synced twice at once.

The API server and the controllers share one event loop (one process), so no step of a
controller may hold it for long: at 10,000 pods one walk over every pod is tens of ms
to seconds, and every watch event, request and Lease renewal waits behind it (issue 25:
watch delivery p99).  Hence:

* A walk over what grows with the cluster (every pod, node or Checkpoint: a resync,
  PodGC's scan) goes through :func:`in_turns`, which gives the loop a turn every
  :data:`WALK_TURN` items.  What a walk reads between turns may have changed meanwhile;
  each item is handled as it is then (level-triggered: a later event looks again).
* Workers give the loop a turn every :data:`SYNCS_PER_TURN` syncs: a queue of a thousand
  keys whose syncs never wait (the node lifecycle's look at every node each second) would
  otherwise run as one step, since a non-empty queue's ``get`` does not wait either.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Hashable, Iterable, TypeVar

from .. import objects, timing
from ..client import PODS, ApiError, Client, EventRecorder, Informer, Kind, WorkQueue
from ..client.workqueue import run_workers
from . import podutil as pu

log = logging.getLogger("kube32.controllers")
T = TypeVar("T")

WALK_TURN = 256        # items of a walk between two turns of the event loop (about a ms of work)
SYNCS_PER_TURN = 32    # syncs of one worker between two turns of the event loop


async def in_turns(items: Iterable[T], every: int = WALK_TURN) -> AsyncIterator[T]:
    """``items`` one by one, the event loop given a turn (``asyncio.sleep(0)``: its ready
    callbacks and its sockets) before each ``every``-th after the first: see the module
    docstring.  Pass a copy (an informer's ``list()``), never a dict that may change while
    the walk waits."""
    for i, item in enumerate(items):
        if i and i % every == 0:
            await asyncio.sleep(0)
        yield item


def taking_turns(sync: Callable[[Hashable], Awaitable[None]],
                 every: int = SYNCS_PER_TURN) -> Callable[[Hashable], Awaitable[None]]:
    """``sync``, giving the event loop a turn before every ``every``-th call."""
    count = 0

    async def in_turn(key: Hashable) -> None:
        nonlocal count
        count += 1
        if count % every == 0:
            await asyncio.sleep(0)
        await sync(key)
    return in_turn


@dataclass(frozen=True)
class ControllerOptions:
    """Timings of the control loops; tests shorten them instead of sleeping minutes."""
    node_monitor_grace_seconds: float = 40.0      # a Lease not renewed for this long: Ready=Unknown
    pod_eviction_timeout_seconds: float = 300.0   # toleration of not-ready/unreachable taints
    node_monitor_period_seconds: float = 1.0
    resync_seconds: float = 30.0
    move_rollback_seconds: float = timing.MOVE_ROLLBACK_SECONDS   # a replacement not running by then rolls back
    checkpoint_retention_seconds: float = 3600.0  # finished non-periodic Checkpoints go after this
    pressure_move_cooldown_seconds: float = 60.0  # memory pressure moves at most one pod per node per this
    auto_move_cooldown_seconds: float = 600.0     # a pod moves on its own at most once per this
    job_backoff_seconds: float = timing.JOB_BACKOFF_SECONDS   # a failed Job pod's first back-off
    extra: dict[str, Any] = field(default_factory=dict)


class SharedInformers:
    """One informer per kind, shared by every controller of the manager."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._informers: dict[Kind, Informer] = {}

    def get(self, kind: Kind) -> Informer:
        inf = self._informers.get(kind)
        if inf is None:
            inf = self._informers[kind] = Informer(self.client, kind)
        return inf

    def start(self) -> list[asyncio.Task]:
        return [inf.start() for inf in self._informers.values()]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(inf.synced.wait() for inf in self._informers.values()))

    async def stop(self) -> None:
        await asyncio.gather(*(inf.stop() for inf in self._informers.values()))


@dataclass
class ControllerContext:
    client: Client
    informers: SharedInformers
    options: ControllerOptions
    recorder: EventRecorder
    shared: dict[str, Any] = field(default_factory=dict)  # cross-controller services (scheduler)


class Controller:
    """Subclasses set ``name``, register handlers in ``setup`` and implement ``sync``."""

    name = "controller"
    workers = 2

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.queue = WorkQueue()
        self.recorder = EventRecorder(ctx.client, self.name)

    def setup(self) -> None:
        """Register informer handlers (they only call ``self.queue.add``)."""

    async def sync(self, key: Hashable) -> None:
        raise NotImplementedError

    async def resync(self) -> None:
        """Called every ``resync_seconds``: enqueue every key worth a look (optional)."""

    async def set_finalizers(self, kind: Kind, obj: dict[str, Any], finalizers: list[str]) -> None:
        """Write ``obj``'s finalizers, guarded by the resourceVersion read (409 raises: the
        queue retries on a fresh copy); an object gone already is fine.  The last one
        removed from an object being deleted removes it."""
        md = obj["metadata"]
        patch = {"metadata": {"resourceVersion": md.get("resourceVersion"), "finalizers": finalizers or None}}
        try:
            await self.client.patch(kind, md["name"], patch, md.get("namespace"))
        except ApiError as e:
            if e.code != 404:
                raise

    async def delete_pod(self, owner: dict[str, Any], key: str, pod: dict[str, Any],
                         expectations: pu.Expectations) -> None:
        """Delete one of ``owner``'s pods, as Kubernetes' PodControl.DeletePod: guarded by
        its uid, an event on ``owner`` either way.  A pod gone already or replaced meanwhile
        (404, 409) is no failure: the next sync counts again.  Any other error is raised;
        a failed delete is observed at once (``key``'s expectation), as no watch event will."""
        pmd = objects.meta(pod)
        try:
            await self.client.delete(PODS, pmd["name"], pmd.get("namespace"), uid=pmd.get("uid"))
        except ApiError as e:
            expectations.deletion_observed(key, pu.pod_key(pod))
            if e.code in (404, 409):
                return
            await self.recorder.record(owner, "Warning", "FailedDelete", f"Error deleting: {e}")
            raise
        await self.recorder.record(owner, "Normal", "SuccessfulDelete", f"Deleted pod: {pmd['name']}")

    def _on_error(self, key: Hashable, err: BaseException) -> None:
        log.warning("%s: sync %s failed (retrying): %s", self.name, key, err)

    async def run(self) -> None:
        async def resync_loop() -> None:
            while True:
                await asyncio.sleep(self.ctx.options.resync_seconds)
                try:
                    await self.resync()
                except Exception as e:  # noqa: BLE001 - resync is best effort
                    log.warning("%s: resync failed: %s", self.name, e)
        await asyncio.gather(run_workers(self.queue, taking_turns(self.sync), self.workers, self._on_error),
                             resync_loop())


def key_of(obj: dict[str, Any]) -> str:
    md = objects.meta(obj)
    return f"{md['namespace']}/{md['name']}" if md.get("namespace") else md.get("name", "")


def split_key(key: str) -> tuple[str | None, str]:
    ns, _, name = key.rpartition("/")
    return (ns or None), name
