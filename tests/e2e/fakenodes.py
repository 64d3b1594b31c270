"""Fake nodes for control-loop tests: Node objects and Lease renewals from the test itself.

A :class:`FakeNodes` registers Nodes through the kubernetes Python client and, on a
background thread, does the part of a kubelet the control loops depend on: renew
each node's Lease in ``kube-node-lease``, mark its pods Running and Ready, and
finish graceful deletions (delete with grace 0 a pod that has a deletionTimestamp).
A node can be "killed" (no more renewals, pods left as they are) and revived.

A Node's status is written as a kubelet writes it (:func:`write_node_status`): read, change,
PUT guarded by the read's resourceVersion, and on 409 (a controller - node lifecycle, the
taint manager - wrote the Node meanwhile) read again and retry, never give up at once.
"""
from __future__ import annotations

import datetime as dt
import threading
from typing import Any, Callable

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(name: str, memory: str = "1Mi", pods: int = 20, labels: dict | None = None,
              extra: dict | None = None) -> dict[str, Any]:
    alloc = {"memory": memory, "pods": str(pods), **(extra or {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"capacity": alloc, "allocatable": alloc, "conditions": [ready_condition()]}}


STATUS_ATTEMPTS = 10   # a 409 each time means something writes the Node in a loop: fail loudly


def ready_condition() -> dict[str, Any]:
    return {"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}


def set_condition(status: dict[str, Any], condition: dict[str, Any]) -> None:
    """``condition`` in ``status``, in place of one of its type."""
    others = [c for c in status.get("conditions") or [] if c.get("type") != condition["type"]]
    status["conditions"] = [*others, condition]


def write_node_status(core: k8s.CoreV1Api, name: str, change: Callable[[dict[str, Any]], bool]) -> None:
    """Change Node ``name``'s status as a kubelet does: ``change(node)`` edits the Node read
    (a dict) and says whether there is anything to write; the PUT carries the read's
    resourceVersion, and a 409 reads the Node again and retries (:data:`STATUS_ATTEMPTS`)."""
    for _ in range(STATUS_ATTEMPTS):
        node = core.api_client.sanitize_for_serialization(core.read_node(name))
        node.setdefault("status", {})
        if not change(node):
            return
        try:
            core.replace_node_status(name, node)
            return
        except ApiException as e:
            if e.status != 409:
                raise
    raise AssertionError(f"node {name}'s status: {STATUS_ATTEMPTS} writes in a row met 409 (Conflict)")


def post_ready(core: k8s.CoreV1Api, name: str) -> None:
    """Node ``name`` reports Ready (nothing written when it does already)."""
    def change(node: dict[str, Any]) -> bool:
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in node["status"].get("conditions") or []):
            return False
        set_condition(node["status"], ready_condition())
        return True
    write_node_status(core, name, change)


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
        post_ready(self.core, name)

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
