"""``POST pods/<name>/eviction``: PodDisruptionBudgets, then what an allowed eviction does.

After Kubernetes' eviction REST (``pkg/registry/core/pod/storage/eviction.go``):

* A pod that is not running yet or any more (Pending, Succeeded, Failed) or is
  already being deleted is evicted without looking at budgets.
* Otherwise every PodDisruptionBudget of the namespace whose selector matches
  the pod is consulted (more than one: 500, as Kubernetes).  The budget is computed
  here from the pods as they are *now* (:func:`kube32.budgets.budget_status`, the same
  function the disruption controller writes into ``status``), under a lock, so two
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
  not deleted, which would lose its state: the eviction waits up to ``timing.REPLACED_WAIT``
  seconds for the move to end and then decides on the pod as it is (moved on if it
  runs there; gone back to its source if it rolled back), or answers 429 to be asked
  again (``kubectl drain`` retries every 5 s).
* The answer to an eviction that moves a pod waits, outside the lock and for at most
  ``timing.REPLACED_WAIT`` seconds, for the move to end, and says how it ended:
  ``Completed`` (the replacement runs on its new node) or failed before the replacement
  (the pod is deleted, as an eviction deletes it) is 201; rolled back to the node it was
  to leave (with its state: a cordoned source takes it back only when no other node
  does) is 429 TooManyRequests naming the move and its reason, so ``kubectl drain``
  prints it, asks again and never says the node is drained while the pod runs there;
  rolled back elsewhere (the pod left the node) is 201.  A move still under way at the
  bound (its replacement restoring) is 201: the replacement has its new uid, which is
  what ``kubectl drain`` waits for (spec).  The move is marked
  ``kube32.io/eviction-answered`` first, so that a later rollback never takes the pod
  back to a cordoned source (the Checkpoint controller's ``rollback_node``): a drained
  node never gets back a pod its drain was told had gone.  ``kubectl drain`` looks at the
  pod right after the answer and then once a second: answered at once, its first look
  would find the old pod (the move takes tens of milliseconds) and the drain would sit a
  second on it.  Kubernetes answers when
  the deletion starts; here the "deletion" is the move.
* A client that was told 429 because the pod is a replacement restoring on node T asks
  again with the pod's name only (``kubectl drain`` sends no uid precondition).  Should the
  move have rolled back meanwhile, the name now belongs to the pod back on its source, a
  node nobody asked to drain: the retry is about the pod that was on T, which is gone from
  there, so it is answered 201 without touching the pod (``kubectl drain`` then sees a new
  uid and completes).  The handler remembers each such refusal (namespace, name, user ->
  the replacement's uid and node) for ``timing.EVICTION_RETRY_MEMORY`` seconds, at most
  ``REFUSALS_KEPT`` of them (oldest forgotten first).
* For ``timing.EVICTION_BACKOFF_AFTER_ROLLBACK`` seconds after an eviction's move of a pod
  rolled back to its source, evictions of that pod are refused the same way (429, the move named)
  instead of moving it again: each try would freeze it and most likely roll back again.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from .. import movability, objects, timing
from ..budgets import BudgetStatus, budget_status, pdb_selects, pod_ready
from ..terms import API_VERSION, Annotation, CheckpointAction, CheckpointPhase, Label, PodPhase, Trigger
from . import dryrun, errors
from .registry import PATCH_MERGE, Registry, check_preconditions
from .resources import by_plural
from .selectors import parse_field_selector

Obj = dict[str, Any]

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
REFUSALS_KEPT = 4096   # "being restored here" refusals remembered for the clients' retries
ANSWERED_TRIES = 5     # marking a move eviction-answered, against other API servers' writes (~1.5 s)


@dataclass(frozen=True)
class _Refusal:
    """A 429 answered because the pod was a move's replacement restoring on ``node``."""
    uid: str
    node: str
    until: float   # time.monotonic() after which a retry is judged afresh


# --- the handler ------------------------------------------------------------------

def _success() -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    return web.Response(body=json.dumps(body).encode(), status=201, content_type="application/json")


