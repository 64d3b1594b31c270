"""``POST pods/<name>/eviction``: PodDisruptionBudgets, then what an allowed eviction does.

After Kubernetes' eviction REST (``pkg/registry/core/pod/storage/eviction.go``):

* A pod that is not running yet or any more (Pending, Succeeded, Failed) or is
  already being deleted is evicted without looking at budgets.
* Otherwise every PodDisruptionBudget of the namespace whose selector matches
  the pod is consulted (more than one: 500, as Kubernetes).  The budget is computed
  here from the pods as they are *now* (:func:`budget_status`, the same function
  the disruption controller writes into ``status``), under a lock, so two
  evictions at once cannot both take the last allowed disruption.
* A budget with no disruption left refuses with 429 TooManyRequests "Cannot evict
  pod as it would violate the pod's disruption budget." and a cause naming the
  budget (kubectl drain prints it and retries every 5 s).  A pod that is not
  Ready may go while the budget is met (``unhealthyPodEvictionPolicy``
  IfHealthyBudget, the default; AlwaysAllow lets it go always).
* An allowed eviction goes through :meth:`EvictionHandler.carry_out`, the one
  place that decides what an eviction does.  A running pod that can move, by its
  spec and its ``kube32.io/migration`` policy (spec: "Drain and evictions"), moves:
  the handler creates a Move Checkpoint labelled ``kube32.io/trigger: eviction``
  (no target: the scheduler picks) and the Checkpoint controller carries it out;
  its replacement has a new uid, which is what ``kubectl drain`` waits for.  Any
  other pod is deleted as a DELETE with the Eviction's deleteOptions would
  (graceful for bound pods), and its owner starts a new one.  A second eviction of
  a pod whose move is under way starts no second move.
* A pod that is the replacement of a move under way (restoring on its target) is
  not deleted, which would lose its state: the eviction waits up to ``REPLACED_WAIT``
  seconds for the move to end and then decides on the pod as it is (moved on if it
  runs there; gone back to its source if it rolled back), or answers 429 to be asked
  again (``kubectl drain`` retries every 5 s).
* The answer to an eviction that moves a pod waits, outside the lock and for at most
  ``REPLACED_WAIT`` seconds, until the pod is replaced (a new uid, or gone) or its
  move ended otherwise.  ``kubectl drain`` looks at the pod right after the answer
  and then once a second: answered at once, its first look would find the old pod
  (the move takes tens of milliseconds) and the drain would sit a second on it.
  Kubernetes answers when the deletion starts; here the "deletion" is the move.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from .. import movability
from ..intstr import scaled_value
from . import dryrun, errors, meta
from .registry import Registry
from .resources import by_plural
from .selectors import parse_field_selector, selector_from_match

Obj = dict[str, Any]

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
REPLACED_WAIT = 5.0  # seconds an eviction's answer may wait for its move's replacement


# --- budgets (pure) ---------------------------------------------------------------

def pdb_selects(pdb: Obj, pod: Obj) -> bool:
    """policy/v1: a null selector selects nothing, an empty one every pod of the namespace."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None or meta.namespace_of(pdb) != meta.namespace_of(pod):
        return False
    try:
        return selector_from_match(selector).matches(meta.labels_of(pod))
    except (KeyError, TypeError, errors.APIError):
        return False


def pod_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [] if isinstance(c, dict))


def pod_healthy(pod: Obj) -> bool:
    return not (pod.get("metadata") or {}).get("deletionTimestamp") and pod_ready(pod)


@dataclass(frozen=True)
class BudgetStatus:
    expected_pods: int
    current_healthy: int
    desired_healthy: int
    disruptions_allowed: int

    def as_status(self) -> Obj:
        return {"expectedPods": self.expected_pods, "currentHealthy": self.current_healthy,
                "desiredHealthy": self.desired_healthy, "disruptionsAllowed": self.disruptions_allowed}


def expected_count(pods: list[Obj], scale_of: dict[str, int]) -> int:
    """How many pods the budget protects: each controller's desired count (``scale_of``,
    by controller uid) once, each pod without a known controller as one."""
    seen: set[str] = set()
    total = 0
    for pod in pods:
        ctrl = next((r for r in (pod.get("metadata") or {}).get("ownerReferences") or []
                     if isinstance(r, dict) and r.get("controller")), None)
        uid = ctrl.get("uid") if ctrl else None
        if uid and uid in scale_of:
            if uid not in seen:
                seen.add(uid)
                total += scale_of[uid]
        else:
            total += 1
    return total


