"""K32S v1: constants, value types and the codecs of the small parts.

Layout (all numbers little-endian, no pointer-sized field, so the same bytes
restore on the ESP32-S3, arm64 and x86_64):

    header   68 bytes  "K32S", u16 version, u16 flags (0), image SHA-256 (32),
                       u32 memory bytes, u32 memory pages, u64 pod time ms,
                       u64 Unix time ms (0 = node clock unset), u32 section count
    section  u16 type, u32 length, `length` bytes       (section count times)
    trailer  32 bytes  SHA-256 of every byte before it

Section types: 1 MEMORY (the linear memory, `memory bytes` long), 2 GLOBALS
(u32 index, u8 value type, u64 bits per mutable global), 3 TABLE (u32 index,
u32 size, u32 function index per entry, 0xFFFFFFFF = null; one per table),
4 CHANNELS (u32 handle, u16 name length, UTF-8 name), 5 EVENTS (u16 topic
length, UTF-8 topic, u32 payload length, payload).  A reader skips types it
does not know.

Bounds (below, MAX_*): a snapshot holds no more than one pod can have - 16 channels
under distinct handles 1..2^31-1 with names of 1-255 bytes (the pod ABI's
kube32_channel_open), 1024 queued events of 1 MiB of topics and payloads together (a
pod's queue), 100,000 mutable globals and 100 tables (what a module may declare).  A
snapshot is its uploader's data (``edit`` may PUT checkpoints/data), and the node
builds something per entry of these sections: the decoders refuse more (`Malformed`)
before they build it, and the reader refuses a section longer than its kind's most
(`max_section_length`) at its head, before buffering it.

Invariants kept here:
- `memory_bytes <= memory_pages * 65536` (bytes may be fewer: a pod whose limit
  is below one page has one page with only the limit backed), never more.
- Encoding is canonical: `decode_*(encode_*(x)) == x` and the reverse for any
  well-formed bytes, so a snapshot read and written again is byte-identical.
- Decoders raise `Malformed` (internal) on bad bytes and never anything else;
  the reader turns that into a `SnapshotError` once it knows whether the
  bytes were damaged (trailer mismatch) or written inconsistently.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAGIC = b"K32S"
VERSION = 1
HEADER_SIZE = 68
TRAILER_SIZE = 32
SECTION_HEAD_SIZE = 6
PAGE_SIZE = 65536
MAX_PAGES = 65536  # wasm32: 4 GiB of linear memory at most

SECTION_MEMORY = 1
SECTION_GLOBALS = 2
SECTION_TABLE = 3
SECTION_CHANNELS = 4
SECTION_EVENTS = 5
SECTION_NAMES = {
    SECTION_MEMORY: "MEMORY",
    SECTION_GLOBALS: "GLOBALS",
    SECTION_TABLE: "TABLE",
    SECTION_CHANNELS: "CHANNELS",
    SECTION_EVENTS: "EVENTS",
}

VALTYPE_I32 = 0x7F
VALTYPE_I64 = 0x7E
VALTYPE_F32 = 0x7D
VALTYPE_F64 = 0x7C
VALTYPE_FUNCREF = 0x70
VALTYPE_NAMES = {
    VALTYPE_I32: "i32",
    VALTYPE_I64: "i64",
    VALTYPE_F32: "f32",
    VALTYPE_F64: "f64",
    VALTYPE_FUNCREF: "funcref",
}
NULL_FUNC = 0xFFFFFFFF

HEADER_STRUCT = struct.Struct("<4sHH32sIIQQI")
SECTION_HEAD_STRUCT = struct.Struct("<HI")
GLOBAL_STRUCT = struct.Struct("<IBQ")
TABLE_HEAD_STRUCT = struct.Struct("<II")
CHANNEL_HEAD_STRUCT = struct.Struct("<IH")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")

assert HEADER_STRUCT.size == HEADER_SIZE

# Bounds of K32S v1: what one pod can have (see the module docstring).  The pod ABI
# (kube32.wasm.abi, kube32.wasm.hostcalls), the pod's event queue (kube32.wasm.pod) and
# the module reader (kube32.wasm.binary) take theirs from here, so nothing a pod can
# hold is refused on restore.
MAX_CHANNELS = 16              # open channels of a pod (kube32_channel_open: K32_ENOSPC beyond)
MAX_CHANNEL_NAME = 255         # bytes of a channel name (kube32_channel_open: K32_EINVAL beyond)
MAX_CHANNEL_HANDLE = 0x7FFFFFFF  # a handle is a positive i32: negative ones are the ABI's errors
MAX_EVENTS = 1024              # events a pod's queue holds, so a snapshot carries at most
MAX_EVENT_BYTES = 1 << 20      # bytes of their topics and payloads together
MAX_GLOBALS = 100_000          # mutable globals of a module (kube32.wasm.binary refuses more)
MAX_TABLES = 100               # tables of a module (wasmparser's MAX_WASM_TABLES, kube32.wasmformat)

# Refusal causes (SnapshotError.cause).
CAUSES = (
    "magic", "version", "image", "memory-limit", "global", "table",
    "trailer", "truncated", "section", "memory-length", "duplicate-memory",
)


class SnapshotError(Exception):
    """A snapshot was refused.  `str(err)` names the cause in words that read
    well after "cannot restore the snapshot: "; `cause` is a short code (see
    CAUSES); `memory_written` tells the caller that bytes already went into
    the memory target, so the instance behind it must be discarded."""

    def __init__(self, message: str, cause: str, memory_written: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause
        self.memory_written = memory_written

    def __repr__(self) -> str:
        return f"SnapshotError({self.message!r}, cause={self.cause!r}, memory_written={self.memory_written})"


class Malformed(Exception):
    """Internal: bytes that do not parse. Never escapes the package."""


@dataclass(frozen=True)
class Header:
    version: int
    flags: int
    image_sha256: bytes
    memory_bytes: int
    memory_pages: int
    pod_time_ms: int
    unix_time_ms: int
    section_count: int


@dataclass(frozen=True)
class GlobalState:
    index: int
    valtype: int
    bits: int


@dataclass(frozen=True)
class TableState:
    index: int
    entries: tuple[int, ...]  # function indices, NULL_FUNC for null


@dataclass(frozen=True)
class ChannelState:
    handle: int
    name: str


@dataclass(frozen=True)
class HeldEvent:
    topic: str
    payload: bytes


@dataclass(frozen=True)
class PodState:
    """Everything a snapshot holds but the memory bytes."""

    image_sha256: bytes
    memory_bytes: int
    memory_pages: int
    pod_time_ms: int
    unix_time_ms: int
    globals: tuple[GlobalState, ...] = ()
    tables: tuple[TableState, ...] = ()
    channels: tuple[ChannelState, ...] = ()
    events: tuple[HeldEvent, ...] = ()


@dataclass(frozen=True)
class SectionInfo:
    """Where a section sat in the snapshot (for tools such as inspect)."""

    type: int
    offset: int  # of its 6-byte section head
    length: int  # of its body


@dataclass(frozen=True)
class Snapshot:
    header: Header
    state: PodState
    sha256: bytes  # the trailer
    sections: tuple[SectionInfo, ...] = field(default=())

    @property
    def total_size(self) -> int:
        body = sum(SECTION_HEAD_SIZE + s.length for s in self.sections)
        return HEADER_SIZE + body + TRAILER_SIZE


# ---------------------------------------------------------------- header


def encode_header(h: Header) -> bytes:
    return HEADER_STRUCT.pack(
        MAGIC, h.version, h.flags, h.image_sha256, h.memory_bytes, h.memory_pages,
        h.pod_time_ms, h.unix_time_ms, h.section_count,
    )


def decode_header(data: bytes | bytearray | memoryview) -> tuple[bytes, Header]:
    """Returns (magic, header); the caller judges the magic and version."""
    magic, version, flags, image, mem_bytes, pages, pod_ms, unix_ms, count = HEADER_STRUCT.unpack(data)
    return magic, Header(version, flags, bytes(image), mem_bytes, pages, pod_ms, unix_ms, count)


def section_head(type_: int, length: int) -> bytes:
    return SECTION_HEAD_STRUCT.pack(type_, length)


# ---------------------------------------------------------------- sections


def encode_globals(globals_: tuple[GlobalState, ...]) -> bytes:
    out = bytearray()
    for g in globals_:
        if g.valtype not in VALTYPE_NAMES:
            raise ValueError(f"global {g.index} has unknown value type 0x{g.valtype:02X}")
        out += GLOBAL_STRUCT.pack(g.index, g.valtype, g.bits)
    return bytes(out)


def max_section_length(type_: int) -> int | None:
    """The most bytes a section of this small kind can hold within the bounds; None:
    not one of the bounded kinds (MEMORY, TABLE and unknown types have other limits)."""
    if type_ == SECTION_CHANNELS:
        return MAX_CHANNELS * (U32.size + U16.size + MAX_CHANNEL_NAME)
    if type_ == SECTION_EVENTS:
        return MAX_EVENTS * (U16.size + U32.size) + MAX_EVENT_BYTES
    if type_ == SECTION_GLOBALS:
        return MAX_GLOBALS * GLOBAL_STRUCT.size
    return None


def decode_globals(body: bytes) -> tuple[GlobalState, ...]:
    if len(body) % GLOBAL_STRUCT.size:
        raise Malformed(f"the GLOBALS section is {len(body)} bytes, not a multiple of {GLOBAL_STRUCT.size}")
    if len(body) // GLOBAL_STRUCT.size > MAX_GLOBALS:
        raise Malformed(f"the GLOBALS section holds {len(body) // GLOBAL_STRUCT.size} globals, "
                        f"more than the {MAX_GLOBALS} mutable globals a module may have")
    out = []
    seen: set[int] = set()
    for index, valtype, bits in GLOBAL_STRUCT.iter_unpack(body):
        if valtype not in VALTYPE_NAMES:
            raise Malformed(f"global {index} has unknown value type 0x{valtype:02X}")
        if index in seen:
            raise Malformed(f"global {index} appears twice")
        seen.add(index)
        out.append(GlobalState(index, valtype, bits))
    return tuple(out)


def encode_table(t: TableState) -> bytes:
    return TABLE_HEAD_STRUCT.pack(t.index, len(t.entries)) + struct.pack(f"<{len(t.entries)}I", *t.entries)


def decode_table(body: bytes) -> TableState:
    if len(body) < TABLE_HEAD_STRUCT.size:
        raise Malformed(f"a TABLE section of {len(body)} bytes is shorter than its 8-byte head")
    index, size = TABLE_HEAD_STRUCT.unpack_from(body)
    if len(body) != TABLE_HEAD_STRUCT.size + 4 * size:
        raise Malformed(f"table {index} declares {size} entries but its section holds {len(body) - 8} bytes of them")
    return TableState(index, struct.unpack_from(f"<{size}I", body, TABLE_HEAD_STRUCT.size))


def _encode_name(name: str, what: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"{what} {name[:40]!r}... is longer than 65535 bytes")
    return U16.pack(len(raw)) + raw


def _decode_name(body: bytes, pos: int, what: str) -> tuple[str, int]:
    if pos + 2 > len(body):
        raise Malformed(f"a {what} length runs past the end of its section")
    (n,) = U16.unpack_from(body, pos)
    pos += 2
    if pos + n > len(body):
        raise Malformed(f"a {what} of {n} bytes runs past the end of its section")
    try:
        return body[pos:pos + n].decode("utf-8"), pos + n
    except UnicodeDecodeError:
        raise Malformed(f"a {what} is not valid UTF-8") from None


def encode_channels(channels: tuple[ChannelState, ...]) -> bytes:
    return b"".join(U32.pack(c.handle) + _encode_name(c.name, "channel name") for c in channels)


def decode_channels(body: bytes) -> tuple[ChannelState, ...]:
    """The channels, each one a pod could have open: at most MAX_CHANNELS, distinct
    handles 1..MAX_CHANNEL_HANDLE, names of 1..MAX_CHANNEL_NAME bytes (checked entry by
    entry, so more entries than a pod can open are refused before they are built)."""
    out: list[ChannelState] = []
    handles: set[int] = set()
    pos = 0
    while pos < len(body):
        if len(out) == MAX_CHANNELS:
            raise Malformed(f"the CHANNELS section holds more than {MAX_CHANNELS} channels, "
                            f"the most a pod can have open")
        if pos + 4 > len(body):
            raise Malformed("a channel handle runs past the end of the CHANNELS section")
        (handle,) = U32.unpack_from(body, pos)
        if not 1 <= handle <= MAX_CHANNEL_HANDLE:
            raise Malformed(f"channel handle {handle} is not one a pod can have (1 to {MAX_CHANNEL_HANDLE})")
        if handle in handles:
            raise Malformed(f"channel handle {handle} appears twice in the CHANNELS section")
        start = pos + 4
        name, pos = _decode_name(body, start, "channel name")
        size = pos - start - U16.size
        if not 1 <= size <= MAX_CHANNEL_NAME:
            raise Malformed(f"the name of channel {handle} is {size} bytes long; a channel name has "
                            f"1 to {MAX_CHANNEL_NAME} bytes")
        handles.add(handle)
        out.append(ChannelState(handle, name))
    return tuple(out)


def encode_events(events: tuple[HeldEvent, ...]) -> bytes:
    return b"".join(
        _encode_name(e.topic, "event topic") + U32.pack(len(e.payload)) + bytes(e.payload) for e in events
    )


def decode_events(body: bytes) -> tuple[HeldEvent, ...]:
    """The queued events: at most MAX_EVENTS, their topics and payloads MAX_EVENT_BYTES
    together (as a pod's queue holds them)."""
    out: list[HeldEvent] = []
    pos = 0
    while pos < len(body):
        if len(out) == MAX_EVENTS:
            raise Malformed(f"the EVENTS section holds more than {MAX_EVENTS} events, the most a pod's queue holds")
        topic, pos = _decode_name(body, pos, "event topic")
        if pos + 4 > len(body):
            raise Malformed(f"the payload length of an event on {topic!r} runs past the end of the EVENTS section")
        (n,) = U32.unpack_from(body, pos)
        pos += 4
        if pos + n > len(body):
            raise Malformed(f"the {n}-byte payload of an event on {topic!r} runs past the end of the EVENTS section")
        out.append(HeldEvent(topic, bytes(body[pos:pos + n])))
        pos += n
    held = sum(len(e.topic.encode()) + len(e.payload) for e in out)
    if held > MAX_EVENT_BYTES:
        raise Malformed(f"the EVENTS section's topics and payloads are {held} bytes, more than the "
                        f"{MAX_EVENT_BYTES} bytes a pod's queue holds")
    return tuple(out)


def valtype_name(valtype: int) -> str:
    return VALTYPE_NAMES.get(valtype, f"0x{valtype:02X}")


def section_name(type_: int) -> str:
    return SECTION_NAMES.get(type_, "unknown")
