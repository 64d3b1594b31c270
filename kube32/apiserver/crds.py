"""The custom resources an API server serves: one :class:`Catalog` per API server, kept
from the store's CustomResourceDefinitions (apiextensions-apiserver's CRD handler,
naming, establishing and finalizing controllers in one).

Design: :meth:`Catalog.start` lists every CRD, then a watch on the CRD prefix keeps
the catalog current, so every API server on one store serves every CRD whichever
server it was written through.  Each served version of a CRD is a
:class:`~.resources.Resource` (``custom=True``, its openAPIV3Schema in ``schema``)
with a strategy from :func:`~.strategies.apiextensions.custom_strategy`, served by
the same generic registry as the built-in kinds; storage keys are
``/registry/<group>/<plural>/...`` for every version (no conversion: a CRD's
``conversion.strategy`` is None).

Invariants:

* A CRD is served once the catalog has built it; the catalog then sets its
  ``Established`` condition True (kubectl wait --for=condition=Established means this
  server serves it).  A version with ``served: false`` is not served; an update of a
  CRD takes effect when the watch brings it.
* A CRD being deleted (``deletionTimestamp``, the cleanup finalizer) stops taking new
  objects (405), says ``Terminating`` True, has all its custom resources deleted, then
  loses its finalizer and goes; the catalog then stops serving it.  Every API server
  may do that cleanup: every step is idempotent.
* :meth:`Catalog.admit` refuses (422) a CRD whose names clash with a built-in
  resource (any group: the registry's hooks and kubectl's short names key on a
  plural) or with another CRD's, and more than :data:`MAX_CRDS` CRDs.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from typing import Any

from .. import objects
from . import errors
from .openapi import documents as openapi_documents
from .patch import rules_from_openapi
from .registry import Registry
from .resources import RESOURCES, Resource, Subresource, by_plural
from .strategies.apiextensions import (CLEANUP_FINALIZER, ESTABLISHED, TERMINATING, custom_strategy,
                                       set_condition, simple_path)
from .strategy import get_path

log = logging.getLogger("kube32.apiserver.crds")

Obj = dict[str, Any]
MAX_CRDS = 256
CLEANUP_PAUSE = 0.5          # between passes of a terminating CRD's cleanup
RESTART_PAUSE = 1.0          # before the watch of CRDs starts again after an error
CRD_PLURAL = "customresourcedefinitions"
_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def crd_resource() -> Resource:
    return by_plural(CRD_PLURAL)


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order: GA before beta before alpha, higher first, others last."""
    m = _VERSION.match(version)
    if not m:
        return (3, 0, 0, version)
    level = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (level, -int(m.group(1)), -int(m.group(3) or 0), version)


def resources_of(crd: Obj) -> list[Resource]:
    """The Resources ``crd`` serves (none while not yet valid enough to serve)."""
    spec = objects.spec(crd)
    names = spec.get("names") or {}
    terminating = bool(objects.meta(crd).get("deletionTimestamp"))
    out = []
    for v in spec.get("versions") or []:
        if not isinstance(v, dict) or v.get("served") is not True:
            continue
        strategy = custom_strategy(crd, v)
        strategy.terminating = terminating
        status = Subresource("status", names.get("kind", ""), ("get", "patch", "update"))
        scale = Subresource("scale", "Scale", ("get", "patch", "update"), "autoscaling", "v1")
        subs = ((status,) if strategy.has_status else ()) + ((scale,) if strategy.scale else ())
        out.append(Resource(spec["group"], v["name"], names["plural"], names.get("singular", ""), names["kind"],
                            spec.get("scope") == "Namespaced", strategy,
                            tuple(names.get("shortNames") or ()), tuple(names.get("categories") or ()),
                            subs, schema=strategy.schema, custom=True,
                            field_rules=rules_from_openapi(strategy.schema)))
    return out


def _names(crd: Obj) -> tuple[str, set[str], set[str]]:
    """(group, the resource names kubectl resolves, the kinds) of a CRD."""
    spec = objects.spec(crd)
    names = spec.get("names") or {}
    words = {names.get("plural"), names.get("singular"), *(names.get("shortNames") or [])}
    kinds = {names.get("kind"), names.get("listKind")}
    return spec.get("group") or "", {w for w in words if w}, {k for k in kinds if k}


