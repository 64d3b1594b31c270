"""The scheduler: binds pending pods to nodes, as kube-scheduler's default profile does.

Design: the choice is a pure function, :func:`pick_node`, over plain dicts
(the pod, the nodes, the pods already placed), so the checkpoint controller can
ask "where would the scheduler put this pod, with this extra nodeSelector, never
on that node" without a scheduler running.  :class:`Scheduler` is the control
loop around it: one work-queue key (:data:`PASS`) stands for "look at every
pending pod"; any pod or node event adds it (level-triggered), and a pass
schedules the pending pods in order of creation, one at a time, so each
binding is counted when the next pod is placed.

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
requested, then the node name, so a Deployment of 3 spreads over 3 nodes and
the choice is deterministic.

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
from typing import Any, Iterable

from ..client import NODES, PODS, ApiError
from ..podfit import node_allocatable, pod_is_active, pod_requests, shortfalls
from .base import Controller

log = logging.getLogger("kube32.scheduler")
Obj = dict[str, Any]

SCHEDULER_NAME = "default-scheduler"
PASS = "pending-pods"                     # the one work-queue key: "look at every pending pod"
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
REPORT_AGAIN_SECONDS = 60.0              # a FailedScheduling with the same message, at most this often

# --- predicates --------------------------------------------------------------

def condition_status(obj: Obj, ctype: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c.get("status")
    return None


def node_ready(node: Obj) -> bool:
    return condition_status(node, "Ready") == "True"


def toleration_matches(toleration: Obj, taint: Obj) -> bool:
    """Kubernetes' ToleratesTaint: an empty effect tolerates every effect; an empty key
    with Exists tolerates every taint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def tolerates(pod: Obj, taint: Obj) -> bool:
    return any(toleration_matches(t, taint) for t in (pod.get("spec") or {}).get("tolerations") or []
               if isinstance(t, dict))


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    for taint in (node.get("spec") or {}).get("taints") or []:
        if isinstance(taint, dict) and taint.get("effect") in SCHEDULING_EFFECTS and not tolerates(pod, taint):
            return taint
    return None


