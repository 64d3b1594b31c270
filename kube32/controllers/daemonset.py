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
  without an available pod (OnDelete: only status is updated);
* every template is recorded as a ControllerRevision (kube32.controllers.history:
  the current one on top, at most ``revisionHistoryLimit`` old ones), before any pod
  of it is made: ``kubectl rollout history`` lists them and ``kubectl rollout undo``
  patches the DaemonSet back to one.

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

from .. import objects
from ..client import CONTROLLERREVISIONS, DAEMONSETS, NODES, PODS, ApiError
from ..intstr import scaled_value
from ..matching import EXISTS, IN, NODE_NAME_FIELD, node_affinity_matches, required_affinity, tolerated
from ..terms import Effect, Label, PodPhase, Taint
from . import history
from . import podutil as pu
from .base import Controller

log = logging.getLogger("kube32.controllers.daemonset")
Obj = dict[str, Any]

API = "apps/v1"
REVISION_LABEL = Label.CONTROLLER_REVISION_HASH
GENERATION_LABEL = Label.POD_TEMPLATE_GENERATION

# What the DaemonSet controller adds to every daemon pod (AddOrUpdateDaemonPodTolerations).
DEFAULT_TOLERATIONS = tuple({"key": key, "operator": EXISTS, "effect": effect} for key, effect in (
    (Taint.NOT_READY, Effect.NO_EXECUTE), (Taint.UNREACHABLE, Effect.NO_EXECUTE),
    (Taint.DISK_PRESSURE, Effect.NO_SCHEDULE), (Taint.MEMORY_PRESSURE, Effect.NO_SCHEDULE),
    (Taint.PID_PRESSURE, Effect.NO_SCHEDULE), (Taint.UNSCHEDULABLE, Effect.NO_SCHEDULE)))


# --- node eligibility -------------------------------------------------------------------
def with_default_tolerations(tolerations: list[Obj] | None) -> list[Obj]:
    out = [dict(t) for t in tolerations or []]
    for t in DEFAULT_TOLERATIONS:
        if not any(x.get("key") == t["key"] and x.get("effect") == t["effect"] and
                   x.get("operator") == EXISTS for x in out):
            out.append(dict(t))
    return out


def node_eligibility(template_spec: Obj, node: Obj) -> tuple[bool, bool]:
    """(should run a daemon pod, may keep a running one), as k8s NodeShouldRunDaemonPod:
    the pod's required node affinity (kube32.matching), then its tolerations (with the
    defaults) of the node's NoSchedule and NoExecute taints."""
    if not node_affinity_matches(template_spec, node):
        return False, False
    tolerations = with_default_tolerations(template_spec.get("tolerations"))
    should_run, keep = True, True
    for taint in objects.spec(node).get("taints") or []:
        if taint.get("effect") not in Effect.SCHEDULING:
            continue
        if not tolerated(tolerations, taint):
            should_run = False
            if taint.get("effect") == Effect.NO_EXECUTE:
                keep = False
    return should_run, keep