class Catalog:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._crds: dict[str, Obj] = {}
        self._by_path: dict[tuple[str, str, str], Resource] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._watcher: asyncio.Task[None] | None = None
        registry.admit[CRD_PLURAL] = self.admit

    # --- serving ------------------------------------------------------------------
    def lookup(self, group: str, version: str, plural: str) -> Resource | None:
        return self._by_path.get((group, version, plural))

    def served(self) -> list[Resource]:
        return list(self._by_path.values())

    def any_version(self, group: str, plural: str) -> Resource | None:
        """A served version of the custom resource ``plural`` of ``group`` (they share
        names and subresources' kinds), or None."""
        return next((r for (g, _, p), r in self._by_path.items() if g == group and p == plural), None)

    def _rebuild(self) -> None:
        by_path: dict[tuple[str, str, str], Resource] = {}
        for crd in self._crds.values():
            try:
                for r in resources_of(crd):
                    by_path[(r.group, r.version, r.plural)] = r
            except Exception as e:  # noqa: BLE001 - stored by hand, not through the strategy: not served
                log.warning("not serving CustomResourceDefinition %s: %s", objects.name(crd), e)
        self._by_path = by_path

    # --- keeping current ------------------------------------------------------------
    async def start(self) -> None:
        rev = await self._relist()
        self._watcher = asyncio.create_task(self._watch(rev))

    async def _relist(self) -> int:
        items, rev = await self.registry.list(crd_resource(), None)
        self._crds = {objects.name(c): c for c in items}
        self._rebuild()
        for crd in items:
            self._follow_up(crd)
        return rev

    async def _watch(self, rev: int) -> None:
        while True:
            try:
                async for etype, crd in self.registry.watch(crd_resource(), None, None, None, str(rev)):
                    rev = int(crd["metadata"]["resourceVersion"])
                    name = objects.name(crd)
                    if etype == "DELETED":
                        self._crds.pop(name, None)
                    else:
                        self._crds[name] = crd
                    self._rebuild()
                    if etype != "DELETED":
                        self._follow_up(crd)
                await asyncio.sleep(RESTART_PAUSE)   # the stream ended (the store closing): again
            except asyncio.CancelledError:
                raise
            except errors.APIError:      # compacted: start again from a list
                await asyncio.sleep(RESTART_PAUSE)
                rev = await self._relist_quietly(rev)
            except Exception:  # noqa: BLE001 - the catalog must outlive a store fault
                log.exception("the watch of CustomResourceDefinitions failed; starting again")
                await asyncio.sleep(RESTART_PAUSE)
                rev = await self._relist_quietly(rev)

    async def _relist_quietly(self, rev: int) -> int:
        try:
            return await self._relist()
        except Exception:  # noqa: BLE001 - tried again after the next pause
            log.exception("cannot list CustomResourceDefinitions")
            return rev

    def _follow_up(self, crd: Obj) -> None:
        """What a CRD's state asks of the server: be established, or be cleaned up."""
        name = objects.name(crd)
        if name in self._tasks and not self._tasks[name].done():
            return
        terminating = bool(objects.meta(crd).get("deletionTimestamp"))
        if terminating and CLEANUP_FINALIZER in (objects.meta(crd).get("finalizers") or []):
            self._tasks[name] = asyncio.create_task(self._clean_up(name))
        elif not terminating and not objects.is_true(crd, ESTABLISHED):
            self._tasks[name] = asyncio.create_task(self._establish(name))

    async def close(self) -> None:
        tasks = [t for t in (self._watcher, *self._tasks.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the controllers ----------------------------------------------------------------
    async def _establish(self, name: str) -> None:
        def established(crd: Obj) -> Obj | None:
            if crd["metadata"].get("deletionTimestamp"):
                return None
            changed = set_condition(crd, ESTABLISHED, "True", "InitialNamesAccepted",
                                    "the initial names have been accepted")
            return crd if changed else None
        try:
            await self.registry.mutate(crd_resource(), None, name, established, subresource="status")
        except errors.APIError as e:
            log.info("cannot mark CustomResourceDefinition %s established: %s", name, e.message)

    async def _clean_up(self, name: str) -> None:
        """Delete every custom resource of a terminating CRD, then its cleanup finalizer."""
        while True:
            crd = await self.registry.try_get(crd_resource(), None, name)
            if crd is None or CLEANUP_FINALIZER not in (objects.meta(crd).get("finalizers") or []):
                return
            left = await self._delete_all(crd)
            status_text = f"{left} custom resources remain" if left else "removed all instances"
            await self._mark_terminating(name, status_text)
            if not left:
                await self._drop_finalizer(name)
                return
            await asyncio.sleep(CLEANUP_PAUSE)

    async def _delete_all(self, crd: Obj) -> int:
        """Delete what is left of ``crd``'s objects; how many remain (finalizers keep them)."""
        storage = [r for r in resources_of({**crd, "spec": {**objects.spec(crd),
                                                           "versions": _all_served(crd)}})][:1]
        if not storage:
            return 0
        res = storage[0]
        items, _ = await self.registry.list(res, None)
        for obj in items:
            if objects.meta(obj).get("deletionTimestamp"):
                continue
            try:
                await self.registry.delete(res, objects.namespace(obj) or None, objects.name(obj))
            except errors.APIError as e:
                if e.code != 404:
                    log.info("cannot delete %s %s: %s", res.kind, objects.name(obj), e.message)
        items, _ = await self.registry.list(res, None)
        return len(items)

    async def _mark_terminating(self, name: str, message: str) -> None:
        def mark(crd: Obj) -> Obj | None:
            changed = set_condition(crd, TERMINATING, "True", "InstanceDeletionInProgress", message)
            return crd if changed else None
        try:
            await self.registry.mutate(crd_resource(), None, name, mark, subresource="status")
        except errors.APIError as e:
            log.info("cannot mark CustomResourceDefinition %s terminating: %s", name, e.message)

    async def _drop_finalizer(self, name: str) -> None:
        def drop(crd: Obj) -> Obj | None:
            fins = crd["metadata"].get("finalizers") or []
            if CLEANUP_FINALIZER not in fins:
                return None
            crd["metadata"]["finalizers"] = [f for f in fins if f != CLEANUP_FINALIZER]
            return crd
        try:
            await self.registry.mutate(crd_resource(), None, name, drop)
        except errors.APIError as e:
            if e.code != 404:
                log.info("cannot finish deleting CustomResourceDefinition %s: %s", name, e.message)

    # --- admission ------------------------------------------------------------------------
    async def admit(self, res: Resource, new: Obj, old: Obj | None) -> None:
        """Refuse a CRD whose names another kind has, or one CRD too many (422)."""
        if objects.meta(new).get("deletionTimestamp"):
            return
        items, _ = await self.registry.list(crd_resource(), None)
        others = [c for c in items if objects.name(c) != objects.name(new)]
        if old is None and len(others) >= MAX_CRDS:
            raise errors.invalid(res.kind, objects.name(new), [("", f"Forbidden: at most {MAX_CRDS} "
                                                                    "CustomResourceDefinitions may exist")],
                                 res.group)
        problems = _clash_builtin(new) + _clash_crds(new, others)
        if problems:
            raise errors.invalid(res.kind, objects.name(new), problems, res.group)


def _steps(path: Any) -> list[str | int]:
    return simple_path(path) or [] if isinstance(path, str) else []


def scale_of(res: Resource, obj: Obj) -> Obj:
    """The autoscaling/v1 Scale of a custom resource, read at its CRD's scale paths."""
    paths = getattr(res.strategy, "scale", None) or {}
    md = objects.meta(obj)
    spec_replicas = get_path(obj, *_steps(paths.get("specReplicasPath")))
    status_replicas = get_path(obj, *_steps(paths.get("statusReplicasPath")))
    selector = get_path(obj, *_steps(paths.get("labelSelectorPath"))) if paths.get("labelSelectorPath") else None
    status: Obj = {"replicas": status_replicas if isinstance(status_replicas, int) else 0}
    if isinstance(selector, str):
        status["selector"] = selector
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: md.get(k) for k in ("name", "namespace", "uid", "resourceVersion",
                                                "creationTimestamp") if md.get(k) is not None},
            "spec": {"replicas": spec_replicas if isinstance(spec_replicas, int) else 0}, "status": status}


