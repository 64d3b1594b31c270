"""asyncio helpers every component shares.

`wait_set(event, timeout)` replaces ``asyncio.wait_for(event.wait(), timeout)`` in
loops that must end when their task is cancelled.  Python 3.11's `wait_for` returns
normally when the cancellation arrives just as the awaited event is set (the
cancellation is lost: python/cpython#86296), and a ``while True`` status loop then
runs on and its owner's ``await task`` after ``task.cancel()`` never returns - a
process that does not stop on SIGTERM.  `asyncio.wait` never loses one.

`FairShare` shares a number of units (bytes of room, a snapshot slot) among keys
(namespaces) so that no key's requests keep another's out (the checkpoint data space's
room for uploads, the control plane's one snapshot slot; kube32.apiserver.dataspace.Room
judges by its own rules what fits and who may pass whom).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, AsyncIterator


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True if it was set.
    A cancellation of the caller always raises."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)


@dataclass(eq=False)
class Waiter:
    """One request in line: ``tag`` is its owner's own (a subclass judges by it)."""

    key: str
    size: int
    seq: int
    turn: asyncio.Future[None]
    tag: Any = None


class FairShare:
    """``capacity`` units (bytes of room, or one snapshot slot) shared by keys (namespaces)
    fairly, as Kubernetes' API priority and fairness shares a priority level's seats among
    flows: one key's many requests cannot keep another key out for longer than the
    requests already inside take.

    * A request enters at once while nobody waits and its units are free.
    * When units come free, the next to enter is the oldest waiter of the key that holds
      the fewest units now, then of the one that entered longest ago (one that never did:
      first), then of the one whose waiter came first.  A key that already holds units, or
      was just served, so waits behind every other key.  Nobody passes that waiter while it
      does not fit (a large request is not starved by small ones).
    * A wait ends after its ``patience`` (``enter`` answers False) or when cancelled; the
      waiters behind it move up.
    * A subclass may judge otherwise what fits (`_fits`), what a key holds (`_holding`), and
      who may pass a waiter that does not fit (`_may_pass`); :meth:`admit` after something
      outside changed what fits.

    Invariant: ``used`` is the sum of what the keys hold, and grows only by what `_fits`.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._held: Counter[str] = Counter()
        self._queues: dict[str, deque[Waiter]] = {}
        self._served: dict[str, int] = {}  # key -> its last entry (a count), while it holds or waits
        self._entries = 0
        self._arrivals = 0

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def busy(self) -> bool:
        """Whether a request would wait (or does): units held, or waiters."""
        return self.used > 0 or bool(self._queues)

    async def enter(self, key: str, size: int, patience: float | None = None, tag: Any = None) -> bool:
        """Take ``size`` units for ``key``; False when its turn did not come within
        ``patience`` seconds (None: wait as long as it takes)."""
        self._arrivals += 1
        waiter = Waiter(key, size, self._arrivals, asyncio.get_running_loop().create_future(), tag)
        self._queues.setdefault(key, deque()).append(waiter)
        self.admit()  # it may be the one to go first, and fit
        if waiter.turn.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(waiter.turn), patience)
        except BaseException as e:
            if waiter.turn.done():  # given its units just as the wait ended
                self._give_back(waiter)
            else:
                waiter.turn.cancel()
                self._remove(waiter)
                self.admit()  # those behind it may go now
            if isinstance(e, TimeoutError):
                return False
            raise
        return True

    def leave(self, key: str, size: int) -> None:
        self.used -= size
        self._held[key] -= size
        if self._held[key] <= 0:
            del self._held[key]
            self._forget(key)
        self.admit()

    @contextlib.asynccontextmanager
    async def turn(self, key: str, size: int = 1) -> AsyncIterator[None]:
        """Hold ``size`` units for ``key`` (waiting as long as it takes) for the block."""
        await self.enter(key, size)
        try:
            yield
        finally:
            self.leave(key, size)

    def admit(self) -> None:
        """Let waiters in, in their fair order, while one fits."""
        while (waiter := self._next()) is not None:
            queue = self._queues[waiter.key]
            queue.popleft()
            if not queue:
                del self._queues[waiter.key]
            self._take(waiter)
            waiter.turn.set_result(None)

    def line(self) -> list[Waiter]:
        """The waiters, in the order they would enter were there room for all of them."""
        return [w for key in sorted(self._queues, key=self._rank) for w in self._queues[key]]

    def _next(self) -> Waiter | None:
        """The first waiter, in fair order, that fits and may pass every one before it."""
        blocked: list[Waiter] = []
        for key in sorted(self._queues, key=self._rank):
            waiter = self._queues[key][0]
            if all(self._may_pass(waiter, b) for b in blocked) and self._fits(waiter):
                return waiter
            blocked.append(waiter)
        return None

    def _fits(self, waiter: Waiter) -> bool:
        return self.used + waiter.size <= self.capacity

    def _may_pass(self, waiter: Waiter, blocked: Waiter) -> bool:
        """Whether ``waiter`` may enter before ``blocked``, which is before it and does not fit."""
        return False

    def _holding(self, key: str) -> int:
        return self._held.get(key, 0)

    def _rank(self, key: str) -> tuple[int, ...]:
        return self._holding(key), self._served.get(key, 0), self._queues[key][0].seq

    def _take(self, waiter: Waiter) -> None:
        self.used += waiter.size
        self._held[waiter.key] += waiter.size
        self._entries += 1
        self._served[waiter.key] = self._entries

    def _give_back(self, waiter: Waiter) -> None:
        """Units given to a waiter whose wait ended just then: they go back."""
        self.leave(waiter.key, waiter.size)

    def _remove(self, waiter: Waiter) -> None:
        queue = self._queues.get(waiter.key)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._queues[waiter.key]
        self._forget(waiter.key)

    def _forget(self, key: str) -> None:
        if key not in self._held and key not in self._queues:
            self._served.pop(key, None)
