"""A work queue of keys, as client-go's ``workqueue``, for level-triggered controllers.

Invariants:

* a key waiting in the queue is there once, however often it was added;
* a key is never handed to two workers at once: a key added while it is being
  processed is queued again only when that processing is done;
* a failed key comes back after an exponential back-off (5 ms doubling up to
  ``max_backoff``); ``forget`` resets its count.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Hashable

Key = Hashable


class WorkQueue:
    def __init__(self, *, base_backoff: float = 0.005, max_backoff: float = 10.0) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._waiting: set[Key] = set()
        self._processing: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._base = base_backoff
        self._max = max_backoff
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def add(self, key: Key) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        old = self._timers.pop(key, None)
        if old is not None:
            if old.when() <= asyncio.get_running_loop().time() + delay:
                self._timers[key] = old
                return
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: Key) -> None:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        self.add_after(key, min(self._base * (2 ** n), self._max))

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._waiting.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def __len__(self) -> int:
        return len(self._waiting)

    def shutdown(self) -> None:
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()


async def run_workers(queue: WorkQueue, sync: Callable[[Key], Awaitable[None]], workers: int,
                      on_error: Callable[[Key, BaseException], None]) -> None:
    """Run ``workers`` loops that sync keys; a sync that raises is retried with back-off."""

    async def worker() -> None:
        while True:
            key = await queue.get()
            try:
                await sync(key)
                queue.forget(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception as e:  # noqa: BLE001 - a failed sync is retried, never fatal
                on_error(key, e)
                queue.add_rate_limited(key)
            queue.done(key)

    await asyncio.gather(*(worker() for _ in range(workers)))
