"""kube32.client: how controllers, kubelets and the CLI talk to the API server.

Everything goes over the Kubernetes REST API (so every write passes the same
validation, status rules and watch as kubectl's), with:

* :class:`Client`: async get/list/create/update/patch/delete/watch and raw
  requests (streaming bodies) over one pooled aiohttp session;
* :class:`Informer`: a list+watch cache of one kind that calls handlers and
  re-lists after a 410; :class:`MutationCache` shows it with a controller's own
  writes that the watch has not delivered yet;
* :class:`WorkQueue`: keys to sync, deduplicated, never one key twice at once,
  retried with back-off (client-go's workqueue);
* :class:`EventRecorder`: Kubernetes Events with counts.
"""
from .kinds import (CHECKPOINTS, CONFIGMAPS, CONTROLLERREVISIONS, CRONJOBS, DAEMONSETS, DEPLOYMENTS,
                    ENDPOINTS, ENDPOINTSLICES, EVENTS, JOBS, LEASES, NAMESPACES, NODES, PDBS, PODS,
                    REPLICASETS, ROLEBINDINGS, ROLES, SECRETS, SERVICEACCOUNTS, SERVICES, Kind)
from .rest import ApiError, Client
from .informer import Informer, MutationCache
from .workqueue import WorkQueue
from .events import EventRecorder

__all__ = ["Kind", "Client", "ApiError", "Informer", "MutationCache", "WorkQueue", "EventRecorder",
           "CHECKPOINTS", "CONFIGMAPS", "CONTROLLERREVISIONS", "CRONJOBS", "DAEMONSETS", "DEPLOYMENTS",
           "ENDPOINTS", "ENDPOINTSLICES", "EVENTS", "JOBS", "LEASES", "NAMESPACES", "NODES", "PDBS", "PODS",
           "REPLICASETS", "ROLEBINDINGS", "ROLES", "SECRETS", "SERVICEACCOUNTS", "SERVICES"]
