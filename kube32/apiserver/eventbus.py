"""The topic event bus: events between pods, users and nodes, across nodes.

Topics are namespace-scoped.  ``POST /apis/kube32.io/v1/namespaces/<ns>/topics/<topic>``
(body = the payload, at most :data:`MAX_PAYLOAD` bytes; optional ``?source=`` names
the publisher) fans the event out to every subscriber;
``GET /apis/kube32.io/v1/topicevents?watch=true`` is a subscription: a stream of
newline-delimited JSON ``{"namespace", "topic", "payload" (base64), "source"}``.

Invariants:

* No history: an event reaches the subscribers connected when it is published,
  and nobody else (pods hold at most a few events themselves while frozen).
* A slow subscriber never slows a publisher: each has a bounded queue, and events
  that do not fit are dropped for that subscriber and counted.
* :meth:`EventBus.close` (the API server stopping) ends every subscription's stream
  and refuses new ones (503), so no subscriber holds the server up.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import Awaitable, Callable

from aiohttp import web

from . import errors

MAX_PAYLOAD = 64 << 10
QUEUE_LIMIT = 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$")


END = b""  # queued to a subscription: its stream ends


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[bytes]] = set()
        self.dropped = 0
        self.published = 0
        self.closed = False

    def publish(self, namespace: str, topic: str, payload: bytes, source: str = "") -> int:
        line = json.dumps({"namespace": namespace, "topic": topic, "source": source,
                           "payload": base64.b64encode(payload).decode()}).encode() + b"\n"
        self.published += 1
        reached = 0
        for q in list(self._subscribers):
            try:
                q.put_nowait(line)
                reached += 1
            except asyncio.QueueFull:
                self.dropped += 1
        return reached

    def subscribe(self) -> asyncio.Queue[bytes]:
        q: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_LIMIT)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[bytes]) -> None:
        self._subscribers.discard(q)

    def close(self) -> None:
        """End every subscription (its stream ends after the events queued before)."""
        self.closed = True
        for q in list(self._subscribers):
            if q.full():
                q.get_nowait()  # a subscriber this far behind loses one more event, not the end
            q.put_nowait(END)


def add_routes(router: web.UrlDispatcher, bus: EventBus,
               namespace_open: Callable[[str], Awaitable[None]] | None = None) -> None:
    """Register before the generic ``/apis/{group}/{version}/...`` route.  ``namespace_open``
    refuses a namespace that does not exist (404) or is being deleted (403), as a create
    in it would be: a typo in ``-n`` is said, not published to nobody."""

    async def publish(request: web.Request) -> web.Response:
        ns, topic = request.match_info["ns"], request.match_info["topic"]
        if not _NAME.match(topic):
            raise errors.bad_request(f'invalid topic name "{topic}": letters, digits and ._:/- only')
        if namespace_open is not None:
            await namespace_open(ns)
        # The whole body, however it arrives (content.read(n) may return a first piece only).
        payload = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            payload += chunk
            if len(payload) > MAX_PAYLOAD:
                raise errors.APIError(413, "RequestEntityTooLarge",
                                      f"an event payload may be at most {MAX_PAYLOAD} bytes")
        payload = bytes(payload)
        reached = bus.publish(ns, topic, payload, request.query.get("source", ""))
        body = {"kind": "TopicEvent", "apiVersion": "kube32.io/v1", "namespace": ns, "topic": topic,
                "size": len(payload), "subscribers": reached}
        return web.Response(body=json.dumps(body).encode(), status=201, content_type="application/json")

    async def subscribe(request: web.Request) -> web.StreamResponse:
        if bus.closed:
            raise errors.service_unavailable("the API server is stopping", retry_after=1)
        q = bus.subscribe()
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            # A first line tells the subscriber it is connected (nothing published
            # before it can reach it, so clients wait for this before relying on it).
            await resp.write(b'{"type":"SUBSCRIBED"}\n')
            while (line := await q.get()) != END:
                await resp.write(line)
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            bus.unsubscribe(q)
        return resp

    router.add_post("/apis/kube32.io/v1/namespaces/{ns}/topics/{topic:.+}", publish)
    router.add_get("/apis/kube32.io/v1/topicevents", subscribe)
