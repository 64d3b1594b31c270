"""The outer layer of the WebAssembly binary format, read with bounded work: the one
section walk of every reader of modules (the kubelet's :mod:`kube32.wasm.binary`, the
control plane's module store :mod:`kube32.apiserver.images`).  Imports nothing.

A module is at most 64 MiB (the kubelet's pull limit), and whoever hosts an image
chooses its bytes: a reader must cost near the module's size, never a multiple of it.
So, as wasmtime's parser (wasmparser) refuses them, and before anything is built:

* a section id the format does not have (only 0-13 exist), a known section given
  twice or out of the format's order, a custom section without a whole UTF-8 name
  (so a run of zero bytes is no module: it would be millions of empty sections);
* more than :data:`MAX_CUSTOM_SECTIONS` custom sections (skipped in one step each, but
  each is a step of Python);
* a count (of types, imports, functions, exports, ...) over its limit below, or over
  what the bytes left in its section could hold (every entry takes a byte at least),
  so no loop runs past the section's end and no count makes a reader reserve room;
* a name longer than :data:`MAX_NAME` bytes or not UTF-8.

The limits are wasmparser's (``MAX_WASM_*``), which wasmtime applies anyway: a module
within them is one wasmtime would also read.  The walk keeps one entry per known
section (13 at most) and none per custom section.
"""
from __future__ import annotations

from typing import NamedTuple

MAGIC = b"\0asm\x01\0\0\0"

SEC_CUSTOM, SEC_TYPE, SEC_IMPORT, SEC_FUNCTION, SEC_TABLE, SEC_MEMORY = 0, 1, 2, 3, 4, 5
SEC_GLOBAL, SEC_EXPORT, SEC_START, SEC_ELEMENT, SEC_CODE, SEC_DATA = 6, 7, 8, 9, 10, 11
SEC_DATACOUNT, SEC_TAG = 12, 13
# The order known sections must come in (the tag section of exception handling sits
# between memory and global; data count between element and code).
SECTION_ORDER = (SEC_TYPE, SEC_IMPORT, SEC_FUNCTION, SEC_TABLE, SEC_MEMORY, SEC_TAG, SEC_GLOBAL,
                 SEC_EXPORT, SEC_START, SEC_ELEMENT, SEC_DATACOUNT, SEC_CODE, SEC_DATA)
_RANK = {sid: i for i, sid in enumerate(SECTION_ORDER)}

# wasmparser's limits (crates/wasmparser/src/limits.rs), as wasmtime applies them.
MAX_TYPES = 1_000_000
MAX_FUNCTIONS = 1_000_000
MAX_IMPORTS = 100_000
MAX_EXPORTS = 100_000
MAX_GLOBALS = 1_000_000
MAX_ELEMENT_SEGMENTS = 100_000
MAX_DATA_SEGMENTS = 100_000
MAX_TABLES = 100
MAX_MEMORIES = 100
MAX_TAGS = 1_000_000
MAX_PARAMS = 1000
MAX_RESULTS = 1000
MAX_NAME = 100_000                  # bytes of one name (MAX_WASM_STRING_SIZE)
MAX_TABLE_ENTRIES = 10_000_000      # items of one element segment
# A function declaring more locals is refused before any engine allocates them (a few
# bytes of LEB128 can declare billions).
MAX_FUNCTION_LOCALS = 50_000
# Kube32's own: real modules carry a handful (name, producers, target_features, DWARF's
# dozen); each one more is a step of the walk.
MAX_CUSTOM_SECTIONS = 1000


class FormatError(ValueError):
    """The bytes are not a WebAssembly module this reader takes; str() says why."""


class Section(NamedTuple):
    id: int
    head: int       # offset of the section's id byte
    start: int      # offset of its content
    end: int        # offset just past it


class Reader:
    """Bounded reads from ``data[pos:end]``; every read past ``end`` is a FormatError."""

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise FormatError("unexpected end of module")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def peek(self) -> int:
        if self.pos >= self.end:
            raise FormatError("unexpected end of module")
        return self.data[self.pos]

    def bytes(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise FormatError("unexpected end of module")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        if n > self.end - self.pos:
            raise FormatError("unexpected end of module")
        self.pos += n

    def uleb(self) -> int:
        pos = self.pos
        if pos < self.end and self.data[pos] < 0x80:   # one byte: most numbers of a module
            self.pos = pos + 1
            return self.data[pos]
        return self._leb(signed=False)

    def sleb(self) -> int:
        return self._leb(signed=True)

    def _leb(self, signed: bool) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if signed and b & 0x40:
                    result -= 1 << shift
                return result
            if shift > 70:
                raise FormatError("LEB128 number too long")

    def count(self, limit: int, what: str) -> int:
        """A vector's length: at most ``limit``, and at most one entry per byte left."""
        n = self.uleb()
        if n > limit:
            raise FormatError(f"{n} {what}, more than the limit of {limit}")
        if n > self.end - self.pos:
            raise FormatError(f"{n} {what} cannot fit in the {self.end - self.pos} bytes left of their section")
        return n

    def name(self) -> str:
        n = self.uleb()
        if n > MAX_NAME:
            raise FormatError(f"a name of {n} bytes, more than the limit of {MAX_NAME}")
        raw = self.bytes(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("a name is not valid UTF-8") from None


def sections(data: bytes) -> list[Section]:
    """The module's known sections, in order (custom ones checked and skipped)."""
    if data[:8] != MAGIC:
        raise FormatError("not a WebAssembly module (bad magic or version)")
    out: list[Section] = []
    customs = 0
    last = -1
    r = Reader(data, 8)
    while r.pos < r.end:
        head = r.pos
        sid = r.byte()
        size = r.uleb()
        start = r.pos
        if size > r.end - start:
            raise FormatError(f"section {sid} at offset {head} runs past the end of the module")
        r.pos = start + size
        if sid == SEC_CUSTOM:
            customs += 1
            if customs > MAX_CUSTOM_SECTIONS:
                raise FormatError(f"more than {MAX_CUSTOM_SECTIONS} custom sections")
            try:
                Reader(data, start, start + size).name()   # a custom section begins with its name
            except FormatError as e:
                raise FormatError(f"the custom section at offset {head} has no whole name ({e})") from None
            continue
        rank = _RANK.get(sid)
        if rank is None:
            raise FormatError(f"unknown section id {sid} at offset {head}")
        if rank <= last:
            raise FormatError(f"section {sid} at offset {head} is repeated or out of order")
        last = rank
        out.append(Section(sid, head, start, start + size))
    return out
