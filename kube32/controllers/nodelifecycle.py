"""Node lifecycle: node health from Leases, NoExecute taints, evictions from lost nodes.

After Kubernetes' ``node_lifecycle_controller.go`` and its taint manager:

* A node's heartbeat is its Lease in ``kube-node-lease`` (``spec.renewTime``)
  and its Ready condition's ``lastHeartbeatTime``.  The controller notes *its
  own* clock when either changes (as Kubernetes' probe timestamps do), so clock
  skew between kubelet and control plane does not matter; a node first seen
  counts as heard from then.
* Not heard from for ``node_monitor_grace_seconds``: its kubelet's conditions
  (``Condition.KUBELET_NODE``; another component's stay) turn Unknown with reason
  NodeStatusUnknown, "Kubelet stopped posting node status.", its pods turn not Ready, and a NodeNotReady event
  is recorded.
* Taints follow the Ready condition: Unknown -> ``node.kubernetes.io/unreachable``,
  False -> ``node.kubernetes.io/not-ready``, each with NoSchedule and NoExecute;
  Ready again -> both gone.  As Kubernetes' TaintNodesByCondition: a Ready node whose
  MemoryPressure is True (its free heap, what its pods and their modules leave, below
  24 KiB) gets ``node.kubernetes.io/memory-pressure`` NoSchedule, so the scheduler
  places no more pods there until it has room again.  Other taints are never touched.
* A pod on a node with a NoExecute taint goes after its toleration period:
  ``tolerationSeconds`` of a matching toleration (a matching toleration without
  it: never), else, for the two taints above, ``pod_eviction_timeout_seconds``
  (Kubernetes' DefaultTolerationSeconds), else at once.  The period counts from
  the taint's ``timeAdded``.  :meth:`NodeLifecycle.evict_from_lost_node` is the
  one place that removes such a pod (the migration feature restores it from a
  checkpoint there instead).

Work-queue keys are node names.  A node is synced at each event of its Node and its Lease,
and when its grace would run out (each sync schedules that look).  A periodic monitor
(every ``node_monitor_period_seconds``) walks every node in turns (kube32.controllers.base)
and syncs those that may need it: not heard from yet, overdue, not Ready, or tainted by
this controller; a healthy node is left to its events and its timer (at 1,000 nodes a sync
of every node every second was 1,000 syncs a second on the API server's event loop, for
nothing).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any

from .. import movability, objects
from ..client import CHECKPOINTS, LEASES, NODES, PODS, ApiError
from ..client.informer import BY_NODE_NAME, by_node_name
from ..matching import tolerates
from ..terms import NODE_LEASE_NAMESPACE, Condition, Effect, Policy, Taint
from .base import Controller, in_turns
from .checkpoint import replaced_by_move, replacement_of
from .periodic import PERIODIC_OF, latest_periodic, periodic_of

log = logging.getLogger("kube32.nodelifecycle")
Obj = dict[str, Any]

LIFECYCLE_TAINT_KEYS = (Taint.UNREACHABLE, Taint.NOT_READY)
MANAGED_TAINT_KEYS = (*LIFECYCLE_TAINT_KEYS, Taint.MEMORY_PRESSURE)   # what this controller writes
UNKNOWN_REASON = "NodeStatusUnknown"
UNKNOWN_MESSAGE = "Kubelet stopped posting node status."
NEVER_MESSAGE = "Kubelet never posted node status."


def rfc3339(t: float | None = None) -> str:
    """An epoch time (now when None) as RFC 3339."""
    return objects.rfc3339(None if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc))


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 timestamp as epoch seconds, None when missing or not one."""
    when = objects.parse_time(text)
    return None if when is None else when.timestamp()


def desired_lifecycle_taints(ready: str | None, memory_pressure: str | None = None) -> set[tuple[str, str]]:
    key = {"Unknown": Taint.UNREACHABLE, None: Taint.UNREACHABLE, "False": Taint.NOT_READY}.get(ready)
    if key:
        return {(key, Effect.NO_SCHEDULE), (key, Effect.NO_EXECUTE)}
    return {(Taint.MEMORY_PRESSURE, Effect.NO_SCHEDULE)} if memory_pressure == "True" else set()


