"""Fake nodes for control-loop tests: Node objects and Lease renewals from the test itself.

A :class:`FakeNodes` registers Nodes through the kubernetes Python client and, on a
background thread, does the part of a kubelet the control loops depend on: renew
each node's Lease in ``kube-node-lease``, mark its pods Running and Ready, and
finish graceful deletions (delete with grace 0 a pod that has a deletionTimestamp).
A node can be "killed" (no more renewals, pods left as they are) and revived.
"""
from __future__ import annotations

import datetime as dt
import threading
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(name: str, memory: str = "1Mi", pods: int = 20, labels: dict | None = None,
              extra: dict | None = None) -> dict[str, Any]:
    alloc = {"memory": memory, "pods": str(pods), **(extra or {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}}


class FakeNodes:
    def __init__(self, api: k8s.ApiClient, period: float = 0.2) -> None:
        self.core = k8s.CoreV1Api(api)
        self.coord = k8s.CoordinationV1Api(api)
        self.period = period
        self.alive: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[str] = []

    def add(self, name: str, **kw: Any) -> None:
        self.core.create_node(node_body(name, **kw))
        self.alive[name] = True

    def kill(self, name: str) -> None:
        self.alive[name] = False

    def revive(self, name: str) -> None:
        self.alive[name] = True
        self._post_ready(name)

    def __enter__(self) -> "FakeNodes":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    # --- the kubelet's part -----------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            for name, alive in list(self.alive.items()):
                if not alive:
                    continue
                try:
                    self._renew(name)
                    self._tend_pods(name)
                except Exception as e:  # noqa: BLE001 - reported by the tests that care
                    self.errors.append(f"{name}: {e}")

    def _renew(self, name: str) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _now()}}
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": body["spec"]})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def _post_ready(self, name: str) -> None:
        node = self.core.read_node(name)
        if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
            return
        cond = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": _now(),
                "lastTransitionTime": _now()}
        self.core.patch_node_status(name, {"status": {"conditions": [cond]}})

    def _tend_pods(self, name: str) -> None:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
        for pod in pods:
            md = pod.metadata
            try:
                if md.deletion_timestamp is not None:
                    self.core.delete_namespaced_pod(md.name, md.namespace, grace_period_seconds=0,
                                                    body=k8s.V1DeleteOptions(grace_period_seconds=0,
                                                                             preconditions={"uid": md.uid}))
                elif pod.status.phase != "Running":
                    self.core.patch_namespaced_pod_status(md.name, md.namespace, {"status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"},
                                       {"type": "ContainersReady", "status": "True"}]}})
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