def not_evicted(pod_name: str, move: Obj, ago: float = 0.0) -> errors.APIError:
    """The 429 of an eviction whose move (``move``, an eviction's) rolled back ``ago``
    seconds ago: the pod is back where it was asked to leave, with its state."""
    left = max(1, round(timing.EVICTION_BACKOFF_AFTER_ROLLBACK - ago))
    return errors.too_many_requests(
        f'pod "{pod_name}" was not evicted: its move (checkpoint {objects.name(move)}) failed: '
        f'{objects.status(move).get("message") or "rolled back"}; evictions do not move it again for {left} s')


def _rolled_back_recently(moves: list[Obj], now: float) -> tuple[Obj, float] | None:
    """The latest of an eviction's ``moves`` of a pod that rolled back less than
    timing.EVICTION_BACKOFF_AFTER_ROLLBACK seconds ago, and how long ago, if any."""
    recent = []
    for ck in moves:
        finished = objects.parse_time(objects.status(ck).get("finishedAt"))
        if objects.labels(ck).get(Label.TRIGGER) == Trigger.EVICTION and movability.rolled_back_to_source(ck) \
                and finished is not None and now - finished.timestamp() < timing.EVICTION_BACKOFF_AFTER_ROLLBACK:
            recent.append((ck, max(0.0, now - finished.timestamp())))
    return min(recent, key=lambda r: r[1]) if recent else None


def violation(pdb_name: str, status: BudgetStatus) -> errors.APIError:
    err = errors.too_many_requests(VIOLATION)
    err.details = {"causes": [{"reason": "DisruptionBudget",
                               "message": f"The disruption budget {pdb_name} needs {status.desired_healthy} "
                                          f"healthy pods and has {status.current_healthy} currently"}]}
    return err


