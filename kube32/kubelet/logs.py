"""Container logs: the last lines a pod logged, with timestamps, for ``kubectl logs``.

Pods log on their own threads; followers (``kubectl logs -f``) are asyncio
streams.  A :class:`LogBuffer` keeps the last ``capacity`` lines (a ring: the
oldest line goes first) under a lock, and wakes followers on the event loop with
``call_soon_threadsafe``.  A follower sees every line appended after it
subscribed, in order; a follower slower than ``capacity`` lines loses the oldest.
The buffer outlives restarts of its container; each line carries the run it came
from (the container's restart count when it was logged), so a reader asks for the
current run's lines or the previous run's (``kubectl logs --previous``), as
Kubernetes keeps one log file per container instance.  A follow ends when the run it
follows ends (``end_run``: the container exited, so ``kubectl logs -f`` returns, as
Kubernetes' kubelet ends it), or at ``close()`` (the pod is gone).  Runs end in order,
so the buffer keeps only the last run that ended; a follow that subscribes after its
run ended gets the lines and ends at once.
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
        self._ended_through = -1   # every run up to this one has ended

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
        """The tail, then every later line of ``run`` until it ends or close() (or the caller stops)."""
        q: asyncio.Queue = asyncio.Queue(self.capacity)
        with self._lock:
            items = _select(list(self._lines), run, since)
            self._followers.add(q)
            ended = run is not None and run <= self._ended_through
        try:
            for entry in _tail(items, tail):
                yield entry
            while not self.closed and not ended:
                entry = await q.get()
                if entry is None:
                    return
                if not isinstance(entry, int) and (run is None or entry[2] == run):
                    yield entry
                # A run ended (the mark may have been dropped for a slow follower: the
                # last run that ended says it too, once the lines before it are out).
                ended = run is not None and run <= self._ended_through and (isinstance(entry, int) or q.empty())
        finally:
            with self._lock:
                self._followers.discard(q)

    def end_run(self, run: int) -> None:
        """Run ``run`` of the container ended: its follows end after its last line (on the
        event loop; the lines its thread logged before it ended come first)."""
        with self._lock:
            self._ended_through = max(self._ended_through, run)
            followers = list(self._followers)
        for q in followers:
            self.loop.call_soon_threadsafe(_offer, q, run)

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


def _offer(q: asyncio.Queue, entry: tuple[str, str, int] | int | None) -> None:
    if q.full():
        try:
            q.get_nowait()   # drop the oldest for this slow follower
        except asyncio.QueueEmpty:
            pass
    q.put_nowait(entry)


def format_line(entry: tuple[str, str, int], timestamps: bool) -> bytes:
    ts, text, _run = entry
    return (f"{ts} {text}\n" if timestamps else f"{text}\n").encode()
