"""Namespace deletion: empty a terminating namespace, then finalize it.

A deleted namespace keeps a deletionTimestamp and phase Terminating while its
``spec.finalizers`` holds ``kubernetes``.  This controller deletes every object of
every namespaced kind in it, custom resources included (read from the API, not a
cache: the namespace must really be empty), waits until nothing is left (bound pods go when their kubelet
confirms; PodGC force-deletes those on lost nodes), then
``PUT namespaces/<n>/finalize`` with no finalizers, which removes the namespace.
While objects remain, the key comes back after a short delay.
"""
from __future__ import annotations

import logging
from typing import Any

from .. import objects
from ..client import NAMESPACES, ApiError, Kind
from ..client.kinds import ALL, CUSTOMRESOURCEDEFINITIONS
from .base import Controller

log = logging.getLogger("kube32.namespace")
Obj = dict[str, Any]

NAMESPACED: tuple[Kind, ...] = tuple(k for k in ALL if k.namespaced)
RECHECK_SECONDS = 0.5


class NamespaceController(Controller):
    name = "namespace-controller"
    workers = 2

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.namespaces = ctx.informers.get(NAMESPACES)

    def setup(self) -> None:
        self.namespaces.add_handler(self._on_namespace)

    def _on_namespace(self, etype: str, ns: Obj, _old: Obj | None) -> None:
        if etype != "DELETED" and objects.meta(ns).get("deletionTimestamp"):
            self.queue.add(ns["metadata"]["name"])

    async def resync(self) -> None:
        for ns in self.namespaces.list():
            self._on_namespace("MODIFIED", ns, None)

    async def sync(self, key: Any) -> None:
        name = str(key)
        ns = await self.client.try_get(NAMESPACES, name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        remaining = await self.delete_contents(name)
        if remaining:
            log.debug("namespace %s: waiting for %s", name, ", ".join(remaining))
            self.queue.add_after(name, RECHECK_SECONDS)
            return
        if objects.spec(ns).get("finalizers"):
            ns["spec"]["finalizers"] = []
            try:
                await self.client.update(NAMESPACES, ns, subresource="finalize")
                log.info("namespace %s is empty and finalized", name)
            except ApiError as e:
                if e.code != 404:
                    raise

    async def custom_kinds(self) -> list[Kind]:
        """The namespaced custom resources served now (one served version of each CRD:
        every version reads the same objects)."""
        crds, _ = await self.client.list(CUSTOMRESOURCEDEFINITIONS)
        out = []
        for crd in crds:
            spec = objects.spec(crd)
            names = spec.get("names") or {}
            served = [str(v.get("name")) for v in spec.get("versions") or []
                      if isinstance(v, dict) and v.get("served")]
            if spec.get("scope") == "Namespaced" and served and names.get("plural") and names.get("kind"):
                out.append(Kind(spec.get("group", ""), served[0], names["plural"], names["kind"], True))
        return out

    async def delete_contents(self, namespace: str) -> list[str]:
        """Delete what is in the namespace; returns what is still there ("3 pods", ...)."""
        remaining = []
        for kind in (*NAMESPACED, *await self.custom_kinds()):
            try:
                items, _ = await self.client.list(kind, namespace)
            except ApiError as e:
                if e.code == 404:   # a custom resource whose CRD went meanwhile
                    continue
                raise
            for obj in items:
                md = objects.meta(obj)
                if md.get("deletionTimestamp"):
                    continue  # on its way out (a kubelet or a finalizer finishes it)
                try:
                    await self.client.delete(kind, md["name"], namespace, uid=md.get("uid"),
                                             propagation="Background")
                except ApiError as e:
                    if e.code not in (404, 409):
                        raise
            if items:
                items, _ = await self.client.list(kind, namespace)
                if items:
                    remaining.append(f"{len(items)} {kind.plural}")
        return remaining
