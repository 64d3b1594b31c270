"""Where each kind lives in the REST API (the client's view; no server imports)."""
from __future__ import annotations

from dataclasses import dataclass

from ..terms import GROUP, VERSION
from ..urlpath import api_path


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The encoded path of the collection, an object or its subresource: every name
        one segment (:func:`kube32.urlpath.api_path`; PathRefused for one that is not)."""
        segments = ["apis", self.group, self.version] if self.group else ["api", self.version]
        if self.namespaced and namespace:
            segments += ["namespaces", namespace]
        segments.append(self.plural)
        if name:
            segments.append(name)
            if subresource:
                segments.append(subresource)
        return api_path(*segments)


NAMESPACES = Kind("", "v1", "namespaces", "Namespace", False)
NODES = Kind("", "v1", "nodes", "Node", False)
PODS = Kind("", "v1", "pods", "Pod", True)
SERVICES = Kind("", "v1", "services", "Service", True)
ENDPOINTS = Kind("", "v1", "endpoints", "Endpoints", True)
EVENTS = Kind("", "v1", "events", "Event", True)
CONFIGMAPS = Kind("", "v1", "configmaps", "ConfigMap", True)
SECRETS = Kind("", "v1", "secrets", "Secret", True)
LEASES = Kind("coordination.k8s.io", "v1", "leases", "Lease", True)
DEPLOYMENTS = Kind("apps", "v1", "deployments", "Deployment", True)
REPLICASETS = Kind("apps", "v1", "replicasets", "ReplicaSet", True)
DAEMONSETS = Kind("apps", "v1", "daemonsets", "DaemonSet", True)
PDBS = Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
ENDPOINTSLICES = Kind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True)
CONTROLLERREVISIONS = Kind("apps", "v1", "controllerrevisions", "ControllerRevision", True)
JOBS = Kind("batch", "v1", "jobs", "Job", True)
CRONJOBS = Kind("batch", "v1", "cronjobs", "CronJob", True)
CHECKPOINTS = Kind(GROUP, VERSION, "checkpoints", "Checkpoint", True)
SERVICEACCOUNTS = Kind("", "v1", "serviceaccounts", "ServiceAccount", True)
ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", True)
ROLEBINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True)
CLUSTERROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
CLUSTERROLEBINDINGS = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False)
CUSTOMRESOURCEDEFINITIONS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                                 "CustomResourceDefinition", False)

# Every kind the API server stores (the namespace controller empties a namespace of each
# namespaced one: a kind missing here would outlive its namespace and come back with a
# namespace of the same name - tests/unit/test_kinds.py keeps the two lists equal).
ALL = (NAMESPACES, NODES, PODS, SERVICES, ENDPOINTS, EVENTS, CONFIGMAPS, SECRETS, LEASES,
       DEPLOYMENTS, REPLICASETS, DAEMONSETS, PDBS, ENDPOINTSLICES, CHECKPOINTS, SERVICEACCOUNTS,
       ROLES, ROLEBINDINGS, CLUSTERROLES, CLUSTERROLEBINDINGS, CONTROLLERREVISIONS, JOBS, CRONJOBS,
       CUSTOMRESOURCEDEFINITIONS)


def by_api_kind(api_version: str, kind: str) -> Kind | None:
    for k in ALL:
        if k.api_version == api_version and k.kind == kind:
            return k
    return None
