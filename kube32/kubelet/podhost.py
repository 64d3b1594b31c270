"""One pod instance's HostServices (kube32.wasm): its logs, its publishes, the node's channels.

Every instance the node makes (:meth:`~.nodeapi.NodeServices.new_instance`) gets a
:class:`PodHost` of its own, so a call from the pod's thread finds its pod without a
lookup.  An instance may exist before the worker that runs it (a move's prefetch makes it
before the replacement pod arrives): its host is unowned until the worker
:meth:`~PodHost.attach` es itself, and :meth:`~PodHost.detach` es when it lets the instance
go.  An unowned host drops what the pod logs and publishes with no source (the API
server's topic bus then delivers the event to every pod that hears its topic).

Invariants: ``log`` and ``publish`` run on the pod's threads, ``attach``/``detach`` on the
event loop; the owner is swapped in one assignment, so a pod thread sees the old owner or
the new one, never half of either.
"""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

from ..wasm import ChannelRegistry, Pod

# (namespace, topic, payload, source): the node's publish, safe to call from any thread.
Publish = Callable[[str, str, bytes, str], None]


class _Owner(NamedTuple):
    source: str                     # "pod/<uid>": the publisher, never sent its own event
    log: Callable[[str], None]      # a line the pod logged (thread-safe)


class PodHost:
    def __init__(self, channels: ChannelRegistry, publish: Publish) -> None:
        self.channels = channels
        self._publish = publish
        self._owner: _Owner | None = None

    def attach(self, source: str, log: Callable[[str], None]) -> None:
        """The instance runs for the worker that ``source`` names; its lines go to ``log``."""
        self._owner = _Owner(source, log)

    def detach(self) -> None:
        self._owner = None

    # --- HostServices (called on the pod's threads) ---------------------------------
    def log(self, pod: Any, line: str) -> None:
        owner = self._owner
        if owner is not None:
            owner.log(line)

    def publish(self, pod: Any, topic: str, payload: bytes) -> None:
        owner = self._owner
        self._publish(pod.config.namespace, topic, payload, owner.source if owner is not None else "")

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)


def host_of(instance: Pod) -> PodHost:
    """The host of an instance the node made (:meth:`~.nodeapi.NodeServices.new_instance`)."""
    host = instance.host
    if not isinstance(host, PodHost):
        raise TypeError(f"pod {instance.key} was not made by its node (its host is a {type(host).__name__})")
    return host
