"""Authorization: the chain every authenticated request passes, and access reviews.

Order, as kube-apiserver's ``--authorization-mode=Node,RBAC`` with the
``system:masters`` short cut:

1. ``system:masters`` may do anything (the admin, and the API server's own
   identity the controllers use).
2. The node authorizer (:class:`NodeAuthorizer`) decides every request of a node
   (user ``system:node:<name>`` in group ``system:nodes``) on the kinds a kubelet
   uses; it gives no opinion on the rest.
3. RBAC (:mod:`.rbac`).

Invariants:

* Attributes come from the URL and method alone (:func:`request_attributes`), as
  Kubernetes' RequestInfo: GET -> get/list/watch, POST -> create, PUT -> update,
  PATCH -> patch, DELETE -> delete/deletecollection; a subresource is
  ``plural/sub`` (``pods/log``, ``nodes/proxy``, ``checkpoints/data``).
* What a URL cannot tell (the name of an object being created) is checked after
  decoding by :func:`admit`, so a node cannot create another node's Node or Lease.
* A node reads only what its pods need: its pods (list/watch only with
  ``fieldSelector=spec.nodeName=<itself>``), the ConfigMaps and Secrets they
  name, and the Checkpoint data their ``kube32.io/restore-from`` names; and the
  Checkpoints of moves toward it (list/watch only with ``fieldSelector=
  status.targetNode=<itself>``; while the move is Saving or Moving, its data, the
  pod being moved and the ConfigMaps and Secrets that pod names); it writes
  only its own Node, Lease and its pods' status; it proxies only to the Services
  its NodePorts serve (type NodePort or LoadBalancer).  Everything else of these
  kinds is a 403 that says why.
* The API servers' own Leases (``kube-system/kube32-apiserver-*``, how they find their
  peers: kube32/apiserver/peers.py) and the controllers' leader Lease
  (``kube-system/kube32-controller-manager``) are written by ``system:kube-apiserver`` alone,
  before every other rule (``system:masters`` included, which may still delete them):
  leader-election rights on Leases in kube-system grant no way to pose as a peer.
* A refusal is a 403 whose message is Kubernetes', word for word:
  ``pods "x" is forbidden: User "jane" cannot get resource "pods" in API group ""
  in the namespace "default"``.
"""
from __future__ import annotations

import enum
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web

from .. import objects, terms
from ..terms import CONTROLLER_MANAGER_LEASE, NODE_LEASE_NAMESPACE, Annotation, CheckpointPhase
from . import bodies, errors
from .auth import APISERVER, User
from .errors import APIError, qualified
from .peers import LEASE_PREFIX as APISERVER_LEASE_PREFIX
from .peers import NAMESPACE as APISERVER_LEASE_NAMESPACE
from .protobuf import fields as _proto_fields
from .proxy import split_proxied_name
from .rbac import AUTHENTICATED, GROUP, MASTERS, Attributes, RBACAuthorizer
from .resources import by_plural
from .routing import json_response, query_flag
from .selectors import parse_field_selector
from .strategies.service import NODE_PORT_TYPES

NODES_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    NO_OPINION = "no-opinion"


def groups_of(user: User) -> tuple[str, ...]:
    return tuple(user.groups) + ((AUTHENTICATED,) if AUTHENTICATED not in user.groups else ())


