"""The Deployment controller: one ReplicaSet per pod template, rolled as Kubernetes does.

``sync(namespace/name)`` reads the Deployment and the ReplicaSets it controls
(adopting matching orphans) from the caches, then:

* finds the *new* ReplicaSet, the one whose template equals the Deployment's
  (ignoring ``pod-template-hash``); creates it when missing, named
  ``<deployment>-<pod-template-hash>`` with the hash added to its selector,
  template labels and so to its pods; it gets the next
  ``deployment.kubernetes.io/revision`` (a rollback to an old template re-uses
  that ReplicaSet and bumps its revision);
* ``RollingUpdate``: scales the new ReplicaSet up while the sum of all
  ReplicaSets' ``spec.replicas`` stays within ``replicas + maxSurge`` and the
  old ones down while at least ``replicas - maxUnavailable`` pods stay
  available (maxSurge rounds up, maxUnavailable down; both 0 means 1
  unavailable), exactly the arithmetic of ``rolling.go``;
* ``Recreate``: scales every old ReplicaSet to 0, waits until their pods are
  gone, then scales the new one up;
* keeps at most ``revisionHistoryLimit`` old ReplicaSets (scaled to 0);
* writes status (replicas, updatedReplicas, readyReplicas, availableReplicas,
  unavailableReplicas, observedGeneration, conditions Available and
  Progressing) so ``kubectl rollout status`` and ``kubectl get deploy`` work.

Scaling decisions are taken from ReplicaSet ``spec.replicas`` (what was
asked, always fresh in this controller's own writes' wake) and availability from
ReplicaSet ``status`` (possibly stale, but only ever too low for a new set),
which is what keeps the surge and unavailability bounds during a rollout.
"""
from __future__ import annotations

import copy
import logging
from typing import Any

from .. import objects
from ..client import DEPLOYMENTS, PODS, REPLICASETS, ApiError
from ..intstr import scaled_value
from ..matching import workload_selects
from ..terms import Condition, DeploymentAnnotation, DeploymentReason
from . import podutil as pu
from .base import Controller, split_key

log = logging.getLogger("kube32.controllers.deployment")
Obj = dict[str, Any]

REVISION = DeploymentAnnotation.REVISION
DESIRED = DeploymentAnnotation.DESIRED_REPLICAS
MAX_REPLICAS = DeploymentAnnotation.MAX_REPLICAS
AVAILABLE, PROGRESSING = Condition.DEPLOYMENT_AVAILABLE, Condition.DEPLOYMENT_PROGRESSING
API = "apps/v1"


def _replicas(obj: Obj) -> int:
    return int(objects.spec(obj).get("replicas", 1) or 0)


def _st(obj: Obj, field: str) -> int:
    return int(objects.status(obj).get(field, 0) or 0)


def _revision(rs: Obj) -> int:
    try:
        return int(objects.annotations(rs).get(REVISION, "0"))
    except ValueError:
        return 0


