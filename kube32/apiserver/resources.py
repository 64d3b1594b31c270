"""The resources Kube32 serves: one :class:`Resource` per (group, version, plural).

This table drives discovery, OpenAPI, routing and storage keys, so a new kind
is one line here plus its strategy.  Storage keys are
``/registry/<group or core>/<plural>/<namespace>/<name>`` (namespaced) and
``/registry/<group or core>/<plural>/<name>`` (cluster-scoped).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .strategies.apiextensions import CustomResourceDefinitionStrategy
from .strategies.apps import (ControllerRevisionStrategy, DaemonSetStrategy, DeploymentStrategy,
                              PodDisruptionBudgetStrategy, ReplicaSetStrategy)
from .strategies.batch import CronJobStrategy, JobStrategy
from .strategies.checkpoint import CheckpointStrategy
from .strategies.namespace import NamespaceStrategy
from .strategies.node import NodeStrategy
from .strategies.pod import PodStrategy
from .strategies.rbac import (ClusterRoleBindingStrategy, ClusterRoleStrategy, ReviewStrategy,
                              RoleBindingStrategy, RoleStrategy, ServiceAccountStrategy)
from .strategies.service import EndpointSliceStrategy, EndpointsStrategy, ServiceStrategy
from .strategies.simple import ConfigMapStrategy, EventStrategy, LeaseStrategy, NotRunStrategy, SecretStrategy
from .strategy import Strategy
from ..terms import GROUP, VERSION

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
READ_ONLY_VERBS = ("get", "list", "watch")
_NO_VOLUMES = "a Kube32 pod has no volumes: it keeps its state in its memory, and reads files from its image"


@dataclass(frozen=True)
class Subresource:
    name: str
    kind: str
    verbs: tuple[str, ...]
    group: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    strategy: Strategy
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[Subresource, ...] = ()
    verbs: tuple[str, ...] = tuple(VERBS)
    # The OpenAPI v3 schema of the kind's objects, where the table has one (a custom
    # resource's openAPIV3Schema, kube32.apiserver.crds); None: the OpenAPI module's own.
    schema: Any = None
    custom: bool = False   # defined by a CustomResourceDefinition (kube32.apiserver.crds)
    # How server-side apply and managedFields merge and own its fields
    # (kube32.apiserver.patch.FieldRules, from a custom resource's schema); None: the kind's
    # built-in rules (patch.rules_for_kind).
    field_rules: Any = None

    @property
    def rules(self) -> Any:
        """What kube32.apiserver.patch takes as the kind: its field rules, else its name."""
        return self.kind if self.field_rules is None else self.field_rules

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def key(self, namespace: str | None, name: str) -> str:
        return f"{self.prefix(namespace)}{name}"

    def prefix(self, namespace: str | None = None) -> str:
        base = f"/registry/{self.group or 'core'}/{self.plural}/"
        if self.namespaced and namespace:
            return f"{base}{namespace}/"
        return base

    def has_sub(self, name: str) -> bool:
        return any(s.name == name for s in self.subresources)


def _status(kind: str) -> Subresource:
    return Subresource("status", kind, ("get", "patch", "update"))


_SCALE = Subresource("scale", "Scale", ("get", "patch", "update"), "autoscaling", "v1")

RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "namespace", "Namespace", False, NamespaceStrategy(),
             ("ns",), subresources=(_status("Namespace"), Subresource("finalize", "Namespace", ("update",)))),
    Resource("", "v1", "nodes", "node", "Node", False, NodeStrategy(), ("no",),
             subresources=(_status("Node"), Subresource("proxy", "NodeProxyOptions",
                                                         ("create", "delete", "get", "patch", "update")))),
    Resource("", "v1", "pods", "pod", "Pod", True, PodStrategy(), ("po",), ("all",),
             subresources=(_status("Pod"),
                           Subresource("binding", "Binding", ("create",)),
                           Subresource("eviction", "Eviction", ("create",), "policy", "v1"),
                           Subresource("log", "Pod", ("get",)),
                           Subresource("proxy", "PodProxyOptions", ("create", "delete", "get", "patch", "update")),
                           Subresource("replacement", "Pod", ("create",)))),
    Resource("", "v1", "services", "service", "Service", True, ServiceStrategy(), ("svc",), ("all",),
             subresources=(_status("Service"), Subresource("proxy", "ServiceProxyOptions",
                                                            ("create", "delete", "get", "patch", "update")))),
    Resource("", "v1", "endpoints", "endpoints", "Endpoints", True, EndpointsStrategy(), ("ep",)),
    Resource("", "v1", "events", "event", "Event", True, EventStrategy(), ("ev",)),
    Resource("", "v1", "configmaps", "configmap", "ConfigMap", True, ConfigMapStrategy(), ("cm",)),
    Resource("", "v1", "secrets", "secret", "Secret", True, SecretStrategy()),
    Resource("coordination.k8s.io", "v1", "leases", "lease", "Lease", True, LeaseStrategy()),
    Resource("apps", "v1", "deployments", "deployment", "Deployment", True, DeploymentStrategy(),
             ("deploy",), ("all",), subresources=(_status("Deployment"), _SCALE)),
    Resource("apps", "v1", "replicasets", "replicaset", "ReplicaSet", True, ReplicaSetStrategy(),
             ("rs",), ("all",), subresources=(_status("ReplicaSet"), _SCALE)),
    Resource("apps", "v1", "daemonsets", "daemonset", "DaemonSet", True, DaemonSetStrategy(),
             ("ds",), ("all",), subresources=(_status("DaemonSet"),)),
    Resource("apps", "v1", "controllerrevisions", "controllerrevision", "ControllerRevision", True,
             ControllerRevisionStrategy()),
    Resource("batch", "v1", "jobs", "job", "Job", True, JobStrategy(), (), ("all",),
             subresources=(_status("Job"),)),
    Resource("batch", "v1", "cronjobs", "cronjob", "CronJob", True, CronJobStrategy(), ("cj",), ("all",),
             subresources=(_status("CronJob"),)),
    Resource("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", True,
             PodDisruptionBudgetStrategy(), ("pdb",), subresources=(_status("PodDisruptionBudget"),)),
    Resource("discovery.k8s.io", "v1", "endpointslices", "endpointslice", "EndpointSlice", True,
             EndpointSliceStrategy()),
    Resource(GROUP, VERSION, "checkpoints", "checkpoint", "Checkpoint", True, CheckpointStrategy(),
             ("ckpt",), ("kube32",),
             subresources=(_status("Checkpoint"), Subresource("data", "Checkpoint", ("get", "update")))),
    Resource("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", True, ServiceAccountStrategy(),
             ("sa",), subresources=(Subresource("token", "TokenRequest", ("create",),
                                                "authentication.k8s.io", "v1"),)),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", False,
             ClusterRoleStrategy()),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding",
             "ClusterRoleBinding", False, ClusterRoleBindingStrategy()),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", True, RoleStrategy()),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", True,
             RoleBindingStrategy()),
    Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
             "CustomResourceDefinition", False, CustomResourceDefinitionStrategy(), ("crd", "crds"),
             ("api-extensions",), subresources=(_status("CustomResourceDefinition"),)),
    # A pod bound to a node (as pods/binding: kube32.apiserver.server), never stored.
    Resource("", "v1", "bindings", "binding", "Binding", True, ReviewStrategy(), verbs=("create",)),
    # Answered by the server (kube32.apiserver.authz), never stored: listed for discovery.
    Resource("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "", "SelfSubjectAccessReview",
             False, ReviewStrategy(), verbs=("create",)),
    Resource("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "", "SelfSubjectRulesReview",
             False, ReviewStrategy(), verbs=("create",)),
    Resource("authorization.k8s.io", "v1", "subjectaccessreviews", "", "SubjectAccessReview",
             False, ReviewStrategy(), verbs=("create",)),
    Resource("authorization.k8s.io", "v1", "localsubjectaccessreviews", "", "LocalSubjectAccessReview",
             True, ReviewStrategy(), verbs=("create",)),
    Resource("authentication.k8s.io", "v1", "tokenreviews", "", "TokenReview",
             False, ReviewStrategy(), verbs=("create",)),
    Resource("authentication.k8s.io", "v1", "selfsubjectreviews", "", "SelfSubjectReview",
             False, ReviewStrategy(), verbs=("create",)),
    # Kinds Kube32 does not run, readable (always empty) for clients that sweep every common
    # kind: kubectl apply --prune's default list, kubectl get all (strategies.simple.NotRunStrategy).
    *(Resource(group, "v1", plural, kind.lower(), kind, namespaced, NotRunStrategy(kind, why), short, categories,
               verbs=READ_ONLY_VERBS)
      for group, plural, kind, namespaced, short, categories, why in (
          ("", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), (), _NO_VOLUMES),
          ("", "persistentvolumes", "PersistentVolume", False, ("pv",), (), _NO_VOLUMES),
          ("", "replicationcontrollers", "ReplicationController", True, ("rc",), ("all",),
           "use a Deployment (apps/v1), which Kube32 runs"),
          ("apps", "statefulsets", "StatefulSet", True, ("sts",), ("all",),
           "a Kube32 pod keeps its state in its own memory, which moves with it (docs/moving-pods.md); "
           "use a Deployment"),
          ("networking.k8s.io", "ingresses", "Ingress", True, ("ing",), (),
           "reach pods through a Service (ClusterIP proxy or NodePort)"),
          ("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), ("all",),
           "nodes report no CPU or memory metrics; scale with kubectl scale"))),
)

GROUP_VERSIONS: dict[str, list[Resource]] = {}
for _r in RESOURCES:
    GROUP_VERSIONS.setdefault(_r.group_version, []).append(_r)

# Kubernetes subresources a Kube32 pod has no use for, refused with the reason rather than
# a bare 404 (kubectl exec, attach, cp, port-forward and debug reach these).
_NO_PROCESS = ("a Kube32 pod is a WebAssembly module, with no processes, shell or terminal to "
               "run commands in; read its output with kubectl logs")
NOT_HERE = {
    ("pods", "exec"): _NO_PROCESS,
    ("pods", "attach"): _NO_PROCESS,
    ("pods", "ephemeralcontainers"): _NO_PROCESS,
    ("pods", "portforward"): "a Kube32 pod has no network ports to forward; reach its HTTP handler "
                             "through the API server: kubectl get --raw "
                             "/api/v1/namespaces/<namespace>/pods/<name>/proxy/<path>, or kubectl proxy",
}


# Groups in discovery order; "policy" serves evictions as a subresource of pods too.
GROUPS: dict[str, str] = {}  # group -> preferred version
for _r in RESOURCES:
    if _r.group:
        GROUPS.setdefault(_r.group, _r.version)

_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_BY_KIND = {(r.group, r.kind): r for r in RESOURCES}


def lookup(group: str, version: str, plural: str) -> Resource | None:
    return _BY_PATH.get((group, version, plural))


def by_kind(group: str, kind: str) -> Resource | None:
    return _BY_KIND.get((group, kind))


def by_plural(plural: str) -> Resource:
    for r in RESOURCES:
        if r.plural == plural:
            return r
    raise KeyError(plural)
