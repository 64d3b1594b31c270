"""The controller manager: builds every controller, starts the shared informers, runs them.

The list :data:`CONTROLLERS` is the one place a controller is registered.
"""
from __future__ import annotations

import asyncio
import logging

from ..client import Client, EventRecorder
from .autopolicy import AutoPolicy
from .base import Controller, ControllerContext, ControllerOptions, SharedInformers
from .checkpoint import CheckpointController
from .cronjob import CronJobController
from .daemonset import DaemonSetController
from .deployment import DeploymentController
from .disruption import DisruptionController
from .endpoints import EndpointsController
from .garbagecollector import GarbageCollector
from .job import JobController
from .namespace import NamespaceController
from .nodelifecycle import NodeLifecycle
from .periodic import PeriodicCheckpoints
from .podgc import PodGC
from .replicaset import ReplicaSetController
from .restore import RestoreController
from .scheduler import Scheduler
from .serviceaccount import ServiceAccountsController

log = logging.getLogger("kube32.controllers")

# Controller classes, in start order.
CONTROLLERS: list[type[Controller]] = [
    # Scheduling, node health, garbage collection, namespaces, disruption budgets.
    Scheduler, NodeLifecycle, PodGC, GarbageCollector, NamespaceController, DisruptionController,
    ServiceAccountsController,
    # Workloads and Services.
    ReplicaSetController, DeploymentController, DaemonSetController, EndpointsController,
    # Jobs and CronJobs (batch/v1).
    JobController, CronJobController,
    # Pod migration.
    CheckpointController, PeriodicCheckpoints, RestoreController, AutoPolicy,
]


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
