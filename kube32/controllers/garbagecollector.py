"""The garbage collector: ownerReferences cascade, as Kubernetes' garbage collector.

Design: one informer per covered kind keeps an index of every object by uid and
of dependents by owner uid (owners are identified by uid only: a same-name
replacement with a new uid is another owner).  Two kinds of work-queue key:

* ``("dependent", plural, key)``: does each owner still exist?  An owner missing
  from the index is checked against the API (the caches of two kinds can lag
  each other: a pod may be seen before its new ReplicaSet).  All owners gone ->
  delete the dependent (background, uid precondition); some gone -> drop the
  dangling references.
  An owner that is a custom resource (not watched here) is looked up again every
  ``CUSTOM_OWNER_RECHECK`` seconds while it exists.
* ``("owner", plural, key)``: an object being deleted that carries a GC finalizer.
  ``orphan``: remove the references to it from its dependents, then the
  finalizer.  ``foregroundDeletion``: delete its dependents (foreground again for
  those that own others), wait until no dependent with ``blockOwnerDeletion``
  remains, then remove the finalizer (the API server then removes the object).

Every step is idempotent and re-derived from the current state.
"""
from __future__ import annotations

import logging
from typing import Any

from .. import objects
from ..client import (CHECKPOINTS, CONFIGMAPS, CONTROLLERREVISIONS, CRONJOBS, DAEMONSETS, DEPLOYMENTS,
                      ENDPOINTS, ENDPOINTSLICES, JOBS, PODS, REPLICASETS, SECRETS, SERVICES, ApiError, Kind)
from ..client.kinds import CUSTOMRESOURCEDEFINITIONS, by_api_kind
from .base import Controller, key_of

log = logging.getLogger("kube32.garbagecollector")
Obj = dict[str, Any]

COVERED: tuple[Kind, ...] = (PODS, REPLICASETS, DEPLOYMENTS, DAEMONSETS, SERVICES, ENDPOINTS,
                             ENDPOINTSLICES, CONFIGMAPS, SECRETS, CHECKPOINTS, JOBS, CRONJOBS, CONTROLLERREVISIONS)
ORPHAN = "orphan"
# A custom resource (a CRD's kind) is not watched here: a dependent of one looks again
# this often whether its owner is still there.
CUSTOM_OWNER_RECHECK = 3.0
FOREGROUND = "foregroundDeletion"


def owner_refs(obj: Obj) -> list[Obj]:
    return [r for r in objects.meta(obj).get("ownerReferences") or [] if isinstance(r, dict)]


def gc_finalizers(obj: Obj) -> set[str]:
    return set(objects.meta(obj).get("finalizers") or []) & {ORPHAN, FOREGROUND}