def budget_status(pdb: Obj, pods: list[Obj], scale_of: dict[str, int] | None = None) -> BudgetStatus:
    """The budget over the pods it selects (``pods`` may hold others: they are filtered).
    Raises ValueError naming a bad minAvailable/maxUnavailable."""
    mine = [p for p in pods if pdb_selects(pdb, p)
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    healthy = sum(1 for p in mine if pod_healthy(p))
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        expected = expected_count(mine, scale_of or {})
        desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected, round_up=True))
    elif spec.get("minAvailable") is not None:
        value = spec["minAvailable"]
        expected = expected_count(mine, scale_of or {}) if isinstance(value, str) and value.strip().endswith("%") else len(mine)
        desired = scaled_value(value, expected, round_up=True)
    else:
        expected, desired = len(mine), len(mine)
    return BudgetStatus(expected, healthy, desired, max(0, healthy - desired))


# --- the handler ------------------------------------------------------------------

def _success() -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    return web.Response(body=json.dumps(body).encode(), status=201, content_type="application/json")


def violation(pdb_name: str, status: BudgetStatus) -> errors.APIError:
    err = errors.too_many_requests(VIOLATION)
    err.details = {"causes": [{"reason": "DisruptionBudget",
                               "message": f"The disruption budget {pdb_name} needs {status.desired_healthy} "
                                          f"healthy pods and has {status.current_healthy} currently"}]}
    return err


