"""A pod bound to a node: ``POST pods/<name>/binding``, or ``POST bindings`` naming the
pod in its ``metadata.name``, as kube-apiserver's BindingREST (both create the same).

Judged in this order, each refusal naming its cause, nothing written on any:

1. the body: a JSON object whose ``kind`` (when given) is ``Binding`` and ``apiVersion``
   ``v1``, its metadata and target objects (400, as a typed decoder refuses them); its
   namespace, when given, the URL's (400); on ``pods/<name>/binding`` a name, when
   given, the URL's (400); on ``bindings`` a name (422);
2. its target (ValidatePodBinding, 422): ``target.kind`` empty or ``Node``,
   ``target.name`` given and a valid node name;
3. the pod, in the write: it exists (404); the Binding's ``metadata.uid`` and
   ``resourceVersion``, when given, are the pod's (409 Precondition failed: a pod
   deleted and created again under the same name is not bound by a stale choice);
   it is not bound already nor being deleted (409).

The write sets ``spec.nodeName``, copies the Binding's annotations onto the pod, and sets
``PodScheduled`` True, in one write (setPodHostAndAnnotations).  Never stored itself.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .. import objects
from ..terms import Condition
from . import bodies, dryrun, errors, meta
from .registry import Registry, check_preconditions
from .resources import by_plural
from .routing import Handler, Target, created

Obj = dict[str, Any]


def _checked(body: Any, t: Target) -> tuple[str, str, Obj]:
    """(the pod's name, the node's, the Binding's metadata) of a body, or the refusal."""
    if not isinstance(body, dict):
        raise errors.bad_request("a Binding must be a JSON object")
    kind, version = body.get("kind"), body.get("apiVersion")
    if (kind is not None and kind != "Binding") or (version is not None and version != "v1"):
        raise errors.bad_request(f"the body of a binding must be a Binding of v1, not {kind} of {version}")
    for field in ("metadata", "target"):
        if body.get(field) is not None and not isinstance(body[field], dict):
            raise errors.bad_request(f"a Binding's {field} must be an object, not {json.dumps(body[field])[:100]}")
    md: Obj = body.get("metadata") or {}
    if md.get("namespace") and md["namespace"] != t.namespace:
        raise errors.bad_request("the namespace of the provided object does not match the namespace "
                                 "sent on the request")
    given = md.get("name")
    if t.name is not None and given and given != t.name:
        raise errors.bad_request("name in URL does not match name in Binding object")
    name = t.name or given
    if not name or not isinstance(name, str):
        raise errors.invalid("Binding", "", [("metadata.name", "Required value: name or generateName is required")])
    target_kind, node = meta.nested(body, "target", "kind"), meta.nested(body, "target", "name")
    problems = []
    if target_kind not in (None, "", "Node"):
        problems.append(("target.kind", f'Unsupported value: "{target_kind}": supported values: "Node", "<empty>"'))
    if not node or not isinstance(node, str):
        problems.append(("target.name", "Required value"))
    elif why := meta.subdomain_problem(node):
        problems.append(("target.name", why))
    if problems:
        raise errors.invalid("Binding", name, problems)
    return name, node, md


def _bound(pod: Obj, name: str, node: str, binding_md: Obj) -> Obj:
    pods = by_plural("pods")
    check_preconditions(pods, pod, {"uid": binding_md.get("uid"), "resourceVersion": binding_md.get("resourceVersion")})
    current = pod["spec"].get("nodeName")
    if current:
        raise errors.conflict("pods", name, why=f"pod {name} is already assigned to node \"{current}\"")
    if pod["metadata"].get("deletionTimestamp"):
        raise errors.conflict("pods", name, why=f"pod {name} is being deleted, cannot be assigned to a host")
    pod["spec"]["nodeName"] = node
    annotations = binding_md.get("annotations")
    if isinstance(annotations, dict) and annotations:
        pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != Condition.POD_SCHEDULED]
    status["conditions"] = [*conditions, {"type": Condition.POD_SCHEDULED, "status": "True",
                                          "lastProbeTime": None, "lastTransitionTime": objects.rfc3339()}]
    return pod


def handler(registry: Registry) -> Handler:
    """The handler of both routes, for the API server's table and its ``bindings`` create."""
    async def binding(request: web.Request, t: Target) -> web.Response:
        if t.namespace is None:
            raise errors.bad_request("the namespace of the object must be given")
        dry_run = dryrun.requested(request)
        body = await bodies.read_body(request, "cannot create bindings")
        name, node, md = _checked(body, t)
        await registry.mutate(by_plural("pods"), t.namespace, name, lambda pod: _bound(pod, name, node, md),
                              subresource="binding", dry_run=dry_run)
        return created()

    return binding