def request_attributes(user: User, method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """Kubernetes' RequestInfo for a request (verb, group, resource, name, ...)."""
    groups = groups_of(user)
    parts = [p for p in path.strip("/").split("/")]
    if len(parts) >= 3 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return Attributes(user.name, groups, method.lower(), path=path or "/", resource_request=False,
                          uid=user.uid)
    ns = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        ns = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if resource == "topics":   # a topic's name may hold slashes
        name, sub = "/".join(rest[1:]), ""
    if method in ("GET", "HEAD"):
        # As RequestInfo: a named GET is a get whatever ``watch`` says (it is served as one).
        verb = "get" if name else "watch" if query_flag(query, "watch") else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _METHOD_VERBS.get(method, method.lower())
    return Attributes(user.name, groups, verb, ns, group, resource, sub, name,
                      field_selector=query.get("fieldSelector", ""), uid=user.uid)


def forbidden(attrs: Attributes, reason: str = "") -> errors.APIError:
    """A 403 worded as Kubernetes words it."""
    why = f": {reason}" if reason else ""
    if not attrs.resource_request:
        return errors.APIError(403, "Forbidden", f'forbidden: User "{attrs.user}" cannot {attrs.verb} '
                                                 f'path "{attrs.path}"{why}', details={})
    qualified = errors.qualified(attrs.resource, attrs.api_group)
    where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    text = (f'User "{attrs.user}" cannot {attrs.verb} resource "{attrs.full_resource}" in API group '
            f'"{attrs.api_group}" {where}{why}')
    head = f'{qualified} "{attrs.name}" is forbidden' if attrs.name else f"{qualified} is forbidden"
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.api_group:
        details["group"] = attrs.api_group
    return errors.APIError(403, "Forbidden", f"{head}: {text}", details=details)


# --- the node authorizer -------------------------------------------------------------
def node_name(attrs: Attributes) -> str | None:
    if NODES_GROUP in attrs.groups and attrs.user.startswith(NODE_PREFIX):
        return attrs.user[len(NODE_PREFIX):] or None
    return None


# Where a pod names other objects: (field, kind, the field holding the name).
_ENV_FROM = (("configMapRef", "configmaps", "name"), ("secretRef", "secrets", "name"))
_VALUE_FROM = (("configMapKeyRef", "configmaps", "name"), ("secretKeyRef", "secrets", "name"))
_VOLUME = (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName"))
_PROJECTED = (("configMap", "configmaps", "name"), ("secret", "secrets", "name"))


def _add_references(refs: dict[str, set[str]], holder: Any, fields: tuple[tuple[str, str, str], ...]) -> None:
    if not isinstance(holder, dict):
        return
    for key, kind, name_field in fields:
        ref = holder.get(key)
        if isinstance(ref, dict):
            refs[kind].add(str(ref.get(name_field) or ""))


def pod_references(pod: dict[str, Any]) -> dict[str, set[str]]:
    """The ConfigMaps, Secrets and Checkpoints a pod names."""
    spec = objects.spec(pod)
    refs: dict[str, set[str]] = {"configmaps": set(), "secrets": set(), "checkpoints": set()}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if not isinstance(c, dict):
            continue
        for src in c.get("envFrom") or []:
            _add_references(refs, src, _ENV_FROM)
        for e in c.get("env") or []:
            _add_references(refs, (e or {}).get("valueFrom") if isinstance(e, dict) else None, _VALUE_FROM)
    for v in spec.get("volumes") or []:
        _add_references(refs, v, _VOLUME)
        for p in ((v.get("projected") or {}).get("sources") or []) if isinstance(v, dict) else []:
            _add_references(refs, p, _PROJECTED)
    restore = objects.annotations(pod).get(Annotation.RESTORE_FROM)
    if restore:
        refs["checkpoints"].add(str(restore))
    for k in refs:
        refs[k].discard("")
    return refs


def _selects(field_selector: str, field: str, node: str) -> bool:
    """Whether the selector, read by the parse the list and watch handlers use, keeps only
    objects whose ``field`` is ``node`` (its terms all hold: one of them is that)."""
    try:
        return (field, "=", node) in parse_field_selector(field_selector).terms
    except APIError:   # the handler refuses it too
        return False


MOVE_UNDER_WAY = CheckpointPhase.IN_FLIGHT  # Checkpoint phases whose target may read the data


_NO_RELATION = "no relationship found between node '{node}' and this object"


class NodeAuthorizer:
    """Kubernetes' node authorizer, reduced to what a Kube32 kubelet does."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    async def _pods_on(self, node: str, namespace: str | None = None) -> list[dict[str, Any]]:
        pods, _ = await self.registry.list(by_plural("pods"), namespace or None,
                                           None, parse_field_selector(f"spec.nodeName={node}"))
        return pods

    async def _pod_is_on(self, node: str, namespace: str, name: str) -> bool:
        pod = await self.registry.try_get(by_plural("pods"), namespace, name)
        # A pod that is gone reveals nothing: the request goes on to its 404, so a kubelet
        # confirming a deletion someone else completed is told "not found", not "forbidden".
        return pod is None or objects.spec(pod).get("nodeName") == node

    async def _referenced(self, node: str, kind: str, namespace: str, name: str) -> bool:
        if kind == "checkpoints" and await self._checkpoint_pod_on(node, namespace, name):
            return True  # the usual restore, without decoding every pod on the node
        if any(name in pod_references(p)[kind] for p in await self._pods_on(node, namespace)):
            return True
        return any(name in pod_references(p)[kind] for p in await self._pods_moving_to(node, namespace))

    async def _pods_moving_to(self, node: str, namespace: str, pod_name: str | None = None) -> list[dict[str, Any]]:
        """The pods that moves under way toward ``node`` are taking there: its kubelet
        begins their restores before the replacements are bound to it (kube32.kubelet.prefetch)."""
        moves, _ = await self.registry.list(by_plural("checkpoints"), namespace or None, None,
                                            parse_field_selector(f"status.targetNode={node}"))
        out = []
        for ck in moves:
            spec, st = objects.spec(ck), objects.status(ck)
            name = spec.get("podName")
            if st.get("phase") not in MOVE_UNDER_WAY or not isinstance(name, str) or \
                    (pod_name is not None and name != pod_name):
                continue
            pod = await self.registry.try_get(by_plural("pods"), ck["metadata"]["namespace"], name)
            if pod is not None and pod["metadata"].get("uid") == st.get("podUID"):
                out.append(pod)
        return out

    async def _serves_node_ports(self, namespace: str, proxied: str) -> bool:
        """Whether the Service a proxy request names (``[scheme:]name[:port]``) is one the
        nodes answer on a port; one that is gone reveals nothing (its 404 follows)."""
        name = split_proxied_name(proxied)
        if name is None or not namespace:
            return False
        svc = await self.registry.try_get(by_plural("services"), namespace, name)
        return svc is None or objects.spec(svc).get("type") in NODE_PORT_TYPES

    async def _checkpoint_pod_on(self, node: str, namespace: str, name: str) -> bool:
        """Whether the pod a Checkpoint was taken of is on ``node`` and restores from it:
        two reads, where listing the pods on the node costs one decode per pod (a drain's
        restores would be quadratic)."""
        ck = await self.registry.try_get(by_plural("checkpoints"), namespace, name)
        pod_name = objects.spec(ck).get("podName")
        if not isinstance(pod_name, str) or not pod_name:
            return False
        pod = await self.registry.try_get(by_plural("pods"), namespace, pod_name)
        return pod is not None and objects.spec(pod).get("nodeName") == node and \
            name in pod_references(pod)["checkpoints"]

    async def authorize(self, a: Attributes) -> tuple[Decision, str]:
        node = node_name(a)
        if node is None or not a.resource_request:
            return Decision.NO_OPINION, ""
        rule = self._rules.get((a.api_group, a.resource))
        if rule is not None:
            return await rule(a, node, _NO_RELATION.format(node=node))
        return self._writes_and_reviews(a, node)

    @property
    def _rules(self) -> dict[tuple[str, str], Callable[[Attributes, str, str], Awaitable[tuple[Decision, str]]]]:
        """(API group, resource) -> its rule; other resources: :meth:`_writes_and_reviews`."""
        return {("", "nodes"): self._nodes, ("", "pods"): self._pods,
                ("", "configmaps"): self._referenced_objects, ("", "secrets"): self._referenced_objects,
                (terms.GROUP, "checkpoints"): self._checkpoints,
                ("coordination.k8s.io", "leases"): self._leases, ("", "services"): self._services}

    async def _nodes(self, a: Attributes, node: str, deny: str) -> tuple[Decision, str]:
        if a.subresource == "" and a.verb in ("get", "list", "watch", "create"):
            return Decision.ALLOW, ""   # create: the name is checked by admit()
        if a.subresource in ("", "status") and a.verb in ("get", "update", "patch", "delete") and a.name == node:
            return Decision.ALLOW, ""
        return Decision.DENY, f"node '{node}' may only change its own Node"

    async def _referenced_objects(self, a: Attributes, node: str, deny: str) -> tuple[Decision, str]:
        """ConfigMaps and Secrets: only those a pod bound to the node references."""
        if a.verb == "get" and not a.subresource and a.name and \
                await self._referenced(node, a.resource, a.namespace, a.name):
            return Decision.ALLOW, ""
        return Decision.DENY, deny

    async def _leases(self, a: Attributes, node: str, deny: str) -> tuple[Decision, str]:
        if a.namespace == NODE_LEASE_NAMESPACE and not a.subresource and (
                a.name == node or (a.verb == "create" and not a.name)):
            return Decision.ALLOW, ""
        return Decision.DENY, f"node '{node}' may only use its own Lease"

    async def _services(self, a: Attributes, node: str, deny: str) -> tuple[Decision, str]:
        if a.subresource == "" and a.verb in ("get", "list", "watch"):
            return Decision.ALLOW, ""
        # As kube-proxy: a node serves NodePort Services, forwarding through services/proxy;
        # to those alone (open to anyone on the network anyway), not to every Service.
        if a.subresource == "proxy":
            if await self._serves_node_ports(a.namespace, a.name):
                return Decision.ALLOW, ""
            return Decision.DENY, f"node '{node}' may only proxy to NodePort and LoadBalancer Services"
        return Decision.DENY, deny

    @staticmethod
    def _writes_and_reviews(a: Attributes, node: str) -> tuple[Decision, str]:
        """Events it writes, token and access reviews, Kube32's images, topics and its own
        credentials; nothing else is the node authorizer's to decide."""
        key = (a.api_group, a.resource)
        if key in (("", "events"), ("events.k8s.io", "events")) and a.verb in ("create", "update", "patch"):
            return Decision.ALLOW, ""
        if key in (("authentication.k8s.io", "tokenreviews"),
                   ("authorization.k8s.io", "subjectaccessreviews")) and a.verb == "create":
            return Decision.ALLOW, ""
        allowed = {"images": ("get",), "topics": ("create",), "topicevents": ("get", "list", "watch")}
        if a.api_group == terms.GROUP:
            if a.verb in allowed.get(a.resource, ()):
                return Decision.ALLOW, ""
            if a.resource == "nodecredentials" and a.verb == "create" and a.name == node:
                return Decision.ALLOW, ""
        return Decision.NO_OPINION, ""

    async def _checkpoints(self, a: Attributes, node: str, deny: str) -> tuple[Decision, str]:
        if a.verb in ("list", "watch") and not a.subresource:
            if _selects(a.field_selector, "status.targetNode", node):
                return Decision.ALLOW, ""
            return Decision.DENY, (f"node '{node}' may only list and watch checkpoints with fieldSelector "
                                   f"status.targetNode={node}")
        if a.verb == "get" and a.subresource in ("", "data") and a.name and (
                await self._move_target(node, a.namespace, a.name)
                or await self._referenced(node, "checkpoints", a.namespace, a.name)):
            return Decision.ALLOW, ""
        return Decision.DENY, deny

    async def _move_target(self, node: str, namespace: str, name: str) -> bool:
        """Whether ``node`` is the target of this Checkpoint's move under way: it may read the
        data before the replacement is bound to it (kube32.kubelet.prefetch)."""
        ck = await self.registry.try_get(by_plural("checkpoints"), namespace, name)
        st = objects.status(ck)
        return st.get("targetNode") == node and st.get("phase") in MOVE_UNDER_WAY

    async def _pods(self, a: Attributes, node: str, deny: str) -> tuple[Decision, str]:
        if a.verb in ("list", "watch") and not a.subresource:
            if _selects(a.field_selector, "spec.nodeName", node):
                return Decision.ALLOW, ""
            return Decision.DENY, f"node '{node}' may only list and watch pods with fieldSelector spec.nodeName={node}"
        allowed = {"": ("get", "delete"), "status": ("get", "update", "patch"), "eviction": ("create",)}
        if a.verb in allowed.get(a.subresource, ()) and a.name and \
                await self._pod_is_on(node, a.namespace, a.name):
            return Decision.ALLOW, ""
        if a.verb == "get" and not a.subresource and a.name and \
                await self._pods_moving_to(node, a.namespace, a.name):
            return Decision.ALLOW, ""
        return Decision.DENY, deny


class Authorizer:
    """system:masters, then the node authorizer, then RBAC."""

    def __init__(self, registry: Any) -> None:
        self.node = NodeAuthorizer(registry)
        self.rbac = RBACAuthorizer(registry)

    async def authorize(self, attrs: Attributes) -> tuple[bool, str]:
        refusal = apiserver_lease_refusal(attrs)
        if refusal:
            return False, refusal
        if MASTERS in attrs.groups:
            return True, ""
        decision, reason = await self.node.authorize(attrs)
        if decision is Decision.ALLOW:
            return True, reason
        if decision is Decision.DENY:
            return False, reason
        return await self.rbac.authorize(attrs)


_LEASE_WRITES = ("create", "update", "patch", "delete", "deletecollection")


def apiserver_lease_refusal(a: Attributes) -> str:
    """Why ``a`` may not write an API server's Lease ("" when it may or it is no such write)."""
    if a.resource != "leases" or a.api_group != "coordination.k8s.io" or a.verb not in _LEASE_WRITES \
            or a.namespace != APISERVER_LEASE_NAMESPACE or a.user == APISERVER:
        return ""
    if a.verb == "deletecollection" and MASTERS not in a.groups:
        return f"only {APISERVER} deletes the API servers' Leases in {APISERVER_LEASE_NAMESPACE}"
    if a.name.startswith(APISERVER_LEASE_PREFIX) and not (a.verb == "delete" and MASTERS in a.groups):
        return (f"Leases named {APISERVER_LEASE_PREFIX}* in {APISERVER_LEASE_NAMESPACE} announce API servers: "
                f"only {APISERVER} writes them")
    if a.name == CONTROLLER_MANAGER_LEASE and not (a.verb == "delete" and MASTERS in a.groups):
        return (f"the Lease {CONTROLLER_MANAGER_LEASE} in {APISERVER_LEASE_NAMESPACE} elects the control planes' "
                f"controllers: only {APISERVER} writes it")
    return ""


def admit(user: User, plural: str, namespace: str | None, obj: Any) -> None:
    """Checks on a created object's body that the URL could not express (NodeRestriction,
    and the API servers' Leases: :func:`apiserver_lease_refusal` on the body's name)."""
    attrs = Attributes(user.name, groups_of(user), "create", namespace or "",
                       "coordination.k8s.io" if plural == "leases" else "", plural)
    md = obj.get("metadata") if isinstance(obj, dict) else None
    name = (md.get("name") or md.get("generateName") or "") if isinstance(md, dict) else ""
    named = Attributes(user.name, attrs.groups, "create", namespace or "", attrs.api_group, plural, name=name)
    refusal = apiserver_lease_refusal(named)
    if refusal:
        raise forbidden(named, refusal)
    node = node_name(attrs)
    if node is None or not isinstance(obj, dict):
        return
    if plural in ("nodes", "leases") and name != node:
        raise forbidden(named, f"node '{node}' cannot create a {plural[:-1]} "
                                                       f"named '{name}'")


# --- access reviews ------------------------------------------------------------------
def review_attributes(user: str, groups: tuple[str, ...], spec: dict[str, Any], uid: str = "",
                      namespace: str | None = None) -> Attributes:
    ra = spec.get("resourceAttributes")
    if isinstance(ra, dict):
        return Attributes(user, groups, str(ra.get("verb", "")),
                          namespace if namespace is not None else str(ra.get("namespace", "") or ""),
                          str(ra.get("group", "") or ""), str(ra.get("resource", "") or ""),
                          str(ra.get("subresource", "") or ""), str(ra.get("name", "") or ""),
                          field_selector=str(((ra.get("fieldSelector") or {}).get("rawSelector")) or ""),
                          uid=uid)
    nra = spec.get("nonResourceAttributes")
    if isinstance(nra, dict):
        return Attributes(user, groups, str(nra.get("verb", "")), path=str(nra.get("path", "")),
                          resource_request=False, uid=uid)
    raise errors.invalid("SubjectAccessReview", "", [
        ("spec.resourceAttributes", "Required value: exactly one of nonResourceAttributes or "
                                    "resourceAttributes must be specified")], "authorization.k8s.io")


def _review_response(kind: str, body: dict[str, Any], spec: dict[str, Any], allowed: bool,
                     reason: str) -> web.Response:
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    return json_response({"kind": kind, "apiVersion": "authorization.k8s.io/v1", "metadata": md,
                          "spec": spec, "status": status}, 201)


def _proto_strings(data: bytes, names: dict[int, str]) -> dict[str, str]:
    fields = _proto_fields(data)
    return {name: fields[n][-1].decode() for n, name in names.items()
            if n in fields and isinstance(fields[n][-1], bytes)}


_RESOURCE_ATTRS = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource", 6: "subresource", 7: "name"}
_NON_RESOURCE_ATTRS = {1: "path", 2: "verb"}


def decode_review_protobuf(raw: bytes) -> dict[str, Any]:
    """An access review sent as Kubernetes protobuf (kubectl's typed clients do):
    runtime.Unknown{2: raw} -> review{2: spec} -> spec{1: resourceAttributes, 2: nonResourceAttributes
    (SelfSubjectAccessReview) | 1/2 the same, 3 user, 4 groups, 6 uid (SubjectAccessReview)}."""
    try:
        unknown = _proto_fields(raw[4:])
        review = _proto_fields(unknown[2][-1])
        spec_raw = review.get(2, [b""])[-1]
        spec_fields = _proto_fields(spec_raw)
        spec: dict[str, Any] = {}
        if 1 in spec_fields:
            spec["resourceAttributes"] = _proto_strings(spec_fields[1][-1], _RESOURCE_ATTRS)
        if 2 in spec_fields:
            spec["nonResourceAttributes"] = _proto_strings(spec_fields[2][-1], _NON_RESOURCE_ATTRS)
        if 3 in spec_fields:
            spec["user"] = spec_fields[3][-1].decode()
        if 4 in spec_fields:
            spec["groups"] = [g.decode() for g in spec_fields[4]]
        if 6 in spec_fields:
            spec["uid"] = spec_fields[6][-1].decode()
        if 1 in spec_fields and not isinstance(spec_fields[1][-1], bytes):
            raise ValueError("bad resourceAttributes")
        return {"spec": spec}
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, AttributeError) as e:
        raise errors.bad_request(f"the protobuf body could not be decoded: {e}") from None


def decode_rules_review_protobuf(raw: bytes) -> dict[str, Any]:
    """SelfSubjectRulesReview as protobuf: runtime.Unknown{2: review{2: spec{1: namespace}}}."""
    try:
        review = _proto_fields(_proto_fields(raw[4:])[2][-1])
        spec = _proto_fields(review.get(2, [b""])[-1])
        return {"spec": {"namespace": spec[1][-1].decode()} if 1 in spec else {}}
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, AttributeError) as e:
        raise errors.bad_request(f"the protobuf body could not be decoded: {e}") from None


