"""The Checkpoint controller: carries out Save and Move Checkpoints (spec: "Moves").

Level-triggered on the Checkpoint's ``status.phase`` and the pod it names:

* ``Pending`` -> while another Move of the pod is Saving or Moving, wait for it to end
  (still ``Pending``, the message saying so), then take the pod as it is then (its new
  node); check the pod spec for blockers (when it has some, the node's too,
  asked with ``dryRun=All``: nothing freezes) and pick the target (Move); have room
  in the checkpoint data space promised to the snapshot (``PUT .../data?fromNode=...&
  reserve=true``: the node says its size, nothing freezes; still ``Pending`` while it
  waits in line for room that moves in flight hold, ``status.message`` naming them and
  its place; ``Failed`` after the rollback timeout and timing.ROOM_WAIT_EXTRA_SECONDS);
  meanwhile a Move's target pulls the pod's image, and its answer is needed before the
  pod freezes (``Failed``, never frozen, when it cannot pull or gives no answer within
  the rollback timeout: kube32.controllers.imagecheck);
  wait for the control plane's one snapshot slot, namespaces in turn (still
  ``Pending``, ``status.message`` saying so: ``Saving`` means frozen), then
  ``Saving`` (with ``status.targetNode`` for a Move, so the target's kubelet asks for
  the data before it is stored: kube32.kubelet.prefetch): ask the pod's kubelet for a snapshot
  (``leave=running`` for Save,
  ``leave=frozen`` for Move) through the node proxy and stream it straight into
  the Checkpoint's data.  Save ends ``Saved``.  Move replaces the pod in one write
  (``pods/<name>/replacement``: same name, spec, labels and owners, a new uid,
  ``spec.nodeName`` = the target, ``kube32.io/restore-from`` = the Checkpoint)
  and turns ``Moving``.
* ``Moving`` -> once the replacement runs: ``Completed``, the annotation removed,
  a Moved event with the time from the freeze.  When it fails to restore, fails,
  or does not run within the rollback timeout (60 s): the pod goes back to its
  source node (or, when that node is not Ready or has no room for it any more, to the
  scheduler; when it is cordoned and the move an eviction's, to another node that takes it,
  else to the scheduler once the eviction was answered: :meth:`CheckpointController.rollback_node`)
  and restores from the same Checkpoint; the Checkpoint turns ``Failed`` with the reason
  and ``status.rollbackNode``.  A
  replacement that ran once is Completed whatever it does later.  When the Checkpoint's
  data is gone (``DataStored=False``: kube32.apiserver.checkpointstatus) there is nothing
  to roll back: the pod is replaced afresh on its source, and the message says so.
* A failure before the replacement thaws the pod where it runs: among them a target
  that cannot pull the image, or whose module is not the snapshot's, and the Checkpoint
  deleted before the replacement (its data is refused then: 409).
* Deleted (``deletionTimestamp``; the finalizer ``kube32.io/checkpoint-protection`` keeps
  it, kube32.apiserver.strategies.checkpoint): a ``Saving`` or ``Moving`` one is carried
  through first; then, and for any other phase at once, the finalizer goes once no pod's
  ``kube32.io/restore-from`` names it, so a replacement or a rollback restoring from it
  never finds it gone (spec: "A Checkpoint stays while a pod's kube32.io/restore-from
  names it").

Invariants: the control plane takes one snapshot at a time (one slot around the
snapshot's transfer; others wait, namespaces in turn, without holding a worker; a move or
a requested Save before any periodic one, :class:`SnapshotTurns`); a pod
still in a call gives the slot up after timing.FREEZE_TRY_SECONDS and tries again at its
next turn, until the freeze timeout; every pod write names the uid it expects, so a pod replaced or deleted
meanwhile is never overwritten; a ``Saving`` phase found with no snapshot in
progress here (a control plane restart) fails and thaws at once, so no pod stays frozen -
unless the move's replacement was written: then the move goes on as ``Moving`` and the
replacement decides it.  A move's replacement is only ever decided here
(:func:`replaced_by_move`: no eviction, node lifecycle or PodGC deletes it).
Bookkeeping lives in status (``podUID``, ``newPodUID``, ``frozenAtMs``, ``movingSinceMs``,
``finishedAt``), so the controller picks up where it was after a restart.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from .. import metrics, movability, objects, testing, timing
from ..aio import FairShare
from ..client import CHECKPOINTS, NODES, PODS, ApiError, MutationCache
from ..terms import (FASTEST, Annotation, Cause, CheckpointAction, CheckpointPhase, Finalizer, Header, Label,
                     PodPhase, StatusReason, Trigger)
from ..urlpath import api_path, group_path
from . import imagecheck
from .base import Controller, in_turns, key_of, split_key
from .periodic import RESTORING_FROM, restoring_from
from .podutil import all_running, failure
from .scheduler import UsageOf, node_misfits, node_ready, pick_node_by, room_misfits, usage_reader

log = logging.getLogger("kube32.checkpoint")
ENDED = metrics.REGISTRY.counter(
    "kube32_checkpoints_ended_total", "Checkpoints that ended, by action and outcome: Saved (a Save), "
    "Completed (a move), Failed (refused or failed before a replacement), RolledBack (the pod restored "
    "from the same Checkpoint), StartedAfresh (rolled back with no data left: the pod started afresh).",
    ("action", "outcome"))
THAW_TRIES = 10   # a second apart: a failed move's thaw while the node or the API server is away
FREEZE_TO_RUNNING = metrics.REGISTRY.histogram(
    "kube32_move_freeze_to_running_seconds", "Time from a moving pod's freeze to its replacement running.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0))
Obj = dict[str, Any]

FINISHED = CheckpointPhase.FINISHED
WAITING_FOR_TURN = "waiting for its turn: the control plane takes one snapshot at a time"
INTERRUPTED = "the snapshot was interrupted (the control plane restarted)"


CHECKPOINTS_OF = "pod"   # the Checkpoints informer's index: each under "<namespace>/<podName>"


def checkpoint_pod(ck: Obj) -> tuple[str, ...]:
    return (f"{ck['metadata'].get('namespace', '')}/{objects.spec(ck).get('podName', '')}",)


def interp_mops(node: Obj) -> float:
    try:
        return float(objects.annotations(node).get(Annotation.INTERP_MOPS, 0))
    except (TypeError, ValueError):
        return 0.0


def fastest_fit(pod: Obj, nodes: list[Obj], usage_of: UsageOf, extra_selector: dict | None,
                exclude: set[str]) -> str | None:
    """The fastest node (``kube32.io/interp-mops``) that takes the pod, never one excluded
    (``usage_of``: each node's usage, the pod aside: scheduler.usage_reader)."""
    fits = [n for n in nodes if n["metadata"]["name"] not in exclude
            and not node_misfits(pod, n, usage_of(n["metadata"]["name"]), extra_selector)]
    if not fits:
        return None
    return max(fits, key=lambda n: (interp_mops(n), n["metadata"]["name"]))["metadata"]["name"]


def replaced_by_move(checkpoints: Any, pod: Obj) -> bool:
    """``pod`` is the replacement of a move under way, by the Checkpoints informer: only
    this controller decides what becomes of it (movability.replacement_of_move)."""
    ck_name = movability.restore_from(pod)
    return ck_name is not None and movability.replacement_of_move(
        checkpoints.get(f"{pod['metadata'].get('namespace')}/{ck_name}"), pod)


class MoveError(Exception):
    def __init__(self, message: str, blockers: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.blockers = blockers or []


class StillInACall(MoveError):
    """The node's 504: the pod's current call did not return within the try's timeout."""

    def outlasted(self, ms: int) -> MoveError:
        """The blocker once the freeze timeout (``ms``) has passed since the first try
        (spec: "call k32_handle still running after <ms> ms")."""
        blockers = [_RUNNING_AFTER.sub(f"still running after {ms} ms", b) for b in self.blockers]
        return MoveError("; ".join(blockers) or self.message, blockers)


_RUNNING_AFTER = re.compile(r"still running after \d+ ms")


GUARD_RETRIES = 3                 # a guarded status write tried again after a change of marks alone
PERIODIC_TURNS = "\x00periodic"   # a periodic Save's turn key: its namespace and this


class SnapshotTurns(FairShare):
    """The control plane's one snapshot slot (:class:`~kube32.aio.FairShare` by namespace),
    where a move or a Save someone asked for goes before every periodic Save: a periodic
    Save is routine and may wait; a move is a drain, a user or a node under pressure
    waiting.  At 1,000 nodes the thousand restored pods' periodic Saves (one every 120 s
    each, 8 a second) took every turn the drain's 500 moves waited for (issue 25)."""

    @staticmethod
    def key(ck: Obj) -> str:
        ns = str(ck["metadata"]["namespace"])
        return ns + PERIODIC_TURNS if objects.labels(ck).get(Label.TRIGGER) == Trigger.PERIODIC else ns

    def _rank(self, key: str) -> tuple[int, ...]:
        return (key.endswith(PERIODIC_TURNS), *super()._rank(key))


@dataclass
class _Take:
    """One Checkpoint's snapshot as it goes (`CheckpointController._snapshot`): the
    target's image pull, begun and answered before the pod freezes, and its Saving
    write, begun in its first turn."""

    ck: Obj
    pod: Obj
    container: str
    source: str
    target: str | None
    guard: bool
    began: bool = False  # Saving was sent
    saving: "asyncio.Future[Obj] | None" = None
    pulled: "asyncio.Future[str] | None" = None

    @property
    def namespace(self) -> str:
        return str(self.ck["metadata"]["namespace"])

    @property
    def leave(self) -> str:
        return "running" if self.target is None else "frozen"

    async def current(self) -> Obj:
        """The Checkpoint as this snapshot last wrote it."""
        if self.saving is not None:
            self.ck, self.saving = await self.saving, None
        return self.ck


def _status(ck: Obj) -> Obj:
    return objects.status(ck)


def _same_but_marks(ck: Obj, latest: Obj) -> bool:
    """Whether ``latest`` is ``ck`` but for its annotations and labels (same uid, spec,
    status, deletion and finalizers)."""
    md, new = ck["metadata"], latest["metadata"]
    return (md.get("uid") == new.get("uid") and objects.spec(ck) == objects.spec(latest)
            and _status(ck) == _status(latest) and md.get("deletionTimestamp") == new.get("deletionTimestamp")
            and md.get("finalizers") == new.get("finalizers"))


def _deleted_unless_in_flight(ck: Obj) -> bool:
    """``ck`` is being deleted, and no snapshot or replacement of it is under way: it goes
    (:meth:`CheckpointController._release`) instead of starting or being looked after.  A
    ``Saving`` or ``Moving`` one is carried through first: its pod's state is in it."""
    return bool(ck["metadata"].get("deletionTimestamp")) and _status(ck).get("phase") not in CheckpointPhase.IN_FLIGHT


def _answer_message(text: str) -> str:
    """The message of an API server's refusal (a Status), or its text."""
    try:
        return str(json.loads(text).get("message", text))
    except (json.JSONDecodeError, AttributeError):
        return text


def _room_cause(text: str) -> str | None:
    """Why a snapshot waits for room in the checkpoint data space, when the refusal says
    it does (the cause WaitingForRoom of a 429): None for any other refusal."""
    try:
        causes = (json.loads(text).get("details") or {}).get("causes") or []
    except (json.JSONDecodeError, AttributeError):
        return None
    return next((str(c.get("message")) for c in causes if isinstance(c, dict)
                 and c.get("reason") == Cause.WAITING_FOR_ROOM), None)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _container_state(pod: Obj, container: str) -> Obj:
    for cs in objects.status(pod).get("containerStatuses") or []:
        if cs.get("name") == container:
            return cs.get("state") or {}
    return {}


def container_of(ck: Obj, pod: Obj) -> str:
    wanted = objects.spec(ck).get("containerName")
    names = [c.get("name") for c in objects.spec(pod).get("containers") or []]
    if wanted:
        if wanted not in names:
            raise MoveError(f'pod {pod["metadata"]["name"]} has no container "{wanted}"')
        return wanted
    if len(names) != 1:
        raise MoveError(f'pod {pod["metadata"]["name"]} has {len(names)} containers: name one in spec.containerName')
    return names[0]


def replacement_of(pod: Obj, node: str | None, checkpoint: str | None) -> Obj:
    """The pod as it should be re-created: same name, spec, labels and owners."""
    md = pod["metadata"]
    annotations = dict(md.get("annotations") or {})
    if checkpoint:
        annotations[Annotation.RESTORE_FROM] = checkpoint
    else:
        annotations.pop(Annotation.RESTORE_FROM, None)
    spec = dict(pod["spec"])
    if node:
        spec["nodeName"] = node
    else:
        spec.pop("nodeName", None)
    new_md = {k: md[k] for k in ("name", "namespace", "labels", "ownerReferences", "finalizers") if k in md}
    new_md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": new_md, "spec": spec}


class CheckpointController(Controller):
    name = "checkpoint-controller"
    workers = 4

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # The control plane takes one snapshot at a time, namespaces in turn (kube32.aio.FairShare).
        self.turns = SnapshotTurns(1)
        self._taking: dict[str, asyncio.Task[None]] = {}  # checkpoint key -> its snapshot (`_snapshot`)
        self._windows: dict[str, tuple[int, int]] = {}  # checkpoint key -> when it held the slot
        self.exports: dict[str, list[str]] = {}  # image digest -> its exports (a drain asks once)
        self._running_since: dict[str, int] = {}  # replacement uid -> when first seen running (Unix ms)
        self.rollback_seconds = ctx.options.move_rollback_seconds
        self.retention_seconds = ctx.options.checkpoint_retention_seconds
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        # Every status write of this controller goes through here: a sync that follows one
        # of them (its own watch events wake it) sees it without a GET.
        self.latest = MutationCache(self.checkpoints)
        self.pods = ctx.informers.get(PODS)
        # A pod's Checkpoints and the pods naming one, by index: a sync reads its own, not
        # every Checkpoint and pod of the cluster (issue 25).
        self.checkpoints.add_index(CHECKPOINTS_OF, checkpoint_pod)
        self.pods.add_index(RESTORING_FROM, restoring_from)
        self.nodes = ctx.informers.get(NODES)

    def setup(self) -> None:
        self.checkpoints.add_handler(lambda t, o, old: self.queue.add(key_of(o)))
        self.pods.add_handler(self._on_pod)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        """A pod that a Moving Checkpoint waits for changed: look at that Checkpoint.  So
        also when a pod's restore-from stopped naming one (a Checkpoint being deleted may
        go then)."""
        ck_name = movability.restore_from(pod)
        if ck_name:
            uid = pod["metadata"].get("uid", "")
            if uid not in self._running_since and all_running(pod):
                # When the replacement was first seen running: the Moved figure ends here,
                # not when a sync gets to it.
                if len(self._running_since) >= 4096:
                    self._running_since.clear()
                self._running_since[uid] = _now_ms()
            self.queue.add(f"{pod['metadata']['namespace']}/{ck_name}")
        was = movability.restore_from(old) if old is not None else None
        if was and was != ck_name:
            self.queue.add(f"{old['metadata']['namespace']}/{was}")  # type: ignore[index]

    async def resync(self) -> None:
        async for ck in in_turns(self.checkpoints.list()):
            phase = _status(ck).get("phase")
            if phase in (CheckpointPhase.COMPLETED, CheckpointPhase.FAILED, CheckpointPhase.MOVING) or phase is None:
                self.queue.add(key_of(ck))

    # --- sync ---------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        if key in self._taking:
            return  # its snapshot decides (`_begin_snapshot`); a sync looks again once it ended
        ns, name = split_key(key)
        # The informer's copy, or this controller's own later write: no GET on the way.
        current = self.latest.get(key)
        phase = (_status(current).get("phase") or CheckpointPhase.PENDING) if current is not None else None
        if current is not None and _deleted_unless_in_flight(current):
            await self._release(current)
            return
        if current is not None and phase in FINISHED:
            # A finished Checkpoint never changes phase again, and its retention deletes
            # by uid: the cached copy will do (a moved pod's later events wake it).
            await self._retain(current)
            return
        if current is not None and phase == CheckpointPhase.PENDING:
            # The copy may be stale (already Saving, if another control plane wrote it); _start's
            # first write names its resourceVersion: a stale copy ends in a 409, a thaw of the
            # pod when it froze it, and a retry - never a second replacement.
            await self._start(current, guard=True)
            return
        if current is not None and phase == CheckpointPhase.MOVING:
            await self._check_move(current, confirmed=False)
            return
        # Saving (a snapshot this control plane is not taking: it restarted), or not cached.
        await self._sync_from_api(ns, name)

    async def _refetch(self, ck: Obj) -> None:
        md = ck["metadata"]
        await self._sync_from_api(md["namespace"], md["name"], md["uid"])

    async def _sync_from_api(self, ns: str | None, name: str, uid: str | None = None) -> None:
        """Decide on the API's copy (a cached one was not enough)."""
        ck = await self.client.try_get(CHECKPOINTS, name, ns)
        if ck is None or (uid is not None and ck["metadata"]["uid"] != uid):
            return
        self.latest.mutated(ck)
        phase = _status(ck).get("phase") or CheckpointPhase.PENDING
        if _deleted_unless_in_flight(ck):
            await self._release(ck)
        elif phase == CheckpointPhase.PENDING:
            await self._start(ck)
        elif phase == CheckpointPhase.SAVING:
            await self._interrupted(ck)
        elif phase == CheckpointPhase.MOVING:
            await self._check_move(ck)
        else:
            await self._retain(ck)

    async def _set_status(self, ck: Obj, guard: bool = False, **fields: Any) -> Obj:
        """``guard``: only if ``ck`` is still current (its resourceVersion), else 409."""
        md = ck["metadata"]
        body: Obj = {"status": fields}
        if guard:
            body["metadata"] = {"resourceVersion": md["resourceVersion"]}
        return self.latest.mutated(
            await self.client.patch(CHECKPOINTS, md["name"], body, md["namespace"], subresource="status"))

    async def _set_status_unless_changed(self, ck: Obj, guard: bool, **fields: Any) -> Obj:
        """:meth:`_set_status`, where a guard's 409 for a change of ``ck``'s annotations or
        labels alone is no change: the write goes on against the newer version.  The
        Eviction API marks a move ``kube32.io/eviction-answered`` while it waits for its
        turn, and Saving, guarded by the version before, was refused after the snapshot
        had been taken: the pod thawed and the move went back to the end of the line
        (issue 25: a 500-pod drain at 1,000 nodes went nowhere).  A change of its spec,
        status or deletion is the 409 it was."""
        for _ in range(GUARD_RETRIES):
            try:
                return await self._set_status(ck, guard, **fields)
            except ApiError as e:
                if not guard or e.code != 409:
                    raise
                latest = await self.client.get(CHECKPOINTS, ck["metadata"]["name"], ck["metadata"]["namespace"])
                if not _same_but_marks(ck, latest):
                    raise
                ck = latest
        return await self._set_status(ck, guard, **fields)

    async def _event(self, pod: Obj | None, type_: str, reason: str, message: str) -> None:
        if pod is not None:
            await self.recorder.record(pod, type_, reason, message)

    # --- Pending -> Saving -> Saved | Moving ------------------------------------------
    def _move_under_way(self, ck: Obj) -> Obj | None:
        """Another Move Checkpoint of ``ck``'s pod that is Saving or Moving (its replacement
        not yet decided), or None.  This controller's own writes count at once."""
        spec, md = objects.spec(ck), ck["metadata"]
        for other in self.checkpoints.by_index(CHECKPOINTS_OF, f"{md['namespace']}/{spec.get('podName', '')}"):
            other = self.latest.get(key_of(other)) or other
            o_spec = objects.spec(other)
            if other["metadata"]["uid"] != md["uid"] and other["metadata"].get("namespace") == md["namespace"] \
                    and o_spec.get("podName") == spec.get("podName") and o_spec.get("action") == CheckpointAction.MOVE \
                    and _status(other).get("phase") in (CheckpointPhase.SAVING, CheckpointPhase.MOVING):
                return other
        return None

    async def _wait_for_move(self, ck: Obj, guard: bool) -> bool:
        """While another move of the pod is under way ``ck`` stays Pending, says so, and looks
        again later: it takes the pod as that move leaves it (its new node), never the copy it
        read before.  Returns whether it waits."""
        other = self._move_under_way(ck)
        if other is None:
            return False
        message = f"waiting for its turn: its pod is under another move (checkpoint {other['metadata']['name']})"
        if _status(ck).get("message") != message:
            await self._set_status(ck, guard, message=message)
        self.queue.add_after(key_of(ck), timing.MOVE_POLL_SECONDS)
        return True

    async def _start(self, ck: Obj, guard: bool = False) -> None:
        spec = objects.spec(ck)
        ns, action = ck["metadata"]["namespace"], spec.get("action", CheckpointAction.SAVE)
        if await self._wait_for_move(ck, guard):
            return
        pod = await self._pod_to_save(ns, spec.get("podName", ""))
        try:
            if pod is None:
                raise MoveError(f'pod "{spec.get("podName")}" not found')
            container = container_of(ck, pod)
            blockers = movability.spec_blockers(pod, await self._image_exports(pod, container))
            if blockers:
                blockers = list(dict.fromkeys(blockers + await self._node_blockers(pod, container)))
                raise MoveError("the pod cannot move: " + "; ".join(blockers), blockers)
            source = objects.spec(pod).get("nodeName")
            if not source or objects.phase(pod) != PodPhase.RUNNING:
                raise MoveError(f'pod {pod["metadata"]["name"]} is not running on a node')
            if pod["metadata"].get("deletionTimestamp"):
                raise MoveError(f'pod {pod["metadata"]["name"]} is being deleted')
            target = await self._target(ck, pod) if action == CheckpointAction.MOVE else None
        except MoveError as e:
            await self._fail(ck, pod, e, action, guard=guard)
            return
        self._begin_snapshot(_Take(ck, pod, container, source, target, guard))

    # --- the snapshot, in the control plane's one slot --------------------------------
    def _begin_snapshot(self, take: "_Take") -> None:
        """The snapshot runs beside the workers, so its wait for the slot holds none of them
        (other Checkpoints' moves go on meanwhile); the Checkpoint's own syncs leave it to
        that task (`_taking`), and one looks again once it ended."""
        key = key_of(take.ck)
        task = asyncio.create_task(self._snapshot(take), name=f"snapshot {key}")
        self._taking[key] = task
        task.add_done_callback(lambda t: self._snapshot_ended(key, t))

    def _snapshot_ended(self, key: str, task: "asyncio.Task[None]") -> None:
        if self._taking.get(key) is task:
            del self._taking[key]
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            self._on_error(key, err)
            self.queue.add_rate_limited(key)
        else:
            self.queue.add(key)  # what changed meanwhile (a replacement already running) is seen

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            tasks = list(self._taking.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _snapshot(self, take: "_Take") -> None:
        """Take the snapshot in the control plane's one slot (namespaces in turn:
        kube32.aio.FairShare), then store it and go on.

        The slot covers the snapshot's transfer only: the replacement, the status and the
        restore of one move overlap the next one's snapshot (a drain moves pods in a row).
        Saving means frozen: a Checkpoint waiting for its turn stays Pending and says so;
        Saving is sent once the slot is held, and the snapshot does not wait for its
        answer: the write and the node's freeze overlap.  A Saving Checkpoint is only ever
        looked at by this task or, after a control plane restart, found interrupted.  A
        move's target is named from Saving on: its kubelet asks for the data at once (a GET
        that waits for it), so the bytes reach it while the pod is being replaced.  Before
        its turn, room for the snapshot in the checkpoint data space is promised to it
        (`_wait_for_room`), so no pod freezes for a snapshot that would find none."""
        self._begin_pull(take)
        try:
            await self._wait_for_room(take)
            await self._target_can_pull(take)
        except MoveError as e:
            imagecheck.drop(take.pulled)
            await self._fail(take.ck, take.pod, e, CheckpointAction.SAVE if take.target is None else
                             CheckpointAction.MOVE, guard=take.guard)
            return
        except BaseException:
            imagecheck.drop(take.pulled)
            raise
        if self.turns.busy():
            take.ck = await self._set_status(take.ck, take.guard, message=WAITING_FOR_TURN)
            take.guard = True
        try:
            outcome = await self._take_turns(take)
            if outcome is None:
                return
            ck = await take.current()
        except asyncio.CancelledError:
            if take.saving is not None:
                take.saving.cancel()
            imagecheck.drop(take.pulled)
            raise
        except Exception:
            # Saving was refused (the Checkpoint changed or went): the sync starts again from
            # the API's copy, and a pod frozen for this try thaws.
            imagecheck.drop(take.pulled)
            if take.leave == "frozen" and take.began:
                await self._thaw(take.source, take.namespace, take.pod["metadata"]["name"], take.container)
            raise
        taken, window = outcome
        # When this snapshot held the control plane's one snapshot slot (Unix ms): users and
        # tests see that snapshots never overlap.
        self._windows[key_of(ck)] = window
        await self._save_and_continue(ck, take.pod, take.container, take.source, take.target, taken, take.pulled)

    async def _take_turns(self, take: "_Take") -> "tuple[tuple[int, Obj] | MoveError, tuple[int, int]] | None":
        """The snapshot (or why it failed) and when it held the slot; None when the turn came
        after another move of the pod took its (the pod read before is gone from its node:
        the Checkpoint starts again once that move ends).  A pod still in a call when its
        turn comes gives the slot to the next snapshot and tries again at its next turn,
        until the freeze timeout has passed since its first try (timing.FREEZE_TRY_SECONDS)."""
        deadline: float | None = None
        while True:
            async with self.turns.turn(SnapshotTurns.key(take.ck)):
                if deadline is None:
                    if self._move_under_way(take.ck) is not None:
                        return None
                    self._begin_saving(take)
                    await asyncio.sleep(0)  # the write goes out first
                    deadline = time.monotonic() + timing.FREEZE_TIMEOUT_SECONDS
                started = _now_ms()
                try_ms = max(1, int(min(timing.FREEZE_TRY_SECONDS, deadline - time.monotonic()) * 1000))
                try:
                    taken: tuple[int, Obj] | MoveError = await self._stream_snapshot(
                        take.ck, take.pod, take.container, take.source, take.leave, try_ms)
                except MoveError as e:
                    taken = e
                window = (started, _now_ms())
            if not isinstance(taken, StillInACall):
                return taken, window
            if time.monotonic() >= deadline:
                return taken.outlasted(int(timing.FREEZE_TIMEOUT_SECONDS * 1000)), window
            await self._in_a_call(take, taken)

    def _begin_saving(self, take: "_Take") -> None:
        """Saving, written beside the first try."""
        pod = take.pod
        take.began = True
        take.saving = asyncio.ensure_future(self._set_status_unless_changed(
            take.ck, take.guard, phase=CheckpointPhase.SAVING, message="", nodeName=take.source,
            podUID=pod["metadata"]["uid"], **({"targetNode": take.target} if take.target else {})))

    def _begin_pull(self, take: "_Take") -> None:
        """A move's target gets the image (imagecheck) while room for the snapshot is asked
        for, before the pod freezes.  Bounded by the rollback timeout: a target that cannot
        say that soon whether it can pull the image would not run the replacement within it
        either (a target that hangs once kept the pod frozen for the pull's 60 s)."""
        if take.target is None:
            return
        pod = take.pod
        take.pulled = asyncio.ensure_future(imagecheck.pull_on(
            self.client, take.target, imagecheck.image_of(pod, take.container),
            pod["metadata"].get("annotations") or {},
            timeout=min(imagecheck.PULL_TIMEOUT_SECONDS, self.rollback_seconds)))

    @staticmethod
    async def _target_can_pull(take: "_Take") -> None:
        """The target's answer to the pull, awaited before the pod freezes: MoveError when
        it cannot pull the image (the pod never froze for it).  Whether the module is the
        snapshot's is checked once the snapshot is taken (`_target_unfit`)."""
        if take.pulled is None:
            return
        try:
            await asyncio.shield(take.pulled)
        except imagecheck.TargetImageError as e:
            raise MoveError(str(e)) from None

    async def _in_a_call(self, take: "_Take", busy: MoveError) -> None:
        """The pod was in a call when its turn came: the Checkpoint says so, and waits for its next."""
        ck = await take.current()
        message = (f"its pod is in a call ({busy.message}): the next snapshot goes first, and this one tries "
                   f"again at its turn, for up to {timing.FREEZE_TIMEOUT_SECONDS:g} s")
        if _status(ck).get("message") != message:
            take.ck = await self._set_status(ck, message=message)

    async def _wait_for_room(self, take: "_Take") -> None:
        """Room in the checkpoint data space promised to the snapshot before its pod freezes
        (``PUT .../data?fromNode=...&reserve=true``: the API server asks the node, without a
        freeze, how large the snapshot would be, and waits in line for room; moves in flight
        hold it until they end).  Meanwhile the Checkpoint stays Pending and its message
        says why and where it stands in line.  MoveError when the node refuses (the pod's
        blockers), when the snapshot cannot fit even once the moves in flight ended, or when
        no room came within the rollback timeout and timing.ROOM_WAIT_EXTRA_SECONDS (by then
        the moves in flight that held it have ended)."""
        name = take.pod["metadata"]["name"]
        bound = self.rollback_seconds + timing.ROOM_WAIT_EXTRA_SECONDS
        deadline = time.monotonic() + bound
        path = CHECKPOINTS.path(take.namespace, take.ck["metadata"]["name"], "data")
        params = {"fromNode": take.source, "pod": name, "container": take.container, "reserve": "true"}
        wait = 0  # the first ask answers at once: a Checkpoint that must wait says so at once
        while True:
            params["waitSeconds"] = str(wait)
            try:
                async with self.client.request("PUT", path, params=params, timeout=aiohttp.ClientTimeout(
                        total=wait + timing.SNAPSHOT_ANSWER_SECONDS + 10)) as r:
                    status, text, from_node = r.status, await r.text(), bool(r.headers.get(Header.FROM_NODE))
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
                raise MoveError(f"no room for the snapshot could be asked for: {e or type(e).__name__}") from None
            if status == 200:
                return
            if from_node:
                raise MoveError(*self._kubelet_refusal(status, text))
            message, cause = _answer_message(text), _room_cause(text)
            if cause is None:
                raise MoveError(message if status in (502, 503, 504) else f"the snapshot cannot be stored: {message}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise MoveError(f"no room for the snapshot in the checkpoint data space within {bound:g} s: {cause}")
            waiting = f"waiting for room in the checkpoint data space: {cause}"
            if _status(take.ck).get("message") != waiting:
                take.ck = await self._set_status(take.ck, take.guard, message=waiting)
                take.guard = True
            wait = max(1, min(timing.ROOM_ASK_SECONDS, int(left)))

    async def _pod_to_save(self, ns: str, name: str) -> Obj | None:
        """The informer's copy when it shows the pod running on a node, else a GET (a pod
        just started may not be Running in the cache yet).  A copy that is stale the other
        way (the pod since gone or replaced) fails at its node (404) or at the
        replacement (uid), as a GET an instant earlier would."""
        cached = self.pods.get(f"{ns}/{name}")
        if cached is not None and objects.spec(cached).get("nodeName") \
                and objects.phase(cached) == PodPhase.RUNNING \
                and not cached["metadata"].get("deletionTimestamp"):
            return cached
        return await self.client.try_get(PODS, name, ns)

    async def _image_exports(self, pod: Obj, container: str) -> list[str] | None:
        image = next((c.get("image", "") for c in pod["spec"]["containers"] if c.get("name") == container), "")
        digest = movability.embedded_digest(image)
        if digest is None:
            return None
        if digest in self.exports:  # an image is its digest: its exports never change
            return self.exports[digest]
        try:
            async with self.client.request("GET", group_path("images", digest, "info")) as r:
                if r.status == 200:
                    exports = list((await r.json()).get("exports") or [])
                    if len(self.exports) >= 256:
                        self.exports.clear()
                    self.exports[digest] = exports
                    return exports
        except aiohttp.ClientError:
            pass
        return None

    async def _node_blockers(self, pod: Obj, container: str) -> list[str]:
        """The blockers the pod's node finds (open files, entry points), asked without a
        freeze (``dryRun=All``): a move the spec already refuses still names every reason.
        Empty when the pod runs on no node or its node does not answer in time."""
        node = objects.spec(pod).get("nodeName")
        if not node or objects.phase(pod) != PodPhase.RUNNING:
            return []
        md = pod["metadata"]
        path = api_path("api", "v1", "nodes", node, "proxy", "checkpoint", md["namespace"], md["name"], container)
        try:
            async with self.client.request("POST", path, params={"dryRun": "All"},
                                           timeout=aiohttp.ClientTimeout(total=timing.NODE_BLOCKERS_TIMEOUT)) as r:
                text = await r.text()
                return self._kubelet_refusal(r.status, text)[1] if r.status == 409 else []
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.info("cannot ask %s for the blockers of %s/%s: %s", node, md["namespace"], md["name"], e)
            return []

    def _usage_of(self, pod: Obj) -> UsageOf:
        """Each node's usage, ``pod`` aside (the scheduler's index: O(1) a node)."""
        return usage_reader(self.ctx.shared, self.pods.list, pod["metadata"].get("uid", ""))

    async def _target(self, ck: Obj, pod: Obj) -> str:
        target = objects.spec(ck).get("target") or {}
        source = pod["spec"]["nodeName"]
        nodes = self.nodes.list()
        if target.get("nodeName"):
            name = target["nodeName"]
            if name == source:
                raise MoveError(f"the pod already runs on {name}")
            node = next((n for n in nodes if n["metadata"]["name"] == name), None)
            if node is None:
                raise MoveError(f'node "{name}" not found')
            usage = self._usage_of(pod)(name)
            why = node_misfits(pod, node, usage, target.get("nodeSelector"))
            if why:
                raise MoveError(f"0/1 nodes are available: 1 {why[0]}." if len(why) == 1 else
                                "0/1 nodes are available: " + ", ".join(f"1 {w}" for w in why) + ".")
            return name
        if objects.annotations(pod).get(Annotation.PLACEMENT) == FASTEST:
            fastest = fastest_fit(pod, nodes, self._usage_of(pod), target.get("nodeSelector"), {source})
            if fastest is not None:
                return fastest
        picked, reason = pick_node_by(pod, nodes, self._usage_of(pod), target.get("nodeSelector"), {source})
        if picked is None:
            raise MoveError(reason)
        return picked

    async def _save_and_continue(self, ck: Obj, pod: Obj, container: str, source: str,
                                 target: str | None, taken: "tuple[int, Obj] | MoveError",
                                 pulled: "asyncio.Future[str] | None" = None) -> None:
        """After the snapshot: ``taken`` is the freeze time (Unix ms) and the Checkpoint with the
        stored snapshot's facts, or why it failed; ``pulled``, the target's pull of the image."""
        move = target is not None
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if isinstance(taken, MoveError):
            imagecheck.drop(pulled)
            if move:
                await self._thaw(source, ns, pod_name, container)
            await self._fail(ck, pod, taken, CheckpointAction.MOVE if move else CheckpointAction.SAVE)
            return
        frozen_at, stored = taken
        # The snapshot's facts, as the data's PUT answered them, go with the next status write.
        facts: dict[str, Any] = {k: v for k, v in _status(stored).items() if k in movability.SNAPSHOT_FACTS}
        if not move:
            st = _status(stored)
            await self._set_status(ck, phase=CheckpointPhase.SAVED, takenAt=objects.rfc3339(),
                                   finishedAt=objects.rfc3339(), message="",
                                   **facts, **self._window_fields(ck))
            ENDED.inc(CheckpointAction.SAVE, CheckpointPhase.SAVED)
            await self._event(pod, "Normal", "Checkpointed",
                              f"Saved the pod's state on {source}: {st.get('sizeBytes')} bytes in checkpoint "
                              f"{ck['metadata']['name']}")
            return
        unfit = await self._target_unfit(pulled, target, imagecheck.image_of(pod, container), facts)
        if unfit is None and self._being_deleted(ck):
            unfit = "the checkpoint was deleted before the pod was replaced"
        if unfit:
            await self._thaw(source, ns, pod_name, container)
            await self._fail(ck, pod, MoveError(unfit), CheckpointAction.MOVE, facts=facts)
            return
        try:
            new = await self._replace(pod, target, ck["metadata"]["name"])
        except ApiError as e:
            await self._thaw(source, ns, pod_name, container)
            await self._fail(ck, pod, MoveError(f"the pod could not be replaced: {e.message}"), CheckpointAction.MOVE,
                             facts=facts)
            return
        # The Moving status and event wait a moment (timing.MOVING_WRITE_DELAY says why).
        await asyncio.sleep(testing.moving_write_delay(ck))
        await self._set_status(ck, phase=CheckpointPhase.MOVING, takenAt=objects.rfc3339(), targetNode=target,
                               newPodName=pod_name,
                               newPodUID=new["metadata"]["uid"], frozenAtMs=frozen_at, movingSinceMs=_now_ms(),
                               **facts, **self._window_fields(ck))
        await self._event(new, "Normal", "Moving",
                          f"Replacement bound to {target}; restoring from checkpoint {ck['metadata']['name']}")
        self.queue.add_after(key_of(ck), self.rollback_seconds)

    def _being_deleted(self, ck: Obj) -> bool:
        """``ck`` (this uid) is being deleted, as the latest copy seen says."""
        latest = self.latest.get(key_of(ck))
        return latest is not None and latest["metadata"].get("uid") == ck["metadata"]["uid"] \
            and bool(latest["metadata"].get("deletionTimestamp"))

    @staticmethod
    async def _target_unfit(pulled: "asyncio.Future[str] | None", target: str | None, image: str,
                            facts: Obj) -> str | None:
        """Why the target cannot run the snapshot's module under ``image`` (None: it can)."""
        if pulled is None or target is None:
            return None
        try:
            digest = await pulled
        except imagecheck.TargetImageError as e:
            return str(e)
        return imagecheck.snapshot_mismatch(target, image, digest, facts.get("imageSha256"))

    def _window_fields(self, ck: Obj) -> dict[str, Any]:
        start, end = self._windows.pop(key_of(ck), (0, 0))
        return {"snapshotStartMs": start, "snapshotEndMs": end} if start else {}

    async def _stream_snapshot(self, ck: Obj, pod: Obj, container: str, node: str,
                               leave: str, timeout_ms: int) -> tuple[int, Obj]:
        """Kubelet snapshot -> Checkpoint data; returns the freeze time (Unix ms) and the
        Checkpoint as the data's PUT answered it (with the snapshot's facts).

        The API server takes the snapshot from the node itself (``PUT .../data?fromNode=``):
        the bytes cross the control plane once, not proxy -> controller -> upload."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        data_path = CHECKPOINTS.path(ns, ck["metadata"]["name"], "data")
        params = {"fromNode": node, "pod": name, "container": container, "leave": leave,
                  "timeoutMs": str(timeout_ms)}
        asked_at = _now_ms()
        try:
            async with self.client.request("PUT", data_path, params=params,
                                           timeout=aiohttp.ClientTimeout(total=None, sock_read=180)) as r:
                text = await r.text()
                if r.status == 200:
                    return int(r.headers.get(Header.FROZEN_AT_MS) or asked_at), json.loads(text)
                if r.headers.get(Header.FROM_NODE):
                    refused = self._kubelet_refusal(r.status, text)
                    raise StillInACall(*refused) if r.status == 504 else MoveError(*refused)
                msg = _answer_message(text)
                if r.status in (502, 503, 504) and msg.startswith("the snapshot transfer from"):
                    raise MoveError(msg)
                raise MoveError(f"the snapshot could not be stored: {msg}")
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            raise MoveError(f"the snapshot transfer from {node} failed: {e or type(e).__name__}") from None

    @staticmethod
    def _kubelet_refusal(status: int, text: str) -> tuple[str, list[str]]:
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            body = {"message": text}
        blockers = list(body.get("blockers") or [])
        reason = body.get("reason", "")
        if reason == StatusReason.NOT_MOVABLE:
            return "the pod cannot move: " + "; ".join(blockers), blockers
        if reason == StatusReason.TIMEOUT:
            return "; ".join(blockers) or "the freeze timed out", blockers
        return body.get("message") or f"the node answered {status}", blockers

    async def _thaw(self, node: str, ns: str, pod: str, container: str) -> None:
        """Thaw a pod a failed move left frozen on its node.  A thaw may go again (a thawed
        pod is thawed): on the next API server when this one died under it (attack round
        26b: the API server that carried the snapshot died, and the pod stayed frozen), and
        again for THAW_TRIES seconds while the node cannot be reached."""
        path = api_path("api", "v1", "nodes", node, "proxy", "thaw", ns, pod, container)
        for attempt in range(THAW_TRIES):
            try:
                await self.client.send("POST", path, ok_below=500, idempotent=True,
                                       timeout=aiohttp.ClientTimeout(total=10))
                return
            except ApiError as e:   # no API server reached, or the node's proxy failed (5xx)
                if attempt == THAW_TRIES - 1:
                    log.warning("cannot thaw %s/%s on %s: %s", ns, pod, node, e)
                    return
                await asyncio.sleep(1)

    async def _fail(self, ck: Obj, pod: Obj | None, e: MoveError, action: str,
                    before_replacement: bool = True, guard: bool = False, facts: Obj | None = None) -> None:
        await self._set_status(ck, guard, phase=CheckpointPhase.FAILED, message=e.message, blockers=e.blockers,
                               finishedAt=objects.rfc3339(), **(facts or {}))
        ENDED.inc(action, CheckpointPhase.FAILED)
        reason = "MoveFailed" if action == CheckpointAction.MOVE else "CheckpointFailed"
        await self._event(pod, "Warning", reason, e.message)
        evicted = objects.labels(ck).get(Label.TRIGGER) == Trigger.EVICTION
        if evicted and before_replacement and pod is not None:
            await self._delete_as_eviction(pod)

    async def _delete_as_eviction(self, pod: Obj) -> None:
        """An eviction's move that failed before the replacement: the pod is deleted as an
        eviction deletes it, so the drain completes (its owner starts a new one)."""
        md = pod["metadata"]
        try:
            await self.client.delete(PODS, md["name"], md["namespace"], uid=md["uid"])
        except ApiError as e:
            if e.code not in (404, 409):
                raise

    async def _interrupted(self, ck: Obj) -> None:
        """A Saving Checkpoint nobody is saving: the control plane restarted mid-move or
        mid-snapshot, or the leading one died (Saving is written only by the Checkpoint's
        snapshot task, in its turn, and no sync of the key runs while that task does).  A move whose
        replacement was written goes on: whether the replacement runs decides it.
        Otherwise the pod, frozen for the snapshot, thaws at once and the Checkpoint fails,
        except an eviction's move, which starts again."""
        spec, st = objects.spec(ck), _status(ck)
        ns = ck["metadata"]["namespace"]
        pod = await self.client.try_get(PODS, spec.get("podName", ""), ns)
        if pod is not None and movability.replacement_of_move(ck, pod):
            await self._moving_after_restart(ck, pod)
            return
        if pod is not None and st.get("nodeName") and pod["metadata"]["uid"] == st.get("podUID"):
            try:
                await self._thaw(st["nodeName"], ns, pod["metadata"]["name"], container_of(ck, pod))
            except MoveError:
                pass
        replaced = pod is not None and pod["metadata"]["uid"] != st.get("podUID")
        evicted = objects.labels(ck).get(Label.TRIGGER) == Trigger.EVICTION
        if evicted and pod is not None and not replaced:
            # An eviction's move (a drain waits for the pod to go): failing it would delete
            # the pod, which nothing may recreate, though it thawed where it was: the move
            # is tried again (the leader that ran it died: docs/high-availability.md).
            ck = await self._set_status(ck, phase=CheckpointPhase.PENDING, message=INTERRUPTED + ": trying again")
            await self._start(ck, guard=True)
            return
        await self._fail(ck, pod, MoveError(INTERRUPTED), spec.get("action", CheckpointAction.SAVE),
                         before_replacement=not replaced)

    async def _moving_after_restart(self, ck: Obj, pod: Obj) -> None:
        """The replacement was written before the restart (the Moving status was not): the
        move is Moving from the replacement's creation on.  The time of the freeze is not
        known, so the Moved figure is not given."""
        created = objects.parse_time(pod["metadata"].get("creationTimestamp"))
        since = int(created.timestamp() * 1000) if created else _now_ms()
        ck = await self._set_status(ck, phase=CheckpointPhase.MOVING,
                                    takenAt=pod["metadata"].get("creationTimestamp") or objects.rfc3339(),
                                    newPodName=pod["metadata"]["name"], newPodUID=pod["metadata"]["uid"],
                                    movingSinceMs=since)
        await self._check_move(ck)

    # --- Moving -> Completed | Failed (rolled back) ---------------------------------------
    async def _check_move(self, ck: Obj, confirmed: bool = True) -> None:
        """``confirmed``: ``ck`` is the API's copy.  A cached copy may be stale (the move
        already Completed or Failed): from one this only completes (a write guarded by its
        resourceVersion) or waits; any other decision is taken again on the API's copy."""
        st = _status(ck)
        ns = ck["metadata"]["namespace"]
        name = st.get("newPodName") or ck["spec"]["podName"]
        # The informer's copy of the replacement: each of its changes is an event that
        # wakes this sync again, so waiting on it needs no GET.
        pod = self.pods.get(f"{ns}/{name}")
        if pod is not None and pod["metadata"]["uid"] == st.get("podUID") and st.get("newPodUID"):
            return  # the informer has not shown the replacement yet: its event will come
        if pod is None or pod["metadata"]["uid"] != st.get("newPodUID"):
            if not confirmed:
                await self._refetch(ck)
                return
            pod = await self.client.try_get(PODS, name, ns)
        if pod is None or pod["metadata"]["uid"] != st.get("newPodUID"):
            await self._fail(ck, pod, MoveError("the pod was deleted or replaced during the move"),
                             CheckpointAction.MOVE,
                             before_replacement=False)
            return
        container = container_of(ck, pod)
        state = _container_state(pod, container)
        # Seen running (by this sync or, a moment earlier, by the informer's handler):
        # the move is done, whatever the container did since.
        if objects.phase(pod) == PodPhase.RUNNING and "running" in state \
                or pod["metadata"].get("uid") in self._running_since:
            await self._complete(ck, pod)
            return
        # The rollback clock starts when the replacement is bound (a pod may have been
        # frozen long before, e.g. a retried transfer); the Moved figure counts from the freeze.
        since = st.get("movingSinceMs") or st.get("frozenAtMs") or _now_ms()
        waited = (_now_ms() - int(since)) / 1000
        failed = failure(pod)  # a RestoreError, or any other end of its first start (a crash loop)
        if (failed or waited >= self.rollback_seconds) and not confirmed:
            await self._refetch(ck)
        elif failed:
            await self._rollback(ck, pod, failed)
        elif waited >= self.rollback_seconds:
            await self._rollback(ck, pod, f"the replacement did not run within {self.rollback_seconds:g} s")
        else:
            self.queue.add_after(key_of(ck), self.rollback_seconds - waited + 0.1)

    async def _complete(self, ck: Obj, pod: Obj) -> None:
        st = _status(ck)
        running_at = self._running_since.pop(pod["metadata"].get("uid", ""), None) or _now_ms()
        moved = f"from {st.get('nodeName')} to {st.get('targetNode')}"
        if st.get("frozenAtMs"):
            ms: int | None = max(0, running_at - int(st["frozenAtMs"]))
            message, took = f"moved {moved} in {ms} ms from the freeze", f"running {ms} ms after the freeze"
        else:  # the control plane restarted between the replacement and the Moving status
            ms, took = None, "the time from the freeze is not known (the control plane restarted during the move)"
            message = f"moved {moved}; {took}"
        await self._drop_annotation(pod)
        try:
            # Guarded: ck may be a cached copy, and a move completes once (one Moved event).
            await self._set_status(ck, guard=True, phase=CheckpointPhase.COMPLETED, message=message,
                                   finishedAt=objects.rfc3339(),
                                   **({"moveMillis": ms} if ms is not None else {}))
        except ApiError as e:
            if e.code != 409:
                raise
            await self._refetch(ck)
            return
        ENDED.inc(CheckpointAction.MOVE, CheckpointPhase.COMPLETED)
        if ms is not None:
            FREEZE_TO_RUNNING.observe(ms / 1000)
        await self._event(pod, "Normal", "Moved", f"Moved {moved}: {took}")

    async def _replace(self, pod: Obj, node: str | None, checkpoint: str | None) -> Obj:
        md = pod["metadata"]
        return await self.client.post_subresource(PODS, md["name"], "replacement",
                                                  replacement_of(pod, node, checkpoint), md["namespace"],
                                                  params={"uid": md["uid"]})

    async def _drop_annotation(self, pod: Obj) -> None:
        if Annotation.RESTORE_FROM not in objects.annotations(pod):
            return
        patch = [{"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
                 {"op": "remove", "path": objects.pointer("metadata", "annotations", Annotation.RESTORE_FROM)}]
        try:
            await self.client.patch(PODS, pod["metadata"]["name"], patch, pod["metadata"]["namespace"], type="json")
        except ApiError as e:
            if e.code not in (404, 422):
                raise

    def rollback_node(self, ck: Obj, pod: Obj) -> tuple[str | None, str]:
        """Where the pod of ``ck``, a move that failed after its replacement, goes back to, and
        why not its source ("" when it is its source).

        Its source while that node is Ready and has room for it beside the pods bound there
        now, cordoned or not (cordoning keeps new pods off a node, not the pods it runs) -
        unless the move is an eviction's (a drain asked the pod to leave): then a cordoned
        source only when no other node takes the pod (the move's target, which just failed
        it, excepted) and no eviction was answered that the pod left
        (``kube32.io/eviction-answered``), so a drained node never gets back a pod its drain
        was told had gone.  Otherwise another node that takes it (picked as the scheduler
        picks) or None: the scheduler binds it, to a node with room."""
        st = _status(ck)
        source, target = st.get("nodeName"), st.get("targetNode")
        node = self.nodes.get(source) if source else None
        if node is None or not node_ready(node):
            return None, f"{source} is not Ready"
        usage_of = self._usage_of(pod)
        short = room_misfits(pod, node, usage_of(objects.name(node)))
        if short:
            return None, f"{source} has no room for it: {', '.join(short)}"
        if objects.spec(node).get("unschedulable") and objects.labels(ck).get(Label.TRIGGER) == Trigger.EVICTION:
            other, _ = pick_node_by(pod, self.nodes.list(), usage_of, None,
                                    {n for n in (source, target) if n})
            if other is not None:
                return other, f"{source} is cordoned"
            if Annotation.EVICTION_ANSWERED in objects.annotations(ck):
                return None, f"{source} is cordoned and its eviction was answered"
        return source, ""

    async def _rollback(self, ck: Obj, pod: Obj, why: str) -> None:
        st = _status(ck)
        source = st.get("nodeName")
        # A source that took other pods meanwhile would refuse the pod (OutOfmemory) and its
        # state would be given up: the scheduler binds it then, and it restores there.  A
        # drained source is left alone when another node takes the pod.
        back_to, not_source = self.rollback_node(ck, pod)
        at = "" if back_to == source else f" ({not_source})"
        # Without its data the Checkpoint restores nothing: the pod starts afresh, and the
        # Checkpoint says so instead of "rolled back".
        lost = movability.data_gone(ck)
        try:
            new = await self._replace(pod, back_to, None if lost else ck["metadata"]["name"])
        except ApiError as e:
            if e.code == 409:  # changed meanwhile: look again
                self.queue.add(key_of(ck))
                return
            raise
        if lost:
            on = f"on {back_to}{at}" if back_to else f"where the scheduler binds it{at}"
            message = f"not rolled back, the pod starts afresh {on}: {why}; " \
                      f"{lost.get('message') or 'the checkpoint has no data'}"
        else:
            where = f"to {back_to}{at}" if back_to else f"to the scheduler{at}"
            message = f"rolled back {where}: {why}"
        ended: Obj = {"phase": CheckpointPhase.FAILED, "message": message, "finishedAt": objects.rfc3339(),
                      "rollbackPodUID": new["metadata"]["uid"]}
        if back_to:
            ended["rollbackNode"] = back_to   # where it went back to (absent: the scheduler's choice)
        await self._set_status(ck, **ended)
        ENDED.inc(CheckpointAction.MOVE, "StartedAfresh" if lost else "RolledBack")
        await self._event(new, "Warning", "MoveFailed", f"Move to {st.get('targetNode')} failed, {message}")

    # --- deletion ------------------------------------------------------------------------
    def _named_by_pod(self, ck: Obj) -> bool:
        """A pod's ``kube32.io/restore-from`` names ``ck`` (the informer's pods)."""
        name, ns = ck["metadata"]["name"], ck["metadata"].get("namespace")
        return any(movability.restore_from(p) == name and p["metadata"].get("namespace") == ns
                   for p in self.pods.by_index(RESTORING_FROM, f"{ns}/{name}"))

    async def _release(self, ck: Obj) -> None:
        """A Checkpoint being deleted goes (its finalizer removed, and its data with it) once
        no pod's restore-from names it: the pod rolled back or restored from it runs, or is
        gone.  A pod's change wakes this again (:meth:`_on_pod`)."""
        finalizers = list(ck["metadata"].get("finalizers") or [])
        if Finalizer.CHECKPOINT_PROTECTION not in finalizers or self._named_by_pod(ck):
            return
        await self.set_finalizers(CHECKPOINTS, ck, [f for f in finalizers if f != Finalizer.CHECKPOINT_PROTECTION])

    # --- retention ----------------------------------------------------------------------
    async def _retain(self, ck: Obj) -> None:
        """Finished Checkpoints (other than periodic ones) go an hour after they finished,
        unless a pod's restore-from still names them."""
        st = _status(ck)
        labels = ck["metadata"].get("labels") or {}
        if labels.get(Label.TRIGGER) == Trigger.PERIODIC or st.get("phase") not in CheckpointPhase.FINISHED:
            return
        finished = objects.parse_time(st.get("finishedAt") or ck["metadata"].get("creationTimestamp"))
        if finished is None:
            return
        age = time.time() - finished.timestamp()
        if age < self.retention_seconds:
            self.queue.add_after(key_of(ck), self.retention_seconds - age + 0.5)
            return
        if self._named_by_pod(ck):
            self.queue.add_after(key_of(ck), 30)
            return
        try:
            await self.client.delete(CHECKPOINTS, ck["metadata"]["name"], ck["metadata"]["namespace"],
                                     uid=ck["metadata"]["uid"])
        except ApiError as e:
            if e.code not in (404, 409):
                raise
