"""HTTP serving limits against slow clients, shared by every Kube32 server (the API
server, the kubelet's endpoint, NodePort listeners).

aiohttp waits for a request's headers and body as long as the client likes, so 200
half-sent requests held 200 connections (and their handlers, buffers and, for
checkpoint data, reserved space) forever.  Here each connection is watched, with
kube-apiserver's numbers:

* ``HEADER_TIMEOUT`` (32 s, its ``ReadHeaderTimeout``): a request's headers must be
  complete this long after the connection opened or the request's first byte came.
* ``IDLE_TIMEOUT`` (90 s, its ``IdleTimeout``): a keep-alive connection with no
  request is closed after this long.
* ``BODY_STALL_TIMEOUT`` (32 s): while a handler waits for a request body, some of it
  must keep coming: no byte for this long (the server itself not pausing the reads)
  ends the request.  It holds for every body, streamed ones too (a 16 MiB checkpoint
  upload at any real speed never pauses that long).
* ``BODY_TIMEOUT`` (60 s, its default ``--request-timeout``): an object body, at most
  3 MiB, is read whole within this long (``kube32.apiserver.bodies.read_raw``).

A server that forwards requests for anyone on the network (a node's NodePorts, which
hold a forwarding slot per request: kube32.kubelet.nodeports) uses
:data:`FORWARDER_LIMITS`: headers within ``FORWARD_HEADER_TIMEOUT`` (10 s) and no pause
in a body longer than ``FORWARD_BODY_STALL_TIMEOUT`` (10 s); a real client's request
does not pause that long, and a stalled one costs a connection for less time.

A client that misses a deadline mid-request gets ``408 Request Timeout`` (a Kubernetes
Status saying which deadline) and the connection is closed; an idle one, or one that
never sent a byte, is closed without a word, as Go's server does.  A refused
connection whose peer reads nothing is dropped ``ABORT_AFTER`` later.  The handler of a request cut off sees its client
gone (its body read raises, the task is cancelled), as with any disconnect.

A server that stops (SIGTERM) lets the requests in progress finish for
``SHUTDOWN_GRACE_SECONDS`` (3 s), then cancels them.  aiohttp's default waits 60 s for
each connection, and a long-lived stream (a topic subscription, a followed log, a
proxied stream) never finishes by itself: a control plane with workers connected did
not stop on SIGTERM.

Design: :class:`GuardedRunner` is an ``aiohttp.web.AppRunner`` whose sites wrap each
connection's aiohttp protocol in a :class:`_Connection`, which forwards every
callback and keeps one timer; :func:`track_requests` (the outermost middleware) tells
it when a request's headers are in (a handler runs) and when its response is done.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

HEADER_TIMEOUT = 32.0
IDLE_TIMEOUT = 90.0
BODY_STALL_TIMEOUT = 32.0
BODY_TIMEOUT = 60.0
ABORT_AFTER = 2.0     # s: a refused connection whose peer reads nothing is dropped this late
SHUTDOWN_GRACE_SECONDS = 3.0  # s: a stopping server cancels the requests still running this late


FORWARD_HEADER_TIMEOUT = 10.0
FORWARD_BODY_STALL_TIMEOUT = 10.0


@dataclass(frozen=True)
class ServingLimits:
    header: float = HEADER_TIMEOUT
    idle: float = IDLE_TIMEOUT
    body_stall: float = BODY_STALL_TIMEOUT


FORWARDER_LIMITS = ServingLimits(header=FORWARD_HEADER_TIMEOUT, body_stall=FORWARD_BODY_STALL_TIMEOUT)


def timeout_body(message: str) -> bytes:
    """The Status of a ``408 Request Timeout`` saying which deadline was missed."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": "Timeout", "code": 408}).encode()


