"""Periodic checkpoints (spec: "Periodic checkpoints and node loss", "Retention").

A pod with ``kube32.io/checkpoint-interval`` gets a Save Checkpoint labelled
``kube32.io/trigger: periodic`` every interval (the Checkpoint controller takes
it; the pod freezes for the snapshot and resumes).  Keys are pods
(``namespace/name``: a moved pod keeps its name, and its checkpoints).

Retention, per pod: the latest Saved periodic checkpoint stays, older ones go;
all of them go with the pod; one that a pod's ``kube32.io/restore-from`` names
stays whatever its age.  Policy ``Never`` pods are never checkpointed.
"""
from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from .. import movability, objects
from ..client import CHECKPOINTS, PODS, ApiError
from ..terms import API_VERSION, Annotation, CheckpointAction, CheckpointPhase, Label, PodPhase, Policy, Trigger
from .base import Controller, in_turns, split_key

log = logging.getLogger("kube32.periodic")
Obj = dict[str, Any]
IN_PROGRESS = (CheckpointPhase.PENDING, CheckpointPhase.SAVING)


def _periodic_of(checkpoints: list[Obj], ns: str, pod: str) -> list[Obj]:
    return [c for c in checkpoints
            if objects.labels(c).get(Label.TRIGGER) == Trigger.PERIODIC
            and c["metadata"].get("namespace") == ns and objects.spec(c).get("podName") == pod]


def _taken(ck: Obj) -> float:
    t = objects.parse_time(objects.status(ck).get("takenAt") or ck["metadata"].get("creationTimestamp"))
    return t.timestamp() if t else 0.0


def _created(ck: Obj) -> float:
    t = objects.parse_time(ck["metadata"].get("creationTimestamp"))
    return t.timestamp() if t else 0.0


PERIODIC_OF = "periodic-of"       # Checkpoints informer index: a periodic one under "<namespace>/<podName>"
RESTORING_FROM = "restoring-from"  # pods informer index: a pod under "<namespace>/<its restore-from>"


def periodic_of(ck: Obj) -> tuple[str, ...]:
    if objects.labels(ck).get(Label.TRIGGER) != Trigger.PERIODIC:
        return ()
    return (f"{ck['metadata'].get('namespace', '')}/{objects.spec(ck).get('podName', '')}",)


def restoring_from(pod: Obj) -> tuple[str, ...]:
    name = objects.annotations(pod).get(Annotation.RESTORE_FROM)
    return (f"{pod['metadata'].get('namespace', '')}/{name}",) if name else ()


def latest_periodic(checkpoints: list[Obj], ns: str, pod: str) -> Obj | None:
    """The newest Saved periodic checkpoint of a pod that still has its data."""
    saved = [c for c in _periodic_of(checkpoints, ns, pod)
             if objects.phase(c) == CheckpointPhase.SAVED and objects.status(c).get("sizeBytes")]
    return max(saved, key=_taken, default=None)


