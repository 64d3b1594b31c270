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
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import bodies, dryrun, errors

if TYPE_CHECKING:
    from .server import APIServer, Target


def spec_changed(current: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why ``new`` does not carry ``current``'s spec (``spec.nodeName`` aside), or None."""
    def rest(pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    was, now = rest(current), rest(new)
    if was == now:
        return None
    fields = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    return ("the pod's spec changed since the replacement was made from it (" +
            ", ".join(f"spec.{f}" for f in fields) + "): a replacement carries the pod's spec as it is")


def install(server: "APIServer") -> None:
    async def replacement(request: web.Request, t: "Target") -> web.Response:
        assert t.name is not None
        uid = request.query.get("uid")
        if not uid:
            raise errors.bad_request("a pod replacement needs the uid of the pod it replaces (?uid=)")
        dry_run = dryrun.requested(request)
        body = await bodies.read_body(request, "cannot create pod replacements")
        bodies.check_fields(t.res, body, request.query.get("fieldValidation", "Strict"))
        out = await server.registry.replace(t.res, t.namespace, t.name, body, expected_uid=uid,
                                            dry_run=dry_run, refusal=spec_changed)
        return web.json_response(out, status=201)

    server.sub_handlers[("pods", "replacement", "POST")] = replacement
