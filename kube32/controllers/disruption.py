"""The disruption controller: PodDisruptionBudget status, as Kubernetes' ``disruption.go``.

For each budget it writes ``status`` (expectedPods, currentHealthy,
desiredHealthy, disruptionsAllowed, observedGeneration and the
DisruptionAllowed condition) from the pods the budget selects.  The numbers come
from :func:`kube32.budgets.budget_status`, the very function the
eviction path decides with, so what ``kubectl get pdb`` shows is what an
eviction would find.  Any pod, ReplicaSet or budget change in a namespace
re-syncs that namespace's budgets (keys are budget keys).
"""
from __future__ import annotations

import logging
from typing import Any

from .. import objects
from ..budgets import budget_status
from ..client import DAEMONSETS, DEPLOYMENTS, PDBS, PODS, REPLICASETS, ApiError
from ..terms import Condition
from .base import Controller, key_of

log = logging.getLogger("kube32.disruption")
Obj = dict[str, Any]


class DisruptionController(Controller):
    name = "disruption-controller"
    workers = 2

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pdbs = ctx.informers.get(PDBS)
        self.pods = ctx.informers.get(PODS)
        self.scalers = [ctx.informers.get(k) for k in (REPLICASETS, DEPLOYMENTS, DAEMONSETS)]

    def setup(self) -> None:
        self.pdbs.add_handler(lambda _t, pdb, _o: self.queue.add(key_of(pdb)))
        for inf in (self.pods, *self.scalers):
            inf.add_handler(lambda _t, obj, _o: self._namespace_changed(objects.meta(obj).get("namespace")))

    def _namespace_changed(self, ns: str | None) -> None:
        for pdb in self.pdbs.list():
            if objects.meta(pdb).get("namespace") == ns:
                self.queue.add(key_of(pdb))

    async def resync(self) -> None:
        for pdb in self.pdbs.list():
            self.queue.add(key_of(pdb))

    def _scales(self, ns: str) -> dict[str, int]:
        """Desired pod count by controller uid (DaemonSets: the nodes they should cover)."""
        out: dict[str, int] = {}
        for inf in self.scalers:
            for obj in inf.list():
                md = objects.meta(obj)
                if md.get("namespace") != ns:
                    continue
                if inf.kind is DAEMONSETS:
                    out[md.get("uid", "")] = int(objects.status(obj).get("desiredNumberScheduled", 0) or 0)
                else:
                    out[md.get("uid", "")] = int(objects.spec(obj).get("replicas", 1) or 0)
        return out

    async def sync(self, key: Any) -> None:
        pdb = self.pdbs.get(str(key))
        if pdb is None:
            return
        md = pdb["metadata"]
        ns = md.get("namespace", "")
        try:
            st = budget_status(pdb, [p for p in self.pods.list() if objects.meta(p).get("namespace") == ns],
                               self._scales(ns))
        except ValueError as e:
            log.warning("budget %s is invalid: %s", key, e)
            return
        old = objects.status(pdb)
        allowed = st.disruptions_allowed > 0
        cond_old: dict[str, Any] = objects.condition(pdb, Condition.DISRUPTION_ALLOWED) or {}
        want_status = "True" if allowed else "False"
        cond = {"type": Condition.DISRUPTION_ALLOWED, "status": want_status,
                "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                "observedGeneration": md.get("generation", 1),
                "lastTransitionTime": (cond_old.get("lastTransitionTime") if cond_old.get("status") == want_status
                                       else objects.rfc3339())}
        status = {**old, **st.as_status(), "observedGeneration": md.get("generation", 1), "conditions": [cond]}
        if status == old:
            return
        try:
            await self.client.update(PDBS, {**pdb, "status": status}, subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise
