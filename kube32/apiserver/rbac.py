"""RBAC: Roles, ClusterRoles and their bindings decide who may do what.

The semantics are Kubernetes' (rbac.authorization.k8s.io/v1): a request is
allowed when some binding names the user (by ``User`` name, ``Group`` or
``ServiceAccount``) and the role it points to has a rule matching the request's
verb, API group, resource (``plural`` or ``plural/subresource``), name and
namespace.  ClusterRoleBindings apply everywhere; RoleBindings only in their own
namespace (a RoleBinding may point at a ClusterRole, whose rules then apply in
that namespace only).  There is no deny: RBAC only ever adds permissions.

Invariants:

* ``*`` in verbs/apiGroups/resources matches anything; ``resourceNames`` empty
  matches any name.  ``pods/*`` matches every subresource of pods but not
  ``pods`` itself, as Kubernetes.
* ``checkpoints/data`` is its own resource: a rule for ``checkpoints`` does not
  reach the snapshot bytes.  The default ``view`` role has no rule for it (nor
  for ``secrets``): a snapshot holds the pod's memory, Secrets' values included.
* The default roles (:data:`DEFAULT_CLUSTER_ROLES`) are written out, not
  aggregated; they are created at start and brought back to their defaults unless
  annotated ``rbac.authorization.kubernetes.io/autoupdate: "false"``.
* The evaluator reads the bindings through the registry and caches them for at
  most :data:`CACHE_SECONDS` (the server also drops the cache after every RBAC
  write), so a grant or revocation applies within that time.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Iterable

from .. import objects, terms

GROUP = "rbac.authorization.k8s.io"
CACHE_SECONDS = 2.0
AUTOUPDATE = terms.RBAC_AUTOUPDATE
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"

READ = ["get", "list", "watch"]
WRITE = ["create", "delete", "deletecollection", "patch", "update"]


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do (Kubernetes' authorizer.Attributes)."""
    user: str
    groups: tuple[str, ...]
    verb: str
    namespace: str = ""
    api_group: str = ""
    resource: str = ""          # plural
    subresource: str = ""
    name: str = ""
    path: str = ""              # for non-resource requests
    resource_request: bool = True
    field_selector: str = ""    # as sent; the node authorizer reads spec.nodeName
    uid: str = ""

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _rule(api_groups: list[str], resources: list[str], verbs: list[str],
          names: list[str] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"apiGroups": api_groups, "resources": resources, "verbs": verbs}
    if names:
        r["resourceNames"] = names
    return r


def _url_rule(urls: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"nonResourceURLs": urls, "verbs": verbs}


# --- the default roles, aggregation written out --------------------------------------
_VIEW = [
    _rule([""], ["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status",
                 "pods", "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts",
                 "services", "services/status"], READ),
    _rule([""], ["bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
                 "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"], READ),
    _rule([""], ["namespaces"], READ),
    _rule(["discovery.k8s.io"], ["endpointslices"], READ),
    _rule(["apps"], ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments",
                     "deployments/scale", "deployments/status", "replicasets", "replicasets/scale",
                     "replicasets/status", "statefulsets", "statefulsets/scale", "statefulsets/status"], READ),
    _rule(["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"], READ),
    _rule(["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"], READ),
    _rule(["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"], READ),
    _rule(["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"], READ),
    # Checkpoint objects but not their data (a pod's memory: as secret as a Secret).
    _rule([terms.GROUP], ["checkpoints", "checkpoints/status", "images", "images/info", "topicevents"], READ),
]
_EDIT = [
    _rule([""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets",
                 "services/proxy"], READ),
    _rule([""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], WRITE),
    _rule([""], ["pods/eviction", "pods/replacement", "serviceaccounts/token"], ["create"]),
    _rule([""], ["serviceaccounts"], ["impersonate"]),  # as Kubernetes' edit role
    _rule([""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                 "replicationcontrollers/scale", "secrets", "serviceaccounts", "services",
                 "services/proxy", "endpoints"], WRITE),
    _rule(["apps"], ["daemonsets", "deployments", "deployments/rollback", "deployments/scale",
                     "replicasets", "replicasets/scale", "statefulsets", "statefulsets/scale"], WRITE),
    _rule(["policy"], ["poddisruptionbudgets"], WRITE),
    _rule(["batch"], ["cronjobs", "jobs"], WRITE),
    _rule(["discovery.k8s.io"], ["endpointslices"], WRITE),
    _rule([terms.GROUP], ["checkpoints"], WRITE),
    _rule([terms.GROUP], ["checkpoints/data"], ["get", "update"]),
    _rule([terms.GROUP], ["images", "topics"], ["create"]),
    *_VIEW,
]
_ADMIN = [
    _rule([GROUP], ["roles", "rolebindings"], READ + WRITE),
    _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
    *_EDIT,
]

