"""Reading and rewriting the WebAssembly binary format, as far as the pod runtime needs.

``parse`` gives what the runtime checks against the pod ABI and what a snapshot needs
(mutable globals, tables, the functions tables may hold), and bounds what an engine
would allocate for a module before it does (:data:`MAX_FUNCTION_LOCALS`).

wasmtime's embedding API reaches a module's exports only, yet a snapshot must hold
every mutable global (clang's hidden ``__stack_pointer`` above all) and every table.
The wasmtime engine therefore compiles a *rewritten* copy of each module whose export
section lists, besides the original exports, reserved names for the hidden state:

- ``__k32_g<i>``: mutable global ``i`` (index in the module's global index space),
- ``__k32_t<i>``: table ``i``,
- ``__k32_f<i>``: function ``i`` when it can be put in a table (named by an element
  segment); the engine maps funcrefs to these to store tables as function indices,
- ``__k32_memory``: memory 0.

Invariants: every section other than the export section is left byte-identical, so
code and data offsets do not move; the image digest is always the SHA-256 of the
*original* bytes; a module that already uses a reserved name is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAGIC = b"\0asm\x01\0\0\0"
RESERVED_PREFIX = "__k32_"
MEMORY_EXPORT = "__k32_memory"

SEC_TYPE, SEC_IMPORT, SEC_FUNCTION, SEC_TABLE, SEC_MEMORY = 1, 2, 3, 4, 5
SEC_GLOBAL, SEC_EXPORT, SEC_START, SEC_ELEMENT, SEC_CODE, SEC_TAG = 6, 7, 8, 9, 10, 13
# As wasmtime's: a function declaring more locals is refused before any engine
# allocates them (a few bytes of LEB128 can declare billions).
MAX_FUNCTION_LOCALS = 50_000
KIND_FUNC, KIND_TABLE, KIND_MEMORY, KIND_GLOBAL = 0, 1, 2, 3
I32, I64, F32, F64, FUNCREF = 0x7F, 0x7E, 0x7D, 0x7C, 0x70   # value types

# Sections that must come before the export section (the binary format fixes the order).
_BEFORE_EXPORT = {SEC_TYPE, SEC_IMPORT, SEC_FUNCTION, SEC_TABLE, SEC_MEMORY, SEC_TAG, SEC_GLOBAL}


class BinaryError(ValueError):
    """The bytes are not a WebAssembly module this runtime can read."""


@dataclass(frozen=True)
class FuncSig:
    params: tuple[int, ...]
    results: tuple[int, ...]


@dataclass
class ModuleInfo:
    types: list[FuncSig] = field(default_factory=list)
    imports: list[tuple[str, str, int, object]] = field(default_factory=list)  # (module, name, kind, desc)
    func_types: list[int] = field(default_factory=list)          # type index per function (imports first)
    imported_funcs: int = 0
    imported_globals: int = 0
    imported_tables: int = 0
    imported_memories: int = 0
    mutable_globals: dict[int, int] = field(default_factory=dict)   # index -> valtype
    tables: dict[int, tuple[int, int, int | None]] = field(default_factory=dict)  # index -> (reftype, min, max)
    memory: tuple[int, int | None] | None = None                    # memory 0: (min pages, max pages)
    exports: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (kind, index)
    table_funcs: set[int] = field(default_factory=set)              # functions an element segment names

    def signature_of_export(self, name: str) -> FuncSig | None:
        kind_index = self.exports.get(name)
        if kind_index is None or kind_index[0] != KIND_FUNC:
            return None
        return self.types[self.func_types[kind_index[1]]]


class _Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise BinaryError("unexpected end of module")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def bytes(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise BinaryError("unexpected end of module")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uleb(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result
            if shift > 70:
                raise BinaryError("LEB128 number too long")

    def sleb(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if b & 0x40:
                    result -= 1 << shift
                return result
            if shift > 70:
                raise BinaryError("LEB128 number too long")

    def name(self) -> str:
        raw = self.bytes(self.uleb())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BinaryError("a name is not valid UTF-8") from exc

    def limits(self) -> tuple[int, int | None]:
        flags = self.byte()
        if flags & ~0x07:
            raise BinaryError(f"unknown limits flags {flags:#x}")
        low = self.uleb()
        high = self.uleb() if flags & 0x01 else None
        return low, high

    def const_expr(self, refs: set[int] | None = None) -> None:
        """Skip a constant expression, noting ref.func targets in *refs*."""
        while True:
            op = self.byte()
            if op == 0x0B:
                return
            if op in (0x41, 0x42):
                self.sleb()
            elif op == 0x43:
                self.bytes(4)
            elif op == 0x44:
                self.bytes(8)
            elif op == 0x23:
                self.uleb()
            elif op == 0xD0:
                self.sleb()
            elif op == 0xD2:
                index = self.uleb()
                if refs is not None:
                    refs.add(index)
            elif op in (0x6A, 0x6B, 0x6C, 0x7C, 0x7D, 0x7E):
                pass
            else:
                raise BinaryError(f"unsupported opcode {op:#x} in a constant expression")


def _sections(data: bytes) -> list[tuple[int, int, int, int]]:
    """(id, start of section header, start of content, end) for each section."""
    if data[:8] != MAGIC:
        raise BinaryError("not a WebAssembly module (bad magic or version)")
    out = []
    r = _Reader(data, 8)
    while r.pos < len(data):
        head = r.pos
        sid = r.byte()
        size = r.uleb()
        start = r.pos
        if start + size > len(data):
            raise BinaryError(f"section {sid} runs past the end of the module")
        out.append((sid, head, start, start + size))
        r.pos = start + size
    return out


def parse(data: bytes) -> ModuleInfo:
    info = ModuleInfo()
    for sid, _head, start, end in _sections(data):
        r = _Reader(data, start, end)
        if sid == SEC_TYPE:
            _parse_types(r, info)
        elif sid == SEC_IMPORT:
            _parse_imports(r, info)
        elif sid == SEC_FUNCTION:
            info.func_types.extend(r.uleb() for _ in range(r.uleb()))
        elif sid == SEC_TABLE:
            for _ in range(r.uleb()):
                index = info.imported_tables + len(info.tables)
                info.tables[index] = _table_type(r, with_init=True)
        elif sid == SEC_MEMORY:
            count = r.uleb()
            if count and info.memory is None:
                info.memory = r.limits()
        elif sid == SEC_GLOBAL:
            _parse_globals(r, info)
        elif sid == SEC_EXPORT:
            for _ in range(r.uleb()):
                name = r.name()
                kind = r.byte()
                info.exports[name] = (kind, r.uleb())
        elif sid == SEC_ELEMENT:
            _parse_elements(r, info)
        elif sid == SEC_CODE:
            _check_locals(r)
    return info


def _parse_types(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.uleb()):
        form = r.byte()
        if form != 0x60:
            raise BinaryError(f"unsupported type form {form:#x}")
        params = tuple(r.byte() for _ in range(r.uleb()))
        results = tuple(r.byte() for _ in range(r.uleb()))
        info.types.append(FuncSig(params, results))


def _table_type(r: _Reader, with_init: bool = False) -> tuple[int, int, int | None]:
    if with_init and r.data[r.pos] == 0x40:
        r.byte(), r.byte()
        reftype = r.byte()
        low, high = r.limits()
        r.const_expr()
        return reftype, low, high
    reftype = r.byte()
    low, high = r.limits()
    return reftype, low, high


def _parse_imports(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.uleb()):
        module, name, kind = r.name(), r.name(), r.byte()
        desc: object
        if kind == KIND_FUNC:
            desc = r.uleb()
            info.func_types.append(desc)
            info.imported_funcs += 1
        elif kind == KIND_TABLE:
            desc = _table_type(r)
            info.imported_tables += 1
        elif kind == KIND_MEMORY:
            desc = r.limits()
            info.imported_memories += 1
        elif kind == KIND_GLOBAL:
            desc = (r.byte(), r.byte())
            info.imported_globals += 1
        elif kind == 4:
            desc = (r.byte(), r.uleb())
        else:
            raise BinaryError(f"unknown import kind {kind}")
        info.imports.append((module, name, kind, desc))


def _parse_globals(r: _Reader, info: ModuleInfo) -> None:
    for i in range(r.uleb()):
        valtype, mutable = r.byte(), r.byte()
        r.const_expr(info.table_funcs)
        if mutable:
            info.mutable_globals[info.imported_globals + i] = valtype


def _parse_elements(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.uleb()):
        flags = r.uleb()
        if flags > 7:
            raise BinaryError(f"unknown element segment flags {flags}")
        if flags & 0x02 and not flags & 0x01:
            r.uleb()                        # explicit table index
        if not flags & 0x01:
            r.const_expr()                  # active: offset expression
        if flags & 0x03:
            r.byte()                        # elemkind or reftype
        count = r.uleb()
        if flags & 0x04:
            for _ in range(count):
                r.const_expr(info.table_funcs)
        else:
            info.table_funcs.update(r.uleb() for _ in range(count))


def _check_locals(r: _Reader) -> None:
    for index in range(r.uleb()):
        end = r.uleb()
        end += r.pos
        total = 0
        for _ in range(r.uleb()):
            total += r.uleb()
            r.byte()                        # the value type
            if total > MAX_FUNCTION_LOCALS:
                raise BinaryError(f"function body {index} declares more than {MAX_FUNCTION_LOCALS} locals")
        if end > r.end:
            raise BinaryError(f"function body {index} runs past the end of the code section")
        r.pos = end


def _uleb_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")
    return _uleb_bytes(len(raw)) + raw


def reserved_exports(info: ModuleInfo) -> list[tuple[str, int, int]]:
    extra = [(f"__k32_g{i}", KIND_GLOBAL, i) for i in sorted(info.mutable_globals)]
    extra += [(f"__k32_t{i}", KIND_TABLE, i) for i in sorted(info.tables)]
    extra += [(f"__k32_f{i}", KIND_FUNC, i) for i in sorted(info.table_funcs)]
    if info.memory is not None and info.imported_memories == 0:
        extra.append((MEMORY_EXPORT, KIND_MEMORY, 0))
    return extra


def add_exports(data: bytes, extra: list[tuple[str, int, int]]) -> bytes:
    """Return *data* with *extra* appended to its export section (created if absent)."""
    if not extra:
        return data
    sections = _sections(data)
    addition = b"".join(_name_bytes(n) + bytes([k]) + _uleb_bytes(i) for n, k, i in extra)
    for sid, head, start, end in sections:
        if sid == SEC_EXPORT:
            r = _Reader(data, start, end)
            count = r.uleb()
            body = _uleb_bytes(count + len(extra)) + data[r.pos:end] + addition
            return data[:head] + bytes([SEC_EXPORT]) + _uleb_bytes(len(body)) + body + data[end:]
    insert_at = 8
    for sid, _head, _start, end in sections:
        if sid in _BEFORE_EXPORT:
            insert_at = end
    body = _uleb_bytes(len(extra)) + addition
    return data[:insert_at] + bytes([SEC_EXPORT]) + _uleb_bytes(len(body)) + body + data[insert_at:]