def with_lifecycle_taints(taints: list[Obj], ready: str | None, now: float,
                          memory_pressure: str | None = None) -> list[Obj] | None:
    """The node's taints with the taints that its Ready and MemoryPressure conditions call
    for, or None when they are already right.  Kept taints keep their timeAdded."""
    want = desired_lifecycle_taints(ready, memory_pressure)
    have = {(t.get("key"), t.get("effect")) for t in taints if t.get("key") in MANAGED_TAINT_KEYS}
    if have == want:
        return None
    out = [t for t in taints if t.get("key") not in MANAGED_TAINT_KEYS or (t.get("key"), t.get("effect")) in want]
    for key, effect in sorted(want - have):
        taint: Obj = {"key": key, "effect": effect}
        if effect == Effect.NO_EXECUTE:
            taint["timeAdded"] = rfc3339(now)
        out.append(taint)
    return out


def toleration_seconds(pod: Obj, taint: Obj, default_seconds: float) -> float | None:
    """How long the pod stays on a node with this NoExecute taint; None = for ever."""
    matching = [t for t in objects.spec(pod).get("tolerations") or []
                if isinstance(t, dict) and tolerates(t, taint)]
    if matching:
        limits = [t.get("tolerationSeconds") for t in matching]
        if any(s is None for s in limits):
            return None
        return float(max(0, min(int(s) for s in limits if s is not None)))
    return default_seconds if taint.get("key") in LIFECYCLE_TAINT_KEYS else 0.0


def eviction_deadline(pod: Obj, taints: list[Obj], default_seconds: float, now: float) -> float | None:
    """When the pod must go (wall clock), None = never: the earliest over NoExecute taints."""
    deadline = None
    for taint in taints:
        if taint.get("effect") != Effect.NO_EXECUTE:
            continue
        seconds = toleration_seconds(pod, taint, default_seconds)
        if seconds is None:
            continue
        added = parse_time(taint.get("timeAdded")) or now
        at = added + seconds
        deadline = at if deadline is None else min(deadline, at)
    return deadline


POD_EVENT_BATCH_SECONDS = 0.2
BY_NODE = BY_NODE_NAME   # the pods informer's index of pods by node


