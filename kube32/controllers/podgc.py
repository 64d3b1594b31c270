"""PodGC: force-deletes pods that no kubelet will ever finish, as Kubernetes' PodGC does.

A bound pod's deletion is graceful: it gets a deletionTimestamp and its kubelet
deletes it (grace 0) once stopped.  When that kubelet is gone that never happens,
so this controller deletes with grace 0:

* pods bound to a node that does not exist, once it has been missing for
  ``node_monitor_grace_seconds`` (Kubernetes' quarantine: a node may register
  just after its pods were bound) and the API confirms it (not only the cache);
* terminating pods on a node that is not Ready (Unknown or False), once their
  deletion grace period has run out.

Never the replacement of a move under way (its target lost or deleted): the Checkpoint
controller rolls it back to its source from the same Checkpoint, and deleting it would
lose the pod's state.

It runs every ``node_monitor_period_seconds``; the work-queue key is the pod key.  A
scan looks only where a candidate can be (issue 25): the nodes that have pods but no
Node, and the nodes that are not Ready, each one's pods read from the pods informer's
index by node; not every pod of the cluster (10,000 pods every second held the event
loop the API server shares).  The nodes are walked in turns (kube32.controllers.base).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .. import objects
from ..client import CHECKPOINTS, NODES, PODS, ApiError
from ..client.informer import BY_NODE_NAME, by_node_name
from ..terms import Condition
from .base import Controller, in_turns, split_key
from .checkpoint import replaced_by_move
from .nodelifecycle import parse_time

log = logging.getLogger("kube32.podgc")
Obj = dict[str, Any]


def grace_over(pod: Obj, now: float) -> bool:
    md = objects.meta(pod)
    started = parse_time(md.get("deletionTimestamp"))
    if started is None:
        return False
    return now >= started + float(md.get("deletionGracePeriodSeconds") or 0)


class PodGC(Controller):
    name = "pod-garbage-collector"
    workers = 1

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pods = ctx.informers.get(PODS)
        self.nodes = ctx.informers.get(NODES)
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        self.pods.add_index(BY_NODE_NAME, by_node_name)
        self._missing_since: dict[str, float] = {}  # node name -> when first seen missing (monotonic)

    async def run(self) -> None:
        await asyncio.gather(super().run(), self._scan())

    async def _scan(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.options.node_monitor_period_seconds)
            await self.scan_once()

    async def scan_once(self) -> None:
        """Queue every candidate: the pods of nodes that are missing or not Ready."""
        with_pods = self.pods.index_values(BY_NODE_NAME)
        self._note_missing_nodes(with_pods)
        look = [n for n in with_pods if self.nodes.get(n) is None]
        async for node in in_turns(self.nodes.list()):
            if objects.condition_status(node, Condition.READY) != "True":
                look.append(objects.name(node))
        now = time.time()
        async for pod in in_turns(p for name in look for p in self.pods.by_index(BY_NODE_NAME, name)):
            if self._candidate(pod, now):
                md = pod["metadata"]
                self.queue.add(f"{md.get('namespace')}/{md['name']}")

    def _note_missing_nodes(self, with_pods: list[str]) -> None:
        missing = {n for n in with_pods if self.nodes.get(n) is None}
        now = time.monotonic()
        self._missing_since = {n: self._missing_since.get(n, now) for n in missing}

    def _candidate(self, pod: Obj, now: float) -> bool:
        node_name = objects.spec(pod).get("nodeName")
        if not node_name or replaced_by_move(self.checkpoints, pod):
            return False
        node = self.nodes.get(node_name)
        if node is None:
            since = self._missing_since.get(node_name)
            return since is not None and time.monotonic() - since >= self.ctx.options.node_monitor_grace_seconds
        return (bool(objects.meta(pod).get("deletionTimestamp"))
                and objects.condition_status(node, Condition.READY) != "True" and grace_over(pod, now))

    async def sync(self, key: Any) -> None:
        ns, name = split_key(str(key))
        pod = self.pods.get(str(key))
        if pod is None or not self._candidate(pod, time.time()):
            return
        node_name = pod["spec"]["nodeName"]
        if self.nodes.get(node_name) is None and await self.client.try_get(NODES, node_name) is not None:
            return  # the node exists; the cache has not caught up
        try:
            await self.client.delete(PODS, name, ns, grace_period=0, uid=pod["metadata"].get("uid"))
            log.info("force-deleted pod %s on node %s (%s)", key, node_name,
                     "gone" if self.nodes.get(node_name) is None else "not ready")
        except ApiError as e:
            if e.code not in (404, 409):
                raise
