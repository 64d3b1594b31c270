"""Restores outside a move: after a node loss or a rolled-back move (spec: "Moves",
"Periodic checkpoints and node loss").

A pod carrying ``kube32.io/restore-from`` that no Moving Checkpoint waits for is
watched here until its container runs: then the annotation goes (a later restart
starts afresh) and a Restored event names the checkpoint and its age.  A restore
that fails ends the pod Failed (the kubelet does that); the pod is then replaced,
in one write, without the annotation, so it starts afresh, and the Checkpoint of a
rolled-back move says so after its "rolled back".  Keys are pods.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from .. import movability
from ..client import CHECKPOINTS, PODS, ApiError
from .base import Controller, key_of
from .checkpoint import replacement_of
from .podutil import all_running, failure, parse_time

log = logging.getLogger("kube32.restore")
Obj = dict[str, Any]


class RestoreController(Controller):
    name = "restore-controller"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pods = ctx.informers.get(PODS)
        self.checkpoints = ctx.informers.get(CHECKPOINTS)

    def setup(self) -> None:
        self.pods.add_handler(lambda t, pod, old: movability.restore_from(pod) and self.queue.add(key_of(pod)))

    async def sync(self, key: Any) -> None:
        # The informers' copies: a pod that neither runs nor failed yet is waited for (its
        # next change is an event), with no GET per event of a replacement being restored.
        pod = self.pods.get(key)
        if pod is None or not movability.restore_from(pod) or pod["metadata"].get("deletionTimestamp"):
            return
        ns, ck_name = pod["metadata"]["namespace"], movability.restore_from(pod)
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
        if running:
            await self._restored(pod, ck_name, (ck or {}).get("status") or {})
        else:
            await self._start_afresh(pod, ck_name, failed or "the restore failed", ck)

    async def _restored(self, pod: Obj, ck_name: str, st: Obj) -> None:
        patch = [{"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
                 {"op": "remove", "path": "/metadata/annotations/kube32.io~1restore-from"}]
        try:
            await self.client.patch(PODS, pod["metadata"]["name"], patch, pod["metadata"]["namespace"], type="json")
        except ApiError as e:
            if e.code in (404, 409, 422):
                return
            raise
        taken = parse_time(st.get("takenAt"))
        age = f"{max(0, int(time.time() - taken.timestamp()))} s" if taken else "unknown age"
        where = pod["spec"].get("nodeName")
        await self.recorder.record(pod, "Normal", "Restored",
                                   f"Restored on {where} from checkpoint {ck_name}, taken {age} ago")

    async def _start_afresh(self, pod: Obj, ck_name: str, why: str, ck: Obj | None) -> None:
        md = pod["metadata"]
        try:
            await self.client.post_subresource(PODS, md["name"], "replacement", replacement_of(pod, None, None),
                                               md["namespace"], params={"uid": md["uid"]})
        except ApiError as e:
            if e.code in (404, 409):
                return
            raise
        await self.recorder.record(pod, "Warning", "MoveFailed",
                                   f"Could not restore from checkpoint {ck_name} ({why}); the pod starts afresh")
        await self._rollback_failed_too(ck, pod, why)

    async def _rollback_failed_too(self, ck: Obj | None, pod: Obj, why: str) -> None:
        """A rolled-back move whose restore on the source failed as well: its Checkpoint,
        which said "rolled back", says the pod started afresh (written once, guarded)."""
        st = (ck or {}).get("status") or {}
        if ck is None or st.get("phase") != "Failed" or st.get("rollbackPodUID") != pod["metadata"]["uid"]:
            return
        message = f"{st.get('message')}; the restore on {pod['spec'].get('nodeName')} failed too ({why}): " \
                  "the pod started afresh"
        try:
            await self.client.patch(CHECKPOINTS, ck["metadata"]["name"],
                                    {"metadata": {"resourceVersion": ck["metadata"]["resourceVersion"]},
                                     "status": {"message": message}},
                                    ck["metadata"]["namespace"], subresource="status")
        except ApiError as e:
            if e.code not in (404, 409):
                raise