class NodeLifecycle(Controller):
    name = "node-controller"
    workers = 2

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.nodes = ctx.informers.get(NODES)
        self.leases = ctx.informers.get(LEASES)
        self.pods = ctx.informers.get(PODS)
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        # A node's pods and a pod's periodic checkpoints by index: a lost node's sync reads
        # its own pods, not every pod of the cluster (issue 25).
        self.pods.add_index(BY_NODE, by_node_name)
        self.checkpoints.add_index(PERIODIC_OF, periodic_of)
        self._heard: dict[str, tuple[tuple, float]] = {}  # node -> (heartbeat marks, monotonic when they changed)
        self._evicting: set[str] = set()                  # pod uids already handed to evict_from_lost_node
        self._last_ready: dict[str, str | None] = {}      # node -> Ready status last seen (for events)

    def setup(self) -> None:
        self.nodes.add_handler(lambda _t, node, _o: self.queue.add(node["metadata"]["name"]))
        self.leases.add_handler(self._on_lease)
        self.pods.add_handler(self._on_pod)

    def _on_lease(self, _t: str, lease: Obj, _o: Obj | None) -> None:
        md = objects.meta(lease)
        if md.get("namespace") == NODE_LEASE_NAMESPACE:
            self.queue.add(md.get("name", ""))

    def _on_pod(self, etype: str, pod: Obj, _o: Obj | None) -> None:
        """A pod matters here only on a node with NoExecute taints (its evictions); the
        node's own events bring the taints, and its sync looks at every pod then."""
        name = objects.spec(pod).get("nodeName")
        if etype == "DELETED" or not name:
            return
        node = self.nodes.get(name)
        if node is None or any(t.get("effect") == Effect.NO_EXECUTE for t in objects.spec(node).get("taints") or []):
            # Batched: each sync looks at every pod, and a storm of pod events (a lost
            # node's thousand pods being marked) must not make it one sync per event.
            self.queue.add_after(name, POD_EVENT_BATCH_SECONDS)

    async def run(self) -> None:
        await asyncio.gather(super().run(), self._monitor())

    async def _monitor(self) -> None:
        while True:
            async for node in in_turns(self.nodes.list()):
                if self._worth_a_look(node):
                    self.queue.add(node["metadata"]["name"])
            await asyncio.sleep(self.ctx.options.node_monitor_period_seconds)

    def _worth_a_look(self, node: Obj) -> bool:
        """Whether the monitor syncs ``node`` (see the module docstring)."""
        name = node["metadata"]["name"]
        seen = self._heard.get(name)
        if seen is None or objects.condition_status(node, Condition.READY) != "True":
            return True
        if any(t.get("key") in MANAGED_TAINT_KEYS for t in objects.spec(node).get("taints") or []):
            return True
        return time.monotonic() - seen[1] >= self.ctx.options.node_monitor_grace_seconds

    # --- health ---------------------------------------------------------------
    def _silent_for(self, node: Obj) -> float:
        """Seconds since this controller last saw the node's heartbeat change."""
        name = node["metadata"]["name"]
        lease = self.leases.get(f"{NODE_LEASE_NAMESPACE}/{name}") or {}
        ready: Obj = objects.condition(node, Condition.READY) or {}
        marks = (objects.spec(lease).get("renewTime"), ready.get("lastHeartbeatTime"))
        now = time.monotonic()
        seen = self._heard.get(name)
        if seen is None or seen[0] != marks:
            self._heard[name] = (marks, now)
            return 0.0
        return now - seen[1]

    async def sync(self, key: Any) -> None:
        name = str(key)
        node = self.nodes.get(name)
        if node is None:
            self._heard.pop(name, None)
            self._last_ready.pop(name, None)
            return
        opts = self.ctx.options
        silent = self._silent_for(node)
        ready = objects.condition_status(node, Condition.READY)
        try:
            if silent >= opts.node_monitor_grace_seconds and ready != "Unknown":
                node = await self._mark_unknown(node)
                ready = "Unknown"
            elif ready != "Unknown":
                # Not overdue yet: look again when it would be.
                self.queue.add_after(name, opts.node_monitor_grace_seconds - silent + 0.05)
            node = await self._update_taints(node, ready)
        except ApiError as e:
            if e.code != 409:
                raise
            # The cache was behind our own (or the kubelet's) last write: look again shortly.
            self.queue.add_after(name, 0.1)
            return
        await self._record_transition(node, ready)
        await self._evict_pods(node)

    async def _record_transition(self, node: Obj, ready: str | None) -> None:
        """NodeNotReady / NodeReady events when Ready leaves or reaches True (first sight: none)."""
        name = node["metadata"]["name"]
        before = self._last_ready.get(name, ready)
        self._last_ready[name] = ready
        if before == "True" and ready != "True":
            await self.recorder.record(node, "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady")
        elif before != "True" and ready == "True":
            await self.recorder.record(node, "Normal", "NodeReady", f"Node {name} status is now: NodeReady")

    async def _mark_unknown(self, node: Obj) -> Obj:
        name = node["metadata"]["name"]
        now = rfc3339()
        conditions = []
        old = objects.status(node).get("conditions") or []
        for c in old:
            c = dict(c)
            if c.get("type") not in Condition.KUBELET_NODE:
                conditions.append(c)
                continue
            if c.get("status") != "Unknown":
                c["lastTransitionTime"] = now
            c.update(status="Unknown", reason=UNKNOWN_REASON, message=UNKNOWN_MESSAGE)
            conditions.append(c)
        if not any(c.get("type") == Condition.READY for c in conditions):
            conditions.append({"type": Condition.READY, "status": "Unknown", "reason": UNKNOWN_REASON,
                               "message": NEVER_MESSAGE, "lastTransitionTime": now})
        patch = {"metadata": {"resourceVersion": node["metadata"].get("resourceVersion")},
                 "status": {"conditions": conditions}}
        out = await self.client.patch(NODES, name, patch, subresource="status")
        log.info("node %s: no heartbeat for %.0fs, Ready=Unknown", name, self.ctx.options.node_monitor_grace_seconds)
        await self._mark_pods_not_ready(name)
        return out

    async def _mark_pods_not_ready(self, node_name: str) -> None:
        for pod in self.pods.by_index(BY_NODE, node_name):
            if objects.node_name(pod) != node_name or objects.condition_status(pod, Condition.READY) == "False":
                continue
            md = pod["metadata"]
            cond = {"type": Condition.READY, "status": "False", "reason": "NodeNotReady",
                    "lastTransitionTime": rfc3339(), "lastProbeTime": None}
            # Guarded by the version the informer showed: a pod replaced under its name in
            # the meantime (a move, a restore elsewhere) is another pod, Ready where it runs.
            patch = {"metadata": {"resourceVersion": md.get("resourceVersion")}, "status": {"conditions": [cond]}}
            try:
                await self.client.patch(PODS, md["name"], patch, md.get("namespace"),
                                        type="strategic", subresource="status")
                await self.recorder.record(pod, "Warning", "NodeNotReady", "Node is not ready")
            except ApiError as e:
                if e.code not in (404, 409):   # gone, or changed since (replaced: not this pod)
                    log.warning("cannot mark pod %s/%s not ready: %s", md.get("namespace"), md["name"], e)

    async def _update_taints(self, node: Obj, ready: str | None) -> Obj:
        taints = list(objects.spec(node).get("taints") or [])
        new = with_lifecycle_taints(taints, ready, time.time(),
                                    objects.condition_status(node, Condition.MEMORY_PRESSURE))
        if new is None:
            return node
        patch = {"metadata": {"resourceVersion": node["metadata"].get("resourceVersion")},
                 "spec": {"taints": new or None}}
        return await self.client.patch(NODES, node["metadata"]["name"], patch)

    # --- evictions ------------------------------------------------------------
    async def _evict_pods(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        taints = [t for t in objects.spec(node).get("taints") or [] if t.get("effect") == Effect.NO_EXECUTE]
        if not taints:
            return
        now = time.time()
        soonest = None
        for pod in self.pods.by_index(BY_NODE, name):
            md = objects.meta(pod)
            if objects.spec(pod).get("nodeName") != name or md.get("uid") in self._evicting:
                continue
            if md.get("deletionTimestamp") and objects.condition_status(node, Condition.READY) != "Unknown":
                continue  # being deleted; its kubelet confirms it
            deadline = eviction_deadline(pod, taints, self.ctx.options.pod_eviction_timeout_seconds, now)
            if deadline is None:
                continue
            if deadline > now:
                soonest = deadline if soonest is None else min(soonest, deadline)
                continue
            if replaced_by_move(self.checkpoints, pod):
                # A move's replacement on a lost target: deleting it would lose the pod's
                # state.  The Checkpoint controller rolls it back to its source from the
                # same Checkpoint within the rollback timeout.
                continue
            self._evicting.add(md.get("uid", ""))
            try:
                await self.recorder.record(pod, "Normal", "TaintManagerEviction",
                                           f"Marking for deletion Pod {md.get('namespace')}/{md.get('name')}")
                await self.evict_from_lost_node(pod, node)
            finally:
                self._evicting.discard(md.get("uid", ""))
        if soonest is not None:
            self.queue.add_after(name, soonest - now + 0.05)

    async def _restore_elsewhere(self, pod: Obj, node: Obj) -> bool:
        """A pod with a Saved periodic checkpoint is replaced, in one write, by one that
        the scheduler binds anew and that restores from the latest such checkpoint
        (owned or not).  Returns whether it was."""
        md = pod["metadata"]
        if movability.policy(pod) == Policy.NEVER:
            return False
        ns = md.get("namespace", "")
        latest = latest_periodic(self.checkpoints.by_index(PERIODIC_OF, f"{ns}/{md['name']}"), ns, md["name"])
        if latest is None:
            return False
        replacement = replacement_of(pod, None, latest["metadata"]["name"])
        try:
            await self.client.post_subresource(PODS, md["name"], "replacement", replacement, md.get("namespace"),
                                               params={"uid": md["uid"]})
        except ApiError as e:
            if e.code in (404, 409):
                return True  # gone or replaced meanwhile: nothing left to evict
            raise
        log.info("pod %s/%s of lost node %s will restore from %s", md.get("namespace"), md["name"],
                 node["metadata"]["name"], latest["metadata"]["name"])
        await self.recorder.record(pod, "Normal", "TaintManagerEviction",
                                   f"Node {node['metadata']['name']} is lost: the pod restores elsewhere from "
                                   f"periodic checkpoint {latest['metadata']['name']}")
        return True

    async def evict_from_lost_node(self, pod: Obj, node: Obj) -> None:
        """Remove a pod whose node has a NoExecute taint it no longer tolerates.

        Its owner makes a new pod; Kubernetes deletes ownerless pods too.  A node that
        stopped answering (Ready Unknown) cannot confirm a graceful deletion, so the pod
        goes at once (grace 0, as PodGC does); on a node whose kubelet reports NotReady
        the kubelet stops it.  The migration feature extends this method: a pod with a
        Saved periodic checkpoint is replaced by one carrying ``kube32.io/restore-from``."""
        md = pod["metadata"]
        if await self._restore_elsewhere(pod, node):
            return
        force = objects.condition_status(node, Condition.READY) != "False"
        try:
            await self.client.delete(PODS, md["name"], md.get("namespace"), uid=md.get("uid"),
                                     grace_period=0 if force else None)
            log.info("evicted pod %s/%s from node %s", md.get("namespace"), md["name"], node["metadata"]["name"])
        except ApiError as e:
            if e.code not in (404, 409):  # gone already, or replaced (another uid)
                raise
