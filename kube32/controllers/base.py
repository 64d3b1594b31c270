"""The controller framework: shared informers, a work queue per controller, workers.

Controllers are level-triggered, as Kubernetes' ``replica_set.go``: informer
handlers only enqueue keys; ``sync(key)`` reads the current state (from the
informer caches, or the API when it must be exact), compares it with the
desired state, acts through the API, and raises to be retried with back-off.
The work queue guarantees one key is never synced twice at once.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Hashable

from ..client import Client, EventRecorder, Informer, Kind, WorkQueue
from ..client.workqueue import run_workers

log = logging.getLogger("kube32.controllers")


@dataclass(frozen=True)
class ControllerOptions:
    """Timings of the control loops; tests shorten them instead of sleeping minutes."""
    node_monitor_grace_seconds: float = 40.0      # a Lease not renewed for this long: Ready=Unknown
    pod_eviction_timeout_seconds: float = 300.0   # toleration of not-ready/unreachable taints
    node_monitor_period_seconds: float = 1.0
    resync_seconds: float = 30.0
    move_rollback_seconds: float = 60.0           # a replacement not running by then rolls back
    checkpoint_retention_seconds: float = 3600.0  # finished non-periodic Checkpoints go after this
    pressure_move_cooldown_seconds: float = 60.0  # memory pressure moves at most one pod per node per this
    auto_move_cooldown_seconds: float = 600.0     # a pod moves on its own at most once per this
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
        await asyncio.gather(run_workers(self.queue, self.sync, self.workers, self._on_error), resync_loop())


def key_of(obj: dict[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{md['namespace']}/{md['name']}" if md.get("namespace") else md.get("name", "")


def split_key(key: str) -> tuple[str | None, str]:
    ns, _, name = key.rpartition("/")
    return (ns or None), name