DEFAULT_CLUSTER_ROLES: dict[str, list[dict[str, Any]]] = {
    "cluster-admin": [_rule(["*"], ["*"], ["*"]), _url_rule(["*"], ["*"])],
    "admin": _ADMIN,
    "edit": _EDIT,
    "view": _VIEW,
    "system:discovery": [_url_rule(["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                                    "/openapi", "/openapi/*", "/readyz", "/version", "/version/"], ["get"])],
    "system:basic-user": [_rule(["authorization.k8s.io"], ["selfsubjectaccessreviews",
                                                           "selfsubjectrulesreviews"], ["create"]),
                          _rule(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"])],
    "system:public-info-viewer": [_url_rule(["/healthz", "/livez", "/readyz", "/version", "/version/"], ["get"])],
    # Who may scrape /metrics (kube-apiserver's system:monitoring, with its health checks).
    "system:monitoring": [_url_rule(["/metrics", "/livez", "/livez/*", "/readyz", "/readyz/*", "/healthz",
                                     "/healthz/*"], ["get"])],
    # A node joining with the bootstrap token may only ask for its own credentials.
    "system:kube32:node-bootstrapper": [_rule([terms.GROUP], ["nodecredentials"], ["create"])],
}

BOOTSTRAP_GROUP = "system:bootstrappers:kube32"
DEFAULT_CLUSTER_ROLE_BINDINGS: dict[str, tuple[str, list[dict[str, str]]]] = {
    "cluster-admin": ("cluster-admin", [{"kind": "Group", "name": MASTERS}]),
    "system:discovery": ("system:discovery", [{"kind": "Group", "name": AUTHENTICATED}]),
    "system:basic-user": ("system:basic-user", [{"kind": "Group", "name": AUTHENTICATED}]),
    "system:public-info-viewer": ("system:public-info-viewer",
                                  [{"kind": "Group", "name": AUTHENTICATED},
                                   {"kind": "Group", "name": "system:unauthenticated"}]),
    "system:kube32:node-bootstrapper": ("system:kube32:node-bootstrapper",
                                        [{"kind": "Group", "name": BOOTSTRAP_GROUP}]),
}


def default_objects() -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of every default ClusterRole and ClusterRoleBinding."""
    labels = {terms.Label.BOOTSTRAPPING: "rbac-defaults"}
    ann = {AUTOUPDATE: "true"}
    out: list[tuple[str, dict[str, Any]]] = []
    for name, rules in DEFAULT_CLUSTER_ROLES.items():
        out.append(("clusterroles", {"apiVersion": f"{GROUP}/v1", "kind": "ClusterRole",
                                     "metadata": {"name": name, "labels": dict(labels), "annotations": dict(ann)},
                                     "rules": rules}))
    for name, (role, subjects) in DEFAULT_CLUSTER_ROLE_BINDINGS.items():
        subs = [{**s, "apiGroup": GROUP} for s in subjects]
        out.append(("clusterrolebindings", {
            "apiVersion": f"{GROUP}/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(labels), "annotations": dict(ann)},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role}, "subjects": subs}))
    return out


# --- matching ----------------------------------------------------------------------
def _has(values: Iterable[str] | None, wanted: str) -> bool:
    vals = list(values or [])
    return "*" in vals or wanted in vals


def _resource_matches(resources: Iterable[str] | None, attrs: Attributes) -> bool:
    full = attrs.full_resource
    for r in resources or []:
        if r == "*" or r == full:
            return True
        # "pods/*" reaches every subresource of pods; "*/scale" every scale.
        if attrs.subresource and (r == f"{attrs.resource}/*" or r == f"*/{attrs.subresource}"):
            return True
    return False


def _url_matches(urls: Iterable[str] | None, path: str) -> bool:
    for u in urls or []:
        if u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1])):
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    if not isinstance(rule, dict) or not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        return _url_matches(rule.get("nonResourceURLs"), attrs.path)
    if not _has(rule.get("apiGroups"), attrs.api_group):
        return False
    if not _resource_matches(rule.get("resources"), attrs):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def subject_matches(subject: dict[str, Any], attrs: Attributes, binding_ns: str = "") -> bool:
    if not isinstance(subject, dict):
        return False
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == attrs.user
    if kind == "Group":
        return name in attrs.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return attrs.user == f"system:serviceaccount:{ns}:{name}"
    return False


@dataclass
class _Snapshot:
    at: float
    cluster_roles: dict[str, dict[str, Any]]
    roles: dict[tuple[str, str], dict[str, Any]]
    cluster_bindings: list[dict[str, Any]]
    bindings: dict[str, list[dict[str, Any]]]   # namespace -> RoleBindings


class RBACAuthorizer:
    """Evaluates RBAC over the objects in the registry (cached briefly)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self._snap: _Snapshot | None = None
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._snap = None

    async def _load(self) -> _Snapshot:
        snap = self._snap
        if snap is not None and time.monotonic() - snap.at < CACHE_SECONDS:
            return snap
        async with self._lock:
            snap = self._snap
            if snap is not None and time.monotonic() - snap.at < CACHE_SECONDS:
                return snap
            from .resources import by_plural
            reg = self.registry
            crs, _ = await reg.list(by_plural("clusterroles"), None)
            rs, _ = await reg.list(by_plural("roles"), None)
            crbs, _ = await reg.list(by_plural("clusterrolebindings"), None)
            rbs, _ = await reg.list(by_plural("rolebindings"), None)
            by_ns: dict[str, list[dict[str, Any]]] = {}
            for rb in rbs:
                by_ns.setdefault(rb["metadata"].get("namespace", ""), []).append(rb)
            snap = _Snapshot(time.monotonic(), {c["metadata"]["name"]: c for c in crs},
                             {(r["metadata"].get("namespace", ""), r["metadata"]["name"]): r for r in rs},
                             crbs, by_ns)
            self._snap = snap
            return snap

    def _rules_of(self, snap: _Snapshot, ref: Any, namespace: str) -> list[dict[str, Any]]:
        if not isinstance(ref, dict):
            return []
        if ref.get("kind") == "ClusterRole":
            role = snap.cluster_roles.get(ref.get("name", ""))
        elif ref.get("kind") == "Role" and namespace:
            role = snap.roles.get((namespace, ref.get("name", "")))
        else:
            role = None
        rules = (role or {}).get("rules") or []
        return rules if isinstance(rules, list) else []

    async def authorize(self, attrs: Attributes) -> tuple[bool, str]:
        snap = await self._load()
        for b in snap.cluster_bindings:
            if any(subject_matches(s, attrs) for s in b.get("subjects") or []):
                if any(rule_allows(r, attrs) for r in self._rules_of(snap, b.get("roleRef"), "")):
                    return True, f'RBAC: allowed by ClusterRoleBinding "{b["metadata"]["name"]}"'
        if attrs.resource_request and attrs.namespace:
            for b in snap.bindings.get(attrs.namespace, []):
                ns = attrs.namespace
                if any(subject_matches(s, attrs, ns) for s in b.get("subjects") or []):
                    if any(rule_allows(r, attrs) for r in self._rules_of(snap, b.get("roleRef"), ns)):
                        return True, (f'RBAC: allowed by RoleBinding "{b["metadata"]["name"]}/{ns}"')
        return False, ""

    async def rules_for(self, attrs: Attributes, namespace: str) -> list[dict[str, Any]]:
        """Every rule that applies to the user in ``namespace`` (SelfSubjectRulesReview)."""
        snap = await self._load()
        out: list[dict[str, Any]] = []
        for b in snap.cluster_bindings:
            if any(subject_matches(s, attrs) for s in b.get("subjects") or []):
                out += self._rules_of(snap, b.get("roleRef"), "")
        for b in snap.bindings.get(namespace, []):
            if any(subject_matches(s, attrs, namespace) for s in b.get("subjects") or []):
                out += self._rules_of(snap, b.get("roleRef"), namespace)
        return out


async def ensure_defaults(registry: Any) -> None:
    """Create the default roles and bindings; reset those still marked autoupdate."""
    from .resources import by_plural
    for plural, obj in default_objects():
        res = by_plural(plural)
        name = obj["metadata"]["name"]
        current = await registry.try_get(res, None, name)
        if current is None:
            await registry.create(res, None, obj)
            continue
        if objects.annotations(current).get(AUTOUPDATE) == "false":
            continue
        fields = ("rules",) if plural == "clusterroles" else ("roleRef", "subjects")
        if all(current.get(f) == obj.get(f) for f in fields):
            continue
        updated = {**current, **{f: obj[f] for f in fields}}
        await registry.update(res, None, name, updated)
