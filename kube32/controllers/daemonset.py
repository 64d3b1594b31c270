"""The DaemonSet controller: one pod per eligible node, as ``daemon_controller.go``.

``sync(namespace/name)`` groups the DaemonSet's pods by target node (``spec.nodeName``,
or for a pod not bound yet the node its ``matchFields metadata.name`` affinity
names) and, for every Node:

* the node *should run* a daemon pod when the pod would fit it: its
  ``nodeSelector`` and required node affinity match, and every NoSchedule /
  NoExecute taint is tolerated (the template's tolerations plus the ones
  Kubernetes adds to every daemon pod: not-ready, unreachable, unschedulable,
  disk/memory/pid-pressure, network-unavailable); it *may keep* one when every
  NoExecute taint is tolerated;
* a node that should run one and has none gets a pod, pinned to it by a
  required node affinity ``matchFields metadata.name In [node]`` (the
  scheduler binds it, as in Kubernetes); a node that has a pod but may not keep
  it loses it; failed pods are deleted (and recreated); of several pods on one
  node the oldest stays;
* a template change rolls: pods are labelled ``controller-revision-hash`` with
  the template's hash; outdated pods that are not available go first, then
  available ones while at most ``maxUnavailable`` (default 1) nodes are
  without an available pod (OnDelete: only status is updated).

Pods are counted by ``namespace/name`` (see podutil): a pod replaced in one write
is still the same pod.  Status: desiredNumberScheduled, currentNumberScheduled,
numberMisscheduled, numberReady, updatedNumberScheduled, numberAvailable,
numberUnavailable, observedGeneration.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

from ..client import DAEMONSETS, NODES, PODS, ApiError
from ..intstr import scaled_value
from . import podutil as pu
from .base import Controller

log = logging.getLogger("kube32.controllers.daemonset")
Obj = dict[str, Any]

API = "apps/v1"
REVISION_LABEL = "controller-revision-hash"
GENERATION_LABEL = "pod-template-generation"

# What the DaemonSet controller adds to every daemon pod (AddOrUpdateDaemonPodTolerations).
DEFAULT_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


# --- node eligibility -------------------------------------------------------------------
def tolerates(toleration: Obj, taint: Obj) -> bool:
    """corev1 Toleration.ToleratesTaint."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if not toleration.get("key") and op == "Equal":
        return False  # an empty key only tolerates everything with Exists
    return (toleration.get("value") or "") == (taint.get("value") or "")


def with_default_tolerations(tolerations: list[Obj] | None) -> list[Obj]:
    out = [dict(t) for t in tolerations or []]
    for t in DEFAULT_TOLERATIONS:
        if not any(x.get("key") == t["key"] and x.get("effect") == t["effect"] and
                   (x.get("operator") or "Equal") == "Exists" for x in out):
            out.append(dict(t))
    return out


