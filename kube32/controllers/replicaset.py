"""The ReplicaSet controller: keeps ``spec.replicas`` pods of a template, as ``replica_set.go``.

Level-triggered: handlers only enqueue ``namespace/name`` keys of ReplicaSets
(and record watch events against :class:`~.podutil.Expectations`); ``sync``
reads the caches and converges:

1. claim pods: those controlled by this ReplicaSet (ownerReference with its uid)
   that still match the selector; orphans that match are adopted, owned pods that
   no longer match are released;
2. when the expectations are satisfied (every earlier create/delete has been
   seen), create the missing pods or delete the extra ones (least valuable
   first: unscheduled, pending, not ready, newest);
3. write ``status`` (replicas, fullyLabeledReplicas, readyReplicas,
   availableReplicas, observedGeneration) when it changed.

Pods are counted by ``namespace/name``, never by uid: a pod replaced by another
component in one write (same name and owner, new uid, other node) stays one
pod — the informer reports it as MODIFIED, which is neither a create nor a
delete here.  Pods being deleted (deletionTimestamp) or finished do not count.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import objects
from ..client import PODS, REPLICASETS, ApiError
from ..matching import workload_selects
from . import podutil as pu
from .base import Controller, split_key

log = logging.getLogger("kube32.controllers.replicaset")
Obj = dict[str, Any]

BURST_REPLICAS = 500  # as k8s: at most this many creates/deletes per sync
RS_API = "apps/v1"


class ReplicaSetController(Controller):
    name = "replicaset-controller"
    workers = 4

    def setup(self) -> None:
        self.rs_informer = self.ctx.informers.get(REPLICASETS)
        self.pod_informer = self.ctx.informers.get(PODS)
        self.expectations = pu.Expectations()
        self.rs_informer.add_handler(self._on_rs)
        self.pod_informer.add_handler(self._on_pod)

    # --- handlers (enqueue only) -------------------------------------------------------
    def _on_rs(self, etype: str, rs: Obj, old: Obj | None) -> None:
        key = pu.pod_key(rs)
        if etype == "DELETED":
            self.expectations.forget(key)
        self.queue.add(key)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        for k in pu.observe_pod(self.expectations, etype, pod, old, "ReplicaSet"):
            self.queue.add(k)
        what, owner = pu.pod_event_kind(etype, pod, old), pu.owner_key_of(pod, "ReplicaSet")
        if owner is None and what != "deleted":
            for rs in self._matching_sets(pod):
                self.queue.add(pu.pod_key(rs))
        if old is not None and what == "updated" and not pu.is_ready(old) and pu.is_ready(pod) and owner:
            # minReadySeconds: look again once the pod has been Ready long enough.
            mrs = int(objects.spec(self.rs_informer.get(owner)).get("minReadySeconds") or 0)
            if mrs > 0:
                self.queue.add_after(owner, mrs + 0.05)

    def _matching_sets(self, pod: Obj) -> list[Obj]:
        ns = objects.meta(pod).get("namespace")
        labels = objects.labels(pod)
        return [rs for rs in self.rs_informer.list()
                if objects.meta(rs).get("namespace") == ns
                and workload_selects(objects.spec(rs).get("selector"), labels)]

    async def resync(self) -> None:
        for rs in self.rs_informer.list():
            self.queue.add(pu.pod_key(rs))

    # --- sync -----------------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        rs = self.rs_informer.get(key)
        if rs is None:
            self.expectations.forget(key)
            return
        ns, _ = split_key(key)
        pods = await self.claim_pods(rs, ns or "default")
        active = [p for p in pods if pu.is_active(p)]
        error: Exception | None = None
        if self.expectations.satisfied(key) and not objects.meta(rs).get("deletionTimestamp"):
            try:
                await self.manage_replicas(rs, key, active)
            except Exception as e:  # noqa: BLE001 - status is still written, then retry
                error = e
        await self.update_status(rs, active)
        if error is not None:
            raise error
        wait = self._next_availability_check(rs, active)
        if wait is not None:
            self.queue.add_after(key, wait)

    async def claim_pods(self, rs: Obj, ns: str) -> list[Obj]:
        """Owned pods that match, after adopting matching orphans and releasing non-matching ones."""
        selector = objects.spec(rs).get("selector")
        uid = objects.meta(rs).get("uid")
        owned: list[Obj] = []
        for pod in self.pod_informer.list():
            pmd = objects.meta(pod)
            if pmd.get("namespace") != ns or pu.is_terminal(pod) and not objects.controller_ref(pod):
                continue
            ref = objects.controller_ref(pod)
            matches = workload_selects(selector, pmd.get("labels"))
            if ref is not None:
                if ref.get("uid") != uid:
                    continue
                if matches:
                    owned.append(pod)
                elif not pu.is_terminating(pod):
                    await self._release(rs, pod)
            elif matches and not pu.is_terminating(pod) and not objects.meta(rs).get("deletionTimestamp"):
                adopted = await self._adopt(rs, pod)
                if adopted is not None:
                    owned.append(adopted)
        return owned

    async def _adopt(self, rs: Obj, pod: Obj) -> Obj | None:
        refs = list(objects.meta(pod).get("ownerReferences") or []) + [pu.owner_reference(rs, RS_API, "ReplicaSet")]
        try:
            return await self.client.patch(PODS, objects.meta(pod)["name"],
                                           {"metadata": {"ownerReferences": refs}},
                                           objects.meta(pod).get("namespace"))
        except ApiError as e:
            if e.code in (404, 409, 422):
                return None  # gone, replaced or changed meanwhile: the next event brings it back
            raise

    async def _release(self, rs: Obj, pod: Obj) -> None:
        refs = [r for r in objects.meta(pod).get("ownerReferences") or [] if r.get("uid") != objects.uid(rs)]
        try:
            await self.client.patch(PODS, objects.meta(pod)["name"], {"metadata": {"ownerReferences": refs or None}},
                                    objects.meta(pod).get("namespace"))
        except ApiError as e:
            if e.code not in (404, 409, 422):
                raise

    async def manage_replicas(self, rs: Obj, key: str, active: list[Obj]) -> None:
        want = int(objects.spec(rs).get("replicas", 1) or 0)
        diff = len(active) - want
        if diff < 0:
            await self._create(rs, key, min(-diff, BURST_REPLICAS))
        elif diff > 0:
            victims = sorted(active, key=pu.deletion_rank)[:min(diff, BURST_REPLICAS)]
            await self._delete(rs, key, victims)

    async def _create(self, rs: Obj, key: str, count: int) -> None:
        """Slow start as k8s: batches of 1, 2, 4, ... stop at the first failing batch."""
        self.expectations.expect_creations(key, count)
        template = objects.spec(rs).get("template") or {}
        created, remaining, batch = 0, count, 1
        first_error: Exception | None = None
        while remaining > 0:
            n = min(batch, remaining)
            pod = pu.pod_from_template(template, rs, RS_API, "ReplicaSet")
            results = await asyncio.gather(*(self.client.create(PODS, pod, objects.meta(rs).get("namespace"))
                                             for _ in range(n)), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            for r in results:
                if isinstance(r, BaseException):
                    self.expectations.creation_observed(key)  # never coming: do not wait for it
                else:
                    created += 1
                    await self.recorder.record(rs, "Normal", "SuccessfulCreate",
                                               f"Created pod: {objects.meta(r).get('name')}")
            remaining -= n
            if failed:
                first_error = failed[0] if isinstance(failed[0], Exception) else RuntimeError(str(failed[0]))
                for _ in range(remaining):
                    self.expectations.creation_observed(key)
                await self.recorder.record(rs, "Warning", "FailedCreate", f"Error creating: {first_error}")
                break
            batch *= 2
        if first_error is not None:
            raise first_error

    async def _delete(self, rs: Obj, key: str, victims: list[Obj]) -> None:
        self.expectations.expect_deletions(key, [pu.pod_key(p) for p in victims])

        results = await asyncio.gather(*(self.delete_pod(rs, key, p, self.expectations) for p in victims),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # --- status ----------------------------------------------------------------------------
    @staticmethod
    def compute_status(rs: Obj, active: list[Obj]) -> Obj:
        spec = objects.spec(rs)
        tmpl_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        mrs = int(spec.get("minReadySeconds") or 0)
        at = objects.now()
        old = objects.status(rs)
        status: Obj = {
            "replicas": len(active),
            "fullyLabeledReplicas": sum(1 for p in active if all(
                objects.labels(p).get(k) == v for k, v in tmpl_labels.items())),
            "readyReplicas": sum(1 for p in active if pu.is_ready(p)),
            "availableReplicas": sum(1 for p in active if pu.is_available(p, mrs, at)),
            "observedGeneration": objects.meta(rs).get("generation", 1),
        }
        if old.get("conditions"):
            status["conditions"] = old["conditions"]
        return status

    async def update_status(self, rs: Obj, active: list[Obj]) -> None:
        status = self.compute_status(rs, active)
        old = objects.status(rs)
        if all(old.get(k, 0) == v for k, v in status.items() if k != "conditions"):
            return
        try:
            await self.client.patch(REPLICASETS, objects.meta(rs)["name"], {"status": status},
                                    objects.meta(rs).get("namespace"), subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise

    @staticmethod
    def _next_availability_check(rs: Obj, active: list[Obj]) -> float | None:
        mrs = int(objects.spec(rs).get("minReadySeconds") or 0)
        waits = [w for p in active if (w := pu.seconds_until_available(p, mrs)) is not None]
        return min(waits) + 0.05 if waits else None
