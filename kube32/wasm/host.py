"""What the kubelet provides to its pods: the HostServices protocol and the
node-local channel registry.

Channels are named message queues between the pods of one node.  A channel is
scoped by namespace: pods of different namespaces never share one.  Every
``kube32_channel_open`` gives the pod its own endpoint with its own inbox; a send
reaches every *other* endpoint open on the same name (a broadcast, so two chat
pods on "chat" hear each other and not themselves).  Messages in an inbox are not
part of a snapshot: after a move the pod's handle is reopened by name with an empty
inbox.  Bounds: ``MAX_INBOX`` messages per inbox (later sends to a full inbox are
dropped for that receiver and counted on the endpoint).
"""
from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any, Protocol, runtime_checkable

from .abi import MAX_INBOX


class Endpoint:
    """One pod's end of a named channel.  Thread-safe."""

    def __init__(self, registry: "ChannelRegistry", scope: str, name: str) -> None:
        self.registry = registry
        self.scope = scope
        self.name = name
        self.dropped = 0
        self._inbox: deque[bytes] = deque()
        self._lock = threading.Lock()
        self.closed = False

    def send(self, message: bytes) -> int:
        """Deliver to every other endpoint on the channel; the number reached."""
        return self.registry._broadcast(self, bytes(message))

    def _push(self, message: bytes) -> bool:
        with self._lock:
            if len(self._inbox) >= self.registry.max_inbox:
                self.dropped += 1
                return False
            self._inbox.append(message)
            return True

    def next_length(self) -> int | None:
        with self._lock:
            return len(self._inbox[0]) if self._inbox else None

    def receive(self) -> bytes | None:
        with self._lock:
            return self._inbox.popleft() if self._inbox else None

    def pending(self) -> int:
        with self._lock:
            return len(self._inbox)

    def close(self) -> None:
        self.registry.close(self)


class ChannelRegistry:
    """The kubelet's registry of node-local channels; one per node."""

    def __init__(self, max_inbox: int = MAX_INBOX) -> None:
        self.max_inbox = max_inbox
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, str], list[Endpoint]] = {}

    def open(self, scope: str, name: str) -> Endpoint:
        endpoint = Endpoint(self, scope, name)
        with self._lock:
            self._channels.setdefault((scope, name), []).append(endpoint)
        return endpoint

    def close(self, endpoint: Endpoint) -> None:
        with self._lock:
            members = self._channels.get((endpoint.scope, endpoint.name), [])
            if endpoint in members:
                members.remove(endpoint)
            if not members:
                self._channels.pop((endpoint.scope, endpoint.name), None)
            endpoint.closed = True

    def _broadcast(self, sender: Endpoint, message: bytes) -> int:
        with self._lock:
            others = [e for e in self._channels.get((sender.scope, sender.name), []) if e is not sender]
        return sum(1 for e in others if e._push(message))

    def channels(self) -> dict[str, int]:
        """"<scope>/<name>" -> number of open endpoints (for status and tests)."""
        with self._lock:
            return {f"{s}/{n}": len(m) for (s, n), m in self._channels.items()}


@runtime_checkable
class HostServices(Protocol):
    """Implemented by the kubelet.  Called on the pod's own thread, inside a Wasm
    call: implementations must be quick and must not call back into the pod.  ``pod`` is
    the calling :class:`kube32.wasm.Pod` (``Any`` here: this module lies below it)."""

    channels: ChannelRegistry

    def log(self, pod: Any, line: str) -> None: ...

    def publish(self, pod: Any, topic: str, payload: bytes) -> None: ...

    def random_bytes(self, n: int) -> bytes: ...


def random_bytes(host: object, n: int) -> bytes:
    """host.random_bytes when the host has it, else os.urandom."""
    fn = getattr(host, "random_bytes", None)
    return fn(n) if fn is not None else os.urandom(n)
