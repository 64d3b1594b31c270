"""Work beside the stream: SHA-256 on a second thread, and pages faulted in ahead.

Why: a snapshot's bytes cost three things on each side of a socket - the
copy, the SHA-256 of the trailer (about 1.4 GB/s with SHA-NI) and, on the
receiving side, the page faults of a fresh instance's memory (on a VM about as
costly as the copy).  Done one after the other on one thread they add up;
`hashlib` and `madvise` release the GIL, so each can run on a core of its own
while the socket moves the next piece.

`HashBehind` - an ordered SHA-256 that may lag behind the stream:
- Small inputs are hashed inline until a large one arrives; from then on every
  update goes, in order, to one worker thread (a one-thread executor keeps the
  order).  `digest()` waits for the worker; `settled()` is the same for an
  event loop, which must not block on it.
- Once the worker runs, small inputs (a reader's 32-byte tail before each MiB of
  memory, a section head) wait in one small buffer and go to the worker with
  the next large input, in the same hand-over: each hand-over wakes the worker,
  which then takes the GIL from the streaming thread, and for a few bytes that
  costs more than the hash.  The buffer goes on its own once it reaches
  `PARALLEL_MIN`, and at `digest()`/`settled()`.
- Invariant: a piece handed over with ``stable=True`` is never written again
  (the destination memory of a restore, the caller's frozen memory, a `bytes`
  object); any other piece is copied first, since its buffer may be reused.
- A worker error (none is expected from hashlib) surfaces at `digest()`.
- The worker ends with `close()`, or when the executor is garbage collected
  (an abandoned reader leaves no thread behind).

`prefault(view)` - fault the pages of a writable buffer in from another thread
(Linux `MADV_POPULATE_WRITE`, 5.14+), front to back in steps, so the receiving
thread mostly finds them present.  It changes no byte; where the call is
missing (other systems, older kernels) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hashlib
import sys
import threading
from typing import Callable
from concurrent.futures import Future, ThreadPoolExecutor

PARALLEL_MIN = 256 << 10   # a piece this large moves the hash to its own thread
PREFAULT_MIN = 4 << 20     # smaller buffers fault in faster than a thread starts
PREFAULT_STEP = 4 << 20
_MADV_POPULATE_WRITE = 23
_PAGE = 4096


class HashBehind:
    """SHA-256 fed in order, possibly computed on a worker thread (see the module doc)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self._pending = bytearray()  # small inputs not yet handed to the worker, in order

    def update(self, data: bytes | bytearray | memoryview, *, stable: bool = False) -> None:
        if self._executor is None:
            if len(data) < PARALLEL_MIN:
                self._hash.update(data)
                return
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k32s-hash")
        if len(data) < PARALLEL_MIN:
            self._pending += data  # a copy: the caller may reuse its buffer
            if len(self._pending) >= PARALLEL_MIN:
                self._hand_over(None)
            return
        if not stable and not isinstance(data, bytes):
            data = bytes(data)
        self._hand_over(data)

    def _hand_over(self, data: bytes | bytearray | memoryview | None) -> None:
        """The pending small inputs, then `data`, to the worker in one job."""
        assert self._executor is not None
        pending, self._pending = self._pending, bytearray()
        self._last = self._executor.submit(self._hash_in_order, pending, data)

    def _hash_in_order(self, pending: bytearray, data: bytes | bytearray | memoryview | None) -> None:
        if pending:
            self._hash.update(pending)
        if data is not None:
            self._hash.update(data)

    def digest(self) -> bytes:
        if self._pending:
            self._hand_over(None)
        if self._last is not None:
            self._last.result()
        return self._hash.digest()

    async def settled(self) -> None:
        """Wait, without blocking the event loop, until every update is hashed."""
        if self._pending:
            self._hand_over(None)
        last = self._last
        if last is not None and not last.done():
            await asyncio.wrap_future(last)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)


def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def _address(view: memoryview) -> int | None:
    if view.readonly or not view.contiguous:
        return None
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def _populate(view: memoryview, start: int, end: int, stop: threading.Event) -> None:
    madvise = _MADVISE
    assert madvise is not None
    for offset in range(start, end, PREFAULT_STEP):
        if stop.is_set():
            return
        if madvise(offset, min(PREFAULT_STEP, end - offset), _MADV_POPULATE_WRITE) != 0:
            return  # EINVAL on kernels without it: the receiving thread faults them instead
    del view  # held until here so the buffer outlives the calls


def prefault(view: memoryview) -> threading.Event | None:
    """Start faulting `view`'s pages in; set the returned event to stop early."""
    if _MADVISE is None or len(view) < PREFAULT_MIN:
        return None
    address = _address(view)
    if address is None:
        return None
    start = (address + _PAGE - 1) // _PAGE * _PAGE
    end = (address + len(view)) // _PAGE * _PAGE
    if end <= start:
        return None
    stop = threading.Event()
    threading.Thread(target=_populate, args=(view, start, end, stop), name="k32s-prefault", daemon=True).start()
    return stop