class GarbageCollector(Controller):
    name = "garbage-collector-controller"
    workers = 4

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.informers = {k.plural: ctx.informers.get(k) for k in COVERED}
        self.kinds = {k.plural: k for k in COVERED}
        self.by_uid: dict[str, tuple[str, str]] = {}                  # uid -> (plural, key)
        self.dependents: dict[str, set[tuple[str, str]]] = {}         # owner uid -> {(plural, key)}
        self._owners_of: dict[tuple[str, str], set[str]] = {}         # (plural, key) -> owner uids

    def setup(self) -> None:
        for plural, inf in self.informers.items():
            inf.add_handler(lambda etype, obj, old, plural=plural: self._on_event(plural, etype, obj))

    # --- the graph ------------------------------------------------------------
    def _on_event(self, plural: str, etype: str, obj: Obj) -> None:
        key = key_of(obj)
        uid = objects.meta(obj).get("uid", "")
        node = (plural, key)
        for owner in self._owners_of.pop(node, set()):
            deps = self.dependents.get(owner)
            if deps is not None:
                deps.discard(node)
                if not deps:
                    self.dependents.pop(owner, None)
        if etype == "DELETED":
            if self.by_uid.get(uid) == node:
                self.by_uid.pop(uid, None)
            for dep in list(self.dependents.get(uid, ())):
                self.queue.add(("dependent", *dep))
        else:
            self.by_uid[uid] = node
            owners = {r.get("uid", "") for r in owner_refs(obj)}
            if owners:
                self._owners_of[node] = owners
                for o in owners:
                    self.dependents.setdefault(o, set()).add(node)
                self.queue.add(("dependent", plural, key))
            if objects.meta(obj).get("deletionTimestamp") and gc_finalizers(obj):
                self.queue.add(("owner", plural, key))
        # A dependent that changed or went may be what a foreground deletion waits for.
        for r in owner_refs(obj):
            owning = self.by_uid.get(r.get("uid", ""))
            if owning is not None:
                self.queue.add(("owner", *owning))

    def _cached(self, plural: str, key: str) -> Obj | None:
        return self.informers[plural].get(key)

    async def _owner_exists(self, dependent: Obj, ref: Obj) -> bool:
        uid = ref.get("uid", "")
        if uid in self.by_uid:
            return True
        kind = by_api_kind(ref.get("apiVersion", ""), ref.get("kind", "")) or await self._custom_kind(ref)
        if kind is None:
            return True  # a kind this collector cannot look up is never judged absent
        ns = objects.meta(dependent).get("namespace") if kind.namespaced else None
        try:
            found = await self.client.try_get(kind, ref.get("name", ""), ns)
        except ApiError as e:
            if e.code in (400, 403):
                return False  # a reference the API cannot resolve (bad name) has no owner behind it
            raise
        return found is not None and objects.meta(found).get("uid") == uid

    async def _custom_kind(self, ref: Obj) -> Kind | None:
        """The custom resource kind a reference names, from the CRDs served now."""
        group, _, version = str(ref.get("apiVersion", "")).rpartition("/")
        if not group:
            return None
        crds, _ = await self.client.list(CUSTOMRESOURCEDEFINITIONS)
        for crd in crds:
            spec = objects.spec(crd)
            names = spec.get("names") or {}
            served = {v.get("name") for v in spec.get("versions") or [] if isinstance(v, dict) and v.get("served")}
            if spec.get("group") == group and names.get("kind") == ref.get("kind") and version in served:
                return Kind(group, version, names.get("plural", ""), names["kind"], spec.get("scope") == "Namespaced")
        return None

    # --- sync -------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        role, plural, obj_key = key
        obj = self._cached(plural, obj_key)
        if obj is None:
            return
        if role == "dependent":
            await self._sync_dependent(plural, obj)
        else:
            await self._sync_owner(plural, obj)

    async def _sync_dependent(self, plural: str, obj: Obj) -> None:
        refs = owner_refs(obj)
        if not refs:
            return
        gone = [r for r in refs if not await self._owner_exists(obj, r)]
        if any(by_api_kind(r.get("apiVersion", ""), r.get("kind", "")) is None for r in refs if r not in gone):
            self.queue.add_after(("dependent", plural, key_of(obj)), CUSTOM_OWNER_RECHECK)
        if not gone:
            return
        md = obj["metadata"]
        kind = self.kinds[plural]
        if len(gone) == len(refs):
            if md.get("deletionTimestamp"):
                return
            log.info("deleting %s %s/%s: its owner %s %s is gone", kind.kind, md.get("namespace"), md["name"],
                     gone[0].get("kind"), gone[0].get("name"))
            try:
                await self.client.delete(kind, md["name"], md.get("namespace"), uid=md.get("uid"),
                                         propagation="Background")
            except ApiError as e:
                if e.code not in (404, 409):
                    raise
            return
        gone_uids = {r.get("uid") for r in gone}
        await self._set_owner_refs(kind, obj, [r for r in refs if r.get("uid") not in gone_uids])

    async def _set_owner_refs(self, kind: Kind, obj: Obj, refs: list[Obj]) -> None:
        md = obj["metadata"]
        patch = {"metadata": {"resourceVersion": md.get("resourceVersion"), "ownerReferences": refs or None}}
        try:
            await self.client.patch(kind, md["name"], patch, md.get("namespace"))
        except ApiError as e:
            if e.code != 404:
                raise  # 409: re-read and try again (the queue retries)

    def _dependents_of(self, uid: str) -> list[tuple[str, Obj]]:
        out = []
        for plural, key in sorted(self.dependents.get(uid, ())):
            dep = self._cached(plural, key)
            if dep is not None and any(r.get("uid") == uid for r in owner_refs(dep)):
                out.append((plural, dep))
        return out

    async def _sync_owner(self, plural: str, obj: Obj) -> None:
        md = obj["metadata"]
        if not md.get("deletionTimestamp"):
            return
        finalizers = list(md.get("finalizers") or [])
        uid = md.get("uid", "")
        kind = self.kinds[plural]
        if ORPHAN in finalizers:
            for dep_plural, dep in self._dependents_of(uid):
                keep = [r for r in owner_refs(dep) if r.get("uid") != uid]
                await self._set_owner_refs(self.kinds[dep_plural], dep, keep)
            await self.set_finalizers(kind, obj, [f for f in finalizers if f != ORPHAN])
            return
        if FOREGROUND not in finalizers:
            return
        blocking = 0
        for dep_plural, dep in self._dependents_of(uid):
            dmd = dep["metadata"]
            if any(r.get("uid") == uid and r.get("blockOwnerDeletion") for r in owner_refs(dep)):
                blocking += 1
            if dmd.get("deletionTimestamp"):
                continue
            policy = "Foreground" if self.dependents.get(dmd.get("uid", "")) else "Background"
            try:
                await self.client.delete(self.kinds[dep_plural], dmd["name"], dmd.get("namespace"),
                                         uid=dmd.get("uid"), propagation=policy)
            except ApiError as e:
                if e.code not in (404, 409):
                    raise
        if blocking == 0:
            await self.set_finalizers(kind, obj, [f for f in finalizers if f != FOREGROUND])
