"""The topic event bus: events between pods, users and nodes, across nodes.

Topics are namespace-scoped.  ``POST /apis/kube32.io/v1/namespaces/<ns>/topics/<topic>``
(body = the payload, at most :data:`MAX_PAYLOAD` bytes; optional ``?source=`` names
the publisher) fans the event out to every subscriber;
``GET /apis/kube32.io/v1/topicevents?watch=true`` is a subscription: a stream of
newline-delimited JSON ``{"seq", "namespace", "topic", "payload" (base64), "source"}``,
after a first line ``{"type": "SUBSCRIBED", "seq"}``.

Lines of the stream (each numbered by ``seq``, one counter for the bus):

* an event: ``{"seq", "namespace", "topic", "payload", "source"}``, plus ``"held":
  [pod names]`` when the bus holds it for pods of that namespace under a move: no
  node delivers it to a pod of those names now (see :class:`Hold`);
* a held event released: the same with ``"to": <pod uid>`` instead: only that pod
  gets it;
* ``{"seq", "type": "DROPPED", "namespace", "to", "count"}``: that many events held for
  the pod were dropped (its node records the pod's EventsDropped event).

Invariants:

* No history: an event reaches the subscribers connected when it is published,
  and nobody else.  Pods hold at most a few events themselves while frozen, and a pod
  under a move has them held here (:class:`Hold`) until it runs again.
* A slow subscriber never slows a publisher: each has a bounded queue, and events
  that do not fit are dropped for that subscriber and counted.
* ``seq`` grows by one per line, and every subscriber sees lines in ``seq`` order, so
  a node that has read line ``n`` has seen every event published before it.
* :meth:`EventBus.close` (the API server stopping) ends every subscription's stream
  and refuses new ones (503), so no subscriber holds the server up.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..terms import API_VERSION, GROUP_PATH
from . import errors
from .routing import query_flag

MAX_PAYLOAD = 64 << 10
QUEUE_LIMIT = 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}\Z")


END = b""  # queued to a subscription: its stream ends


@dataclass
class Hold:
    """The events for one pod under a move (spec: "Events for the pod are held, at most
    8, and later ones are dropped and counted"), from before its snapshot until it runs
    again: the replacement on the target, the pod back on its source, or the source
    thawed.  Keyed by the pod's name, so every incarnation of it is covered; nothing is
    delivered to a pod of that name meanwhile.

    ``room`` is what the snapshot leaves of the limit: the events the pod already held
    are in the snapshot, delivered by the restore (or the thaw) before these."""

    namespace: str
    pod: str
    pod_uid: str                 # the pod when the hold began: its own publishes are not for it
    topics: frozenset[str]
    limit: int
    checkpoint: str = ""         # the Checkpoint whose move this is
    checkpoint_uid: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    room: int = -1               # -1 until the snapshot's count is known: ``limit`` then
    dropped: int = 0

    def wants(self, namespace: str, topic: str, source: str) -> bool:
        return namespace == self.namespace and topic in self.topics and source != f"pod/{self.pod_uid}"

    def add(self, event: dict[str, Any]) -> None:
        if len(self.events) >= self._room():
            self.dropped += 1
        else:
            self.events.append(event)

    def in_snapshot(self, count: int) -> None:
        """The snapshot holds ``count`` events: these get what is left of the limit, the
        latest ones over it dropped."""
        self.room = max(0, self.limit - count)
        while len(self.events) > self.room:
            self.events.pop()
            self.dropped += 1

    def _room(self) -> int:
        return self.limit if self.room < 0 else self.room


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[bytes]] = set()
        self._holds: dict[tuple[str, str], Hold] = {}
        self.dropped = 0
        self.published = 0
        self.seq = 0  # the number of the latest line
        self.closed = False

    def publish(self, namespace: str, topic: str, payload: bytes, source: str = "") -> int:
        self.published += 1
        event = {"namespace": namespace, "topic": topic, "source": source,
                 "payload": base64.b64encode(payload).decode()}
        held = [h for h in self._holds.values() if h.wants(namespace, topic, source)]
        for h in held:
            h.add(event)
        return self._send({**event, "held": sorted(h.pod for h in held)} if held else event)

    def _send(self, line: dict[str, Any]) -> int:
        self.seq += 1
        data = json.dumps({"seq": self.seq, **line}).encode() + b"\n"
        reached = 0
        for q in list(self._subscribers):
            try:
                q.put_nowait(data)
                reached += 1
            except asyncio.QueueFull:
                self.dropped += 1
        return reached

    # --- holds for pods under a move ----------------------------------------------
    def hold(self, namespace: str, pod: str, pod_uid: str, topics: frozenset[str], limit: int,
             checkpoint: str = "", checkpoint_uid: str = "") -> Hold:
        """Hold the pod's events from the next line on.  A hold of it already there (a move
        tried again before the last one's hold ended) is released to ``pod_uid`` first:
        its lines come before the new hold, so they reach the pod before its snapshot."""
        key = (namespace, pod)
        if key in self._holds:
            self.release(self._holds[key], pod_uid)
        hold = self._holds[key] = Hold(namespace, pod, pod_uid, topics, limit, checkpoint, checkpoint_uid)
        return hold

    def holding(self, hold: Hold) -> bool:
        return self._holds.get((hold.namespace, hold.pod)) is hold

    def release(self, hold: Hold, uid: str) -> None:
        """The held events go to the pod ``uid``, in order, and then the count of those
        dropped; later events reach it as any.  Nothing is published in between: this
        runs in one turn of the event loop."""
        if not self.holding(hold):
            return
        del self._holds[(hold.namespace, hold.pod)]
        for event in hold.events:
            self._send({**event, "to": uid})
        if hold.dropped:
            self._send({"type": "DROPPED", "namespace": hold.namespace, "to": uid, "count": hold.dropped})

    def discard(self, hold: Hold) -> None:
        """The pod is gone: its held events go with it."""
        if self.holding(hold):
            del self._holds[(hold.namespace, hold.pod)]

    # --- subscriptions --------------------------------------------------------------
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
        received = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            received += chunk
            if len(received) > MAX_PAYLOAD:
                raise errors.APIError(413, "RequestEntityTooLarge",
                                      f"an event payload may be at most {MAX_PAYLOAD} bytes")
        payload = bytes(received)
        reached = bus.publish(ns, topic, payload, request.query.get("source", ""))
        body = {"kind": "TopicEvent", "apiVersion": API_VERSION, "namespace": ns, "topic": topic,
                "size": len(payload), "subscribers": reached}
        return web.Response(body=json.dumps(body).encode(), status=201, content_type="application/json")

    async def subscribe(request: web.Request) -> web.StreamResponse:
        if not query_flag(request.query, "watch"):
            # Served only as what it is authorised as: a watch (a list would be authorised
            # as "list" and answered with the stream).
            raise errors.bad_request("topicevents is a stream of events: subscribe with ?watch=true")
        if bus.closed:
            raise errors.service_unavailable("the API server is stopping", retry_after=1)
        q = bus.subscribe()
        # The first line tells the subscriber it is connected (nothing published before
        # it can reach it, so clients wait for this before relying on it) and the number
        # of the latest line: the next one it reads is numbered after it.
        first = json.dumps({"type": "SUBSCRIBED", "seq": bus.seq}).encode() + b"\n"
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            await resp.write(first)
            while (line := await q.get()) != END:
                await resp.write(line)
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            bus.unsubscribe(q)
        return resp

    router.add_post(GROUP_PATH + "/namespaces/{ns}/topics/{topic:.+}", publish)
    router.add_get(GROUP_PATH + "/topicevents", subscribe)
