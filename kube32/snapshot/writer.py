"""SnapshotWriter: streams a K32S v1 snapshot without a second memory buffer.

Design:
- The small parts (header, GLOBALS, one TABLE per table, CHANNELS, EVENTS, and
  the memory section's head) are encoded up front into one small buffer, so
  `total_size` is known before the first byte goes out (Content-Length), and
  they go out as one write: one syscall, one TLS record, where a piece each
  cost a record and a send each (and, on a socket with Nagle's algorithm, a
  wait for the first one's ACK).
- The memory section follows them and comes last: a reader can then judge
  every small part before it touches the destination memory.
- Memory goes out as slices (1 MiB) of the caller's buffer, a memoryview over
  Wasm linear memory: never copied.  The hash reads the same buffer in place,
  8 MiB at a time, each step handed over as its first slice goes out; for a
  large memory it runs on a thread of its own (`parallel.HashBehind`), so
  hashing and the socket progress side by side.  Steps of 8 MiB, not a hand-over
  per slice: each hand-over wakes the hash thread and trades the GIL with the
  sending one (py-spy and bench_snapshot's CPU: 6 ms per 64 MiB above the
  floor with a hand-over per MiB, 1.5 ms with one per 8 MiB), and a send that
  breaks leaves at most a step's hashing behind it.
- Sections appear in a fixed order (GLOBALS, TABLEs by position, CHANNELS,
  EVENTS, MEMORY; empty GLOBALS/CHANNELS/EVENTS omitted), which makes the
  encoding canonical: a snapshot read and written again is byte-identical.

The caller keeps the memory unchanged while writing (the pod is frozen).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .parallel import HashBehind
from .format import (
    HEADER_SIZE, MAX_PAGES, PAGE_SIZE, SECTION_CHANNELS, SECTION_EVENTS, SECTION_GLOBALS,
    SECTION_HEAD_SIZE, SECTION_MEMORY, SECTION_TABLE, TRAILER_SIZE, VERSION, Header, PodState,
    encode_channels, encode_events, encode_globals, encode_header, encode_table, section_head,
)

WRITE_CHUNK = 1 << 20
HASH_STEP = 8 << 20  # memory goes to the hash 8 MiB at a time: fewer hand-overs, a lag bounded when a send breaks
ASYNC_WRITE = 256 << 10  # an event loop's TLS encrypts and sends each write whole: smaller ones stay cache-warm

_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


def _byte_view(buf: memoryview | bytes | bytearray) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1 or view.format != "B":
        view = view.cast("B")  # ctypes arrays come as '<B'
    return view


def _check_state(state: PodState, memory_len: int) -> None:
    """Programming errors of the caller, not refusals: ValueError."""
    if len(state.image_sha256) != 32:
        raise ValueError("image_sha256 must be 32 bytes")
    if not 0 <= state.memory_pages <= MAX_PAGES:
        raise ValueError(f"memory_pages {state.memory_pages} is out of range")
    if not 0 <= state.memory_bytes <= min(state.memory_pages * PAGE_SIZE, _U32_MAX):
        raise ValueError(
            f"memory_bytes {state.memory_bytes} exceeds memory_pages {state.memory_pages} * 65536 (or u32)"
        )
    if memory_len < state.memory_bytes:
        raise ValueError(f"the memory buffer holds {memory_len} bytes, below memory_bytes {state.memory_bytes}")
    for name in ("pod_time_ms", "unix_time_ms"):
        if not 0 <= getattr(state, name) <= _U64_MAX:
            raise ValueError(f"{name} does not fit a u64")
    for g in state.globals:
        if not (0 <= g.index <= _U32_MAX and 0 <= g.bits <= _U64_MAX):
            raise ValueError(f"global {g.index} does not fit the format")
    for t in state.tables:
        if not 0 <= t.index <= _U32_MAX or any(not 0 <= e <= _U32_MAX for e in t.entries):
            raise ValueError(f"table {t.index} does not fit the format")
    for c in state.channels:
        if not 0 <= c.handle <= _U32_MAX:
            raise ValueError(f"channel handle {c.handle} does not fit a u32")
    for e in state.events:
        if len(e.payload) > _U32_MAX:
            raise ValueError("an event payload does not fit a u32 length")


def _total_size(small: list[bytes], memory_bytes: int) -> int:
    return HEADER_SIZE + sum(len(s) for s in small) + SECTION_HEAD_SIZE + memory_bytes + TRAILER_SIZE


def snapshot_size(state: PodState) -> int:
    """The bytes of the snapshot of ``state`` (its memory ``state.memory_bytes`` long),
    without the memory itself: what the writer's ``total_size`` would be."""
    _check_state(state, state.memory_bytes)
    return _total_size(SnapshotWriter._encode_small_sections(state), state.memory_bytes)