def _requirement_matches(req: Obj, values: dict[str, str]) -> bool:
    key, op, vals = req.get("key", ""), req.get("operator", ""), req.get("values") or []
    present, value = key in values, values.get(key)
    if op == "In":
        return present and value in vals
    if op == "NotIn":
        return not present or value not in vals
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(vals) == 1:
        try:
            a, b = int(value or ""), int(vals[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_affinity_matches(affinity: Obj | None, node: Obj) -> bool:
    """Required node affinity: any term matches (all its expressions and fields); none = any node."""
    req = (((affinity or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms")
    if not terms:
        return True
    labels = pu.md(node).get("labels") or {}
    fields = {"metadata.name": pu.md(node).get("name", "")}
    for term in terms:
        exprs, mfields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not mfields:
            continue  # an empty term matches nothing
        if all(_requirement_matches(e, labels) for e in exprs) and \
                all(_requirement_matches(f, fields) for f in mfields):
            return True
    return False


def node_eligibility(template_spec: Obj, node: Obj) -> tuple[bool, bool]:
    """(should run a daemon pod, may keep a running one), as k8s NodeShouldRunDaemonPod."""
    labels = pu.md(node).get("labels") or {}
    if any(labels.get(k) != v for k, v in (template_spec.get("nodeSelector") or {}).items()):
        return False, False
    if not node_affinity_matches(template_spec.get("affinity"), node):
        return False, False
    tolerations = with_default_tolerations(template_spec.get("tolerations"))
    should_run, keep = True, True
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            should_run = False
            if taint.get("effect") == "NoExecute":
                keep = False
    return should_run, keep


def pin_to_node(spec: Obj, node_name: str) -> Obj:
    """The pod spec with its required node affinity replaced by ``metadata.name In [node]``."""
    spec = copy.deepcopy(spec)
    affinity = spec.setdefault("affinity", {})
    na = affinity.setdefault("nodeAffinity", {})
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    na["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [term]}
    spec["tolerations"] = with_default_tolerations(spec.get("tolerations"))
    return spec


def target_node(pod: Obj) -> str | None:
    """Where a daemon pod runs or will run (k8s GetTargetNodeName)."""
    name = (pod.get("spec") or {}).get("nodeName")
    if name:
        return name
    req = ((((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in req.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(f.get("values") or []) == 1:
                return f["values"][0]
    return None


class DaemonSetController(Controller):
    name = "daemonset-controller"
    workers = 2

    def setup(self) -> None:
        self.ds_informer = self.ctx.informers.get(DAEMONSETS)
        self.node_informer = self.ctx.informers.get(NODES)
        self.pod_informer = self.ctx.informers.get(PODS)
        self.expectations = pu.Expectations()
        self.ds_informer.add_handler(self._on_ds)
        self.node_informer.add_handler(self._on_node)
        self.pod_informer.add_handler(self._on_pod)

    def _on_ds(self, etype: str, ds: Obj, old: Obj | None) -> None:
        if etype == "DELETED":
            self.expectations.forget(pu.pod_key(ds))
        self.queue.add(pu.pod_key(ds))

    def _on_node(self, etype: str, node: Obj, old: Obj | None) -> None:
        if old is not None and etype == "MODIFIED" and \
                (pu.md(node).get("labels"), (node.get("spec") or {}).get("taints")) == \
                (pu.md(old).get("labels"), (old.get("spec") or {}).get("taints")):
            return  # heartbeats and status: eligibility did not change
        for ds in self.ds_informer.list():
            self.queue.add(pu.pod_key(ds))

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        what = pu.pod_event_kind(etype, pod, old)
        owner = pu.owner_key_of(pod, "DaemonSet")
        if what == "added" and owner:
            self.expectations.creation_observed(owner)
        elif what == "deleted" and owner:
            self.expectations.deletion_observed(owner, pu.pod_key(pod))
        old_owner = pu.owner_key_of(old, "DaemonSet") if old else None
        for k in {owner, old_owner} - {None}:
            self.queue.add(k)

    async def resync(self) -> None:
        for ds in self.ds_informer.list():
            self.queue.add(pu.pod_key(ds))

    # --- sync ---------------------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        ds = self.ds_informer.get(key)
        if ds is None:
            self.expectations.forget(key)
            return
        ns = pu.md(ds).get("namespace", "default")
        spec = ds.get("spec") or {}
        template = spec.get("template") or {}
        tspec = template.get("spec") or {}
        h = pu.template_hash(template)
        nodes = {pu.md(n)["name"]: n for n in self.node_informer.list()}
        by_node: dict[str, list[Obj]] = {}
        for pod in self.pod_informer.list():
            if pu.md(pod).get("namespace") == ns and pu.is_controlled_by(pod, ds):
                by_node.setdefault(target_node(pod) or "", []).append(pod)

        create_on: list[str] = []
        delete: list[Obj] = []
        for name in sorted(set(nodes) | set(by_node)):
            node = nodes.get(name)
            should_run, keep = node_eligibility(tspec, node) if node is not None else (False, False)
            pods = by_node.get(name, [])
            live = [p for p in pods if not pu.is_terminating(p)]
            if should_run and not pods:
                create_on.append(name)
            elif keep:
                running = []
                for p in live:
                    if (p.get("status") or {}).get("phase") == "Failed" and not pu.awaits_replacement(p):
                        delete.append(p)  # recreated once it is gone
                    else:
                        running.append(p)
                running.sort(key=lambda p: (pu.md(p).get("creationTimestamp") or "", pu.md(p).get("name", "")))
                delete += running[1:]
            else:
                delete += live

        if self.expectations.satisfied(key) and not pu.md(ds).get("deletionTimestamp"):
            if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate":
                delete += self._rolling_victims(ds, nodes, by_node, h, {pu.pod_key(p) for p in delete})
            await self._manage(ds, key, create_on, delete, h)
        await self._update_status(ds, nodes, by_node, h)

    def _rolling_victims(self, ds: Obj, nodes: dict[str, Obj], by_node: dict[str, list[Obj]], h: str,
                         already: set[str]) -> list[Obj]:
        """Outdated pods to delete now: unavailable ones freely, then within maxUnavailable."""
        spec = ds.get("spec") or {}
        mrs = int(spec.get("minReadySeconds") or 0)
        eligible = [n for n, node in nodes.items() if node_eligibility((spec.get("template") or {}).get("spec") or {}, node)[0]]
        ru = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        budget = max(scaled_value(ru.get("maxUnavailable", 1), len(eligible), round_up=True), 1) \
            if eligible else 0
        unavailable = 0
        outdated_available: list[Obj] = []
        victims: list[Obj] = []
        for name in eligible:
            live = [p for p in by_node.get(name, []) if not pu.is_terminating(p)]
            if not live or not any(pu.is_available(p, mrs) for p in live):
                unavailable += 1
            for p in live:
                if (pu.md(p).get("labels") or {}).get(REVISION_LABEL) == h or pu.pod_key(p) in already:
                    continue
                if pu.is_available(p, mrs):
                    outdated_available.append(p)
                else:
                    victims.append(p)
        outdated_available.sort(key=lambda p: pu.md(p).get("name", ""))
        room = budget - unavailable
        return victims + outdated_available[:max(room, 0)]

    async def _manage(self, ds: Obj, key: str, create_on: list[str], delete: list[Obj], h: str) -> None:
        self.expectations.expect_creations(key, len(create_on))
        self.expectations.expect_deletions(key, [pu.pod_key(p) for p in delete])
        template = (ds.get("spec") or {}).get("template") or {}
        errors: list[BaseException] = []

        async def create(node_name: str) -> None:
            pod = pu.pod_from_template(template, ds, API, "DaemonSet")
            pod["metadata"]["labels"][REVISION_LABEL] = h
            pod["metadata"]["labels"][GENERATION_LABEL] = str(pu.md(ds).get("generation", 1))
            pod["spec"] = pin_to_node(pod["spec"], node_name)
            try:
                out = await self.client.create(PODS, pod, pu.md(ds).get("namespace"))
            except ApiError as e:
                self.expectations.creation_observed(key)
                await self.recorder.record(ds, "Warning", "FailedCreate", f"Error creating: {e}")
                errors.append(e)
                return
            await self.recorder.record(ds, "Normal", "SuccessfulCreate",
                                       f"Created pod: {pu.md(out)['name']}")

        async def remove(pod: Obj) -> None:
            pmd = pu.md(pod)
            try:
                await self.client.delete(PODS, pmd["name"], pmd.get("namespace"), uid=pmd.get("uid"))
            except ApiError as e:
                self.expectations.deletion_observed(key, pu.pod_key(pod))
                if e.code not in (404, 409):
                    await self.recorder.record(ds, "Warning", "FailedDelete", f"Error deleting: {e}")
                    errors.append(e)
                return
            await self.recorder.record(ds, "Normal", "SuccessfulDelete", f"Deleted pod: {pmd['name']}")

        await asyncio.gather(*(create(n) for n in create_on), *(remove(p) for p in delete))
        if errors:
            raise errors[0]

    async def _update_status(self, ds: Obj, nodes: dict[str, Obj], by_node: dict[str, list[Obj]], h: str) -> None:
        spec = ds.get("spec") or {}
        tspec = (spec.get("template") or {}).get("spec") or {}
        mrs = int(spec.get("minReadySeconds") or 0)
        desired = current = misscheduled = ready = updated = available = 0
        for name, node in nodes.items():
            should_run, _ = node_eligibility(tspec, node)
            live = [p for p in by_node.get(name, []) if not pu.is_terminating(p)]
            if should_run:
                desired += 1
                if live:
                    current += 1
                    newest = max(live, key=lambda p: pu.md(p).get("creationTimestamp") or "")
                    if pu.is_ready(newest):
                        ready += 1
                    if pu.is_available(newest, mrs):
                        available += 1
                    if (pu.md(newest).get("labels") or {}).get(REVISION_LABEL) == h:
                        updated += 1
            elif live:
                misscheduled += 1
        status = {"desiredNumberScheduled": desired, "currentNumberScheduled": current,
                  "numberMisscheduled": misscheduled, "numberReady": ready,
                  "updatedNumberScheduled": updated, "numberAvailable": available,
                  "numberUnavailable": desired - available,
                  "observedGeneration": pu.md(ds).get("generation", 1)}
        old = ds.get("status") or {}
        if all(old.get(k, 0) == v for k, v in status.items()):
            return
        try:
            await self.client.patch(DAEMONSETS, pu.md(ds)["name"], {"status": status},
                                    pu.md(ds).get("namespace"), subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise
