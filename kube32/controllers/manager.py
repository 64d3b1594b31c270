"""The controller manager: builds every controller, starts the shared informers, runs them.

The list :data:`CONTROLLERS` is the one place a controller is registered.
"""
from __future__ import annotations

import asyncio
import logging

from ..client import Client, EventRecorder
from .base import Controller, ControllerContext, ControllerOptions, SharedInformers

log = logging.getLogger("kube32.controllers")

# Controller classes, in start order (filled as controllers land).
CONTROLLERS: list[type[Controller]] = []

# Scheduling, node health, garbage collection, namespaces, disruption budgets.
from .disruption import DisruptionController  # noqa: E402
from .garbagecollector import GarbageCollector  # noqa: E402
from .namespace import NamespaceController  # noqa: E402
from .nodelifecycle import NodeLifecycle  # noqa: E402
from .podgc import PodGC  # noqa: E402
from .scheduler import Scheduler  # noqa: E402
from .serviceaccount import ServiceAccountsController  # noqa: E402

CONTROLLERS += [Scheduler, NodeLifecycle, PodGC, GarbageCollector, NamespaceController, DisruptionController,
                ServiceAccountsController]

from .replicaset import ReplicaSetController  # noqa: E402 - registered right after the list
from .deployment import DeploymentController  # noqa: E402
from .daemonset import DaemonSetController  # noqa: E402
from .endpoints import EndpointsController  # noqa: E402

CONTROLLERS += [ReplicaSetController, DeploymentController, DaemonSetController, EndpointsController]

# Pod migration.
from .checkpoint import CheckpointController  # noqa: E402
from .periodic import PeriodicCheckpoints  # noqa: E402
from .restore import RestoreController  # noqa: E402
from .autopolicy import AutoPolicy  # noqa: E402

CONTROLLERS += [CheckpointController, PeriodicCheckpoints, RestoreController, AutoPolicy]


class ControllerManager:
    def __init__(self, client: Client, options: ControllerOptions | None = None) -> None:
        self.options = options or ControllerOptions()
        self.ctx = ControllerContext(client, SharedInformers(client), self.options,
                                     EventRecorder(client, "kube32-controller-manager"))
        self.controllers = [cls(self.ctx) for cls in CONTROLLERS]
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        for c in self.controllers:
            c.setup()
        self._tasks += self.ctx.informers.start()
        await self.ctx.informers.wait_synced()
        for c in self.controllers:
            self._tasks.append(asyncio.create_task(c.run(), name=f"controller-{c.name}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ctx.informers.stop()
