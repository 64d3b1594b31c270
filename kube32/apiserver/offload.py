"""Work too big for the event loop: a body's decoding, a pass over a big object.

The API server's event loop answers ``/healthz``, ``/readyz`` and node Lease renewals;
none of them may wait behind one request's work on a big object.  Such work runs on
one of :data:`WORKERS` worker threads instead (:func:`run`): Python code on a thread
gives the loop the interpreter every few milliseconds (``sys.getswitchinterval``), so
the loop keeps turning while it works.  What still holds the loop is one C call on an
object (``json.loads``/``json.dumps`` of at most ``limits.MAX_OBJECT`` bytes: tens of
milliseconds, a few hundred on a loaded machine), never a chain of passes.

Invariants:

* At most :data:`WORKERS` threads compete with the loop for the interpreter, whatever
  the number of requests: the loop keeps at least its share, and the rest wait in line
  without holding anything.
* What runs here is a pure function of what it is given (a decode, a patch, a
  validation, an encode of an object only this request holds): it touches no shared
  state and needs no lock.  An exception it raises (an ``APIError``) reaches the caller
  as if it ran on the loop.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

__all__ = ["WORKERS", "run"]

T = TypeVar("T")

WORKERS = 2   # threads: each takes the interpreter from the loop in turns, so few
_POOL = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="kube32-offload")


async def run(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on a worker thread; the loop serves others meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)