def _requirement_matches(req: Obj, value: str | None) -> bool:
    op, values = req.get("operator"), [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            have, want = int(value), int(values[0])  # type: ignore[arg-type]
        except (TypeError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_selector_term_matches(term: Obj, node: Obj) -> bool:
    """A nodeSelectorTerm: all matchExpressions (labels) and matchFields (metadata.name).
    An empty term matches nothing, as in Kubernetes."""
    exprs = [e for e in term.get("matchExpressions") or [] if isinstance(e, dict)]
    fields = [e for e in term.get("matchFields") or [] if isinstance(e, dict)]
    if not exprs and not fields:
        return False
    md = node.get("metadata") or {}
    labels = md.get("labels") or {}
    for e in exprs:
        if not _requirement_matches(e, labels.get(e.get("key", ""))):
            return False
    for e in fields:
        value = md.get("name") if e.get("key") == "metadata.name" else None
        if not _requirement_matches(e, value):
            return False
    return True


def matches_node_selection(pod: Obj, node: Obj, extra_node_selector: dict[str, str] | None = None) -> bool:
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = {**(spec.get("nodeSelector") or {}), **(extra_node_selector or {})}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    terms = [t for t in (required.get("nodeSelectorTerms") or []) if isinstance(t, dict)]
    return any(node_selector_term_matches(t, node) for t in terms)


def _uid(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


@dataclass(frozen=True)
class NodeUsage:
    requested: dict[str, Fraction]
    pods: tuple[Obj, ...]


def usage_by_node(pods: Iterable[Obj], skip_uid: str = "") -> dict[str, NodeUsage]:
    acc: dict[str, tuple[dict[str, Fraction], list[Obj]]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or not pod_is_active(p) or (skip_uid and _uid(p) == skip_uid):
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
    if (node.get("spec") or {}).get("unschedulable"):
        return ["node(s) were unschedulable"]
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return [f"node(s) had untolerated taint {_format_taint(taint)}"]
    if not node_ready(node):
        return ["node(s) were not ready"]
    if not matches_node_selection(pod, node, extra_node_selector):
        return ["node(s) didn't match Pod's node affinity/selector"]
    usage = usage or NodeUsage({}, ())
    return ["Too many pods" if short.resource == "pods" else f"Insufficient {short.resource}"
            for short in shortfalls(pod, node_allocatable(node), usage.requested, len(usage.pods))]


def _owner_uid(pod: Obj) -> str | None:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    ctrl = next((r for r in refs if isinstance(r, dict) and r.get("controller")), None)
    ref = ctrl or (refs[0] if refs and isinstance(refs[0], dict) else None)
    return ref.get("uid") if ref else None


def _siblings(pod: Obj, usage: NodeUsage | None) -> int:
    if usage is None:
        return 0
    owner = _owner_uid(pod)
    if owner:
        return sum(1 for p in usage.pods if _owner_uid(p) == owner)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not labels:
        return 0
    return sum(1 for p in usage.pods if ((p.get("metadata") or {}).get("labels") or {}) == labels)


def _memory_fraction(node: Obj, usage: NodeUsage | None) -> Fraction:
    alloc = node_allocatable(node).get("memory", Fraction(0))
    used = usage.requested.get("memory", Fraction(0)) if usage else Fraction(0)
    return used / alloc if alloc > 0 else Fraction(0)


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
    usage = usage_by_node(pods, skip_uid=_uid(pod))
    reasons: dict[str, int] = {}
    fits: list[tuple[int, Fraction, str]] = []
    for node in nodes:
        name = _name(node)
        if name in exclude:
            why = ["node(s) were excluded"]
        else:
            why = node_misfits(pod, node, usage.get(name), extra_node_selector)
        if why:
            for r in why:
                reasons[r] = reasons.get(r, 0) + 1
            continue
        fits.append((_siblings(pod, usage.get(name)), _memory_fraction(node, usage.get(name)), name))
    if not fits:
        return None, fit_error(len(nodes), reasons)
    best = min(fits)[2]
    return best, f"Successfully assigned {(pod.get('metadata') or {}).get('namespace', 'default')}/{_name(pod)} to {best}"


# --- the control loop -------------------------------------------------------------

def wants_scheduling(pod: Obj) -> bool:
    spec, md = pod.get("spec") or {}, pod.get("metadata") or {}
    return (not spec.get("nodeName") and not md.get("deletionTimestamp")
            and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
            and pod_is_active(pod))


def _creation_order(pod: Obj) -> tuple[str, str, str]:
    md = pod.get("metadata") or {}
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
        ctx.shared["pick_node"] = self.pick

    def setup(self) -> None:
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(lambda *_: self.queue.add(PASS))

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        # Pending pods need a pass; a pod leaving a node (deleted, finished) frees room.
        if etype == "DELETED" or wants_scheduling(pod) or (old is not None and pod_is_active(old) != pod_is_active(pod)):
            self.queue.add(PASS)

    async def resync(self) -> None:
        self.queue.add(PASS)

    def placed_pods(self) -> list[Obj]:
        """The cached pods with the scheduler's own bindings applied."""
        out = []
        live = set()
        for p in self.pods.list():
            uid = _uid(p)
            live.add(uid)
            node = self._assumed.get(uid)
            if node and not (p.get("spec") or {}).get("nodeName"):
                p = {**p, "spec": {**(p.get("spec") or {}), "nodeName": node}}
            elif node:
                self._assumed.pop(uid, None)
            out.append(p)
        for uid in [u for u in self._assumed if u not in live]:
            self._assumed.pop(uid, None)
        return out

    def pick(self, pod: Obj, extra_node_selector: dict[str, str] | None = None,
             exclude: set[str] | frozenset[str] = frozenset()) -> tuple[str | None, str]:
        """:func:`pick_node` over the scheduler's current view (for other controllers)."""
        return pick_node(pod, self.nodes.list(), self.placed_pods(), extra_node_selector, exclude)

    async def sync(self, key: Any) -> None:
        pods = self.placed_pods()
        pending = sorted((p for p in pods if wants_scheduling(p) and _uid(p) not in self._assumed),
                         key=_creation_order)
        failed = None
        for pod in pending:
            try:
                await self.schedule_one(pod, pods)
            except ApiError as e:
                failed = e
        live = {_uid(p) for p in pods}
        for uid in [u for u in self._reported if u not in live]:
            self._reported.pop(uid, None)
        if failed is not None:
            raise failed  # retried with back-off; the bound ones are already assumed

    async def schedule_one(self, pod: Obj, pods: list[Obj]) -> None:
        md = pod["metadata"]
        node, message = pick_node(pod, self.nodes.list(), pods)
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
        pods.append({**pod, "spec": {**pod["spec"], "nodeName": node}})
        self._reported.pop(md["uid"], None)
        await self.recorder.record(pod, "Normal", "Scheduled", message)
        await self._set_condition(pod, "True", None, None)

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
        cond: Obj = {"type": "PodScheduled", "status": status, "lastProbeTime": None,
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