def pin_to_node(spec: Obj, node_name: str) -> Obj:
    """The pod spec with its required node affinity replaced by ``metadata.name In [node]``."""
    spec = copy.deepcopy(spec)
    affinity = spec.setdefault("affinity", {})
    na = affinity.setdefault("nodeAffinity", {})
    term = {"matchFields": [{"key": NODE_NAME_FIELD, "operator": IN, "values": [node_name]}]}
    na["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [term]}
    spec["tolerations"] = with_default_tolerations(spec.get("tolerations"))
    return spec


def target_node(pod: Obj) -> str | None:
    """Where a daemon pod runs or will run (k8s GetTargetNodeName)."""
    name = objects.spec(pod).get("nodeName")
    if name:
        return name
    req = required_affinity(objects.spec(pod)) or {}
    for term in req.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == NODE_NAME_FIELD and f.get("operator") == IN and len(f.get("values") or []) == 1:
                return f["values"][0]
    return None


class DaemonSetController(Controller):
    name = "daemonset-controller"
    workers = 2

    def setup(self) -> None:
        self.ds_informer = self.ctx.informers.get(DAEMONSETS)
        self.node_informer = self.ctx.informers.get(NODES)
        self.pod_informer = self.ctx.informers.get(PODS)
        self.rev_informer = self.ctx.informers.get(CONTROLLERREVISIONS)
        self.expectations = pu.Expectations()
        self.ds_informer.add_handler(self._on_ds)
        self.rev_informer.add_handler(self._on_revision)
        self.node_informer.add_handler(self._on_node)
        self.pod_informer.add_handler(self._on_pod)

    def _on_ds(self, etype: str, ds: Obj, old: Obj | None) -> None:
        if etype == "DELETED":
            self.expectations.forget(pu.pod_key(ds))
        self.queue.add(pu.pod_key(ds))

    def _on_revision(self, etype: str, rev: Obj, old: Obj | None) -> None:
        owner = pu.owner_key_of(rev, "DaemonSet")
        if owner:
            self.queue.add(owner)

    def _on_node(self, etype: str, node: Obj, old: Obj | None) -> None:
        if old is not None and etype == "MODIFIED" and \
                (objects.meta(node).get("labels"), objects.spec(node).get("taints")) == \
                (objects.meta(old).get("labels"), objects.spec(old).get("taints")):
            return  # heartbeats and status: eligibility did not change
        for ds in self.ds_informer.list():
            self.queue.add(pu.pod_key(ds))

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        for k in pu.observe_pod(self.expectations, etype, pod, old, "DaemonSet"):
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
        ns = objects.meta(ds).get("namespace", "default")
        spec = objects.spec(ds)
        template = spec.get("template") or {}
        tspec = objects.spec(template)
        h = pu.template_hash(template)
        nodes = {objects.meta(n)["name"]: n for n in self.node_informer.list()}
        by_node: dict[str, list[Obj]] = {}
        for pod in self.pod_informer.list():
            if objects.meta(pod).get("namespace") == ns and pu.is_controlled_by(pod, ds):
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
                    if objects.phase(p) == PodPhase.FAILED and not pu.awaits_replacement(p):
                        delete.append(p)  # recreated once it is gone
                    else:
                        running.append(p)
                running.sort(key=lambda p: (objects.meta(p).get("creationTimestamp") or "", objects.name(p)))
                delete += running[1:]
            else:
                delete += live

        if not objects.meta(ds).get("deletionTimestamp"):
            await self._record_history(ds, template, h, by_node)
        if self.expectations.satisfied(key) and not objects.meta(ds).get("deletionTimestamp"):
            if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate":
                delete += self._rolling_victims(ds, nodes, by_node, h, {pu.pod_key(p) for p in delete})
            await self._manage(ds, key, create_on, delete, h)
        await self._update_status(ds, nodes, by_node, h)

    async def _record_history(self, ds: Obj, template: Obj, h: str, by_node: dict[str, list[Obj]]) -> None:
        """The DaemonSet's ControllerRevisions brought in line with its template (history.plan)."""
        ns = objects.meta(ds).get("namespace")
        revisions = [r for r in self.rev_informer.list()
                     if objects.meta(r).get("namespace") == ns and pu.is_controlled_by(r, ds)]
        live = {objects.labels(p).get(REVISION_LABEL, "") for pods in by_node.values() for p in pods
                if not pu.is_terminating(p)}
        todo = history.plan(ds, revisions, template, h, live)
        try:
            if todo.create is not None:
                await self.client.create(CONTROLLERREVISIONS,
                                         history.new_revision(ds, API, "DaemonSet", template, h, todo.create), ns)
            if todo.renumber is not None:
                rev, number = todo.renumber
                await self.client.patch(CONTROLLERREVISIONS, objects.name(rev),
                                        {"metadata": {"resourceVersion": objects.meta(rev).get("resourceVersion")},
                                         "revision": number}, ns)
            for rev in todo.delete:
                await self.client.delete(CONTROLLERREVISIONS, objects.name(rev), ns, uid=objects.uid(rev))
        except ApiError as e:
            if e.code not in (404, 409):   # a cache behind our own writes: the next sync sees them
                raise

    def _rolling_victims(self, ds: Obj, nodes: dict[str, Obj], by_node: dict[str, list[Obj]], h: str,
                         already: set[str]) -> list[Obj]:
        """Outdated pods to delete now: unavailable ones freely, then within maxUnavailable."""
        spec = objects.spec(ds)
        mrs = int(spec.get("minReadySeconds") or 0)
        template_spec = objects.spec(spec.get("template"))
        eligible = [n for n, node in nodes.items() if node_eligibility(template_spec, node)[0]]
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
                if objects.labels(p).get(REVISION_LABEL) == h or pu.pod_key(p) in already:
                    continue
                if pu.is_available(p, mrs):
                    outdated_available.append(p)
                else:
                    victims.append(p)
        outdated_available.sort(key=lambda p: objects.meta(p).get("name", ""))
        room = budget - unavailable
        return victims + outdated_available[:max(room, 0)]

    async def _manage(self, ds: Obj, key: str, create_on: list[str], delete: list[Obj], h: str) -> None:
        self.expectations.expect_creations(key, len(create_on))
        self.expectations.expect_deletions(key, [pu.pod_key(p) for p in delete])
        template = objects.spec(ds).get("template") or {}
        errors: list[BaseException] = []

        async def create(node_name: str) -> None:
            pod = pu.pod_from_template(template, ds, API, "DaemonSet")
            pod["metadata"]["labels"][REVISION_LABEL] = h
            pod["metadata"]["labels"][GENERATION_LABEL] = str(objects.meta(ds).get("generation", 1))
            pod["spec"] = pin_to_node(pod["spec"], node_name)
            try:
                out = await self.client.create(PODS, pod, objects.meta(ds).get("namespace"))
            except ApiError as e:
                self.expectations.creation_observed(key)
                await self.recorder.record(ds, "Warning", "FailedCreate", f"Error creating: {e}")
                errors.append(e)
                return
            await self.recorder.record(ds, "Normal", "SuccessfulCreate",
                                       f"Created pod: {objects.meta(out)['name']}")

        async def remove(pod: Obj) -> None:
            try:
                await self.delete_pod(ds, key, pod, self.expectations)
            except ApiError as e:
                errors.append(e)

        await asyncio.gather(*(create(n) for n in create_on), *(remove(p) for p in delete))
        if errors:
            raise errors[0]

    async def _update_status(self, ds: Obj, nodes: dict[str, Obj], by_node: dict[str, list[Obj]], h: str) -> None:
        spec = objects.spec(ds)
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
                    newest = max(live, key=lambda p: objects.meta(p).get("creationTimestamp") or "")
                    if pu.is_ready(newest):
                        ready += 1
                    if pu.is_available(newest, mrs):
                        available += 1
                    if objects.labels(newest).get(REVISION_LABEL) == h:
                        updated += 1
            elif live:
                misscheduled += 1
        status = {"desiredNumberScheduled": desired, "currentNumberScheduled": current,
                  "numberMisscheduled": misscheduled, "numberReady": ready,
                  "updatedNumberScheduled": updated, "numberAvailable": available,
                  "numberUnavailable": desired - available,
                  "observedGeneration": objects.meta(ds).get("generation", 1)}
        old = objects.status(ds)
        if all(old.get(k, 0) == v for k, v in status.items()):
            return
        try:
            await self.client.patch(DAEMONSETS, objects.meta(ds)["name"], {"status": status},
                                    objects.meta(ds).get("namespace"), subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise
