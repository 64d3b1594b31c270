"""A stopping worker drains itself (spec: "Drain and evictions"), and undoes it when it
starts again.

On Ctrl-C or SIGTERM a ``kube32-sim`` worker cordons its Node, marks it with the
annotation ``kube32.io/left: "true"``, evicts its pods other than DaemonSet pods
(through ``pods/<name>/eviction``, so a movable pod moves and any other is
deleted and replaced by its owner) and waits up to 20 s for them to leave, while
its kubelet still serves their snapshots.  A budget that refuses (429) is asked
again every second until the time is up.

A worker that starts again under the same name undoes what its drain did
(:func:`rejoin`): the ``left`` mark goes, and so does its cordon - only its own.  The
drain marks a cordon it made itself with ``kube32.io/left-cordoned: "true"``; a Node
a user had cordoned before (``spec.unschedulable`` already true) gets no such mark and
stays cordoned.  Both writes name the resourceVersion they read, so a user's cordon or
uncordon in between is never overwritten.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from .. import objects
from ..client import NODES, PODS, ApiError, Client
from ..terms import Annotation, PodPhase
from ..timing import DRAIN_SECONDS
from .agent import NodeAgent

log = logging.getLogger("kube32.kubelet.drain")
LEFT = Annotation.LEFT
LEFT_CORDONED = Annotation.LEFT_CORDONED  # the drain cordoned the Node itself
WRITE_TRIES = 3  # a guarded Node write that meets another write reads again this often


def _daemon_pod(pod: dict[str, Any]) -> bool:
    return any(r.get("kind") == "DaemonSet" for r in (pod["metadata"].get("ownerReferences") or []))


async def _evicted(kl: NodeAgent, uid: str, pod: dict) -> bool:
    """Evict one pod; False when a budget refused (429: to be asked again)."""
    md = pod["metadata"]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": md["name"], "namespace": md["namespace"]},
                "deleteOptions": {"preconditions": {"uid": uid}}}
    try:
        await kl.client.post_subresource(PODS, md["name"], "eviction", eviction, md["namespace"])
    except ApiError as e:
        if e.code == 429:
            return False
        if e.code not in (404, 409):  # 404/409: gone or replaced already
            log.warning("cannot evict %s/%s: %s", md["namespace"], md["name"], e)
    return True


async def _patch_node(client: Client, name: str, change: Callable[[dict], dict | None]) -> None:
    """Patch the Node with ``change(node)`` (None: nothing to write), guarded by the
    resourceVersion read; read again when another write came in between."""
    for _ in range(WRITE_TRIES):
        node = await client.get(NODES, name)
        patch = change(node)
        if patch is None:
            return
        patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
        try:
            await client.patch(NODES, name, patch)
            return
        except ApiError as e:
            if e.code != 409:
                raise
    raise ApiError(409, "Conflict", f"node {name} kept changing while it was being written")


def _leaving(node: dict) -> dict:
    """Cordon (marked as the drain's own) unless a user did already; mark left."""
    if objects.spec(node).get("unschedulable"):
        return {"metadata": {"annotations": {LEFT: "true"}}}
    return {"spec": {"unschedulable": True}, "metadata": {"annotations": {LEFT: "true", LEFT_CORDONED: "true"}}}


def _back(node: dict) -> dict | None:
    """Undo :func:`_leaving`: the marks go, and the cordon when the drain made it."""
    ann = node["metadata"].get("annotations") or {}
    if LEFT not in ann and LEFT_CORDONED not in ann:
        return None
    patch: dict[str, Any] = {"metadata": {"annotations": {LEFT: None, LEFT_CORDONED: None}}}
    if ann.get(LEFT_CORDONED) == "true" and objects.spec(node).get("unschedulable"):
        patch["spec"] = {"unschedulable": None}  # as kubectl uncordon writes it
    return patch


async def rejoin(client: Client, name: str) -> None:
    """A Node that exists already is this worker's again: undo its last drain."""
    try:
        await _patch_node(client, name, _back)
    except ApiError as e:
        log.warning("cannot undo the drain of %s: %s", name, e)


async def drain_self(kl: NodeAgent, timeout: float = DRAIN_SECONDS) -> list[str]:
    """Cordon, mark left, evict, wait; returns the pods still here when the time ran out."""
    name = kl.options.node_name
    deadline = time.monotonic() + timeout
    try:
        await _patch_node(kl.client, name, _leaving)
    except ApiError as e:
        log.warning("cannot cordon %s: %s", name, e)
    leaving = {p["metadata"]["uid"]: p for p in kl.bound_pods()
               if not _daemon_pod(p) and objects.phase(p) not in PodPhase.TERMINAL}
    pending = leaving
    while pending and time.monotonic() < deadline:
        # All at once: the answer to an eviction that moves a pod waits for its replacement
        # (up to 5 s), and one pod that cannot move must not hold up the others.
        done = await asyncio.gather(*(_evicted(kl, uid, pod) for uid, pod in pending.items()))
        pending = {uid: pod for (uid, pod), gone in zip(pending.items(), done, strict=True) if not gone}
        if pending:
            await asyncio.sleep(1.0)
    while time.monotonic() < deadline:
        here = {p["metadata"]["uid"] for p in kl.bound_pods()}
        if not (here & set(leaving)):
            return []
        await asyncio.sleep(0.1)
    still = {p["metadata"]["uid"]: p for p in kl.bound_pods()}
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for u, p in still.items() if u in leaving]