def set_scale_replicas(res: Resource, obj: Obj, replicas: int) -> None:
    """Write ``replicas`` at the CRD's specReplicasPath (making the objects on the way)."""
    paths = getattr(res.strategy, "scale", None) or {}
    steps = [s for s in _steps(paths.get("specReplicasPath")) if isinstance(s, str)]
    if not steps:
        raise errors.bad_request(f"{res.kind} has no specReplicasPath to scale")
    cur = obj
    for step in steps[:-1]:
        nxt = cur.get(step)
        if not isinstance(nxt, dict):
            nxt = cur[step] = {}
        cur = nxt
    cur[steps[-1]] = replicas


def strategic_refusal(ptype: str) -> errors.APIError:
    """415 for a strategic merge patch of a custom resource (no patch strategies: as Kubernetes)."""
    return errors.APIError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           f"application/json-patch+json, application/merge-patch+json, "
                           f'application/apply-patch+yaml (got "{ptype}")')


def _all_served(crd: Obj) -> list[Obj]:
    """The CRD's versions, storage first, all served (for its cleanup: every object)."""
    versions = [dict(v, served=True) for v in objects.spec(crd).get("versions") or [] if isinstance(v, dict)]
    return sorted(versions, key=lambda v: v.get("storage") is not True)


def _clash_builtin(crd: Obj) -> list[tuple[str, str]]:
    group, words, kinds = _names(crd)
    problems = []
    for r in RESOURCES:
        taken = {r.plural, r.singular, *r.short_names} - {""}
        for word in sorted(words & taken):
            problems.append(("spec.names", f'Invalid value: "{word}": is already in use by the built-in '
                                           f'resource {r.plural}{"." + r.group if r.group else ""}'))
        if r.group == group and r.kind in kinds:
            problems.append(("spec.names.kind", f'Invalid value: "{r.kind}": is already in use in group {group}'))
    return problems


