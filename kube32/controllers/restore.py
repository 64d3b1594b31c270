"""Restores outside a move: after a node loss or a rolled-back move (spec: "Moves",
"Periodic checkpoints and node loss").

A pod carrying ``kube32.io/restore-from`` that no Moving Checkpoint waits for is
watched here until its container runs: then the annotation goes (a later restart
starts afresh) and a Restored event names the checkpoint and its age.  A restore
that fails ends the pod Failed (the kubelet does that); the pod is then replaced,
in one write, without the annotation, so it starts afresh, and the Checkpoint of a
rolled-back move says so after its "rolled back".  Keys are pods.

The fresh start stays on the node the pod was bound to (``spec.nodeName``, whether a
user named it or the scheduler or a rollback bound it) while that node is Ready, not
cordoned and has room for it: a fresh start needs nothing of the snapshot the restore
failed on, and a Kubernetes container that fails starts again where it is.  On a node
that is gone, not Ready, cordoned or full, the replacement has no node and the scheduler
binds it.

A pod its node refused to run (the kubelet's admission: ``OutOf<resource>``, another pod
took the room) did not fail to restore: nothing was tried.  It is replaced in one write
*with* its ``kube32.io/restore-from`` and no node, so the scheduler binds it to a node with
room, which restores it: the state is not given up while the Checkpoint has it.  A
rolled-back move's Checkpoint follows it (``rollbackPodUID``) and says so.  A pod refused
again soon after waits a back-off first (timing.REFUSED_RESTORE_BACKOFF, doubling), so a
node and the scheduler that disagree for a while never make a loop of replacements.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from .. import movability, objects, timing
from ..client import CHECKPOINTS, NODES, PODS, ApiError
from ..terms import Annotation, CheckpointPhase
from .base import Controller, key_of
from .checkpoint import replacement_of
from .podutil import all_running, failure, rejected_at_admission
from .scheduler import node_ready, room_misfits, usage_reader

log = logging.getLogger("kube32.restore")
Obj = dict[str, Any]


class RestoreController(Controller):
    name = "restore-controller"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pods = ctx.informers.get(PODS)
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        self.nodes = ctx.informers.get(NODES)
        self._refused: dict[str, tuple[int, float]] = {}  # pod key -> (refusals, when the last was rebound)

    def setup(self) -> None:
        self.pods.add_handler(self._on_pod)

    def _on_pod(self, _etype: str, pod: Obj, _old: Obj | None) -> None:
        if movability.restore_from(pod):
            self.queue.add(key_of(pod))

    async def sync(self, key: Any) -> None:
        # The informers' copies: a pod that neither runs nor failed yet is waited for (its
        # next change is an event), with no GET per event of a replacement being restored.
        pod = self.pods.get(key)
        ck_name = movability.restore_from(pod) if pod is not None else None
        if pod is None or ck_name is None or pod["metadata"].get("deletionTimestamp"):
            return
        ns = pod["metadata"]["namespace"]
        running = all_running(pod)
        failed = None if running else failure(pod)
        if not (running or failed):
            return
        ck = self.checkpoints.get(f"{ns}/{ck_name}")
        if not movability.replacement_of_move(ck, pod):
            # About to act: on the API's copy (the informer may not show the move's Moving yet).
            ck = await self.client.try_get(CHECKPOINTS, ck_name, ns)
        if movability.replacement_of_move(ck, pod):
            return  # a move under way: the Checkpoint controller sees it through
        refused = None if running else rejected_at_admission(pod)
        if running:
            self._refused.pop(key, None)
            await self._restored(pod, ck_name, objects.status(ck))
        elif refused is not None:
            await self._elsewhere(pod, ck_name, refused, ck)
        else:
            await self._start_afresh(pod, ck_name, failed or "the restore failed", ck)

    async def _restored(self, pod: Obj, ck_name: str, st: Obj) -> None:
        patch = [{"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
                 {"op": "remove", "path": objects.pointer("metadata", "annotations", Annotation.RESTORE_FROM)}]
        try:
            await self.client.patch(PODS, pod["metadata"]["name"], patch, pod["metadata"]["namespace"], type="json")
        except ApiError as e:
            if e.code in (404, 409, 422):
                return
            raise
        taken = objects.parse_time(st.get("takenAt"))
        age = f"{max(0, int(time.time() - taken.timestamp()))} s" if taken else "unknown age"
        where = pod["spec"].get("nodeName")
        await self.recorder.record(pod, "Normal", "Restored",
                                   f"Restored on {where} from checkpoint {ck_name}, taken {age} ago")

    def _fresh_node(self, pod: Obj) -> str | None:
        """The node a fresh start stays on: the pod's own while it takes pods and has room
        for it, else None."""
        name = objects.spec(pod).get("nodeName")
        node = self.nodes.get(name) if name else None
        if node is None or not node_ready(node) or objects.spec(node).get("unschedulable") \
                or room_misfits(pod, node, usage_reader(self.ctx.shared, self.pods.list, objects.uid(pod))(
                    objects.name(node))):
            return None
        return name

    def _rebind_wait(self, key: str) -> float:
        """How long a pod refused again must wait before its next rebind (0: now)."""
        count, last = self._refused.get(key, (0, 0.0))
        if count == 0:
            return 0.0
        backoff = min(timing.REFUSED_RESTORE_BACKOFF * 2 ** (count - 1), timing.REFUSED_RESTORE_BACKOFF_MAX)
        return max(0.0, last + backoff - time.monotonic())

    async def _elsewhere(self, pod: Obj, ck_name: str, why: str, ck: Obj | None) -> None:
        """The pod's node refused it for room: the scheduler binds it, still restoring from
        ``ck_name`` (after a back-off when it was refused before)."""
        md = pod["metadata"]
        key = key_of(pod)
        wait = self._rebind_wait(key)
        if wait > 0:
            self.queue.add_after(key, wait)
            return
        refused_by = objects.spec(pod).get("nodeName")
        try:
            new = await self.client.post_subresource(PODS, md["name"], "replacement",
                                                     replacement_of(pod, None, ck_name), md["namespace"],
                                                     params={"uid": md["uid"]})
        except ApiError as e:
            if e.code in (404, 409):
                return
            raise
        if len(self._refused) >= 4096:
            self._refused.clear()
        self._refused[key] = (self._refused.get(key, (0, 0.0))[0] + 1, time.monotonic())
        log.info("%s/%s: %s refused it (%s); it restores from %s where the scheduler binds it",
                 md["namespace"], md["name"], refused_by, why, ck_name)
        await self._rollback_says(ck, pod, f"{refused_by} refused it ({why}): it restores from the same "
                                           "checkpoint where the scheduler binds it", new)

    async def _start_afresh(self, pod: Obj, ck_name: str, why: str, ck: Obj | None) -> None:
        md = pod["metadata"]
        node = self._fresh_node(pod)
        try:
            await self.client.post_subresource(PODS, md["name"], "replacement", replacement_of(pod, node, None),
                                               md["namespace"], params={"uid": md["uid"]})
        except ApiError as e:
            if e.code in (404, 409):
                return
            raise
        await self.recorder.record(pod, "Warning", "MoveFailed",
                                   f"Could not restore from checkpoint {ck_name} ({why}); the pod starts afresh"
                                   + (f" on {node}" if node else ""))
        await self._rollback_says(ck, pod, f"the restore on {pod['spec'].get('nodeName')} failed too ({why}): "
                                           "the pod started afresh")

    async def _rollback_says(self, ck: Obj | None, pod: Obj, what: str, follow: Obj | None = None) -> None:
        """What became of a rolled-back move's pod (``pod``, the rollback's): its Checkpoint,
        which said "rolled back", adds ``what`` (written once, guarded); with ``follow``, the
        pod that now carries the rollback on (``rollbackPodUID``: kube32-cli follows it)."""
        st = objects.status(ck)
        if ck is None or st.get("phase") != CheckpointPhase.FAILED \
                or st.get("rollbackPodUID") != pod["metadata"]["uid"]:
            return
        status: Obj = {"message": f"{st.get('message')}; {what}"}
        if follow is not None:
            status["rollbackPodUID"] = follow["metadata"]["uid"]
            status["rollbackNode"] = objects.spec(follow).get("nodeName")   # None: the scheduler binds it
        try:
            await self.client.patch(CHECKPOINTS, ck["metadata"]["name"],
                                    {"metadata": {"resourceVersion": ck["metadata"]["resourceVersion"]},
                                     "status": status},
                                    ck["metadata"]["namespace"], subresource="status")
        except ApiError as e:
            if e.code not in (404, 409):
                raise
