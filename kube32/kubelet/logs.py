"""Container logs: the last lines a pod logged, with timestamps, for ``kubectl logs``.

Pods log on their own threads; followers (``kubectl logs -f``) are asyncio
streams.  A :class:`LogBuffer` keeps the last ``capacity`` lines (a ring: the
oldest line goes first) under a lock, and wakes followers on the event loop with
``call_soon_threadsafe``.  A follower sees every line appended after it
subscribed, in order; a follower slower than ``capacity`` lines loses the oldest.
The buffer outlives restarts of its container; each line carries the run it came
from (the container's restart count when it was logged), so a reader asks for the
current run's lines or the previous run's (``kubectl logs --previous``), as
Kubernetes keeps one log file per container instance.  ``close()`` ends all follows
(the pod is gone).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections import deque
from typing import AsyncIterator

DEFAULT_CAPACITY = 1000


def rfc3339_nano(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


class LogBuffer:
    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int = DEFAULT_CAPACITY) -> None:
        self.loop = loop
        self.capacity = capacity
        self._lines: deque[tuple[str, str, int]] = deque(maxlen=capacity)  # (timestamp, text, run)
        self._lock = threading.Lock()
        self._followers: set[asyncio.Queue] = set()
        self.closed = False

    def append(self, line: str, run: int = 0) -> None:
        """Thread-safe; called from pod threads and the event loop."""
        entry = (rfc3339_nano(dt.datetime.now(dt.timezone.utc)), line.rstrip("\n"), run)
        with self._lock:
            self._lines.append(entry)
            followers = list(self._followers)
        for q in followers:
            try:
                self.loop.call_soon_threadsafe(_offer, q, entry)
            except RuntimeError:   # the loop is closed: nobody follows any more
                pass

    def lines(self, tail: int | None = None, run: int | None = None,
              since: str | None = None) -> list[tuple[str, str, int]]:
        """The lines of one run (None: all), logged at ``since`` (an rfc3339_nano
        timestamp) or later, then the last ``tail`` of them."""
        with self._lock:
            items = list(self._lines)
        return _tail(_select(items, run, since), tail)

    async def follow(self, tail: int | None = None, run: int | None = None,
                     since: str | None = None) -> AsyncIterator[tuple[str, str, int]]:
        """The tail, then every later line until close() (or the caller stops)."""
        q: asyncio.Queue = asyncio.Queue(self.capacity)
        with self._lock:
            items = _select(list(self._lines), run, since)
            self._followers.add(q)
        try:
            for entry in _tail(items, tail):
                yield entry
            while not self.closed:
                entry = await q.get()
                if entry is None:
                    return
                yield entry
        finally:
            with self._lock:
                self._followers.discard(q)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            followers = list(self._followers)
        for q in followers:
            try:
                self.loop.call_soon_threadsafe(_offer, q, None)
            except RuntimeError:
                pass


def _select(items: list, run: int | None, since: str | None) -> list:
    return [e for e in items if (run is None or e[2] == run) and (since is None or e[0] >= since)]


def _tail(items: list, tail: int | None) -> list:
    if tail is None or tail < 0:
        return items
    return items[-tail:] if tail else []


def _offer(q: asyncio.Queue, entry: tuple[str, str, int] | None) -> None:
    if q.full():
        try:
            q.get_nowait()   # drop the oldest for this slow follower
        except asyncio.QueueEmpty:
            pass
    q.put_nowait(entry)


def format_line(entry: tuple[str, str, int], timestamps: bool) -> bytes:
    ts, text, _run = entry
    return (f"{ts} {text}\n" if timestamps else f"{text}\n").encode()