class PeriodicCheckpoints(Controller):
    name = "periodic-checkpoints"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pods = ctx.informers.get(PODS)
        self.checkpoints = ctx.informers.get(CHECKPOINTS)
        # A pod's periodic checkpoints and the pods naming a checkpoint, by index: a sync
        # reads its pod's own, not every Checkpoint and pod of the cluster (issue 25).
        self.checkpoints.add_index(PERIODIC_OF, periodic_of)
        self.pods.add_index(RESTORING_FROM, restoring_from)

    def setup(self) -> None:
        self.pods.add_handler(self._on_pod)
        self.checkpoints.add_handler(self._on_checkpoint)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        """Only pods that ask for periodic checkpoints or restore from one (or did, or are
        gone: checkpoints may have to go): every other pod event is none of this controller's
        business, and a drain or a status storm makes thousands of them."""
        asked = any(k in ((o or {}).get("metadata", {}).get("annotations") or {})
                    for o in (pod, old) for k in (Annotation.CHECKPOINT_INTERVAL, Annotation.RESTORE_FROM))
        if asked or etype == "DELETED":
            self._enqueue(pod["metadata"].get("namespace", ""), pod["metadata"]["name"])

    def _on_checkpoint(self, etype: str, ck: Obj, old: Obj | None) -> None:
        if objects.labels(ck).get(Label.TRIGGER) == Trigger.PERIODIC:
            self._enqueue(ck["metadata"].get("namespace", ""), objects.spec(ck).get("podName", ""))

    def _enqueue(self, ns: str, name: str) -> None:
        self.queue.add(f"{ns}/{name}")

    async def resync(self) -> None:
        async for pod in in_turns(self.pods.list()):
            if Annotation.CHECKPOINT_INTERVAL in objects.annotations(pod):
                self._enqueue(pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def sync(self, key: Any) -> None:
        ns, name = split_key(key)
        ns = ns or "default"
        pod = self.pods.get(f"{ns}/{name}")
        mine = self.checkpoints.by_index(PERIODIC_OF, f"{ns}/{name}")
        if mine:
            await self._retain(pod, ns, name, mine)
        if pod is None:
            return
        interval = self._interval(pod)
        if interval is None:
            return
        if any(objects.phase(c) in IN_PROGRESS for c in mine):
            return  # the one under way is this interval's
        last = max((_created(c) for c in mine), default=0.0)
        due = last + interval - time.time()
        if due > 0:
            self.queue.add_after(key, due + 0.05)
            return
        if not self._running(pod):
            self.queue.add_after(key, min(interval, 5.0))
            return
        await self.client.create(CHECKPOINTS, {
            "apiVersion": API_VERSION, "kind": "Checkpoint",
            "metadata": {"name": f"{name[:40]}-periodic-{int(time.time())}-{secrets.token_hex(2)}", "namespace": ns,
                         "labels": {Label.TRIGGER: Trigger.PERIODIC}},
            "spec": {"podName": name, "action": CheckpointAction.SAVE}}, ns)
        self.queue.add_after(key, interval)

    @staticmethod
    def _interval(pod: Obj) -> float | None:
        value = objects.annotations(pod).get(Annotation.CHECKPOINT_INTERVAL)
        if value is None or movability.policy(pod) == Policy.NEVER:
            return None
        try:
            return movability.parse_interval(str(value))
        except ValueError:
            return None  # the API server refuses such pods; an old one is left alone

    @staticmethod
    def _running(pod: Obj) -> bool:
        status = objects.status(pod)
        return (status.get("phase") == PodPhase.RUNNING and not pod["metadata"].get("deletionTimestamp")
                and all(cs.get("ready") for cs in status.get("containerStatuses") or [{}]))

    async def _retain(self, pod: Obj | None, ns: str, name: str, mine: list[Obj]) -> None:
        """Keep the latest Saved, those under way, the newest failure after it (so users
        see why) and any a pod's restore-from names; the rest go (all, with the pod)."""
        keep: set[str] = set()
        if pod is not None:
            latest = latest_periodic(mine, ns, name)
            since = _taken(latest) if latest else 0.0
            failed = sorted((c for c in mine if objects.phase(c) == CheckpointPhase.FAILED
                             and _created(c) > since), key=_created)
            keep = {c["metadata"]["name"] for c in mine if objects.phase(c) in IN_PROGRESS}
            keep |= {c["metadata"]["name"] for c in ([latest] if latest else []) + failed[-1:]}
        doomed = [ck for ck in mine if ck["metadata"]["name"] not in keep]
        if not doomed:
            return
        for ck in doomed:
            if self.pods.by_index(RESTORING_FROM, f"{ns}/{ck['metadata']['name']}"):
                continue
            try:
                await self.client.delete(CHECKPOINTS, ck["metadata"]["name"], ns, uid=ck["metadata"]["uid"])
            except ApiError as e:
                if e.code not in (404, 409):
                    raise
