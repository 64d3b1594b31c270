"""The scheduler: binds pending pods to nodes, as kube-scheduler's default profile does.

Design: the choice is a pure function, :func:`pick_node`, over plain dicts
(the pod, the nodes, the pods already placed), so the checkpoint controller can
ask "where would the scheduler put this pod, with this extra nodeSelector, never
on that node" without a scheduler running.  :class:`Scheduler` is the control
loop around it: one work-queue key (:data:`PASS`) stands for "look at every
pending pod"; an event of a pending pod, a pod leaving a node while some are
pending, and a node event that changes what a choice reads of it while some are
pending add it (level-triggered; the resync every 30 s too), and a pass
schedules the pending pods in order of creation, one at a time, so each
binding is counted when the next pod is placed.

Cost (issue 25: a fleet of a thousand nodes reports status 100 times a second):
the scheduler keeps the pending pods and each node's pods and usage
(:class:`PodsByNode`) from the informers' events, so a pass is O(pending x nodes)
and a node's status report with nothing pending costs nothing; neither sums every
pod of the cluster.

Filters, in order (a node fails on the first that does not pass, and the
reason is counted for the FailedScheduling message, as Kubernetes' FitError):

1. excluded by the caller (``exclude``);
2. ``spec.unschedulable`` (cordoned): "node(s) were unschedulable";
3. a NoSchedule/NoExecute taint the pod does not tolerate:
   "node(s) had untolerated taint {key: value}";
4. not Ready: "node(s) were not ready";
5. ``nodeSelector`` and required node affinity: "node(s) didn't match Pod's node
   affinity/selector";
6. room: pod count ("Too many pods"), memory and the extended resources
   ``hardware.kube32.io/*`` / ``esp32.io/*`` ("Insufficient memory"): requests
   (limits where a request is unset) against allocatable minus what the pods
   bound there request (:mod:`kube32.podfit`, which the kubelet's admission uses
   too).  Every resource short is a reason of its own.

Score (lowest wins): pods of the same owner (or, ownerless, with the same
labels) already on the node, then the fraction of allocatable memory
requested, then the fraction of its pod slots in use, then the node name, so a
Deployment of 3 spreads over 3 nodes, pods that request nothing spread over idle
nodes (Kubernetes' LeastAllocated counts such pods with its default non-zero
requests; round 25 found every such pod, and a drain's, on the first node by name),
and the choice is deterministic.

Invariants: a pod is bound only through ``pods/<name>/binding`` (the API server
refuses a second binding); a pod the scheduler bound is counted on its node
from the moment the binding succeeded, before the informer shows it.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable

from .. import objects
from ..client import NODES, PODS, ApiError
from ..client.informer import key_of
from ..matching import node_affinity_matches, tolerated
from ..podfit import node_allocatable, pod_is_active, pod_requests, shortfalls
from ..terms import Condition, Effect
from .base import Controller, in_turns

log = logging.getLogger("kube32.scheduler")
Obj = dict[str, Any]

SCHEDULER_NAME = "default-scheduler"
PASS = "pending-pods"                     # the one work-queue key: "look at every pending pod"
REPORT_AGAIN_SECONDS = 60.0              # a FailedScheduling with the same message, at most this often

# --- predicates --------------------------------------------------------------

def node_ready(node: Obj) -> bool:
    return objects.is_true(node, Condition.READY)


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    tolerations = objects.spec(pod).get("tolerations")
    for taint in objects.spec(node).get("taints") or []:
        if isinstance(taint, dict) and taint.get("effect") in Effect.SCHEDULING and not tolerated(tolerations, taint):
            return taint
    return None


@dataclass(frozen=True)
class NodeUsage:
    requested: dict[str, Fraction]
    pods: tuple[Obj, ...]


def usage_by_node(pods: Iterable[Obj], skip_uid: str = "") -> dict[str, NodeUsage]:
    acc: dict[str, tuple[dict[str, Fraction], list[Obj]]] = {}
    for p in pods:
        node = objects.spec(p).get("nodeName")
        if not node or not pod_is_active(p) or (skip_uid and objects.uid(p) == skip_uid):
            continue
        req, members = acc.setdefault(node, ({}, []))
        for k, v in pod_requests(p).items():
            req[k] = req.get(k, Fraction(0)) + v
        members.append(p)
    return {n: NodeUsage(r, tuple(m)) for n, (r, m) in acc.items()}


def _format_taint(taint: Obj) -> str:
    return f"{{{taint.get('key', '')}: {taint.get('value', '')}}}"


def node_misfits(pod: Obj, node: Obj, usage: NodeUsage | None,
                 extra_node_selector: dict[str, str] | None = None) -> list[str]:
    """Why the pod cannot go to this node (empty: it fits)."""
    if objects.spec(node).get("unschedulable"):
        return ["node(s) were unschedulable"]
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return [f"node(s) had untolerated taint {_format_taint(taint)}"]
    if not node_ready(node):
        return ["node(s) were not ready"]
    if not node_affinity_matches(objects.spec(pod), node, extra_node_selector):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return room_misfits(pod, node, usage)


def room_misfits(pod: Obj, node: Obj, usage: NodeUsage | None) -> list[str]:
    """Why the node has no room for the pod beside the pods bound there (empty: it has):
    filter 6 alone, which the kubelet's admission checks too.  A rollback to a cordoned
    source asks only this."""
    usage = usage or NodeUsage({}, ())
    return ["Too many pods" if short.resource == "pods" else f"Insufficient {short.resource}"
            for short in shortfalls(pod, node_allocatable(node), usage.requested, len(usage.pods))]


def room_on(pod: Obj, node: Obj, pods: Iterable[Obj]) -> list[str]:
    """:func:`room_misfits` on ``node`` beside those of ``pods`` bound there (the pod
    itself, by uid, aside)."""
    return room_misfits(pod, node, usage_by_node(pods, skip_uid=objects.uid(pod)).get(objects.name(node)))


def _owner_uid(pod: Obj) -> str | None:
    refs = objects.meta(pod).get("ownerReferences") or []
    ctrl = next((r for r in refs if isinstance(r, dict) and r.get("controller")), None)
    ref = ctrl or (refs[0] if refs and isinstance(refs[0], dict) else None)
    return ref.get("uid") if ref else None


def _siblings(pod: Obj, usage: NodeUsage | None) -> int:
    if usage is None:
        return 0
    owner = _owner_uid(pod)
    if owner:
        return sum(1 for p in usage.pods if _owner_uid(p) == owner)
    labels = objects.labels(pod)
    if not labels:
        return 0
    return sum(1 for p in usage.pods if objects.labels(p) == labels)


def _memory_fraction(node: Obj, usage: NodeUsage | None) -> Fraction:
    alloc = node_allocatable(node).get("memory", Fraction(0))
    used = usage.requested.get("memory", Fraction(0)) if usage else Fraction(0)
    return used / alloc if alloc > 0 else Fraction(0)


def _pods_fraction(node: Obj, usage: NodeUsage | None) -> Fraction:
    slots = node_allocatable(node).get("pods", Fraction(0))
    used = len(usage.pods) if usage else 0
    return Fraction(used) / slots if slots > 0 else Fraction(used)


def fit_error(total: int, reasons: dict[str, int]) -> str:
    """Kubernetes' FitError text: "0/3 nodes are available: 1 node(s) were unschedulable,
    2 Insufficient memory." (count-prefixed reasons, sorted)."""
    if total == 0:
        return "no nodes available to schedule pods"
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{total} nodes are available: {', '.join(parts)}."


