"""``POST pods/<name>/replacement?uid=<uid>``: replace a pod by a new incarnation in one write.

Kube32's own subresource, for pod moves: the Checkpoint controller sends the pod
as it should be on the target (same name, spec, labels and owners; ``spec.nodeName``
set to the target; ``kube32.io/restore-from`` naming the Checkpoint).  The API
server gives it a new uid and creation time, resets its status, and writes it
only if the pod still has ``uid`` (409 otherwise).  Watchers filtered by
``spec.nodeName`` see the old pod DELETED on its node and the new one ADDED on
the target; owners see one pod throughout.

The replacement carries the pod's spec as it is, ``spec.nodeName`` aside: one that
differs (the caller read the pod before a user changed it, its image above all) is
refused with 409, so a change made during a move is never undone by it, and a
snapshot is never handed to another image than the one it was taken from.

A move's first replacement is refused (409) when its Checkpoint is being deleted while
still ``Saving``: a Checkpoint deleted before the move replaced the pod fails the move,
and the pod thaws where it runs (:func:`checkpoint_refusal`).  Later replacements that
restore from a Checkpoint being deleted (a rollback) are taken: its finalizer keeps it
for them.

Its metadata is the pod's as stored at this write (:func:`carry_metadata`): labels,
annotations, owners and finalizers written while the pod moved (``kubectl label``
during the snapshot) are kept, not replaced by the caller's older copy.  Only
``kube32.io/restore-from`` comes from the body: the one annotation a move sets or removes.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from .. import objects
from ..terms import Annotation, CheckpointPhase
from . import bodies, dryrun, errors
from .registry import Registry
from .resources import by_plural
from .routing import Handler, Target


def spec_changed(current: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why ``new`` does not carry ``current``'s spec (``spec.nodeName`` aside), or None."""
    def rest(pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in objects.spec(pod).items() if k != "nodeName"}
    was, now = rest(current), rest(new)
    if was == now:
        return None
    fields = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    return ("the pod's spec changed since the replacement was made from it (" +
            ", ".join(f"spec.{f}" for f in fields) + "): a replacement carries the pod's spec as it is")


CARRIED = ("labels", "ownerReferences", "finalizers")


def carry_metadata(current: dict[str, Any], new: dict[str, Any]) -> None:
    """``new`` takes ``current``'s labels, owners, finalizers and annotations, all but
    ``kube32.io/restore-from``, which stays as ``new`` has it (set or absent)."""
    was, md = current.get("metadata") or {}, new.setdefault("metadata", {})
    for field in CARRIED:
        if field in was:
            md[field] = was[field]
        else:
            md.pop(field, None)
    annotations = {k: v for k, v in objects.annotations(current).items() if k != Annotation.RESTORE_FROM}
    restore_from = objects.annotations(new).get(Annotation.RESTORE_FROM)
    if restore_from is not None:
        annotations[Annotation.RESTORE_FROM] = restore_from
    md["annotations"] = annotations


async def checkpoint_refusal(registry: Registry, namespace: str | None, new: dict[str, Any]) -> str | None:
    """Why ``new`` may not restore from the Checkpoint it names: that Checkpoint is being
    deleted before its move replaced the pod (still ``Saving``).  None: it may."""
    name = objects.annotations(new).get(Annotation.RESTORE_FROM)
    if not name:
        return None
    ck = await registry.try_get(by_plural("checkpoints"), namespace, name)
    if ck is None or not objects.meta(ck).get("deletionTimestamp") \
            or objects.status(ck).get("phase") != CheckpointPhase.SAVING:
        return None
    return f"checkpoint {name} was deleted before the move replaced the pod"


def handler(registry: Registry) -> Handler:
    """The subresource's handler, for the API server's table."""
    async def replacement(request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        uid = request.query.get("uid")
        if not uid:
            raise errors.bad_request("a pod replacement needs the uid of the pod it replaces (?uid=)")
        dry_run = dryrun.requested(request)
        body = await bodies.read_body(request, "cannot create pod replacements")
        bodies.check_fields(t.res, body, request.query.get("fieldValidation", "Strict"))
        refused = await checkpoint_refusal(registry, t.namespace, body)
        if refused:
            raise errors.conflict("pods", t.name, "", refused)
        out = await registry.replace(t.res, t.namespace, t.name, body, expected_uid=uid,
                                     dry_run=dry_run, refusal=spec_changed, carry=carry_metadata)
        return web.json_response(out, status=201)

    return replacement