class EvictionHandler:
    """Installed as ``APIServer.eviction_handler``: (request, target, Eviction body) -> response."""

    def __init__(self, registry: Registry,
                 image_exports: Callable[[str], list[str] | None] | None = None) -> None:
        self.registry = registry
        self.image_exports = image_exports or (lambda digest: None)  # embedded image -> its exports
        self._lock = asyncio.Lock()  # one eviction decision at a time: budgets are read-then-act

    async def __call__(self, request: web.Request, t: Any, body: Obj) -> web.StreamResponse:
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise errors.bad_request("deleteOptions must be an object")
        # kubectl drain --dry-run=server says it in deleteOptions, not in the query
        dry_run = dryrun.requested(request, options)
        first_uid = None
        for last_try in (False, True):
            async with self._lock:
                pod = await self.registry.get(t.res, t.namespace, t.name)
                if first_uid is not None and pod["metadata"].get("uid") != first_uid:
                    return _success()  # the move rolled back: the pod asked to leave is gone from here
                first_uid = pod["metadata"].get("uid")
                restoring = await self._move_restoring(pod)
                if restoring is None:
                    await self.check_budgets(pod)
                    move = await self.carry_out(pod, options, dry_run)
                    break
            if last_try:
                raise errors.too_many_requests(
                    f'pod "{meta.name_of(pod)}" is being restored here by move {meta.name_of(restoring)}: it can '
                    "be evicted once the move ends (it runs here, or goes back to its source)")
            await self._until_move_ends(restoring)
        if move is not None and not dry_run:
            await self._until_replaced(pod, move)
        return _success()

    async def _move_restoring(self, pod: Obj) -> Obj | None:
        """The move under way whose replacement ``pod`` is, if it is one: deleting it would
        lose the pod's state (the Checkpoint controller completes the move or rolls it back)."""
        name = movability.restore_from(pod)
        if name is None:
            return None
        try:
            ck = await self.registry.get(by_plural("checkpoints"), meta.namespace_of(pod), name)
        except errors.APIError as e:
            if e.code == 404:
                return None
            raise
        return ck if movability.replacement_of_move(ck, pod) else None

    async def _until_move_ends(self, move: Obj) -> None:
        """Until ``move`` is no longer under way, at most REPLACED_WAIT seconds (a restore
        takes milliseconds; a target that never finishes it rolls back within the
        rollback timeout)."""
        try:
            await asyncio.wait_for(self._watch_until("checkpoints", move, lambda _, c: (c.get("status") or {}).get(
                "phase") not in ("Saving", "Moving")), REPLACED_WAIT)
        except (asyncio.TimeoutError, errors.APIError):
            pass  # looked at again by the caller

    async def check_budgets(self, pod: Obj) -> None:
        """Raise 429 when a budget forbids evicting ``pod`` now."""
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return
        if (pod.get("status") or {}).get("phase") in ("Pending", "Succeeded", "Failed"):
            return
        ns = meta.namespace_of(pod)
        pdbs, _ = await self.registry.list(by_plural("poddisruptionbudgets"), ns)
        mine = [p for p in pdbs if pdb_selects(p, pod)]
        if not mine:
            return
        if len(mine) > 1:
            raise errors.internal("This pod has more than one PodDisruptionBudget, which the eviction "
                                  "subresource does not support.")
        pdb = mine[0]
        pods, _ = await self.registry.list(by_plural("pods"), ns)
        try:
            status = budget_status(pdb, pods, await self._scales(ns))
        except ValueError as e:
            raise errors.internal(f"the disruption budget {meta.name_of(pdb)} is invalid: {e}") from None
        if not pod_ready(pod):
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
            if policy == "AlwaysAllow" or status.current_healthy >= status.desired_healthy:
                return
        if status.disruptions_allowed <= 0:
            raise violation(meta.name_of(pdb), status)

    async def _scales(self, ns: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for plural in ("replicasets", "deployments"):
            items, _ = await self.registry.list(by_plural(plural), ns)
            for obj in items:
                out[obj["metadata"].get("uid", "")] = int((obj.get("spec") or {}).get("replicas", 1) or 0)
        items, _ = await self.registry.list(by_plural("daemonsets"), ns)
        for obj in items:
            out[obj["metadata"].get("uid", "")] = int((obj.get("status") or {}).get("desiredNumberScheduled", 0) or 0)
        return out

    async def carry_out(self, pod: Obj, options: Obj, dry_run: bool) -> Obj | None:
        """What an allowed eviction does: move a pod that can move, delete any other.
        Returns the Move Checkpoint carrying out the eviction, if it is a move."""
        if self.can_move(pod):
            return await self._move(pod, dry_run)
        if (pod.get("metadata") or {}).get("uid") and not (options.get("preconditions") or {}).get("uid"):
            options = {**options, "preconditions": {**(options.get("preconditions") or {}),
                                                    "uid": pod["metadata"]["uid"]}}
        await self.registry.delete(by_plural("pods"), meta.namespace_of(pod), meta.name_of(pod),
                                   options=options, dry_run=dry_run)
        return None

    def can_move(self, pod: Obj) -> bool:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") != "Running":
            return False
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        containers = spec.get("containers") or []
        if len(containers) != 1:
            return False
        digest = movability.embedded_digest(containers[0].get("image", ""))
        exports = self.image_exports(digest) if digest else None
        return not movability.spec_blockers(pod, exports)

    async def _move(self, pod: Obj, dry_run: bool) -> Obj | None:
        ns, name = meta.namespace_of(pod), meta.name_of(pod)
        checkpoints = by_plural("checkpoints")
        existing, _ = await self.registry.list(checkpoints, ns)
        for ck in existing:
            if ((ck.get("spec") or {}).get("podName") == name and (ck.get("spec") or {}).get("action") == "Move"
                    and (ck.get("status") or {}).get("phase") in ("Pending", "Saving", "Moving")):
                return ck  # a move is under way: the eviction is that move
        import secrets
        ck = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
              "metadata": {"name": f"{name[:40]}-evict-{secrets.token_hex(3)}", "namespace": ns,
                           "labels": {movability.TRIGGER: "eviction"}},
              "spec": {"podName": name, "action": "Move"}}
        return await self.registry.create(checkpoints, ns, ck, dry_run=dry_run)

    async def _watch_until(self, plural: str, obj: Obj, done: Callable[[str, Obj], bool]) -> None:
        """Until ``obj`` is deleted or ``done`` says so of a later version: the watch replays
        from the revision read, so nothing that happened since is missed."""
        fields = parse_field_selector(f"metadata.name={meta.name_of(obj)}")
        async for kind, seen in self.registry.watch(by_plural(plural), meta.namespace_of(obj), None, fields,
                                                    obj["metadata"]["resourceVersion"]):
            if kind == "DELETED" or done(kind, seen):
                return

    async def _until_replaced(self, pod: Obj, move: Obj) -> None:
        """Until ``pod`` has a replacement (or is gone) or ``move`` ended, at most
        REPLACED_WAIT seconds: the watches replay from the revisions read, so nothing
        that happened since is missed."""
        uid = pod["metadata"]["uid"]
        waits = [asyncio.ensure_future(self._watch_until("pods", pod, lambda _, p: p["metadata"].get("uid") != uid)),
                 asyncio.ensure_future(self._watch_until("checkpoints", move, lambda _, c: (c.get("status") or {}).get(
                     "phase") in ("Completed", "Failed")))]
        try:
            await asyncio.wait(waits, timeout=REPLACED_WAIT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            # a watch that failed (a compacted revision: 410) only ends the wait early
            await asyncio.gather(*waits, return_exceptions=True)