def timeout_response(message: str) -> bytes:
    """A whole ``408 Request Timeout`` HTTP/1.1 response, closing the connection."""
    body = timeout_body(message)
    head = (f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class _Connection(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the deadlines around it."""

    def __init__(self, inner: Any, limits: ServingLimits) -> None:
        self._inner = inner
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = 0                        # requests whose handler runs
        self._body: Any = None                # the running request's body stream, while it is unread
        self._body_seen = 0
        self._body_since = 0.0
        self._headers_due: float | None = None  # set while a request's headers are awaited
        self._partial = False                 # some of those headers came

    # --- asyncio.Protocol, forwarded ------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._inner.connection_made(transport)
        self._expect_headers()

    def data_received(self, data: bytes) -> None:
        if not self._busy:
            if self._headers_due is None:
                self._expect_headers()        # the first byte of the next request
            self._partial = True
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # --- requests (from track_requests) -----------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        self._busy += 1
        self._headers_due = None
        self._cancel()
        if request.body_exists and not request.content.is_eof():
            self._body = request.content
            self._body_seen, self._body_since = self._body.total_bytes, self._loop.time()
            self._schedule(self._limits.body_stall / 4, self._check_body)

    def request_finished(self) -> None:
        self._busy -= 1
        self._body = None
        if not self._busy and self._transport is not None:
            self._cancel()
            self._schedule(self._limits.idle, self._idle_expired)

    # --- deadlines ----------------------------------------------------------------
    def _expect_headers(self) -> None:
        self._cancel()
        self._partial = False
        self._headers_due = self._loop.time() + self._limits.header
        self._schedule(self._limits.header, self._headers_expired)

    def _schedule(self, delay: float, callback: Callable[[], None]) -> None:
        self._timer = self._loop.call_later(delay, callback)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_expired(self) -> None:
        self._timer = None
        if self._busy or self._transport is None:
            return
        if self._partial:
            self._refuse(f"the request headers did not arrive whole within {self._limits.header:g}s")
        else:
            self._transport.close()           # nothing was asked: closed without a word

    def _idle_expired(self) -> None:
        self._timer = None
        if not self._busy and self._headers_due is None and self._transport is not None:
            self._transport.close()

    def _check_body(self) -> None:
        self._timer = None
        body = self._body
        if body is None or body.is_eof() or self._transport is None:
            return
        now = self._loop.time()
        if body.total_bytes != self._body_seen or not self._transport.is_reading():
            # Progress, or the server paused reading (its buffer is full): not the client's stall.
            self._body_seen, self._body_since = body.total_bytes, now
        elif now - self._body_since >= self._limits.body_stall:
            self._refuse(f"the request body stopped coming: no byte for {self._limits.body_stall:g}s "
                         f"({body.total_bytes} bytes came)")
            return
        self._schedule(self._limits.body_stall / 4, self._check_body)

    def _refuse(self, message: str) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(timeout_response(message))
        transport.close()
        self._loop.call_later(ABORT_AFTER, transport.abort)   # a peer that reads nothing


class GuardedRunner(web.AppRunner):
    """An AppRunner whose sites watch every connection with ``limits``; the app must
    have :func:`track_requests` as its first middleware."""

    def __init__(self, app: web.Application, *, limits: ServingLimits = ServingLimits(),
                 **kwargs: Any) -> None:
        kwargs.setdefault("shutdown_timeout", SHUTDOWN_GRACE_SECONDS)
        super().__init__(app, **kwargs)
        self._limits = limits

    @property
    def server(self) -> Any:
        inner = super().server
        if inner is None:
            return None
        limits = self._limits
        return lambda: _Connection(inner(), limits)


@web.middleware
async def track_requests(request: web.Request, handler: Any) -> web.StreamResponse:
    """Tells the request's connection when its handler runs (headers in) and ends."""
    transport = request.transport
    conn = transport.get_protocol() if transport is not None else None
    if not isinstance(conn, _Connection):
        return await handler(request)
    conn.request_started(request)
    try:
        return await handler(request)
    finally:
        conn.request_finished()