def pick_node(pod: Obj, nodes: list[Obj], pods: list[Obj],
              extra_node_selector: dict[str, str] | None = None,
              exclude: set[str] | frozenset[str] = frozenset()) -> tuple[str | None, str]:
    """The node the scheduler picks for ``pod`` (None when none fits) and the reason.

    ``pods`` are the pods in the cluster (those with ``spec.nodeName`` count on their
    node; the pod itself, by uid, does not).  ``extra_node_selector`` is added to the
    pod's own nodeSelector; nodes named in ``exclude`` are never chosen.  Pure."""
    return pick_node_by(pod, nodes, usage_by_node(pods, skip_uid=objects.uid(pod)).get, extra_node_selector, exclude)


def pick_node_by(pod: Obj, nodes: list[Obj], usage_of: Callable[[str], NodeUsage | None],
                 extra_node_selector: dict[str, str] | None = None,
                 exclude: set[str] | frozenset[str] = frozenset()) -> tuple[str | None, str]:
    """:func:`pick_node` with each node's usage from ``usage_of`` (the pod itself not
    counted): O(nodes), whatever the number of pods (:class:`PodsByNode`)."""
    reasons: dict[str, int] = {}
    fits: list[tuple[int, Fraction, Fraction, str]] = []
    for node in nodes:
        name = objects.name(node)
        usage = None
        if name in exclude:
            why = ["node(s) were excluded"]
        else:
            usage = usage_of(name)
            why = node_misfits(pod, node, usage, extra_node_selector)
        if why:
            for r in why:
                reasons[r] = reasons.get(r, 0) + 1
            continue
        fits.append((_siblings(pod, usage), _memory_fraction(node, usage), _pods_fraction(node, usage), name))
    if not fits:
        return None, fit_error(len(nodes), reasons)
    best = min(fits)[-1]
    ns = objects.namespace(pod) or "default"
    return best, f"Successfully assigned {ns}/{objects.name(pod)} to {best}"


