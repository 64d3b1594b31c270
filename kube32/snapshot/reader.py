"""SnapshotReader: validates a K32S v1 snapshot while its bytes arrive.

Design:
- One state machine, three ways to drive it: `read_from` (blocking socket
  `recv_into` / file `readinto`, straight into the destination memory),
  `read_async` (asyncio/aiohttp streams: `.read(n)` chunks copied into the
  destination slice, n bounded by what the current part still needs) and
  `feed`/`finish` (push style, for the API server storing an upload).
- The reader never asks for more bytes than the current part needs, so a
  pull reader stops exactly at the trailer and never consumes what follows.
- Memory is written into the buffer the caller's `memory_target(header)`
  returns (the new instance's memory); besides it the reader keeps only the
  small sections and a scratch buffer of a few hundred bytes (64 KiB when it
  skips memory without a target, or drains a broken snapshot).
- The hash runs 32 bytes behind the stream (`_TailHash`): at any point it is
  the SHA-256 of everything but the last 32 bytes seen.  For a large memory
  it runs on a thread of its own (`parallel.HashBehind`), on the bytes
  already in the destination memory, while the next ones arrive; a second
  thread faults the destination's pages in ahead of the stream
  (`parallel.prefault`).  Both change nothing the reader decides, only when
  the work is done.  So when the stream
  ends where the structure says it should not, the reader can still tell a
  snapshot whose trailer matches (written inconsistently: cause "section"…)
  from damaged bytes (cause "trailer") and from a cut stream ("truncated").

Order of judgement, and why:
1. Header, as soon as its 68 bytes are in: magic, version/flags, image
   SHA-256, then the memory limit - policy refusals, immediate.
2. Structural faults (lengths that overrun, a memory section whose length
   differs from the header, duplicate sections, malformed small sections,
   more than a pod can have - a section longer than its kind's most, checked
   at its head before it is buffered; more than 16 channels, a handle twice, a
   bad channel name, more than 1024 events, 100,000 globals or 100 tables,
   checked entry by entry before the entry is built (format.py's bounds) -
   bytes after the trailer) stop all writes into the memory target; the
   reader drains the rest of the stream and then reports "trailer" when the
   bytes were damaged, else the structural cause.
3. The trailer.
4. Globals and tables against the module.  An equal image SHA-256 means the
   same module, so a mismatch here is damage or a writer bug: checking after
   the trailer makes damage read as damage.  A table the module could not hold
   (no such table, more entries than its maximum) is judged here too, but its
   entries are never built: the reader keeps only its declared size.
Nothing is returned before all of this passed; `SnapshotError.memory_written`
tells the caller when the memory target already holds snapshot bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from .parallel import HashBehind, prefault
from .format import (
    HEADER_SIZE, MAGIC, MAX_PAGES, PAGE_SIZE, SECTION_CHANNELS, SECTION_EVENTS, SECTION_GLOBALS,
    MAX_TABLES, SECTION_HEAD_SIZE, SECTION_HEAD_STRUCT, SECTION_MEMORY, SECTION_TABLE, TABLE_HEAD_STRUCT,
    TRAILER_SIZE, VERSION, ChannelState, GlobalState, Header, HeldEvent, Malformed, PodState, SectionInfo,
    Snapshot, SnapshotError, TableState, decode_channels, decode_events, decode_globals, decode_header,
    decode_table, max_section_length, section_name, valtype_name,
)

SMALL_SCRATCH = 512
BULK_SCRATCH = 64 << 10
MEMORY_CHUNK = 1 << 20  # one recv_into at most
HASH_STEP = 1 << 20  # memory goes to the hash in pieces this large: one hand-over per MiB, not per recv
MAX_SMALL_SECTION = 16 << 20  # a damaged length must not make us buffer gigabytes

TRUNCATED = "the snapshot ends before its trailer (truncated)"
DAMAGED = "the snapshot's trailer does not match its contents (damaged in transfer or storage)"


@dataclass(frozen=True)
class ModuleShape:
    """What the module being deployed has."""

    image_sha256: bytes
    memory_limit_bytes: int | None
    globals: Mapping[int, int]  # index -> valtype of each mutable global
    tables: Mapping[int, tuple[int, int | None]]  # index -> (min size, max size or None)


class _Stage(Enum):
    HEADER = auto()
    SECTION_HEAD = auto()
    SMALL = auto()      # a known small section, buffered
    MEMORY = auto()     # into the memory target
    SKIP = auto()       # hashed and dropped: unknown type, or memory without a target
    TRAILER = auto()
    DRAIN = auto()      # after a structural fault: hash to the end, then judge
    DONE = auto()
    FAILED = auto()


class _TailHash:
    """SHA-256 of everything but the last 32 bytes seen, and those bytes."""

    def __init__(self) -> None:
        self._hash = HashBehind()
        self._tail = b""

    def update(self, view: memoryview, stable: bool) -> None:
        """`stable`: the bytes under `view` are never written again (HashBehind)."""
        n = len(view)
        if n >= TRAILER_SIZE:
            if self._tail:
                self._hash.update(self._tail)
            self._hash.update(view[: n - TRAILER_SIZE], stable=stable)
            self._tail = bytes(view[n - TRAILER_SIZE:])
        else:
            joined = self._tail + bytes(view)
            if len(joined) > TRAILER_SIZE:
                self._hash.update(joined[: len(joined) - TRAILER_SIZE])
                joined = joined[len(joined) - TRAILER_SIZE:]
            self._tail = joined

    def tail_is_trailer(self) -> bool:
        return len(self._tail) == TRAILER_SIZE and self._hash.digest() == self._tail

    @property
    def tail(self) -> bytes:
        return self._tail

    def digest(self) -> bytes:
        return self._hash.digest()

    async def settled(self) -> None:
        await self._hash.settled()

    def close(self) -> None:
        self._hash.close()


class SnapshotReader:
    def __init__(
        self,
        module: ModuleShape | None = None,
        memory_target: Callable[[Header], memoryview] | None = None,
        *,
        total_size: int | None = None,
    ) -> None:
        """`memory_target` is called once, after the header is checked, and
        returns a writable buffer of at least header.memory_bytes; None hashes
        and skips the memory.  `total_size` (file size, Content-Length), when
        known, lets overrunning lengths be found before their bytes arrive."""
        self._module = module
        self._memory_target = memory_target
        self._total = total_size
        self._hash = _TailHash()
        self._pos = 0
        self._stage = _Stage.HEADER
        self._left: int | None = HEADER_SIZE
        self._buf = bytearray()  # the part being buffered (header, section head, small body, trailer)
        self._small_scratch = bytearray(SMALL_SCRATCH)
        self._bulk_scratch: bytearray | None = None
        self.header: Header | None = None
        self._memory: memoryview | None = None
        self._prefault: Any = None  # threading.Event that stops the prefault thread
        self._memory_offset = 0
        self._memory_hashed = 0  # memory[:_memory_hashed] is with the hash
        self._memory_seen = False
        self._memory_written = False
        self._section_type = 0
        self._sections: list[SectionInfo] = []
        self._globals: tuple[GlobalState, ...] | None = None
        self._tables: list[TableState] = []
        self._table_sizes: dict[int, int] = {}  # index -> entries declared (a table kept unbuilt has none)
        self._channels: tuple[ChannelState, ...] | None = None
        self._events: tuple[HeldEvent, ...] | None = None
        self._pending: SnapshotError | None = None
        self._error: SnapshotError | None = None
        self._result: Snapshot | None = None

    # ------------------------------------------------------------ drivers

    @property
    def done(self) -> bool:
        return self._stage is _Stage.DONE

    def read_from(self, src: Any) -> Snapshot:
        """Blocking: a socket (recv_into), a binary file (readinto) or anything with read(n)."""
        if hasattr(src, "recv_into"):
            receive = src.recv_into
        elif hasattr(src, "readinto"):
            receive = src.readinto
        else:
            receive = _readinto_from_read(src)
        while self._stage is not _Stage.DONE:
            target = self._want()
            into_memory = self._stage is _Stage.MEMORY
            try:
                n = receive(target)
            except Exception as err:  # reset, timeout: the stream ended early
                self._stream_broke(err)
            if not n:
                return self._end()
            self._got(target[:n], stable=into_memory)
        return self._end()

    async def read_async(self, stream: Any) -> Snapshot:
        """asyncio or aiohttp StreamReader: `.read(n)` chunks copied into place;
        an aiohttp body (it has `readchunk`) chunk by chunk, see `_read_chunks`."""
        if hasattr(stream, "readchunk"):
            return await self._read_chunks(stream)
        while self._stage is not _Stage.DONE:
            if self._stage is _Stage.TRAILER:
                await self.settled()  # the trailer's check must not block the loop on the hash
            target = self._want()
            data = await self._arrived(stream.read(len(target)))
            if data is None:
                return self._end()
            n = len(data)
            if self._stage is _Stage.MEMORY:
                target[:n] = data
                self._got(target[:n], stable=True)
            else:  # the scratch buffer is not needed: judge the chunk itself
                self._got(memoryview(data), stable=isinstance(data, bytes))
        return self._end()

    async def _read_chunks(self, stream: Any) -> Snapshot:
        """Each chunk as the connection delivered it: aiohttp's `read(n)` and
        `readany()` join the chunks they find buffered into a new bytes object
        first, `readchunk()` hands over one without a copy.  A chunk may span
        parts: `feed` splits it, memory straight into the target."""
        while self._stage is not _Stage.DONE:
            data = await self._arrived(_chunk(stream))
            if data is None:
                return self._end()
            view = memoryview(data)
            left = self._left
            if self._stage is _Stage.MEMORY and left is not None and len(view) > left:
                self.feed(view[:left], stable=True)
                view = view[left:]
            if self._stage is _Stage.TRAILER:
                await self.settled()  # the trailer's check must not block the loop on the hash
            self.feed(view, stable=True)  # bytes from the connection: never written again
        return self._end()

    async def _arrived(self, pending: Awaitable[Any]) -> Any:
        """The next bytes of an async stream, or None at its end (once the hash has
        caught up, so judging the end does not block the loop on it)."""
        try:
            data = await pending
        except Exception as err:  # aiohttp ClientPayloadError, reset, timeout
            self._stream_broke(err)
        if not data:
            await self.settled()
            return None
        return data

    async def settled(self) -> None:
        """Wait, without blocking an event loop, for the hash to catch up with
        the bytes given so far: call it before the last `feed` or `finish`."""
        await self._hash.settled()

    def feed(self, data: bytes | bytearray | memoryview, *, stable: bool | None = None) -> None:
        """Push style: any chunking.  Raises as soon as a refusal is certain.
        `stable`: the caller never writes these bytes again (default: only for
        `bytes`), so the hash may read them later instead of a copy."""
        view = _as_bytes(memoryview(data))
        immutable = isinstance(data, bytes) if stable is None else stable
        while view:
            if self._stage in (_Stage.DONE, _Stage.FAILED):
                self._got(view, stable=immutable)  # raises
            if self._stage in (_Stage.MEMORY,):
                target = self._want()
                n = min(len(target), len(view))
                target[:n] = view[:n]
                self._got(target[:n], stable=True)
            else:
                n = len(view) if self._left is None else min(self._left, len(view))
                self._got(view[:n], stable=immutable)
            view = view[n:]

    def finish(self) -> Snapshot:
        """Push style: the upload ended."""
        return self._end()

    # ------------------------------------------------------------ the machine

    def _want(self) -> memoryview:
        """The buffer the next bytes should go to, no larger than the current part needs."""
        stage = self._stage
        if stage is _Stage.FAILED:
            raise self._error  # type: ignore[misc]
        if stage is _Stage.MEMORY:
            assert self._memory is not None and self._left is not None
            n = min(self._left, MEMORY_CHUNK)
            return self._memory[self._memory_offset: self._memory_offset + n]
        if stage in (_Stage.SKIP, _Stage.DRAIN) and (self._left is None or self._left > SMALL_SCRATCH):
            if self._bulk_scratch is None:
                self._bulk_scratch = bytearray(BULK_SCRATCH)
            scratch = memoryview(self._bulk_scratch)
        else:
            scratch = memoryview(self._small_scratch)
        return scratch if self._left is None else scratch[: min(self._left, len(scratch))]

    def _got(self, view: memoryview, stable: bool) -> None:
        """`view` holds the next len(view) bytes of the stream, already in place;
        `stable`: they stay as they are (destination memory, `bytes`)."""
        stage = self._stage
        if stage is _Stage.FAILED:
            raise self._error  # type: ignore[misc]
        if stage is _Stage.DONE:
            self._fail_structure(
                "section", f"bytes follow the snapshot's trailer at offset {self._pos}", drain=False
            )
        n = len(view)
        if stage is not _Stage.MEMORY:
            self._hash.update(view, stable)
        self._pos += n
        if stage is _Stage.DRAIN:
            if self._left is not None:
                self._left -= n
                if self._left == 0:
                    self._judge_drained()
            return
        assert self._left is not None
        self._left -= n
        if stage is _Stage.MEMORY:
            self._memory_written = True
            self._memory_offset += n
            if self._memory_offset - self._memory_hashed >= HASH_STEP or self._left == 0:
                self._hash_memory()
        elif stage in (_Stage.HEADER, _Stage.SECTION_HEAD, _Stage.SMALL, _Stage.TRAILER):
            self._buf += view
        if self._left == 0:
            self._complete()

    def _hash_memory(self) -> None:
        """Hand the memory received since the last call to the hash: the bytes are
        in the destination, contiguous and written once, so no copy is needed."""
        if self._memory is not None and self._memory_offset > self._memory_hashed:
            self._hash.update(self._memory[self._memory_hashed: self._memory_offset], True)
            self._memory_hashed = self._memory_offset

    def _complete(self) -> None:
        stage = self._stage
        data = bytes(self._buf)
        self._buf = bytearray()
        if stage is _Stage.HEADER:
            self._on_header(data)
        elif stage is _Stage.SECTION_HEAD:
            self._on_section_head(data)
        elif stage is _Stage.SMALL:
            self._on_small_section(data)
        elif stage in (_Stage.MEMORY, _Stage.SKIP):
            self._next_section()
        elif stage is _Stage.TRAILER:
            self._on_trailer(data)

    def _enter(self, stage: _Stage, length: int) -> None:
        self._stage, self._left = stage, length
        if length == 0:
            self._complete()

    def _fits(self, length: int) -> bool:
        """Whether `length` more bytes fit before the trailer of a stream of known size."""
        return self._total is None or self._pos + length + TRAILER_SIZE <= self._total

    # ------------------------------------------------------------ parts

    def _on_header(self, data: bytes) -> None:
        magic, h = decode_header(data)
        if magic != MAGIC:
            self._refuse("magic", f"the data is not a K32S snapshot (it starts with {magic!r}, not b'K32S')")
        if h.version != VERSION:
            self._refuse("version", f"the snapshot is K32S version {h.version}; this node reads version {VERSION}")
        if h.flags != 0:
            self._refuse(
                "version",
                f"the snapshot uses flags 0x{h.flags:04X}; this node reads K32S version {VERSION} with flags 0",
            )
        self.header = h
        module = self._module
        if module is not None and h.image_sha256 != bytes(module.image_sha256):
            self._refuse(
                "image",
                f"the snapshot was taken from image sha256:{h.image_sha256.hex()}, "
                f"not from this pod's image sha256:{bytes(module.image_sha256).hex()}",
            )
        if h.memory_pages > MAX_PAGES or h.memory_bytes > h.memory_pages * PAGE_SIZE:
            return self._fail_structure(
                "memory-length",
                f"the snapshot's header gives {h.memory_bytes} bytes of memory in {h.memory_pages} pages "
                f"of 64 KiB, more than those pages hold",
            )
        if module is not None and module.memory_limit_bytes is not None and module.memory_limit_bytes < h.memory_bytes:
            self._refuse(
                "memory-limit",
                f"the pod's memory limit of {module.memory_limit_bytes} bytes is below "
                f"the snapshot's {h.memory_bytes} bytes of memory",
            )
        least = HEADER_SIZE + h.section_count * SECTION_HEAD_SIZE + h.memory_bytes + TRAILER_SIZE
        if self._total is not None and self._total < least:
            return self._fail_structure(
                "section",
                f"the snapshot is {self._total} bytes long, too short for the {h.section_count} sections "
                f"and {h.memory_bytes} bytes of memory its header announces",
            )
        if self._memory_target is not None:
            self._take_memory_target(h)
        self._next_section()

    def _take_memory_target(self, h: Header) -> None:
        target = self._memory_target(h)  # type: ignore[misc]
        view = _as_bytes(memoryview(target))
        if view.readonly:
            raise ValueError("the memory target must be writable")
        if len(view) < h.memory_bytes:
            self._refuse(
                "memory-limit",
                f"the pod's memory holds {len(view)} bytes, below the snapshot's {h.memory_bytes} bytes of memory",
            )
        self._memory = view
        self._prefault = prefault(view[: h.memory_bytes])

    def _next_section(self) -> None:
        assert self.header is not None
        if len(self._sections) < self.header.section_count:
            if not self._fits(SECTION_HEAD_SIZE):
                return self._fail_structure(
                    "section",
                    f"the snapshot's header announces {self.header.section_count} sections, "
                    f"but only {len(self._sections)} fit before its trailer",
                )
            return self._enter(_Stage.SECTION_HEAD, SECTION_HEAD_SIZE)
        if self.header.memory_bytes and not self._memory_seen:
            return self._fail_structure(
                "memory-length",
                f"the snapshot has no memory section, but its header gives {self.header.memory_bytes} bytes of memory",
            )
        # Bytes beyond the trailer (total_size larger than the structure) are
        # judged after the trailer, which tells damage from extra bytes.
        self._enter(_Stage.TRAILER, TRAILER_SIZE)

    def _on_section_head(self, data: bytes) -> None:
        type_, length = SECTION_HEAD_STRUCT.unpack(data)
        number = len(self._sections) + 1
        self._sections.append(SectionInfo(type_, self._pos - SECTION_HEAD_SIZE, length))
        self._section_type = type_
        label = f"section {number} ({section_name(type_)}, type {type_})"
        if not self._fits(length):
            remaining = self._total - self._pos - TRAILER_SIZE  # type: ignore[operator]
            return self._fail_structure(
                "section",
                f"{label} is {length} bytes long, but only {max(remaining, 0)} bytes remain before the trailer"
            )
        if type_ == SECTION_MEMORY:
            return self._on_memory_head(label, length)
        if type_ in (SECTION_GLOBALS, SECTION_TABLE, SECTION_CHANNELS, SECTION_EVENTS):
            most = max_section_length(type_) or MAX_SMALL_SECTION
            if length > most:
                return self._fail_structure(
                    "section", f"{label} is {length} bytes long, more than the {most} bytes its kind holds at most "
                               f"(what one pod can have)")
            return self._enter(_Stage.SMALL, length)
        self._enter(_Stage.SKIP, length)  # a type this reader does not know: skipped, as the format says

    def _on_memory_head(self, label: str, length: int) -> None:
        assert self.header is not None
        if self._memory_seen:
            return self._fail_structure("duplicate-memory", f"{label} is a second memory section")
        self._memory_seen = True
        if length != self.header.memory_bytes:
            return self._fail_structure(
                "memory-length",
                f"the memory section holds {length} bytes, but the snapshot's header gives {self.header.memory_bytes}",
            )
        self._memory_offset = self._memory_hashed = 0
        self._enter(_Stage.MEMORY if self._memory is not None else _Stage.SKIP, length)

    def _on_small_section(self, body: bytes) -> None:
        type_ = self._section_type
        try:
            if type_ == SECTION_GLOBALS:
                if self._globals is not None:
                    raise Malformed("the snapshot has two GLOBALS sections")
                self._globals = decode_globals(body)
            elif type_ == SECTION_TABLE:
                self._on_table(body)
            elif type_ == SECTION_CHANNELS:
                if self._channels is not None:
                    raise Malformed("the snapshot has two CHANNELS sections")
                self._channels = decode_channels(body)
            elif type_ == SECTION_EVENTS:
                if self._events is not None:
                    raise Malformed("the snapshot has two EVENTS sections")
                self._events = decode_events(body)
        except Malformed as err:
            return self._fail_structure("section", str(err))
        self._next_section()

    def _on_table(self, body: bytes) -> None:
        """A TABLE section (Malformed when it is not one).  A table the module cannot
        hold is kept as its index and size only: the module check refuses it after the
        trailer, and building millions of entries first would cost the node for nothing."""
        if len(body) >= TABLE_HEAD_STRUCT.size:
            index, size = TABLE_HEAD_STRUCT.unpack_from(body)
            if index in self._table_sizes:
                raise Malformed(f"the snapshot has two TABLE sections for table {index}")
            if len(self._table_sizes) == MAX_TABLES:
                raise Malformed(f"the snapshot has more than {MAX_TABLES} TABLE sections, "
                                f"the most tables a module may have")
            module = self._module
            if module is not None and (index not in module.tables or not _within(size, module.tables[index])):
                if len(body) != TABLE_HEAD_STRUCT.size + 4 * size:
                    decode_table(body)  # raises: the section's own fault comes first
                self._table_sizes[index] = size
                self._tables.append(TableState(index, ()))
                return
        table = decode_table(body)
        self._table_sizes[table.index] = len(table.entries)
        self._tables.append(table)

    def _on_trailer(self, trailer: bytes) -> None:
        if self._hash.digest() != trailer:
            self._refuse("trailer", DAMAGED)
        if self._total is not None and self._pos != self._total:
            self._refuse(
                "section", f"{self._total - self._pos} bytes follow the snapshot's trailer at offset {self._pos}"
            )
        state = self._state()
        self._check_module(state)
        assert self.header is not None
        self._result = Snapshot(self.header, state, trailer, tuple(self._sections))
        self._stage, self._left = _Stage.DONE, 0
        self._release()

    def _state(self) -> PodState:
        h = self.header
        assert h is not None
        return PodState(
            image_sha256=h.image_sha256, memory_bytes=h.memory_bytes, memory_pages=h.memory_pages,
            pod_time_ms=h.pod_time_ms, unix_time_ms=h.unix_time_ms,
            globals=self._globals or (), tables=tuple(self._tables),
            channels=self._channels or (), events=self._events or (),
        )

    def _check_module(self, state: PodState) -> None:
        module = self._module
        if module is None:
            return
        in_snapshot = {g.index: g.valtype for g in state.globals}
        for index, valtype in in_snapshot.items():
            if index not in module.globals:
                self._refuse(
                    "global", f"global {index} is {valtype_name(valtype)} in the snapshot "
                              f"but the module has no mutable global {index}"
                )
            if module.globals[index] != valtype:
                self._refuse(
                    "global",
                    f"global {index} is {valtype_name(valtype)} in the snapshot but "
                    f"{valtype_name(module.globals[index])} in the module",
                )
        for index, valtype in sorted(module.globals.items()):
            if index not in in_snapshot:
                self._refuse(
                    "global",
                    f"the module's mutable global {index} ({valtype_name(valtype)}) is missing from the snapshot"
                )
        seen = set()
        for table in state.tables:
            seen.add(table.index)
            if table.index not in module.tables:
                self._refuse("table",
                             f"table {table.index} is in the snapshot but the module has no table {table.index}")
            low, high = module.tables[table.index]
            size = self._table_sizes.get(table.index, len(table.entries))
            if size < low:
                self._refuse(
                    "table",
                    f"table {table.index} has {size} entries in the snapshot but the module's needs at least {low}"
                )
            if high is not None and size > high:
                self._refuse(
                    "table",
                    f"table {table.index} has {size} entries in the snapshot but the module's holds at most {high}"
                )
        for index in sorted(set(module.tables) - seen):
            self._refuse("table", f"the module's table {index} is missing from the snapshot")

    # ------------------------------------------------------------ endings

    def _end(self) -> Snapshot:
        """The stream ended (EOF, or finish())."""
        stage = self._stage
        if stage is _Stage.MEMORY:
            self._hash_memory()
        if stage is _Stage.FAILED:
            raise self._error  # type: ignore[misc]
        if stage is _Stage.DONE:
            assert self._result is not None
            return self._result
        if self._total is not None and self._pos < self._total:
            self._refuse("truncated", TRUNCATED)
        if stage is _Stage.DRAIN:
            self._judge_drained()
        # The stream ended inside the structure of a snapshot of unknown size.
        if self._hash.tail_is_trailer():
            self._refuse(
                "section",
                "the snapshot's sections run past its end: its last 32 bytes are a valid trailer at byte "
                f"{self._pos - TRAILER_SIZE}",
            )
        self._refuse("truncated", TRUNCATED)
        raise AssertionError("unreachable")

    def _stream_broke(self, err: Exception) -> None:
        error = SnapshotError(f"{TRUNCATED}: {err or type(err).__name__}", "truncated", self._memory_written)
        self._fail(error)
        raise error from err

    def _fail_structure(self, cause: str, message: str, *, drain: bool = True) -> None:
        """A structural fault: stop writing memory, drain, then judge damage vs fault."""
        error = SnapshotError(message, cause, self._memory_written)
        if not drain:
            self._fail(error)
            raise error
        self._pending = error
        self._memory = None
        self._stop_prefault()
        self._stage = _Stage.DRAIN
        self._left = None if self._total is None else self._total - self._pos
        if self._left is not None and self._left <= 0:
            self._judge_drained()

    def _judge_drained(self) -> None:
        assert self._pending is not None
        if self._hash.tail_is_trailer():
            self._fail(self._pending)
            raise self._pending
        self._refuse("trailer", DAMAGED)

    def _refuse(self, cause: str, message: str) -> None:
        error = SnapshotError(message, cause, self._memory_written)
        self._fail(error)
        raise error

    def _fail(self, error: SnapshotError) -> None:
        self._stage, self._error = _Stage.FAILED, error
        self._release()

    def _stop_prefault(self) -> None:
        if self._prefault is not None:
            self._prefault.set()
            self._prefault = None

    def _release(self) -> None:
        """The side threads end (the hash's worker once its queue is empty), and the
        memory target is let go: it is the pod's memory, and an engine whose memory is
        a bytearray cannot grow it while a view of it lives."""
        self._stop_prefault()
        self._hash.close()
        self._memory = None


def _within(size: int, limits: tuple[int, int | None]) -> bool:
    low, high = limits
    return size >= low and (high is None or size <= high)


async def _chunk(stream: Any) -> bytes:
    data, _end_of_http_chunk = await stream.readchunk()
    return data


def _as_bytes(view: memoryview) -> memoryview:
    if view.ndim != 1 or view.itemsize != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _readinto_from_read(src: Any) -> Callable[[memoryview], int]:
    def readinto(target: memoryview) -> int:
        data = src.read(len(target))
        if not data:
            return 0
        target[: len(data)] = data
        return len(data)

    return readinto
