"""The Auto policy: pods with ``kube32.io/migration: Auto`` move on their own (spec: "Policies").

Two cases, both as Move Checkpoints the Checkpoint controller carries out:

* Memory pressure: while a node reports ``MemoryPressure`` (free heap below 24 KiB),
  the Auto pod on it that requests the most memory moves (no target: the
  scheduler, or the fastest node for ``placement: fastest`` pods, picks one), at
  most one pod per node per minute.  Label ``kube32.io/trigger: memory-pressure``.
* A faster node: an Auto pod with ``kube32.io/placement: fastest`` moves to the
  fastest Ready node that takes it when that node's ``kube32.io/interp-mops`` is at
  least twice its current node's.  Label ``kube32.io/trigger: placement``.  A move
  never follows from noise (:func:`faster`): figures two nodes measured on one
  machine with one engine (the same ``kube32.io/interp-mops-measured-on``) count as
  equal, whatever they say, and a node without a figure is never faster.

A pod moves on its own at most once per 10 minutes.  The cooldowns live in memory:
a control plane restart clears them.  Work-queue keys: ``node/<name>`` for pressure
and :data:`PLACEMENT_PASS` for placement.
"""
from __future__ import annotations

import logging
import secrets
import time
from fractions import Fraction
from typing import Any

from .. import movability, objects
from ..client import CHECKPOINTS, NODES, PODS
from ..client.informer import BY_NODE_NAME, by_node_name
from ..terms import (API_VERSION, FASTEST, Annotation, CheckpointAction, CheckpointPhase, Condition, Label, PodPhase,
                     Policy, Trigger)
from .base import Controller, in_turns
from .checkpoint import fastest_fit, interp_mops
from .scheduler import node_ready, pod_requests, usage_reader

log = logging.getLogger("kube32.autopolicy")
Obj = dict[str, Any]
PLACEMENT_PASS = "placement"
UNDER_WAY = (CheckpointPhase.PENDING, CheckpointPhase.SAVING, CheckpointPhase.MOVING)


def faster(candidate: Obj, current: Obj) -> bool:
    """Whether ``candidate`` is at least twice as fast as ``current`` (spec: "Policies").

    The kubelets' figures are the best of several runs in CPU time (repeatable within
    a few per cent on a loaded machine); two nodes that measured on the same machine
    with the same engine are the same speed by construction, so any difference between
    them is noise.  A figure given with ``--interp-mops`` names no machine."""
    key = Annotation.INTERP_MOPS_MEASURED_ON
    on = objects.annotations(candidate).get(key)
    if on and on == objects.annotations(current).get(key):
        return False
    fast = interp_mops(candidate)
    return fast > 0 and fast >= 2 * interp_mops(current)


def _placement_facts(node: Obj) -> tuple[Any, ...]:
    """What a placement reads of a node (readiness, speed, what fits): a status report
    that changes none of it (a heartbeat, the free heap) asks for no placement pass."""
    md, status = node["metadata"], objects.status(node)
    ann = md.get("annotations") or {}
    return (node_ready(node), ann.get(Annotation.INTERP_MOPS), ann.get(Annotation.INTERP_MOPS_MEASURED_ON),
            md.get("labels"), node.get("spec"), status.get("allocatable"))


def _pod_key(pod: Obj) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"