async def _review_body(request: web.Request, what: str,
                       proto: Any = decode_review_protobuf) -> tuple[dict[str, Any], dict[str, Any]]:
    raw = await bodies.read_raw(request)
    if raw.startswith(b"k8s\x00"):
        body: Any = proto(raw)
    else:
        body = await bodies.decode_async(raw, bodies.media_type(request), f"cannot create {what}")
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise errors.bad_request(f"cannot create {what}: the body must be an object with a spec")
    return body, body["spec"]


def add_routes(router: web.UrlDispatcher, authorizer: Authorizer) -> None:
    """The authorization.k8s.io/v1 reviews (before the generic resource routes)."""
    base = "/apis/authorization.k8s.io/v1"

    async def self_review(request: web.Request) -> web.Response:
        user: User = request["user"]
        body, spec = await _review_body(request, "selfsubjectaccessreviews")
        attrs = review_attributes(user.name, groups_of(user), spec, user.uid)
        allowed, reason = await authorizer.authorize(attrs)
        return _review_response("SelfSubjectAccessReview", body, spec, allowed, reason)

    async def subject_review(request: web.Request) -> web.Response:
        body, spec = await _review_body(request, "subjectaccessreviews")
        groups = tuple(g for g in spec.get("groups") or [] if isinstance(g, str))
        user = str(spec.get("user") or "")
        if not user and not groups:
            raise errors.invalid("SubjectAccessReview", "", [
                ("spec.user", "Invalid value: at least one of user or group must be specified")],
                "authorization.k8s.io")
        ns = request.match_info.get("ns")
        attrs = review_attributes(user, groups, spec, str(spec.get("uid") or ""), ns)
        allowed, reason = await authorizer.authorize(attrs)
        kind = "LocalSubjectAccessReview" if ns is not None else "SubjectAccessReview"
        return _review_response(kind, body, spec, allowed, reason)

    async def rules_review(request: web.Request) -> web.Response:
        user: User = request["user"]
        body, spec = await _review_body(request, "selfsubjectrulesreviews", decode_rules_review_protobuf)
        ns = str(spec.get("namespace") or "")
        attrs = Attributes(user.name, groups_of(user), "")
        if MASTERS in attrs.groups:
            rules = [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
                     {"verbs": ["*"], "nonResourceURLs": ["*"]}]
        else:
            rules = await authorizer.rbac.rules_for(attrs, ns)
        resource_rules = [{k: r[k] for k in ("verbs", "apiGroups", "resources", "resourceNames") if r.get(k)}
                          for r in rules if isinstance(r, dict) and r.get("resources")]
        url_rules = [{"verbs": r.get("verbs", []), "nonResourceURLs": r["nonResourceURLs"]}
                     for r in rules if isinstance(r, dict) and r.get("nonResourceURLs")]
        return json_response({"kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1",
                              "metadata": {}, "spec": spec,
                              "status": {"resourceRules": resource_rules, "nonResourceRules": url_rules,
                                         "incomplete": node_name(attrs) is not None}}, 201)

    async def who_am_i(request: web.Request) -> web.Response:
        user: User = request["user"]
        await bodies.read_raw(request)      # any body: the answer is the caller
        info = {"username": user.name, "uid": user.uid, "groups": list(groups_of(user))}
        return json_response({"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                              "metadata": {}, "status": {"userInfo": info}}, 201)

    router.add_post("/apis/authentication.k8s.io/v1/selfsubjectreviews", who_am_i)
    router.add_post(f"{base}/selfsubjectaccessreviews", self_review)
    router.add_post(f"{base}/subjectaccessreviews", subject_review)
    router.add_post(f"{base}/namespaces/{{ns}}/localsubjectaccessreviews", subject_review)
    router.add_post(f"{base}/selfsubjectrulesreviews", rules_review)


# --- RBAC escalation prevention ------------------------------------------------------
def _strs(value: Any) -> list[str]:
    """The strings of a list field; anything malformed is left to validation (422)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _rule_attrs(user: str, groups: tuple[str, ...], rule: dict[str, Any], namespace: str) -> list[Attributes]:
    """Every (verb, group, resource, name) a rule grants, as request attributes."""
    out: list[Attributes] = []
    verbs = _strs(rule.get("verbs"))
    for url in _strs(rule.get("nonResourceURLs")):
        out += [Attributes(user, groups, v, path=str(url), resource_request=False) for v in verbs]
    names = _strs(rule.get("resourceNames")) or [""]
    for g in _strs(rule.get("apiGroups")):
        for r in _strs(rule.get("resources")):
            res, _, sub = str(r).partition("/")
            out += [Attributes(user, groups, v, namespace, str(g), res, sub, n) for v in verbs for n in names]
    return out


def _rule_text(rule: dict[str, Any]) -> str:
    def q(key: str) -> str:
        return "[" + " ".join(f'"{v}"' for v in _strs(rule.get(key))) + "]"
    if rule.get("nonResourceURLs"):
        return f"{{NonResourceURLs:{q('nonResourceURLs')}, Verbs:{q('verbs')}}}"
    names = f", ResourceNames:{q('resourceNames')}" if rule.get("resourceNames") else ""
    return f"{{APIGroups:{q('apiGroups')}, Resources:{q('resources')}{names}, Verbs:{q('verbs')}}}"


async def check_escalation(authorizer: Authorizer, user: User, plural: str, namespace: str | None,
                           obj: Any) -> None:
    """A user may write a role, or bind one, only with every permission in it, as Kubernetes
    (unless RBAC grants them ``escalate`` on the role / ``bind`` on the role bound)."""
    groups = groups_of(user)
    if MASTERS in groups or not isinstance(obj, dict):
        return
    ns = namespace if isinstance(namespace, str) else ""
    md = obj.get("metadata")
    name = str(md.get("name", "")) if isinstance(md, dict) else ""
    if not ns and plural in ("roles", "rolebindings") and isinstance(md, dict):
        ns = str(md.get("namespace") or "")    # created through the cluster-wide URL
    if plural in ("roles", "clusterroles"):
        special = Attributes(user.name, groups, "escalate", ns, GROUP, plural, "", name)
        rules = obj.get("rules") or []
    elif plural in ("rolebindings", "clusterrolebindings"):
        ref: dict[str, Any] = obj["roleRef"] if isinstance(obj.get("roleRef"), dict) else {}
        role_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
        special = Attributes(user.name, groups, "bind", ns if role_plural == "roles" else "", GROUP,
                             role_plural, "", str(ref.get("name", "")))
        role = await authorizer.rbac.registry.try_get(by_plural(role_plural),
                                                      ns if role_plural == "roles" else None,
                                                      str(ref.get("name", ""))) if ref.get("name") else None
        rules = (role or {}).get("rules") or []
    else:
        return
    if (await authorizer.authorize(special))[0]:
        return
    missing = []
    for rule in rules if isinstance(rules, list) else []:
        if not isinstance(rule, dict):
            continue
        for a in _rule_attrs(user.name, groups, rule, ns):
            if not (await authorizer.authorize(a))[0]:
                missing.append(_rule_text(rule))
                break
    if missing:
        shown = " ".join(f'"{g}"' for g in groups)
        raise APIError(403, "Forbidden",
                       f'{qualified(plural, GROUP)} "{name}" is forbidden: user "{user.name}" (groups=[{shown}]) '
                       f"is attempting to grant RBAC permissions not currently held:\n" + "\n".join(missing),
                       details={"name": name, "group": GROUP, "kind": plural})