class PodsByNode:
    """The active pods bound to each node and what they request, kept from pod events
    (:meth:`put`, :meth:`remove`; keys are the informer's, ``namespace/name``): a choice
    reads each node's usage from here, O(1) a node, instead of summing every pod of the
    cluster (issue 25).  A node's usage is summed again only after one of its pods
    changed (:attr:`summed` counts it)."""

    def __init__(self) -> None:
        self._node_of: dict[str, str] = {}
        self._pods: dict[str, dict[str, Obj]] = {}
        self._usage: dict[str, NodeUsage | None] = {}
        self.summed = 0

    def put(self, key: str, pod: Obj) -> None:
        """``pod`` as it is now (its ``spec.nodeName`` says where it counts, if active)."""
        node = objects.spec(pod).get("nodeName")
        was = self._node_of.get(key)
        if was is not None and was != node:
            self.remove(key)
        if node and pod_is_active(pod):
            self._node_of[key] = node
            self._pods.setdefault(node, {})[key] = pod
            self._usage.pop(node, None)
        elif was is not None:
            self.remove(key)

    def remove(self, key: str) -> None:
        node = self._node_of.pop(key, None)
        if node is None:
            return
        members = self._pods.get(node, {})
        members.pop(key, None)
        if not members:
            self._pods.pop(node, None)
        self._usage.pop(node, None)

    def reset(self, pods: Iterable[tuple[str, Obj]]) -> None:
        self._node_of.clear()
        self._pods.clear()
        self._usage.clear()
        for key, pod in pods:
            self.put(key, pod)

    def keys(self) -> list[str]:
        """The keys of the pods counted now."""
        return list(self._node_of)

    def pods_on(self, node: str) -> list[Obj]:
        return list(self._pods.get(node, {}).values())

    def usage(self, node: str, skip_uid: str = "") -> NodeUsage | None:
        """What the pods on ``node`` request (None: no pod), ``skip_uid``'s aside."""
        members = self._pods.get(node)
        if not members:
            return None
        if skip_uid and any(objects.uid(p) == skip_uid for p in members.values()):
            return usage_by_node((p for p in members.values() if objects.uid(p) != skip_uid)).get(node)
        if node not in self._usage:
            self.summed += 1
            self._usage[node] = usage_by_node(members.values()).get(node)
        return self._usage[node]


UsageOf = Callable[[str], NodeUsage | None]


def usage_reader(shared: dict[str, Any], pods: Callable[[], list[Obj]], skip_uid: str = "") -> UsageOf:
    """Each node's usage (``skip_uid``'s pod aside): from the scheduler's
    :class:`PodsByNode` when it runs in this controller manager (``shared``, the
    context's), O(1) a node; else summed over ``pods()`` once, O(pods)."""
    index = shared.get("pods_by_node")
    if isinstance(index, PodsByNode):
        return lambda n: index.usage(n, skip_uid)
    return usage_by_node(pods(), skip_uid=skip_uid).get