class SnapshotWriter:
    def __init__(self, state: PodState, memory: memoryview | bytes | bytearray) -> None:
        view = _byte_view(memory)
        _check_state(state, len(view))
        self.state = state
        self._memory = view[: state.memory_bytes]
        small = self._encode_small_sections(state)
        self.header = Header(
            version=VERSION, flags=0, image_sha256=bytes(state.image_sha256),
            memory_bytes=state.memory_bytes, memory_pages=state.memory_pages,
            pod_time_ms=state.pod_time_ms, unix_time_ms=state.unix_time_ms,
            section_count=len(small) + 1,
        )
        self.total_size: int = _total_size(small, state.memory_bytes)
        # Everything before the memory, in order, in one buffer that is never written
        # again (so the hash may read it late): the first piece of the stream.
        prefix = bytearray(encode_header(self.header))
        for part in small:
            prefix += part
        prefix += section_head(SECTION_MEMORY, state.memory_bytes)
        self._prefix = prefix
        self.sha256: bytes | None = None  # the trailer, once written

    @staticmethod
    def _encode_small_sections(state: PodState) -> list[bytes]:
        bodies: list[tuple[int, bytes]] = []
        if state.globals:
            bodies.append((SECTION_GLOBALS, encode_globals(state.globals)))
        bodies.extend((SECTION_TABLE, encode_table(t)) for t in state.tables)
        if state.channels:
            bodies.append((SECTION_CHANNELS, encode_channels(state.channels)))
        if state.events:
            bodies.append((SECTION_EVENTS, encode_events(state.events)))
        for type_, body in bodies:
            if len(body) > _U32_MAX:
                raise ValueError(f"a section of type {type_} is longer than a u32 length")
        return [section_head(t, len(b)) + b for t, b in bodies]

    def release(self) -> None:
        """Let go of the memory (a pod thaws: its memory may grow again, which a bytearray
        cannot while a view of it lives).  The writer is not used afterwards."""
        try:
            self._memory.release()
        except BufferError:   # something still holds a buffer of this very view: it goes with it
            pass

    def _body(self) -> Iterator[memoryview]:
        yield memoryview(self._prefix)
        for offset in range(0, len(self._memory), WRITE_CHUNK):
            yield self._memory[offset: offset + WRITE_CHUNK]

    def digest(self) -> bytes:
        """The trailer, computed ahead of writing (for a header such as
        X-Kube32-Snapshot-Sha256); later writes then send without hashing again.
        Valid while the memory does not change (a frozen pod)."""
        if self.sha256 is None:
            h = hashlib.sha256()  # one pass with nothing to overlap: inline
            for piece in self._body():
                h.update(piece)
            self.sha256 = h.digest()
        return self.sha256

    def pieces(self) -> Iterator[memoryview]:
        """The snapshot in order, trailer last.  Memory pieces are slices of
        the caller's buffer; the hash gets them in steps of HASH_STEP as the first
        piece of each is yielded (unless :meth:`digest` already did), so it may
        lag behind the output until the trailer."""
        if self.sha256 is not None:
            yield from self._body()
            yield memoryview(self.sha256)
            return
        h = HashBehind()
        try:
            yield from self._hashed_body(h)
            self.sha256 = h.digest()
        finally:
            h.close()
        yield memoryview(self.sha256)

    def _hashed_body(self, h: HashBehind) -> Iterator[memoryview]:
        # Header bytes and frozen memory are never rewritten: the hash reads them in
        # place, in steps of HASH_STEP handed over as the first piece of each goes out.
        prefix = memoryview(self._prefix)
        h.update(prefix, stable=True)
        yield prefix
        memory = self._memory
        for offset in range(0, len(memory), WRITE_CHUNK):
            if offset % HASH_STEP == 0:
                h.update(memory[offset: offset + HASH_STEP], stable=True)
            yield memory[offset: offset + WRITE_CHUNK]

    def write_to(self, out: Any) -> bytes:
        """Blocking: `out` has sendall() (socket) or write() (file).  Returns the trailer."""
        send = getattr(out, "sendall", None) or _full_write(out)
        for piece in self.pieces():
            send(piece)
        assert self.sha256 is not None
        return self.sha256

    async def write_async(self, write: Callable[[memoryview], Awaitable[Any]]) -> bytes:
        """`write` is an async callable such as aiohttp's `resp.write`.  Returns the trailer."""
        if self.sha256 is None:
            h = HashBehind()
            try:
                for piece in self._hashed_body(h):
                    await _write_in_parts(write, piece)
                await h.settled()  # the lagging hash must not block the event loop
                self.sha256 = h.digest()
            finally:
                h.close()
        else:
            for piece in self._body():
                await _write_in_parts(write, piece)
        await write(memoryview(self.sha256))
        return self.sha256

    def to_bytes(self) -> bytes:
        """The whole snapshot in one buffer: for tests and small snapshots only."""
        return b"".join(self.pieces())


async def _write_in_parts(write: Callable[[memoryview], Awaitable[Any]], piece: memoryview) -> None:
    for offset in range(0, len(piece), ASYNC_WRITE):
        await write(piece[offset: offset + ASYNC_WRITE])


def _full_write(out: Any) -> Callable[[memoryview], None]:
    """A write() that may write partially (raw files) made to write everything."""

    def send(piece: memoryview) -> None:
        while piece:
            n = out.write(piece)
            if n is None:  # non-blocking raw stream with nothing written: not supported
                raise BlockingIOError("the output would block")
            piece = piece[n:]

    return send