def _short_names(crd: Obj) -> list[str]:
    return [n for n in get_path(crd, "spec", "names", "shortNames", default=[]) or [] if isinstance(n, str)]


def _clash_crds(crd: Obj, others: list[Obj]) -> list[tuple[str, str]]:
    group, words, kinds = _names(crd)
    problems = []
    for other in others:
        ogroup, owords, okinds = _names(other)
        # Within a group every name is one resource's; across groups a short name too
        # (``kubectl get <shortName>`` must name one resource).
        shared = words & owords if ogroup == group else set(_short_names(crd)) & owords
        for word in sorted(shared):
            problems.append(("spec.names", f'Invalid value: "{word}": is already in use by '
                                           f'CustomResourceDefinition {objects.name(other)}'))
        if ogroup == group:
            for kind in sorted(kinds & okinds):
                problems.append(("spec.names.kind", f'Invalid value: "{kind}": is already in use by '
                                                    f'CustomResourceDefinition {objects.name(other)}'))
    return problems


# --- discovery and OpenAPI ------------------------------------------------------------------
def _gv_entry(group: str, version: str) -> Obj:
    return {"groupVersion": f"{group}/{version}", "version": version}


def group_document(catalog: Catalog, group: str) -> Obj | None:
    versions = sorted({r.version for r in catalog.served() if r.group == group}, key=version_priority)
    if not versions:
        return None
    entries = [_gv_entry(group, v) for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def group_list(catalog: Catalog, builtin: Obj) -> Obj:
    """The built-in APIGroupList with the custom groups after it."""
    known = {g["name"] for g in builtin.get("groups", [])}
    extra = sorted({r.group for r in catalog.served()} - known)
    groups = list(builtin.get("groups", [])) + [d for d in (group_document(catalog, g) for g in extra) if d]
    return {**builtin, "groups": groups}


def resource_list(catalog: Catalog, group_version: str) -> Obj | None:
    group, _, version = group_version.partition("/")
    served = [r for r in catalog.served() if r.group == group and r.version == version]
    if not served:
        return None
    entries = []
    for r in sorted(served, key=lambda r: r.plural):
        entry: Obj = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                      "kind": r.kind, "verbs": list(r.verbs)}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        entries.append(entry)
        for sub in r.subresources:
            entries.append({"name": f"{r.plural}/{sub.name}", "singularName": "", "namespaced": r.namespaced,
                            "kind": r.kind, "verbs": list(sub.verbs)})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}


def schema_name(res: Resource) -> str:
    """The OpenAPI component name of a custom kind (reversed group, as kube-apiserver's)."""
    return ".".join([*reversed(res.group.split(".")), res.version, res.kind])


def openapi_document(catalog: Catalog, group_version: str) -> Obj | None:
    """A custom group version's OpenAPI v3 document: its paths as the built-in kinds' (path
    parameters, list parameters, subresources; a PATCH with ``fieldValidation``, so
    kubectl leaves validation to the server), each kind's schema and what they refer to."""
    group, _, version = group_version.partition("/")
    served = [r for r in catalog.served() if r.group == group and r.version == version]
    if not served:
        return None
    paths: Obj = {}
    schemas: Obj = {}
    for r in served:
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        paths.update(openapi_documents.resource_paths(r, schema_name(r)))
        schemas[schema_name(r)] = {**(r.schema or {}), "x-kubernetes-group-version-kind": [gvk]}
    shared = openapi_documents.components([n for n in openapi_documents.referenced(paths) if n not in schemas])
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
            "paths": paths, "components": {"schemas": {**shared, **schemas}}}


def openapi_paths(catalog: Catalog) -> Obj:
    """The ``/openapi/v3`` entries of the custom group versions."""
    out = {}
    for gv in sorted({r.group_version for r in catalog.served()}):
        doc = openapi_document(catalog, gv)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        out[f"apis/{gv}"] = {"serverRelativeURL": f"/openapi/v3/apis/{gv}?hash={digest}"}
    return out