def _rv(obj: Obj) -> int:
    try:
        return int(objects.meta(obj).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _created(rs: Obj) -> tuple:
    return (objects.meta(rs).get("creationTimestamp") or "", objects.meta(rs).get("name", ""))


def resolve_fenceposts(d: Obj) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as absolute numbers; never both 0 (k8s ResolveFenceposts)."""
    ru = (objects.spec(d).get("strategy") or {}).get("rollingUpdate") or {}
    want = _replicas(d)
    surge = scaled_value(ru.get("maxSurge", "25%"), want, round_up=True)
    unavailable = scaled_value(ru.get("maxUnavailable", "25%"), want, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def max_unavailable(d: Obj) -> int:
    strategy = (objects.spec(d).get("strategy") or {}).get("type", "RollingUpdate")
    if strategy != "RollingUpdate" or _replicas(d) == 0:
        return 0
    return min(resolve_fenceposts(d)[1], _replicas(d))


class DeploymentController(Controller):
    name = "deployment-controller"
    workers = 2

    def setup(self) -> None:
        self.d_informer = self.ctx.informers.get(DEPLOYMENTS)
        self.rs_informer = self.ctx.informers.get(REPLICASETS)
        self.pod_informer = self.ctx.informers.get(PODS)
        self._written: dict[str, Obj] = {}  # uid -> the ReplicaSet as our last write returned it
        self.d_informer.add_handler(lambda t, o, old: self.queue.add(pu.pod_key(o)))
        self.rs_informer.add_handler(self._on_rs)
        self.pod_informer.add_handler(self._on_pod)

    def _on_rs(self, etype: str, rs: Obj, old: Obj | None) -> None:
        for obj in (rs, old):
            key = pu.owner_key_of(obj, "Deployment") if obj else None
            if key:
                self.queue.add(key)
        if objects.controller_ref(rs) is None and etype != "DELETED":
            ns = objects.meta(rs).get("namespace")
            for d in self.d_informer.list():
                if objects.meta(d).get("namespace") == ns and workload_selects(
                        objects.spec(d).get("selector"), objects.meta(rs).get("labels")):
                    self.queue.add(pu.pod_key(d))

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        # Recreate waits for the old pods to be gone; a pod's end is what unblocks it.
        if etype != "DELETED":
            return
        rs_key = pu.owner_key_of(pod, "ReplicaSet")
        rs = self.rs_informer.get(rs_key) if rs_key else None
        d_key = pu.owner_key_of(rs, "Deployment") if rs else None
        if d_key:
            self.queue.add(d_key)

    async def resync(self) -> None:
        for d in self.d_informer.list():
            self.queue.add(pu.pod_key(d))

    # --- sync ---------------------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        d = self.d_informer.get(key)
        if d is None or objects.meta(d).get("deletionTimestamp"):
            return
        ns, _ = split_key(key)
        d = copy.deepcopy(d)
        sets = await self.claim_replica_sets(d, ns or "default")
        if not objects.spec(d).get("selector"):
            return
        new_rs, old_sets = self.split_new_old(d, sets)
        if objects.spec(d).get("paused"):
            await self.sync_status(d, new_rs, old_sets)
            return
        strategy = (objects.spec(d).get("strategy") or {}).get("type", "RollingUpdate")
        if strategy == "Recreate":
            new_rs = await self.rollout_recreate(d, new_rs, old_sets, ns or "default")
        else:
            new_rs = await self.rollout_rolling(d, new_rs, old_sets)
        await self.cleanup(d, new_rs, old_sets)
        await self.sync_status(d, new_rs, old_sets)

    async def claim_replica_sets(self, d: Obj, ns: str) -> list[Obj]:
        uid = objects.meta(d).get("uid")
        selector = objects.spec(d).get("selector")
        out = []
        for rs in self.rs_informer.list():
            rs = self._freshest(rs)
            rmd = objects.meta(rs)
            if rmd.get("namespace") != ns:
                continue
            ref = objects.controller_ref(rs)
            if ref is not None:
                if ref.get("uid") == uid:
                    out.append(rs)
            elif workload_selects(selector, rmd.get("labels")) and not rmd.get("deletionTimestamp"):
                refs = list(rmd.get("ownerReferences") or []) + [pu.owner_reference(d, API, "Deployment")]
                try:
                    out.append(await self.client.patch(REPLICASETS, rmd["name"],
                                                       {"metadata": {"ownerReferences": refs}}, ns))
                except ApiError as e:
                    if e.code not in (404, 409, 422):
                        raise
        return out

    def _freshest(self, rs: Obj) -> Obj:
        """The cached set, or our own later write of it when the cache has not caught up.

        Decisions on a ReplicaSet this controller just scaled must see that scale,
        or a sync triggered by another event could undo or repeat it.
        """
        mine = self._written.get(objects.meta(rs).get("uid", ""))
        if mine is not None and _rv(mine) > _rv(rs):
            return mine
        return rs

    def _remember(self, rs: Obj) -> Obj:
        if len(self._written) > 10000:
            self._written.clear()
        self._written[objects.meta(rs).get("uid", "")] = rs
        return rs

    @staticmethod
    def split_new_old(d: Obj, sets: list[Obj]) -> tuple[Obj | None, list[Obj]]:
        template = objects.spec(d).get("template")
        matching = sorted((rs for rs in sets if pu.templates_equal_ignoring_hash(
            objects.spec(rs).get("template"), template)), key=_created)
        new_rs = matching[0] if matching else None
        old = [rs for rs in sets if new_rs is None or objects.meta(rs).get("uid") != objects.meta(new_rs).get("uid")]
        return new_rs, old

    # --- the new ReplicaSet ---------------------------------------------------------------------
    async def ensure_new_rs(self, d: Obj, new_rs: Obj | None, old_sets: list[Obj], replicas: int) -> Obj:
        """The new ReplicaSet, created (with ``replicas``) or given the newest revision."""
        max_rev = max((_revision(rs) for rs in old_sets), default=0)
        if new_rs is not None:
            rev = _revision(new_rs)
            ann = objects.annotations(new_rs)
            want_ann = {DESIRED: str(_replicas(d)), MAX_REPLICAS: str(_replicas(d) + self._surge(d))}
            if rev <= max_rev or any(ann.get(k) != v for k, v in want_ann.items()):
                if rev <= max_rev:
                    want_ann[REVISION] = str(max_rev + 1)
                new_rs = self._remember(await self.client.patch(
                    REPLICASETS, objects.meta(new_rs)["name"], {"metadata": {"annotations": want_ann}},
                    objects.meta(new_rs).get("namespace")))
            await self._set_deployment_revision(d, _revision(new_rs))
            return new_rs
        collisions = int(objects.status(d).get("collisionCount") or 0)
        template = copy.deepcopy(objects.spec(d).get("template") or {})
        for _ in range(5):
            h = pu.template_hash(template, collisions)
            rs = self._new_rs_object(d, template, h, replicas, max_rev + 1)
            try:
                created = self._remember(await self.client.create(REPLICASETS, rs, objects.meta(d).get("namespace")))
            except ApiError as e:
                if e.code != 409:
                    raise
                existing = await self.client.try_get(REPLICASETS, rs["metadata"]["name"],
                                                     objects.meta(d).get("namespace"))
                if existing is not None and pu.is_controlled_by(existing, d) and pu.templates_equal_ignoring_hash(
                        objects.spec(existing).get("template"), template):
                    return existing  # our own earlier create: the cache had not seen it yet
                collisions += 1  # a different template hashed to the same name
                await self._patch_status(d, {"collisionCount": collisions})
                continue
            await self.recorder.record(d, "Normal", "ScalingReplicaSet",
                                       f"Scaled up replica set {objects.meta(created)['name']} to {replicas}")
            await self._set_deployment_revision(d, max_rev + 1)
            d.setdefault("status", {})["_created_new"] = objects.meta(created)["name"]
            return created
        raise ApiError(409, "Conflict", "cannot find a free name for the new replica set")

    def _new_rs_object(self, d: Obj, template: Obj, h: str, replicas: int, revision: int) -> Obj:
        t = copy.deepcopy(template)
        t.setdefault("metadata", {}).setdefault("labels", {})[pu.POD_TEMPLATE_HASH] = h
        selector = copy.deepcopy(objects.spec(d).get("selector") or {})
        selector.setdefault("matchLabels", {})[pu.POD_TEMPLATE_HASH] = h
        dmd = objects.meta(d)
        spec: Obj = {"replicas": replicas, "selector": selector, "template": t,
                     "minReadySeconds": int(objects.spec(d).get("minReadySeconds") or 0)}
        return {"apiVersion": API, "kind": "ReplicaSet",
                "metadata": {"name": f"{dmd['name']}-{h}", "namespace": dmd.get("namespace", "default"),
                             "labels": dict(t["metadata"]["labels"]),
                             "annotations": {REVISION: str(revision), DESIRED: str(_replicas(d)),
                                             MAX_REPLICAS: str(_replicas(d) + self._surge(d))},
                             "ownerReferences": [pu.owner_reference(d, API, "Deployment")]},
                "spec": spec}

    @staticmethod
    def _surge(d: Obj) -> int:
        strategy = (objects.spec(d).get("strategy") or {}).get("type", "RollingUpdate")
        return resolve_fenceposts(d)[0] if strategy == "RollingUpdate" else 0

    async def _set_deployment_revision(self, d: Obj, rev: int) -> None:
        ann = objects.annotations(d)
        if ann.get(REVISION) == str(rev):
            return
        try:
            out = await self.client.patch(DEPLOYMENTS, objects.meta(d)["name"],
                                          {"metadata": {"annotations": {REVISION: str(rev)}}},
                                          objects.meta(d).get("namespace"))
            d["metadata"] = out["metadata"]
        except ApiError as e:
            if e.code != 404:
                raise

    async def scale(self, d: Obj, rs: Obj, replicas: int) -> Obj:
        if _replicas(rs) == replicas:
            return rs
        old = _replicas(rs)
        out = await self.client.patch(REPLICASETS, objects.meta(rs)["name"],
                                      {"spec": {"replicas": replicas},
                                       "metadata": {"annotations": {
                                           DESIRED: str(_replicas(d)),
                                           MAX_REPLICAS: str(_replicas(d) + self._surge(d))}}},
                                      objects.meta(rs).get("namespace"))
        self._remember(out)
        verb = "up" if replicas > old else "down"
        await self.recorder.record(d, "Normal", "ScalingReplicaSet",
                                   f"Scaled {verb} replica set {objects.meta(rs)['name']} from {old} to {replicas}")
        return out

    # --- strategies -------------------------------------------------------------------------------
    async def rollout_rolling(self, d: Obj, new_rs: Obj | None, old_sets: list[Obj]) -> Obj:
        want = _replicas(d)
        surge, _ = resolve_fenceposts(d)
        if new_rs is None:
            current = sum(_replicas(rs) for rs in old_sets)
            # k8s NewRSNewReplicas: the new set starts with what the surge allows.
            start = want if not any(_replicas(rs) for rs in old_sets) else max(0, min(want, want + surge - current))
            new_rs = await self.ensure_new_rs(d, None, old_sets, start)
        else:
            new_rs = await self.ensure_new_rs(d, new_rs, old_sets, _replicas(new_rs))
            new_rs = await self.reconcile_new(d, new_rs, old_sets)
        await self.reconcile_old(d, new_rs, old_sets)
        return new_rs

    async def reconcile_new(self, d: Obj, new_rs: Obj, old_sets: list[Obj]) -> Obj:
        want = _replicas(d)
        have = _replicas(new_rs)
        if have == want:
            return new_rs
        if have > want:
            return await self.scale(d, new_rs, want)
        surge, _ = resolve_fenceposts(d)
        current = have + sum(_replicas(rs) for rs in old_sets)
        if current >= want + surge:
            return new_rs
        return await self.scale(d, new_rs, have + min(want + surge - current, want - have))

    async def reconcile_old(self, d: Obj, new_rs: Obj, old_sets: list[Obj]) -> None:
        """Scale old sets down as far as availability allows (k8s reconcileOldReplicaSets)."""
        if not sum(_replicas(rs) for rs in old_sets):
            return
        all_pods = _replicas(new_rs) + sum(_replicas(rs) for rs in old_sets)
        min_available = _replicas(d) - max_unavailable(d)
        new_unavailable = _replicas(new_rs) - _st(new_rs, "availableReplicas")
        max_scaled_down = all_pods - min_available - new_unavailable
        if max_scaled_down <= 0:
            return
        # First the old pods that are not available anyway: removing them costs nothing.
        ordered = sorted(old_sets, key=_created)
        cleaned = 0
        for i, rs in enumerate(ordered):
            if cleaned >= max_scaled_down:
                break
            unhealthy = _replicas(rs) - _st(rs, "availableReplicas")
            if _replicas(rs) == 0 or unhealthy <= 0:
                continue
            down = min(unhealthy, max_scaled_down - cleaned)
            ordered[i] = await self.scale(d, rs, _replicas(rs) - down)
            cleaned += down
        # Then available ones, while enough stay available.
        available = _st(new_rs, "availableReplicas") + sum(min(_st(rs, "availableReplicas"), _replicas(rs))
                                                          for rs in ordered)
        if available <= min_available:
            self._sync_old_back(old_sets, ordered)
            return
        budget = min(available - min_available, max_scaled_down - cleaned)
        for i, rs in enumerate(ordered):
            if budget <= 0:
                break
            if _replicas(rs) == 0:
                continue
            down = min(_replicas(rs), budget)
            ordered[i] = await self.scale(d, rs, _replicas(rs) - down)
            budget -= down
        self._sync_old_back(old_sets, ordered)

    @staticmethod
    def _sync_old_back(old_sets: list[Obj], ordered: list[Obj]) -> None:
        by_uid = {objects.meta(rs).get("uid"): rs for rs in ordered}
        old_sets[:] = [by_uid.get(objects.meta(rs).get("uid"), rs) for rs in old_sets]

    async def rollout_recreate(self, d: Obj, new_rs: Obj | None, old_sets: list[Obj], ns: str) -> Obj | None:
        for i, rs in enumerate(old_sets):
            if _replicas(rs):
                old_sets[i] = await self.scale(d, rs, 0)
        old_uids = {objects.meta(rs).get("uid") for rs in old_sets}
        old_pods_left = any(objects.meta(p).get("namespace") == ns
                            and (objects.controller_ref(p) or {}).get("uid") in old_uids
                            and not pu.is_terminal(p) for p in self.pod_informer.list())
        if old_pods_left:
            if new_rs is not None:
                await self.ensure_new_rs(d, new_rs, old_sets, _replicas(new_rs))
            return new_rs  # the pods' DELETED events bring this deployment back
        if new_rs is None:
            return await self.ensure_new_rs(d, None, old_sets, _replicas(d))
        new_rs = await self.ensure_new_rs(d, new_rs, old_sets, _replicas(new_rs))
        return await self.scale(d, new_rs, _replicas(d))

    async def cleanup(self, d: Obj, new_rs: Obj | None, old_sets: list[Obj]) -> None:
        limit = objects.spec(d).get("revisionHistoryLimit", 10)
        if limit is None:
            return
        idle = [rs for rs in old_sets if _replicas(rs) == 0 and _st(rs, "replicas") == 0
                and not objects.meta(rs).get("deletionTimestamp")]
        excess = len(idle) - int(limit)
        for rs in sorted(idle, key=lambda r: (_revision(r), _created(r)))[:max(excess, 0)]:
            try:
                await self.client.delete(REPLICASETS, objects.meta(rs)["name"], objects.meta(rs).get("namespace"),
                                         uid=objects.meta(rs).get("uid"), propagation="Background")
            except ApiError as e:
                if e.code not in (404, 409):
                    raise

    # --- status ------------------------------------------------------------------------------------
    def compute_status(self, d: Obj, new_rs: Obj | None, old_sets: list[Obj]) -> Obj:
        sets = ([new_rs] if new_rs else []) + old_sets
        want = _replicas(d)
        available = sum(_st(rs, "availableReplicas") for rs in sets)
        old = objects.status(d)
        status: Obj = {
            "observedGeneration": objects.meta(d).get("generation", 1),
            "replicas": sum(_st(rs, "replicas") for rs in sets),
            "updatedReplicas": _st(new_rs, "replicas") if new_rs else 0,
            "readyReplicas": sum(_st(rs, "readyReplicas") for rs in sets),
            "availableReplicas": available,
            # As k8s calculateStatus: asked-for pods (all sets) not available, never negative.
            "unavailableReplicas": max(0, sum(_replicas(rs) for rs in sets) - available),
        }
        if old.get("collisionCount"):
            status["collisionCount"] = old["collisionCount"]
        conds = {c.get("type"): c for c in old.get("conditions") or [] if isinstance(c, dict)}
        now = objects.rfc3339()

        def set_cond(ctype: str, cstatus: str, reason: str, message: str, progress: bool = False) -> None:
            prev = conds.get(ctype)
            c = {"type": ctype, "status": cstatus, "reason": reason, "message": message,
                 "lastUpdateTime": now, "lastTransitionTime": now}
            if prev is not None:
                if prev.get("status") == cstatus:
                    c["lastTransitionTime"] = prev.get("lastTransitionTime", now)
                if prev.get("status") == cstatus and prev.get("reason") == reason and not progress:
                    c["lastUpdateTime"] = prev.get("lastUpdateTime", now)
                    c["message"] = prev.get("message", message) if prev.get("message") == message else message
            conds[ctype] = c

        if available >= want - max_unavailable(d):
            set_cond(AVAILABLE, "True", DeploymentReason.MINIMUM_REPLICAS_AVAILABLE,
                     "Deployment has minimum availability.")
        else:
            set_cond(AVAILABLE, "False", DeploymentReason.MINIMUM_REPLICAS_UNAVAILABLE,
                     "Deployment does not have minimum availability.")
        paused = bool(objects.spec(d).get("paused"))
        name = objects.meta(new_rs)["name"] if new_rs else ""
        complete = (new_rs is not None and status["updatedReplicas"] == want and status["replicas"] == want
                    and available >= want and _replicas(new_rs) == want)
        created_now = objects.status(d).get("_created_new")
        if paused:
            set_cond(PROGRESSING, "Unknown", DeploymentReason.PAUSED, "Deployment is paused")
        elif complete:
            set_cond(PROGRESSING, "True", DeploymentReason.NEW_REPLICA_SET_AVAILABLE,
                     f'ReplicaSet "{name}" has successfully progressed.')
        elif created_now:
            set_cond(PROGRESSING, "True", DeploymentReason.NEW_REPLICA_SET_CREATED, f'Created new replica set "{name}"',
                     progress=True)
        else:
            progressed = any(old.get(k, 0) != status[k] for k in ("replicas", "updatedReplicas", "readyReplicas",
                                                                   "availableReplicas"))
            prev = conds.get(PROGRESSING)
            deadline = objects.spec(d).get("progressDeadlineSeconds")
            last = objects.parse_time((prev or {}).get("lastUpdateTime"))
            timed_out = (not progressed and deadline is not None and last is not None
                         and (prev or {}).get("reason") != DeploymentReason.NEW_REPLICA_SET_AVAILABLE
                         and (objects.now() - last).total_seconds() > int(deadline))
            exceeded = (prev or {}).get("reason") == DeploymentReason.PROGRESS_DEADLINE_EXCEEDED
            if timed_out or exceeded and not progressed:
                set_cond(PROGRESSING, "False", DeploymentReason.PROGRESS_DEADLINE_EXCEEDED,
                         f'ReplicaSet "{name}" has timed out progressing.')
            elif new_rs is not None:
                set_cond(PROGRESSING, "True", DeploymentReason.REPLICA_SET_UPDATED,
                         f'ReplicaSet "{name}" is progressing.',
                         progress=progressed or (prev or {}).get("reason") != DeploymentReason.REPLICA_SET_UPDATED)
        # Its own two first, then any other a user or a tool set, kept (as the Deployment
        # controller keeps conditions it does not manage).
        status["conditions"] = [conds[t] for t in (AVAILABLE, PROGRESSING) if t in conds] + [
            c for t, c in conds.items() if t not in (AVAILABLE, PROGRESSING)]
        return status

    async def sync_status(self, d: Obj, new_rs: Obj | None, old_sets: list[Obj]) -> None:
        status = self.compute_status(d, new_rs, old_sets)
        old = {k: v for k, v in objects.status(d).items() if k != "_created_new"}
        if status != old:
            await self._patch_status(d, status)
        prog = next((c for c in status["conditions"] if c["type"] == PROGRESSING), None)
        deadline = objects.spec(d).get("progressDeadlineSeconds")
        if prog and prog.get("reason") == DeploymentReason.REPLICA_SET_UPDATED and deadline is not None:
            self.queue.add_after(pu.pod_key(d), float(deadline) + 1)

    async def _patch_status(self, d: Obj, status: Obj) -> None:
        try:
            out = await self.client.patch(DEPLOYMENTS, objects.meta(d)["name"], {"status": status},
                                          objects.meta(d).get("namespace"), subresource="status")
            d["status"] = out.get("status", status)
        except ApiError as e:
            if e.code != 404:
                raise
