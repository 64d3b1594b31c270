"""The node with its pods: what the kubelet's endpoint (kube32.kubelet.server and
kube32.kubelet.migration) and a stopping worker's drain (kube32.kubelet.drain) use of it.

:class:`NodeAgent` is :class:`~.nodeapi.NodeServices` and the node's pods - their workers
by UID and by name, what moved away, the free heap, the topic stream - as the
:class:`~.kubelet.Kubelet` keeps them.  The handlers and the drain take it, never the
Kubelet itself (kubelet.py imports them; tests/unit/test_kubelet_imports.py keeps the
package free of import circles).
"""
from __future__ import annotations

from typing import Any, Protocol

from .nodeapi import NodeServices
from .pods import PodWorker


class NodeAgent(NodeServices, Protocol):
    workers: dict[str, PodWorker]   # uid -> worker: the node's pods

    def bound_pods(self) -> list[dict[str, Any]]:
        """The pods bound to this node, as its informer has them."""

    def worker_by_name(self, ns: str, name: str) -> PodWorker | None:
        """The worker of this pod name (a live one before one stopping)."""

    def moved_away_lately(self, ns: str, name: str) -> bool:
        """The pod left this node frozen lately: a move replaced it elsewhere."""

    def free_heap(self) -> int: ...

    @property
    def reported_free_heap(self) -> int | None:
        """The free heap the Node's status said last."""

    def count_dropped(self, worker: PodWorker, count: int) -> None:
        """``count`` events for the pod were dropped: its EventsDropped Warning says so."""

    async def topics_read(self, seq: int, timeout: float) -> bool:
        """Wait until topic line ``seq`` has been read here; False after ``timeout`` s."""

    async def publish_async(self, ns: str, topic: str, payload: bytes, source: str = "") -> None: ...
