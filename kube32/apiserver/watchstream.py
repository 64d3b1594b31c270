"""A watch's stream as the API server sends it: each event encoded once for every
watcher, a bounded queue per watcher, and bookmarks.

Design: one :class:`WatchEncoder` per server keeps the encoded line of each recent event
(keyed by type, resource, object, revision, and whether the object is the previous
content): a write seen by many watchers is encoded once, not once per watcher, and every
watcher's stream shares those bytes.  A :class:`WatchFeed` runs a watch's events into
its own queue in a task of its own, and the handler writes from the queue: a watcher
that does not read fills its queue, not the server's memory or the event loop.

Invariants:

* A watcher's queue holds at most ``QUEUE_BYTES`` bytes and ``QUEUE_EVENTS`` events of
  live events (one event bigger than that is let in alone).  A watcher that falls that
  far behind is dropped: its stream ends, as kube-apiserver closes an unresponsive
  watcher; the client watches again from the last revision it saw, or lists again.
  The initial events of a watch are not dropped: the feed waits for room instead.
* With ``allowWatchBookmarks``, a BOOKMARK (an object of only ``kind``, ``apiVersion`` and
  ``metadata.resourceVersion``) comes every ``BOOKMARK_INTERVAL`` seconds and just before
  the watch's timeout; its revision is the newest the watch has been through (every
  event up to it that the watch selects has been sent), never one the client has not
  been given all events of.
* With ``sendInitialEvents``, the initial ADDED events are followed by a BOOKMARK
  annotated ``k8s.io/initial-events-end: "true"`` at the revision they were read at
  (client-go's WatchList waits for it).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict, deque
from typing import Any, AsyncGenerator, Callable

from ..store import KeyValue
from ..terms import Annotation
from ..timing import WATCH_BOOKMARK_INTERVAL
from . import errors
from .registry import EVENT_TYPES, INITIAL_END, WatchItem, encoded

log = logging.getLogger("kube32.apiserver.watch")

QUEUE_BYTES = 8 << 20   # live event bytes a watcher may have waiting
QUEUE_EVENTS = 1000     # ... and events
ENCODED_KEPT = 256      # recent event lines kept encoded for every watcher
BOOKMARK_INTERVAL = WATCH_BOOKMARK_INTERVAL
BOOKMARK_BEFORE_END = 1.0  # the last bookmark this long before a watch's timeout

Obj = dict[str, Any]


def line(etype: str, obj: Obj) -> bytes:
    return json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"


def stored_line(etype: str, kv: KeyValue) -> bytes:
    """:func:`line` of the object a stored version decodes to, made from its bytes (it is
    neither decoded nor encoded again: :func:`~.registry.encoded`)."""
    return b'{"type":' + json.dumps(etype).encode() + b',"object":' + encoded(kv) + b"}\n"


class WatchEncoder:
    """The encoded lines of recent events, shared by every watcher they reach."""

    def __init__(self, kept: int = ENCODED_KEPT) -> None:
        self._kept = kept
        self._lines: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self.encoded = 0  # lines encoded (a figure for tests)

    def encode(self, plural: str, item: WatchItem) -> bytes:
        obj = item.object
        assert obj is not None
        md = obj.get("metadata") or {}
        key = (item.type, plural, md.get("namespace"), md.get("name"), md.get("resourceVersion"), item.derived,
               item.replaced)
        data = self._lines.get(key)
        if data is None:
            data = self._lines[key] = stored_line(item.type, item.kv) if item.kv is not None else line(item.type, obj)
            self.encoded += 1
            if len(self._lines) > self._kept:
                self._lines.popitem(last=False)
        return data


def bookmark(kind: str, api_version: str, revision: int, initial_end: bool = False) -> bytes:
    md: Obj = {"resourceVersion": str(revision)}
    if initial_end:
        md["annotations"] = {Annotation.INITIAL_EVENTS_END: "true"}
    return line("BOOKMARK", {"kind": kind, "apiVersion": api_version, "metadata": md})


class WatchFeed:
    """One watch's lines: its events, encoded by ``encode`` (shared or not), through a
    bounded queue, with bookmarks when asked for (see the module docstring)."""

    def __init__(self, items: AsyncGenerator[WatchItem, None], encode: Callable[[WatchItem], bytes],
                 kind: str, api_version: str, *, bookmarks: bool, timeout: float, start: int = 0,
                 initial_end_mark: bool = False, interval: float = BOOKMARK_INTERVAL) -> None:
        self.items, self.encode = items, encode
        self.kind, self.api_version = kind, api_version
        self.bookmarks, self.timeout, self.interval = bookmarks, timeout, interval
        self.revision = start      # the newest revision the watch has been through
        self.initial_end_mark = initial_end_mark
        self.dropped = False       # it fell too far behind and was dropped
        self._queue: deque[bytes] = deque()
        self._bytes = 0
        self._changed = asyncio.Event()
        self._done = False
        self._error: BaseException | None = None

    # --- the producer -------------------------------------------------------------------
    async def _pump(self) -> None:
        try:
            async for item in self.items:
                if not await self._take(item):
                    return
        except errors.APIError as e:
            self._put(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
        except Exception as e:  # noqa: BLE001 - ends this watch, said in the log
            self._error = e
        finally:
            self._done = True
            self._changed.set()

    async def _take(self, item: WatchItem) -> bool:
        """Queue what ``item`` makes; False when the watcher is dropped."""
        if item.type == INITIAL_END:
            self.revision = item.revision
            if self.bookmarks and self.initial_end_mark:
                self._put(bookmark(self.kind, self.api_version, item.revision, initial_end=True))
            return True
        if item.type in EVENT_TYPES:
            await asyncio.sleep(0)   # the decode that made the item and this encode: two turns
            data = self.encode(item)
            if item.initial:
                while self._queue and self._bytes + len(data) > QUEUE_BYTES:
                    self._changed.clear()
                    await self._changed.wait()
            elif self._queue and (self._bytes + len(data) > QUEUE_BYTES or len(self._queue) >= QUEUE_EVENTS):
                self.dropped = True
                return False
            self._put(data)
        if not item.initial:
            self.revision = max(self.revision, item.revision)
        return True

    def _put(self, data: bytes) -> None:
        self._queue.append(data)
        self._bytes += len(data)
        self._changed.set()

    # --- the consumer -------------------------------------------------------------------
    async def lines(self) -> AsyncGenerator[bytes, None]:
        """The lines to send, until the watch ends, times out or is dropped."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.timeout
        marks = _Marks(loop.time(), end, self.interval)
        pump = asyncio.ensure_future(self._pump())
        try:
            while True:
                while self._queue:
                    data = self._queue.popleft()
                    self._bytes -= len(data)
                    self._changed.set()   # room for initial events waiting
                    yield data
                now = loop.time()
                if self._done or now >= end:
                    break
                if self.bookmarks and self.revision and marks.due(now):
                    yield bookmark(self.kind, self.api_version, self.revision)
                    continue
                await self._wait(min(end, marks.next) - now if self.bookmarks else end - now)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            await self.items.aclose()
        if self.dropped:
            log.info("a %s watch fell %d events (%d bytes) behind and was closed", self.kind,
                     len(self._queue), self._bytes)
        if self._error is not None:
            log.error("a %s watch ended: %s", self.kind, self._error, exc_info=self._error)

    async def _wait(self, seconds: float) -> None:
        self._changed.clear()
        if self._queue or self._done:
            return
        try:
            await asyncio.wait_for(self._changed.wait(), max(seconds, 0.001))
        except TimeoutError:
            pass


class _Marks:
    """When a watch's bookmarks are due: every ``interval`` s, and once just before ``end``."""

    def __init__(self, start: float, end: float, interval: float) -> None:
        self.interval = interval
        self.last_at = end - BOOKMARK_BEFORE_END
        self.last_sent = self.last_at <= start
        self.next = self._after(start)

    def _after(self, now: float) -> float:
        at = now + self.interval
        return at if self.last_sent else min(at, self.last_at)

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        if now >= self.last_at:
            self.last_sent = True
        self.next = self._after(now)
        return True