class EvictionHandler:
    """``APIServer.evictions``: (request, target, Eviction body) -> response."""

    def __init__(self, registry: Registry,
                 image_exports: Callable[[str], list[str] | None] | None = None) -> None:
        self.registry = registry
        self.image_exports = image_exports or (lambda digest: None)  # embedded image -> its exports
        self._lock = asyncio.Lock()  # one eviction decision at a time: budgets are read-then-act
        self._refusals: OrderedDict[tuple[str, str, str], _Refusal] = OrderedDict()

    def _remember_refusal(self, key: tuple[str, str, str], pod: Obj) -> None:
        self._refusals.pop(key, None)
        self._refusals[key] = _Refusal(objects.meta(pod).get("uid", ""), objects.spec(pod).get("nodeName", ""),
                                       time.monotonic() + timing.EVICTION_RETRY_MEMORY)
        while len(self._refusals) > REFUSALS_KEPT:
            self._refusals.popitem(last=False)

    def _retry_of_gone_replacement(self, key: tuple[str, str, str], pod: Obj) -> bool:
        """Whether this eviction retries one refused for a replacement that has since left
        its node (its move rolled back): the pod it was about is gone from there."""
        refusal = self._refusals.get(key)
        if refusal is None:
            return False
        if refusal.until < time.monotonic():
            del self._refusals[key]
            return False
        if objects.meta(pod).get("uid") == refusal.uid or objects.spec(pod).get("nodeName") == refusal.node:
            return False
        del self._refusals[key]
        return True

    async def __call__(self, request: web.Request, t: Any, body: Obj) -> web.StreamResponse:
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise errors.bad_request("deleteOptions must be an object")
        # kubectl drain --dry-run=server says it in deleteOptions, not in the query
        dry_run = dryrun.requested(request, options)
        user = request.get("user")
        key = (t.namespace, t.name, getattr(user, "name", ""))
        first_uid = None
        for last_try in (False, True):
            async with self._lock:
                pod = await self.registry.get(t.res, t.namespace, t.name)
                if first_uid is not None and pod["metadata"].get("uid") != first_uid:
                    return _success()  # the move rolled back: the pod asked to leave is gone from here
                if first_uid is None and not (options.get("preconditions") or {}).get("uid") \
                        and self._retry_of_gone_replacement(key, pod):
                    return _success()
                # A move keeps the name, so a client that names the pod it meant by uid must
                # not evict its replacement: judged before budgets, as Kubernetes does.
                check_preconditions(t.res, pod, options.get("preconditions"))
                first_uid = pod["metadata"].get("uid")
                restoring = await self._move_restoring(pod)
                if restoring is None:
                    await self.check_budgets(pod)
                    move = await self.carry_out(pod, options, dry_run)
                    break
            if last_try:
                if not dry_run:
                    self._remember_refusal(key, pod)
                raise errors.too_many_requests(
                    f'pod "{objects.name(pod)}" is being restored here by move {objects.name(restoring)}: it can '
                    "be evicted once the move ends (it runs here, or goes back to its source)")
            await self._until_move_ends(restoring)
        if move is not None and not dry_run:
            ended = await self._until_finished(move)
            if ended is None:
                ended = await self._answered(move)
            if movability.rolled_back_to_source(ended):
                assert ended is not None
                raise not_evicted(objects.name(pod), ended)
        return _success()

    async def _answered(self, move: Obj) -> Obj | None:
        """Mark ``move``, still under way, ``kube32.io/eviction-answered`` before the answer
        says the pod left: should it roll back later, the pod does not go back to its source
        while that node is cordoned (a drain was told it had gone).  The move as marked
        (it may have rolled back just before), or None when it is gone."""
        for attempt in range(ANSWERED_TRIES):
            try:
                marked, _ = await self.registry.patch(
                    by_plural("checkpoints"), objects.namespace(move), objects.name(move), PATCH_MERGE,
                    {"metadata": {"annotations": {Annotation.EVICTION_ANSWERED: "true"}}})
                return marked
            except errors.APIError as e:
                if e.code == 404:
                    return None
                # Another API server's controllers write the move at that moment (a leader's
                # failover resyncs them all): the registry's retries ran out; wait a little,
                # boundedly, rather than answer kubectl drain a 409 it does not retry.
                if e.code != 409 or attempt == ANSWERED_TRIES - 1:
                    raise
                await asyncio.sleep(0.05 * 2 ** attempt)
        return None

    async def _move_restoring(self, pod: Obj) -> Obj | None:
        """The move under way whose replacement ``pod`` is, if it is one: deleting it would
        lose the pod's state (the Checkpoint controller completes the move or rolls it back)."""
        name = movability.restore_from(pod)
        if name is None:
            return None
        try:
            ck = await self.registry.get(by_plural("checkpoints"), objects.namespace(pod), name)
        except errors.APIError as e:
            if e.code == 404:
                return None
            raise
        return ck if movability.replacement_of_move(ck, pod) else None

    async def _until_move_ends(self, move: Obj) -> None:
        """Until ``move`` is no longer under way, at most timing.REPLACED_WAIT seconds (a restore
        takes milliseconds; a target that never finishes it rolls back within the
        rollback timeout)."""
        try:
            await asyncio.wait_for(self._watch_until("checkpoints", move, lambda _, c: objects.status(c).get(
                "phase") not in CheckpointPhase.IN_FLIGHT), timing.REPLACED_WAIT)
        except (asyncio.TimeoutError, errors.APIError):
            pass  # looked at again by the caller

    async def check_budgets(self, pod: Obj) -> None:
        """Raise 429 when a budget forbids evicting ``pod`` now."""
        if objects.meta(pod).get("deletionTimestamp"):
            return
        if objects.phase(pod) in (PodPhase.PENDING, PodPhase.SUCCEEDED, PodPhase.FAILED):
            return
        ns = objects.namespace(pod)
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
            raise errors.internal(f"the disruption budget {objects.name(pdb)} is invalid: {e}") from None
        if not pod_ready(pod):
            policy = objects.spec(pdb).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
            if policy == "AlwaysAllow" or status.current_healthy >= status.desired_healthy:
                return
        if status.disruptions_allowed <= 0:
            raise violation(objects.name(pdb), status)

    async def _scales(self, ns: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for plural in ("replicasets", "deployments"):
            items, _ = await self.registry.list(by_plural(plural), ns)
            for obj in items:
                out[obj["metadata"].get("uid", "")] = int(objects.spec(obj).get("replicas", 1) or 0)
        items, _ = await self.registry.list(by_plural("daemonsets"), ns)
        for obj in items:
            out[obj["metadata"].get("uid", "")] = int(objects.status(obj).get("desiredNumberScheduled", 0) or 0)
        return out

    async def carry_out(self, pod: Obj, options: Obj, dry_run: bool) -> Obj | None:
        """What an allowed eviction does: move a pod that can move, delete any other.
        Returns the Move Checkpoint carrying out the eviction, if it is a move."""
        if self.can_move(pod):
            return await self._move(pod, dry_run)
        if objects.meta(pod).get("uid") and not (options.get("preconditions") or {}).get("uid"):
            options = {**options, "preconditions": {**(options.get("preconditions") or {}),
                                                    "uid": pod["metadata"]["uid"]}}
        await self.registry.delete(by_plural("pods"), objects.namespace(pod), objects.name(pod),
                                   options=options, dry_run=dry_run)
        return None

    def can_move(self, pod: Obj) -> bool:
        spec, status = objects.spec(pod), objects.status(pod)
        if not spec.get("nodeName") or status.get("phase") != PodPhase.RUNNING:
            return False
        if objects.meta(pod).get("deletionTimestamp"):
            return False
        containers = spec.get("containers") or []
        if len(containers) != 1:
            return False
        digest = movability.embedded_digest(containers[0].get("image", ""))
        exports = self.image_exports(digest) if digest else None
        return not movability.spec_blockers(pod, exports)

    async def _checkpoints_of(self, ns: str, name: str) -> list[Obj]:
        """The namespace's Checkpoints whose ``spec.podName`` is ``name``: read as stored
        bytes, and only those that hold ``"podName":"<name>"`` decoded (a superset: the
        caller checks the field).  A drain's evictions each decoded every Checkpoint of the
        namespace: at 1,000 nodes, with a thousand pods' periodic ones, a quarter of the
        control plane during a 500-pod drain (issue 25, bench/notes.md)."""
        kvs, _ = await self.registry.store.list(by_plural("checkpoints").prefix(ns))
        mark = b'"podName":' + json.dumps(name).encode()
        return [self.registry.shared_decode(kv) for kv in kvs if mark in kv.value]

    async def _move(self, pod: Obj, dry_run: bool) -> Obj | None:
        ns, name = objects.namespace(pod), objects.name(pod)
        checkpoints = by_plural("checkpoints")
        existing = await self._checkpoints_of(ns, name)
        moves = [ck for ck in existing if objects.spec(ck).get("podName") == name
                 and objects.spec(ck).get("action") == CheckpointAction.MOVE
                 and not objects.meta(ck).get("deletionTimestamp")]
        for ck in moves:
            if objects.phase(ck) in (CheckpointPhase.PENDING, CheckpointPhase.SAVING, CheckpointPhase.MOVING):
                return ck  # a move is under way: the eviction is that move
        recent = _rolled_back_recently(moves, time.time())
        if recent is not None:
            raise not_evicted(name, *recent)
        import secrets
        ck = {"apiVersion": API_VERSION, "kind": "Checkpoint",
              "metadata": {"name": f"{name[:40]}-evict-{secrets.token_hex(3)}", "namespace": ns,
                           "labels": {Label.TRIGGER: Trigger.EVICTION}},
              "spec": {"podName": name, "action": CheckpointAction.MOVE}}
        return await self.registry.create(checkpoints, ns, ck, dry_run=dry_run)

    async def _watch_until(self, plural: str, obj: Obj, done: Callable[[str, Obj], bool]) -> Obj | None:
        """Until ``obj`` is deleted (None) or ``done`` says so of a later version (that
        version): the watch replays from the revision read, so nothing that happened since
        is missed."""
        fields = parse_field_selector(f"metadata.name={objects.name(obj)}")
        async for kind, seen in self.registry.watch(by_plural(plural), objects.namespace(obj), None, fields,
                                                    obj["metadata"]["resourceVersion"]):
            if kind == "DELETED":
                return None
            if done(kind, seen):
                return seen
        return None

    async def _until_finished(self, move: Obj) -> Obj | None:
        """``move`` as it ended (Completed or Failed), waiting timing.REPLACED_WAIT seconds at
        most; None when it is still under way then, or gone."""
        if objects.phase(move) in (CheckpointPhase.COMPLETED, CheckpointPhase.FAILED):
            return move
        try:
            return await asyncio.wait_for(self._watch_until("checkpoints", move, lambda _, c: objects.phase(c) in (
                CheckpointPhase.COMPLETED, CheckpointPhase.FAILED)), timing.REPLACED_WAIT)
        except (asyncio.TimeoutError, errors.APIError):
            return None  # still under way; a watch that failed (a compacted revision: 410) too