class AutoPolicy(Controller):
    name = "auto-policy"
    workers = 1  # cooldowns are read and written by one worker

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.nodes = ctx.informers.get(NODES)
        self.pods = ctx.informers.get(PODS)
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        self.pods.add_index(BY_NODE_NAME, by_node_name)   # a pressure pass reads its node's pods only
        self.node_cooldown = ctx.options.pressure_move_cooldown_seconds
        self.pod_cooldown = ctx.options.auto_move_cooldown_seconds
        self._node_moved: dict[str, float] = {}   # node -> monotonic time of its last pressure move
        self._pod_moved: dict[str, float] = {}    # ns/name -> monotonic time of its last own move

    def setup(self) -> None:
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(lambda t, pod, old: self._on_pod(pod))

    def _on_node(self, etype: str, node: Obj, old: Obj | None) -> None:
        # O(1) per node event: a node's every status report is an event (a fleet of a
        # thousand reports a hundred a second), so a pass over every pod and node runs
        # only when what a placement reads of the node changed; the pressure pass only
        # for a node under pressure; the resync looks at everything every 30 s besides.
        if objects.condition_status(node, Condition.MEMORY_PRESSURE) == "True":
            self.queue.add(f"node/{node['metadata']['name']}")
        if etype == "DELETED" or old is None or _placement_facts(node) != _placement_facts(old):
            self.queue.add(PLACEMENT_PASS)

    def _on_pod(self, pod: Obj) -> None:
        if movability.policy(pod) == Policy.AUTO:
            self.queue.add(PLACEMENT_PASS)
            if pod["spec"].get("nodeName"):
                self.queue.add(f"node/{pod['spec']['nodeName']}")

    async def resync(self) -> None:
        self.queue.add(PLACEMENT_PASS)
        async for node in in_turns(self.nodes.list()):
            self.queue.add(f"node/{node['metadata']['name']}")

    async def sync(self, key: Any) -> None:
        if key == PLACEMENT_PASS:
            await self._placement()
        elif str(key).startswith("node/"):
            await self._pressure(str(key)[5:])

    # --- shared -------------------------------------------------------------------
    def _candidates(self, node: str | None = None) -> list[Obj]:
        """Auto pods that run, have no move under way and are out of their cooldown."""
        busy = {(c["metadata"].get("namespace"), objects.spec(c).get("podName"))
                for c in self.checkpoints.list()
                if objects.spec(c).get("action") == CheckpointAction.MOVE
                and objects.status(c).get("phase", CheckpointPhase.PENDING) in UNDER_WAY}
        now = time.monotonic()
        out = []
        for pod in self.pods.list() if node is None else self.pods.by_index(BY_NODE_NAME, node):
            md, spec, st = pod["metadata"], objects.spec(pod), objects.status(pod)
            if movability.policy(pod) != Policy.AUTO or md.get("deletionTimestamp") \
                    or st.get("phase") != PodPhase.RUNNING:
                continue
            if node is not None and spec.get("nodeName") != node:
                continue
            if (md.get("namespace"), md["name"]) in busy or Annotation.RESTORE_FROM in (md.get("annotations") or {}):
                continue
            if now - self._pod_moved.get(_pod_key(pod), -1e18) < self.pod_cooldown:
                continue
            if movability.spec_blockers(pod):
                continue
            out.append(pod)
        return out

    async def _move(self, pod: Obj, trigger: str, target: str | None, why: str) -> None:
        md = pod["metadata"]
        spec: Obj = {"podName": md["name"], "action": CheckpointAction.MOVE}
        if target:
            spec["target"] = {"nodeName": target}
        await self.client.create(CHECKPOINTS, {
            "apiVersion": API_VERSION, "kind": "Checkpoint",
            "metadata": {"name": f"{md['name'][:40]}-{trigger}-{secrets.token_hex(3)}", "namespace": md["namespace"],
                         "labels": {Label.TRIGGER: trigger}},
            "spec": spec}, md["namespace"])
        self._pod_moved[_pod_key(pod)] = time.monotonic()
        await self.recorder.record(pod, "Normal", "AutoMove", why)

    # --- memory pressure -------------------------------------------------------------
    async def _pressure(self, node_name: str) -> None:
        node = self.nodes.get(node_name)
        if node is None or objects.condition_status(node, Condition.MEMORY_PRESSURE) != "True":
            return
        waited = time.monotonic() - self._node_moved.get(node_name, -1e18)
        if waited < self.node_cooldown:
            self.queue.add_after(f"node/{node_name}", self.node_cooldown - waited + 0.05)
            return
        pods = self._candidates(node_name)
        if not pods:
            return
        biggest = max(pods, key=lambda p: (pod_requests(p).get("memory", Fraction(0)), p["metadata"]["name"]))
        self._node_moved[node_name] = time.monotonic()
        await self._move(biggest, Trigger.MEMORY_PRESSURE, None,
                         f"Node {node_name} is short of memory: moving the Auto pod that requests the most")
        self.queue.add_after(f"node/{node_name}", self.node_cooldown + 0.05)

    # --- faster nodes ------------------------------------------------------------------
    async def _placement(self) -> None:
        soonest = None
        fastest = [p async for p in in_turns(self.pods.list())
                   if objects.annotations(p).get(Annotation.PLACEMENT) == FASTEST]
        if not fastest:
            return
        nodes = [n for n in self.nodes.list() if node_ready(n)]
        by_name = {n["metadata"]["name"]: n for n in self.nodes.list()}
        for pod in fastest:
            if pod not in self._candidates(pod["spec"].get("nodeName")):
                left = self.pod_cooldown - (time.monotonic() - self._pod_moved.get(_pod_key(pod), -1e18))
                if 0 < left and movability.policy(pod) == Policy.AUTO:
                    soonest = left if soonest is None else min(soonest, left)
                continue
            current = by_name.get(pod["spec"]["nodeName"])
            if current is None:
                continue
            quicker = [n for n in nodes if faster(n, current)]
            best = fastest_fit(pod, quicker, usage_reader(self.ctx.shared, self.pods.list, objects.uid(pod)), None,
                               {pod["spec"]["nodeName"]})
            if best is not None:
                fast, here = interp_mops(by_name[best]), interp_mops(current)
                await self._move(pod, Trigger.PLACEMENT, best,
                                 f"Node {best} ({fast:g} MOPS) is at least twice as fast as "
                                 f"{current['metadata']['name']} ({here:g} MOPS)")
        if soonest is not None:
            self.queue.add_after(PLACEMENT_PASS, soonest + 0.05)
