"""The Checkpoint controller: carries out Save and Move Checkpoints (spec: "Moves").

Level-triggered on the Checkpoint's ``status.phase`` and the pod it names:

* ``Pending`` -> check the pod spec for blockers (when it has some, the node's too,
  asked with ``dryRun=All``: nothing freezes) and pick the target (Move); wait for
  the control plane's one snapshot slot (still ``Pending``, ``status.message`` saying so:
  ``Saving`` means frozen), then
  ``Saving`` (with ``status.targetNode`` for a Move, so the target's kubelet asks for
  the data before it is stored: kube32.kubelet.prefetch): ask the pod's kubelet for a snapshot (``leave=running`` for Save,
  ``leave=frozen`` for Move) through the node proxy and stream it straight into
  the Checkpoint's data.  Save ends ``Saved``.  Move replaces the pod in one write
  (``pods/<name>/replacement``: same name, spec, labels and owners, a new uid,
  ``spec.nodeName`` = the target, ``kube32.io/restore-from`` = the Checkpoint)
  and turns ``Moving``.
* ``Moving`` -> once the replacement runs: ``Completed``, the annotation removed,
  a Moved event with the time from the freeze.  When it fails to restore, fails,
  or does not run within the rollback timeout (60 s): the pod goes back to its
  source node (or, when that node is not Ready, to the scheduler) and restores
  from the same Checkpoint; the Checkpoint turns ``Failed`` with the reason.  A
  replacement that ran once is Completed whatever it does later.  When the Checkpoint's
  data is gone (``DataStored=False``: kube32.apiserver.checkpointstatus) there is nothing
  to roll back: the pod is replaced afresh on its source, and the message says so.
* A failure before the replacement thaws the pod where it runs.

Invariants: the control plane takes one snapshot at a time (one lock around the
snapshot's transfer; others wait); every pod write names the uid it expects, so a pod replaced or deleted
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
import os
import time
from typing import Any

import aiohttp

from .. import movability
from ..client import CHECKPOINTS, NODES, PODS, ApiError, MutationCache
from .base import Controller, key_of, split_key
from .podutil import all_running, failure, parse_time, rfc3339
from .scheduler import node_misfits, node_ready, pick_node, usage_by_node

log = logging.getLogger("kube32.checkpoint")
Obj = dict[str, Any]

FREEZE_TIMEOUT_MS = 10000
NODE_BLOCKERS_TIMEOUT = 5.0  # s: a refused move waits this long at most for the node's blockers
MOVING_WRITE_DELAY = 0.05  # s after the replacement: see _save_and_continue
# Test-only fault (tests/e2e/test_rollbacks.py): with KUBE32_TEST_FAULTS=hold-moving-status in
# the control plane's environment, a move labelled kube32.io/test-fault: hold-moving-status
# writes its Moving status 30 s after the replacement instead of 50 ms (a window to restart
# the control plane between the two).  Off unless both are given.
TEST_FAULT_LABEL = "kube32.io/test-fault"
HOLD_MOVING = "hold-moving-status"
HOLD_MOVING_SECONDS = 30.0
FINISHED = ("Saved", "Completed", "Failed")
WAITING_FOR_TURN = "waiting for its turn: the control plane takes one snapshot at a time"
TRIGGER = movability.TRIGGER


def _test_fault(ck: Obj, name: str) -> bool:
    return name in os.environ.get("KUBE32_TEST_FAULTS", "").split(",") \
        and (ck["metadata"].get("labels") or {}).get(TEST_FAULT_LABEL) == name


def interp_mops(node: Obj) -> float:
    try:
        return float((node["metadata"].get("annotations") or {}).get(movability.INTERP_MOPS, 0))
    except (TypeError, ValueError):
        return 0.0


def fastest_fit(pod: Obj, nodes: list[Obj], pods: list[Obj], extra_selector: dict | None,
                exclude: set[str]) -> str | None:
    """The fastest node (``kube32.io/interp-mops``) that takes the pod, never one excluded."""
    usage = usage_by_node(pods, skip_uid=pod["metadata"].get("uid", ""))
    fits = [n for n in nodes if n["metadata"]["name"] not in exclude
            and not node_misfits(pod, n, usage.get(n["metadata"]["name"]), extra_selector)]
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


def _status(ck: Obj) -> Obj:
    return ck.get("status") or {}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _container_state(pod: Obj, container: str) -> Obj:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return cs.get("state") or {}
    return {}


def container_of(ck: Obj, pod: Obj) -> str:
    wanted = (ck.get("spec") or {}).get("containerName")
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
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
        annotations[movability.RESTORE_FROM] = checkpoint
    else:
        annotations.pop(movability.RESTORE_FROM, None)
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
        self.snapshot_lock = asyncio.Lock()  # the control plane takes one snapshot at a time
        self._windows: dict[str, tuple[int, int]] = {}  # checkpoint key -> when it held the lock
        self.exports: dict[str, list[str]] = {}  # image digest -> its exports (a drain asks once)
        self._running_since: dict[str, int] = {}  # replacement uid -> when first seen running (Unix ms)
        self.rollback_seconds = ctx.options.move_rollback_seconds
        self.retention_seconds = ctx.options.checkpoint_retention_seconds
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        # Every status write of this controller goes through here: a sync that follows one
        # of them (its own watch events wake it) sees it without a GET.
        self.latest = MutationCache(self.checkpoints)
        self.pods = ctx.informers.get(PODS)
        self.nodes = ctx.informers.get(NODES)

    def setup(self) -> None:
        self.checkpoints.add_handler(lambda t, o, old: self.queue.add(key_of(o)))
        self.pods.add_handler(self._on_pod)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        """A pod that a Moving Checkpoint waits for changed: look at that Checkpoint."""
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        ck_name = ann.get(movability.RESTORE_FROM)
        if ck_name:
            uid = pod["metadata"].get("uid", "")
            if uid not in self._running_since and all_running(pod):
                # When the replacement was first seen running: the Moved figure ends here,
                # not when a sync gets to it.
                if len(self._running_since) >= 4096:
                    self._running_since.clear()
                self._running_since[uid] = _now_ms()
            self.queue.add(f"{pod['metadata']['namespace']}/{ck_name}")

    async def resync(self) -> None:
        for ck in self.checkpoints.list():
            phase = _status(ck).get("phase")
            if phase in ("Completed", "Failed", "Moving") or phase is None:
                self.queue.add(key_of(ck))

    # --- sync ---------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        ns, name = split_key(key)
        # The informer's copy, or this controller's own later write: no GET on the way.
        current = self.latest.get(key)
        phase = (_status(current).get("phase") or "Pending") if current is not None else None
        if current is not None and phase in FINISHED:
            # A finished Checkpoint never changes phase again, and its retention deletes
            # by uid: the cached copy will do (a moved pod's later events wake it).
            await self._retain(current)
            return
        if current is not None and phase == "Pending":
            # The copy may be stale (already Saving, if another control plane wrote it); _start's
            # first write names its resourceVersion: a stale copy ends in a 409, a thaw of the
            # pod when it froze it, and a retry - never a second replacement.
            await self._start(current, guard=True)
            return
        if current is not None and phase == "Moving":
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
        phase = _status(ck).get("phase") or "Pending"
        if phase == "Pending":
            await self._start(ck)
        elif phase == "Saving":
            await self._interrupted(ck)
        elif phase == "Moving":
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

    async def _event(self, pod: Obj | None, type_: str, reason: str, message: str) -> None:
        if pod is not None:
            await self.recorder.record(pod, type_, reason, message)

    # --- Pending -> Saving -> Saved | Moving ------------------------------------------
    async def _start(self, ck: Obj, guard: bool = False) -> None:
        spec = ck.get("spec") or {}
        ns, action = ck["metadata"]["namespace"], spec.get("action", "Save")
        pod = await self._pod_to_save(ns, spec.get("podName", ""))
        try:
            if pod is None:
                raise MoveError(f'pod "{spec.get("podName")}" not found')
            container = container_of(ck, pod)
            blockers = movability.spec_blockers(pod, await self._image_exports(pod, container))
            if blockers:
                blockers = list(dict.fromkeys(blockers + await self._node_blockers(pod, container)))
                raise MoveError("the pod cannot move: " + "; ".join(blockers), blockers)
            source = (pod.get("spec") or {}).get("nodeName")
            if not source or (pod.get("status") or {}).get("phase") != "Running":
                raise MoveError(f'pod {pod["metadata"]["name"]} is not running on a node')
            if pod["metadata"].get("deletionTimestamp"):
                raise MoveError(f'pod {pod["metadata"]["name"]} is being deleted')
            target = await self._target(ck, pod) if action == "Move" else None
        except MoveError as e:
            await self._fail(ck, pod, e, action, guard=guard)
            return
        # The lock covers the snapshot's transfer only: the replacement, the status and the
        # restore of one move overlap the next one's snapshot (a drain moves pods in a row).
        # Saving means frozen: a Checkpoint waiting for its turn stays Pending and says so;
        # Saving is sent once the lock is held, and the snapshot does not wait for its
        # answer: the write and the node's freeze overlap.  A Saving Checkpoint is only ever
        # looked at by its own sync (running here) or, after a control plane restart, found
        # interrupted.  A move's target is named from Saving on: its kubelet asks for the
        # data at once (a GET that waits for it), so the bytes reach it while the pod is
        # being replaced.
        leave = "running" if target is None else "frozen"
        if self.snapshot_lock.locked():
            ck = await self._set_status(ck, guard, message=WAITING_FOR_TURN)
            guard = True
        saving: asyncio.Future[Obj] | None = None
        try:
            async with self.snapshot_lock:
                saving = asyncio.ensure_future(self._set_status(
                    ck, guard, phase="Saving", message="", nodeName=source, podUID=pod["metadata"]["uid"],
                    **({"targetNode": target} if target else {})))
                await asyncio.sleep(0)  # the write goes out first
                window = [_now_ms()]
                try:
                    taken: tuple[int, Obj] | MoveError = await self._stream_snapshot(ck, pod, container,
                                                                                     source, leave)
                except MoveError as e:
                    taken = e
                window.append(_now_ms())
            ck = await saving
        except asyncio.CancelledError:
            if saving is not None:
                saving.cancel()
            raise
        except Exception:
            # Saving was refused (the Checkpoint changed or went): the sync starts again from
            # the API's copy, and a pod frozen for this try thaws.
            if leave == "frozen" and saving is not None:
                await self._thaw(source, ns, pod["metadata"]["name"], container)
            raise
        # When this snapshot held the control plane's one snapshot slot (Unix ms): users and
        # tests see that snapshots never overlap.
        self._windows[key_of(ck)] = (window[0], window[1])
        await self._save_and_continue(ck, pod, container, source, target, taken)

    async def _pod_to_save(self, ns: str, name: str) -> Obj | None:
        """The informer's copy when it shows the pod running on a node, else a GET (a pod
        just started may not be Running in the cache yet).  A copy that is stale the other
        way (the pod since gone or replaced) fails at its node (404) or at the
        replacement (uid), as a GET an instant earlier would."""
        cached = self.pods.get(f"{ns}/{name}")
        if cached is not None and (cached.get("spec") or {}).get("nodeName") \
                and (cached.get("status") or {}).get("phase") == "Running" \
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
            async with self.client.request("GET", f"/apis/kube32.io/v1/images/{digest}/info") as r:
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
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") != "Running":
            return []
        md = pod["metadata"]
        path = f"/api/v1/nodes/{node}/proxy/checkpoint/{md['namespace']}/{md['name']}/{container}"
        try:
            async with self.client.request("POST", path, params={"dryRun": "All"},
                                           timeout=aiohttp.ClientTimeout(total=NODE_BLOCKERS_TIMEOUT)) as r:
                text = await r.text()
                return self._kubelet_refusal(r.status, text)[1] if r.status == 409 else []
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.info("cannot ask %s for the blockers of %s/%s: %s", node, md["namespace"], md["name"], e)
            return []

    async def _target(self, ck: Obj, pod: Obj) -> str:
        target = (ck.get("spec") or {}).get("target") or {}
        source = pod["spec"]["nodeName"]
        nodes = self.nodes.list()
        if target.get("nodeName"):
            name = target["nodeName"]
            if name == source:
                raise MoveError(f"the pod already runs on {name}")
            node = next((n for n in nodes if n["metadata"]["name"] == name), None)
            if node is None:
                raise MoveError(f'node "{name}" not found')
            usage = usage_by_node(self.pods.list(), skip_uid=pod["metadata"]["uid"]).get(name)
            why = node_misfits(pod, node, usage, target.get("nodeSelector"))
            if why:
                raise MoveError(f"0/1 nodes are available: 1 {why[0]}." if len(why) == 1 else
                                "0/1 nodes are available: " + ", ".join(f"1 {w}" for w in why) + ".")
            return name
        if (pod["metadata"].get("annotations") or {}).get(movability.PLACEMENT) == "fastest":
            fastest = fastest_fit(pod, nodes, self.pods.list(), target.get("nodeSelector"), {source})
            if fastest is not None:
                return fastest
        picked, reason = pick_node(pod, nodes, self.pods.list(), target.get("nodeSelector"), {source})
        if picked is None:
            raise MoveError(reason)
        return picked

    async def _save_and_continue(self, ck: Obj, pod: Obj, container: str, source: str,
                                 target: str | None, taken: "tuple[int, Obj] | MoveError") -> None:
        """After the snapshot: ``taken`` is the freeze time (Unix ms) and the Checkpoint with the
        stored snapshot's facts, or why it failed."""
        move = target is not None
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if isinstance(taken, MoveError):
            if move:
                await self._thaw(source, ns, pod_name, container)
            await self._fail(ck, pod, taken, "Move" if move else "Save")
            return
        frozen_at, stored = taken
        # The snapshot's facts, as the data's PUT answered them, go with the next status write.
        facts = {k: v for k, v in _status(stored).items() if k in movability.SNAPSHOT_FACTS}
        if not move:
            st = _status(stored)
            await self._set_status(ck, phase="Saved", takenAt=rfc3339(), finishedAt=rfc3339(), message="",
                                   **facts, **self._window_fields(ck))
            await self._event(pod, "Normal", "Checkpointed",
                              f"Saved the pod's state on {source}: {st.get('sizeBytes')} bytes in checkpoint "
                              f"{ck['metadata']['name']}")
            return
        try:
            new = await self._replace(pod, target, ck["metadata"]["name"])
        except ApiError as e:
            await self._thaw(source, ns, pod_name, container)
            await self._fail(ck, pod, MoveError(f"the pod could not be replaced: {e.message}"), "Move",
                             facts=facts)
            return
        # The Moving status and event wait a moment: a small pod's restore (tens of ms) then
        # runs without the control plane serving these writes and their watch events in its
        # middle.  The replacement does not depend on them; its own status is what a user,
        # a Service and the Deployment wait for.
        await asyncio.sleep(HOLD_MOVING_SECONDS if _test_fault(ck, HOLD_MOVING) else MOVING_WRITE_DELAY)
        await self._set_status(ck, phase="Moving", takenAt=rfc3339(), targetNode=target, newPodName=pod_name,
                               newPodUID=new["metadata"]["uid"], frozenAtMs=frozen_at, movingSinceMs=_now_ms(),
                               **facts, **self._window_fields(ck))
        await self._event(new, "Normal", "Moving",
                          f"Replacement bound to {target}; restoring from checkpoint {ck['metadata']['name']}")
        self.queue.add_after(key_of(ck), self.rollback_seconds)

    def _window_fields(self, ck: Obj) -> dict[str, int]:
        start, end = self._windows.pop(key_of(ck), (0, 0))
        return {"snapshotStartMs": start, "snapshotEndMs": end} if start else {}

    async def _stream_snapshot(self, ck: Obj, pod: Obj, container: str, node: str,
                               leave: str) -> tuple[int, Obj]:
        """Kubelet snapshot -> Checkpoint data; returns the freeze time (Unix ms) and the
        Checkpoint as the data's PUT answered it (with the snapshot's facts).

        The API server takes the snapshot from the node itself (``PUT .../data?fromNode=``):
        the bytes cross the control plane once, not proxy -> controller -> upload."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        data_path = CHECKPOINTS.path(ns, ck["metadata"]["name"], "data")
        params = {"fromNode": node, "pod": name, "container": container, "leave": leave,
                  "timeoutMs": str(FREEZE_TIMEOUT_MS)}
        asked_at = _now_ms()
        try:
            async with self.client.request("PUT", data_path, params=params,
                                           timeout=aiohttp.ClientTimeout(total=None, sock_read=180)) as r:
                text = await r.text()
                if r.status == 200:
                    return int(r.headers.get("X-Kube32-Frozen-At-Ms") or asked_at), json.loads(text)
                if r.headers.get("X-Kube32-From-Node"):
                    raise MoveError(*self._kubelet_refusal(r.status, text))
                try:
                    msg = json.loads(text).get("message", text)
                except (json.JSONDecodeError, AttributeError):
                    msg = text
                if r.status in (502, 503) and msg.startswith("the snapshot transfer from"):
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
        if reason == "NotMovable":
            return "the pod cannot move: " + "; ".join(blockers), blockers
        if reason == "Timeout":
            return "; ".join(blockers) or "the freeze timed out", blockers
        return body.get("message") or f"the node answered {status}", blockers

    async def _thaw(self, node: str, ns: str, pod: str, container: str) -> None:
        try:
            async with self.client.request("POST", f"/api/v1/nodes/{node}/proxy/thaw/{ns}/{pod}/{container}") as r:
                await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.warning("cannot thaw %s/%s on %s: %s", ns, pod, node, e)

    async def _fail(self, ck: Obj, pod: Obj | None, e: MoveError, action: str,
                    before_replacement: bool = True, guard: bool = False, facts: Obj | None = None) -> None:
        await self._set_status(ck, guard, phase="Failed", message=e.message, blockers=e.blockers,
                               finishedAt=rfc3339(), **(facts or {}))
        reason = "MoveFailed" if action == "Move" else "CheckpointFailed"
        await self._event(pod, "Warning", reason, e.message)
        evicted = (ck["metadata"].get("labels") or {}).get(TRIGGER) == "eviction"
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
        mid-snapshot (Saving is written only by the sync that holds the snapshot slot, and a
        key is synced by one worker at a time).  A move whose replacement was written goes
        on: whether the replacement runs decides it.  Otherwise the pod, frozen for the
        snapshot, thaws at once and the Checkpoint fails."""
        spec, st = ck.get("spec") or {}, _status(ck)
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
        await self._fail(ck, pod, MoveError("the snapshot was interrupted (the control plane restarted)"),
                         spec.get("action", "Save"), before_replacement=not replaced)

    async def _moving_after_restart(self, ck: Obj, pod: Obj) -> None:
        """The replacement was written before the restart (the Moving status was not): the
        move is Moving from the replacement's creation on.  The time of the freeze is not
        known, so the Moved figure is not given."""
        created = parse_time(pod["metadata"].get("creationTimestamp"))
        since = int(created.timestamp() * 1000) if created else _now_ms()
        ck = await self._set_status(ck, phase="Moving", takenAt=pod["metadata"].get("creationTimestamp") or rfc3339(),
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
            await self._fail(ck, pod, MoveError("the pod was deleted or replaced during the move"), "Move",
                             before_replacement=False)
            return
        container = container_of(ck, pod)
        state = _container_state(pod, container)
        # Seen running (by this sync or, a moment earlier, by the informer's handler):
        # the move is done, whatever the container did since.
        if (pod.get("status") or {}).get("phase") == "Running" and "running" in state \
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
            await self._set_status(ck, guard=True, phase="Completed", message=message, finishedAt=rfc3339(),
                                   **({"moveMillis": ms} if ms is not None else {}))
        except ApiError as e:
            if e.code != 409:
                raise
            await self._refetch(ck)
            return
        await self._event(pod, "Normal", "Moved", f"Moved {moved}: {took}")

    async def _replace(self, pod: Obj, node: str | None, checkpoint: str | None) -> Obj:
        md = pod["metadata"]
        return await self.client.post_subresource(PODS, md["name"], "replacement",
                                                  replacement_of(pod, node, checkpoint), md["namespace"],
                                                  params={"uid": md["uid"]})

    async def _drop_annotation(self, pod: Obj) -> None:
        if movability.RESTORE_FROM not in (pod["metadata"].get("annotations") or {}):
            return
        patch = [{"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
                 {"op": "remove", "path": "/metadata/annotations/kube32.io~1restore-from"}]
        try:
            await self.client.patch(PODS, pod["metadata"]["name"], patch, pod["metadata"]["namespace"], type="json")
        except ApiError as e:
            if e.code not in (404, 422):
                raise

    async def _rollback(self, ck: Obj, pod: Obj, why: str) -> None:
        st = _status(ck)
        source = st.get("nodeName")
        node = next((n for n in self.nodes.list() if n["metadata"]["name"] == source), None)
        back_to = source if node is not None and node_ready(node) else None
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
            on = f"on {source}" if back_to else f"where the scheduler binds it ({source} is not Ready)"
            message = f"not rolled back, the pod starts afresh {on}: {why}; " \
                      f"{lost.get('message') or 'the checkpoint has no data'}"
        else:
            where = f"to {source}" if back_to else f"to the scheduler ({source} is not Ready)"
            message = f"rolled back {where}: {why}"
        await self._set_status(ck, phase="Failed", message=message, finishedAt=rfc3339(),
                               rollbackPodUID=new["metadata"]["uid"])
        await self._event(new, "Warning", "MoveFailed", f"Move to {st.get('targetNode')} failed, {message}")

    # --- retention ----------------------------------------------------------------------
    async def _retain(self, ck: Obj) -> None:
        """Finished Checkpoints (other than periodic ones) go an hour after they finished,
        unless a pod's restore-from still names them."""
        st = _status(ck)
        labels = ck["metadata"].get("labels") or {}
        if labels.get(TRIGGER) == "periodic" or st.get("phase") not in ("Saved", "Completed", "Failed"):
            return
        finished = parse_time(st.get("finishedAt") or ck["metadata"].get("creationTimestamp"))
        if finished is None:
            return
        age = time.time() - finished.timestamp()
        if age < self.retention_seconds:
            self.queue.add_after(key_of(ck), self.retention_seconds - age + 0.5)
            return
        name = ck["metadata"]["name"]
        ns = ck["metadata"]["namespace"]
        if any(((p.get("metadata") or {}).get("annotations") or {}).get(movability.RESTORE_FROM) == name
               and p["metadata"].get("namespace") == ns for p in self.pods.list()):
            self.queue.add_after(key_of(ck), 30)
            return
        try:
            await self.client.delete(CHECKPOINTS, name, ns, uid=ck["metadata"]["uid"])
        except ApiError as e:
            if e.code not in (404, 409):
                raise
