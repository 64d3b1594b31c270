"""``POST pods/<name>/replacement?uid=<uid>``: replace a pod by a new incarnation in one write.

Kube32's own subresource, for pod moves: the Checkpoint controller sends the pod
as it should be on the target (same name, spec, labels and owners; ``spec.nodeName``
set to the target; ``kube32.io/restore-from`` naming the Checkpoint).  The API
server gives it a new uid and creation time, resets its status, and writes it
only if the pod still has ``uid`` (409 otherwise).  Watchers filtered by
``spec.nodeName`` see the old pod DELETED on its node and the new one ADDED on
the target; owners see one pod throughout.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from . import bodies, dryrun, errors

if TYPE_CHECKING:
    from .server import APIServer, Target


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
                                            dry_run=dry_run)
        return web.json_response(out, status=201)

    server.sub_handlers[("pods", "replacement", "POST")] = replacement
