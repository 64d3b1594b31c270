"""Held requests reach their pod in the order the API server sends them (issue 24).

The API server's hold queue hands a pod several held requests at once (up to its window,
:data:`kube32.apiserver.hold.WINDOW`), each on a connection of its own; how fast each
connection is made, and each request read, decides which reaches the pod first, so a
window sent in arrival order came in shuffled (seen: ``1, 9, 10, 7, 8, 11, ..., 2``).
So the API server numbers the held requests it sends to one pod (header
:data:`~kube32.holding.ORDER`: ``<stream>:<n>``, a stream per queue and pod, n from 0 up)
and the kubelet queues request *n* into its pod only after *n - 1* of that stream got
there (was queued into the pod, or refused, or failed), or after
:data:`~kube32.timing.HOLD_ORDER_WAIT` s (a request lost on its way: its client went
away, a connection failed).  A request without the header (every request no hold
sent) passes at once: no hold, no wait.

Bounds: a value of at most :data:`MAX_VALUE` characters (else it is ignored, as is any
that does not parse); at most :data:`MAX_STREAMS` streams kept (the least recently used
goes; one of its late requests then waits at most the bound).  The API server drops the
header from what clients send (kube32.apiserver.proxy), so only it numbers requests.

Imports nothing of Kube32 but the header name and the timing.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import AsyncIterator

from ..holding import parse_order
from ..timing import HOLD_ORDER_WAIT

MAX_STREAMS = 256


class _Stream:
    def __init__(self) -> None:
        self.next = 0                       # the number whose turn it is
        self.moved = asyncio.Condition()    # a number passed


class OrderGate:
    """The numbered streams of held requests one kubelet is sent."""

    def __init__(self, wait: float = HOLD_ORDER_WAIT, kept: int = MAX_STREAMS) -> None:
        self.wait = wait
        self.kept = kept
        self.streams: collections.OrderedDict[tuple[str, str, str], _Stream] = collections.OrderedDict()

    def _stream(self, key: tuple[str, str, str]) -> _Stream:
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = _Stream()
            while len(self.streams) > self.kept:
                self.streams.popitem(last=False)
        else:
            self.streams.move_to_end(key)
        return stream

    @contextlib.asynccontextmanager
    async def turn(self, namespace: str, pod: str, value: str | None) -> AsyncIterator[None]:
        """Wait until the request numbered by ``value`` (the :data:`~kube32.holding.ORDER`
        header, or None) may go into ``pod``; its leaving lets the next one go."""
        order = parse_order(value)
        if order is None:
            yield
            return
        token, n = order
        stream = self._stream((namespace, pod, token))
        deadline = time.monotonic() + self.wait
        async with stream.moved:
            while stream.next < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break   # the one before is lost on its way: no longer wait for it
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stream.moved.wait(), left)
        try:
            yield
        finally:
            async with stream.moved:
                stream.next = max(stream.next, n + 1)
                stream.moved.notify_all()
