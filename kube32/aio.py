"""asyncio helpers every component shares.

`wait_set(event, timeout)` replaces ``asyncio.wait_for(event.wait(), timeout)`` in
loops that must end when their task is cancelled.  Python 3.11's `wait_for` returns
normally when the cancellation arrives just as the awaited event is set (the
cancellation is lost: python/cpython#86296), and a ``while True`` status loop then
runs on and its owner's ``await task`` after ``task.cancel()`` never returns - a
process that does not stop on SIGTERM.  `asyncio.wait` never loses one.
"""
from __future__ import annotations

import asyncio


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