def scheduling_facts(node: Obj | None) -> tuple[Any, ...]:
    """What a choice reads of a node (:func:`node_misfits`, the score): a node event that
    changes none of it (a status report's heartbeat, its free heap) can make no pending
    pod fit, so it asks for no pass."""
    if node is None:
        return ()
    spec, status = objects.spec(node), objects.status(node)
    return (bool(spec.get("unschedulable")), repr(spec.get("taints")), node_ready(node),
            repr(sorted(objects.labels(node).items())), repr(status.get("allocatable")))


# --- the control loop -------------------------------------------------------------

def wants_scheduling(pod: Obj) -> bool:
    spec, md = objects.spec(pod), objects.meta(pod)
    return (not spec.get("nodeName") and not md.get("deletionTimestamp")
            and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
            and pod_is_active(pod))


def _creation_order(pod: Obj) -> tuple[str, str, str]:
    md = objects.meta(pod)
    return (md.get("creationTimestamp", ""), md.get("namespace", ""), md.get("name", ""))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Scheduler(Controller):
    name = "default-scheduler"
    workers = 1  # one pass at a time: each binding is counted before the next choice

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pods = ctx.informers.get(PODS)
        self.nodes = ctx.informers.get(NODES)
        self._assumed: dict[str, str] = {}                    # pod uid -> node, until the cache shows it
        self._reported: dict[str, tuple[str, float]] = {}     # pod uid -> (message, when)
        self.by_node = PodsByNode()                            # the pods bound to each node, assumed ones too
        self._pending: dict[str, Obj] = {}                    # key -> a pod that wants scheduling
        self.passes = 0
        self._loaded = False   # no events followed (no setup()): the first pass reads the cache
        ctx.shared["pick_node"] = self.pick
        ctx.shared["pods_by_node"] = self.by_node

    def setup(self) -> None:
        # Before the informers start: their events build the pending pods and the usage.
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(self._on_node)
        self._loaded = True

    def _placed(self, pod: Obj) -> Obj:
        """The pod with the scheduler's own binding applied, until the informer shows it."""
        uid = objects.uid(pod)
        node = self._assumed.get(uid)
        if node is None:
            return pod
        if objects.spec(pod).get("nodeName"):
            self._assumed.pop(uid, None)
            return pod
        return {**pod, "spec": {**objects.spec(pod), "nodeName": node}}

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        key = key_of(pod)
        if etype == "DELETED":
            self.by_node.remove(key)
            self._pending.pop(key, None)
            self._assumed.pop(objects.uid(pod), None)
            self._reported.pop(objects.uid(pod), None)
            self.queue.add(PASS)   # room freed (a pass with nothing pending costs nothing)
            return
        placed = self._placed(pod)
        self.by_node.put(key, placed)
        if wants_scheduling(placed):
            self._pending[key] = placed
            self.queue.add(PASS)
        else:
            self._pending.pop(key, None)
            if old is not None and pod_is_active(old) != pod_is_active(pod):
                self.queue.add(PASS)   # a pod leaving a node (finished) frees room

    def _on_node(self, etype: str, node: Obj, old: Obj | None) -> None:
        # Only a node that changed in what a choice reads (or is new, or gone) asks for a
        # pass: a thousand nodes' status reports are not a thousand passes.
        if etype != "MODIFIED" or old is None or scheduling_facts(node) != scheduling_facts(old):
            self.queue.add(PASS)

    async def resync(self) -> None:
        await self._reload()
        self.queue.add(PASS)

    async def _reload(self) -> None:
        """:meth:`_load`'s safety net, in turns (kube32.controllers.base): every pod of the
        cache put again as it is when its turn comes (events between turns keep the state
        as they always do, so a pod is never put back as it was before one), then what the
        cache no longer holds dropped."""
        self._loaded = True
        async for key in in_turns(list(self.pods.cache)):
            pod = self.pods.get(key)
            if pod is not None:
                self._take(key, self._placed(pod))
        for key in [k for k in self.by_node.keys() if self.pods.get(k) is None]:
            self.by_node.remove(key)
        for key in [k for k in self._pending if self.pods.get(k) is None]:
            self._pending.pop(key, None)
        self._forget_gone({objects.uid(p) for p in self.pods.list()})

    def _take(self, key: str, placed: Obj) -> None:
        self.by_node.put(key, placed)
        if wants_scheduling(placed):
            self._pending[key] = placed
        else:
            self._pending.pop(key, None)

    def _forget_gone(self, live: set[str]) -> None:
        for uid in [u for u in self._assumed if u not in live]:
            self._assumed.pop(uid, None)
        for uid in [u for u in self._reported if u not in live]:
            self._reported.pop(uid, None)

    def _load(self) -> None:
        """The pending pods and each node's pods again, from the informer's cache."""
        self._loaded = True
        placed = [(key_of(p), self._placed(p)) for p in self.pods.list()]
        self.by_node.reset(placed)
        self._pending = {k: p for k, p in placed if wants_scheduling(p)}
        self._forget_gone({objects.uid(p) for _, p in placed})

    def pick(self, pod: Obj, extra_node_selector: dict[str, str] | None = None,
             exclude: set[str] | frozenset[str] = frozenset()) -> tuple[str | None, str]:
        """:func:`pick_node` over the scheduler's current view (for other controllers)."""
        uid = objects.uid(pod)
        return pick_node_by(pod, self.nodes.list(), lambda n: self.by_node.usage(n, uid), extra_node_selector, exclude)

    async def sync(self, key: Any) -> None:
        """One pass over the pending pods (not every pod), oldest first."""
        self.passes += 1
        if not self._loaded:
            self._load()
        if not self._pending:
            return
        pending = sorted((p for p in self._pending.values() if objects.uid(p) not in self._assumed),
                         key=_creation_order)
        failed = None
        nodes = self.nodes.list()
        for pod in pending:
            try:
                await self.schedule_one(pod, nodes)
            except ApiError as e:
                failed = e
        if failed is not None:
            raise failed  # retried with back-off; the bound ones are already assumed

    async def schedule_one(self, pod: Obj, nodes: list[Obj]) -> None:
        md = pod["metadata"]
        node, message = pick_node_by(pod, nodes, self.by_node.usage)
        if node is None:
            await self._unschedulable(pod, message)
            return
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": md["name"], "namespace": md.get("namespace", "default"), "uid": md.get("uid")},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            await self.client.create(PODS, binding, md.get("namespace"), subresource_of=md["name"],
                                     subresource="binding")
        except ApiError as e:
            if e.code in (404, 409):  # gone, being deleted, or bound by someone else: nothing to do
                log.debug("binding %s/%s skipped: %s", md.get("namespace"), md["name"], e)
                return
            raise
        self._assumed[md["uid"]] = node
        log.info("bound %s/%s to %s", md.get("namespace"), md["name"], node)  # as kube-scheduler's V(2)
        key = key_of(pod)
        self._pending.pop(key, None)
        self.by_node.put(key, {**pod, "spec": {**pod["spec"], "nodeName": node}})
        self._reported.pop(md["uid"], None)
        await self.recorder.record(pod, "Normal", "Scheduled", message)   # PodScheduled: set by the binding

    async def _unschedulable(self, pod: Obj, message: str) -> None:
        uid = pod["metadata"]["uid"]
        last = self._reported.get(uid)
        now = time.monotonic()
        if last is not None and last[0] == message and now - last[1] < REPORT_AGAIN_SECONDS:
            return
        self._reported[uid] = (message, now)
        await self.recorder.record(pod, "Warning", "FailedScheduling", message)
        await self._set_condition(pod, "False", "Unschedulable", message)

    async def _set_condition(self, pod: Obj, status: str, reason: str | None, message: str | None) -> None:
        cond: Obj = {"type": Condition.POD_SCHEDULED, "status": status, "lastProbeTime": None,
                     "lastTransitionTime": _now()}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        md = pod["metadata"]
        try:
            await self.client.patch(PODS, md["name"], {"status": {"conditions": [cond]}}, md.get("namespace"),
                                    type="strategic", subresource="status")
        except ApiError as e:
            log.debug("cannot set PodScheduled on %s/%s: %s", md.get("namespace"), md["name"], e)
