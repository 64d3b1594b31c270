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

Bounded: the section walk, the counts and the names are :mod:`kube32.wasmformat`'s
(wasmparser's limits; unknown, repeated or misordered sections and nameless custom
sections refused), and what is kept costs a few bytes per byte of module at most:
function types are read when asked (an offset kept per type, in a copy of the type
section), type indices live in an ``array``, and the rest is capped by the export
limit, since every mutable global, table and function a table may hold becomes an
export of the rewritten module (:data:`~kube32.wasmformat.MAX_EXPORTS` in all).  An
index that names nothing (a type, a function) is refused here, not met later.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable

from .. import leb128
from .. import snapshot as k32s
from .. import wasmformat as wf
from ..wasmformat import MAGIC, SEC_CODE, SEC_ELEMENT, SEC_EXPORT, SEC_FUNCTION, SEC_GLOBAL, SEC_IMPORT
from ..wasmformat import SEC_MEMORY, SEC_TABLE, SEC_TAG, SEC_TYPE

__all__ = ["MAGIC", "BinaryError", "FuncSig", "FuncTypes", "ModuleInfo", "parse", "reserved_exports",
           "add_exports"]

RESERVED_PREFIX = "__k32_"
MEMORY_EXPORT = "__k32_memory"

MAX_FUNCTION_LOCALS = wf.MAX_FUNCTION_LOCALS
KIND_FUNC, KIND_TABLE, KIND_MEMORY, KIND_GLOBAL, KIND_TAG = 0, 1, 2, 3, 4
I32, I64, F32, F64, V128, FUNCREF, EXTERNREF = 0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F   # value types
_VALTYPES = bytes((I32, I64, F32, F64, V128, FUNCREF, EXTERNREF))

# Sections that must come before the export section (the binary format fixes the order).
_BEFORE_EXPORT = {SEC_TYPE, SEC_IMPORT, SEC_FUNCTION, SEC_TABLE, SEC_MEMORY, SEC_TAG, SEC_GLOBAL}

# The reader's refusal is this module's: one error for "not a module this runtime reads".
BinaryError = wf.FormatError


@dataclass(frozen=True, slots=True)
class FuncSig:
    params: tuple[int, ...]
    results: tuple[int, ...]


class FuncTypes:
    """The type section's function types, each read when asked: a module of 3-byte types
    costs an offset (8 bytes) per type here, not an object of a hundred."""

    def __init__(self, section: bytes = b"", offsets: array[int] | None = None) -> None:
        self._section = section
        self._offsets = offsets if offsets is not None else array("Q")

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> FuncSig:
        r = _Reader(self._section, self._offsets[index])
        r.byte()                                        # 0x60, checked by parse
        params = tuple(r.bytes(r.uleb()))
        return FuncSig(params, tuple(r.bytes(r.uleb())))


@dataclass
class ModuleInfo:
    types: FuncTypes = field(default_factory=FuncTypes)
    imports: list[tuple[str, str, int, object]] = field(default_factory=list)  # (module, name, kind, desc)
    func_types: array[int] = field(default_factory=lambda: array("L"))  # type index per function (imports first)
    imported_funcs: int = 0
    imported_globals: int = 0
    imported_tables: int = 0
    imported_memories: int = 0
    globals: int = 0                                                # all, imported ones included
    memories: int = 0                                               # all, imported ones included
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

    def reserved_count(self) -> int:
        """How many exports the rewritten module adds (:func:`reserved_exports`)."""
        own_memory = self.memory is not None and self.imported_memories == 0
        return len(self.mutable_globals) + len(self.tables) + len(self.table_funcs) + own_memory


class _Reader(wf.Reader):
    def valtype(self) -> int:
        t = self.byte()
        if t not in _VALTYPES:
            raise BinaryError(f"unsupported value type {t:#x}")
        return t

    def valtypes(self, limit: int, what: str) -> bytes:
        raw = self.bytes(self.count(limit, what))
        if raw.translate(None, _VALTYPES):
            raise BinaryError(f"unsupported value type among the {what}")
        return raw

    def limits(self) -> tuple[int, int | None]:
        flags = self.byte()
        if flags & ~0x07:
            raise BinaryError(f"unknown limits flags {flags:#x}")
        low = self.uleb()
        high = self.uleb() if flags & 0x01 else None
        return low, high

    def const_expr(self, refs: set[int] | None = None) -> None:
        """Skip a constant expression, noting ref.func targets in *refs*: the MVP's
        constants, ``global.get``, references, extended-const arithmetic and SIMD's
        ``v128.const`` (a valid module's v128 global is initialised by nothing else)."""
        while True:
            op = self.byte()
            if op == 0x0B:
                return
            if op in (0x41, 0x42):
                self.sleb()
            elif op == 0x43:
                self.skip(4)
            elif op == 0x44:
                self.skip(8)
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
            elif op == 0xFD:                # SIMD's prefix: v128.const is its one constant
                sub = self.uleb()
                if sub != 0x0C:
                    raise BinaryError(f"SIMD opcode 0xfd {sub:#x} is not constant (only v128.const is)")
                self.skip(16)
            else:
                raise BinaryError(f"unsupported opcode {op:#x} in a constant expression")


def parse(data: bytes) -> ModuleInfo:
    info = ModuleInfo()
    sections = wf.sections(data)
    for section in sections:
        reader = _PARSERS.get(section.id)
        if reader is not None:
            r = _Reader(data, section.start, section.end)
            reader(r, info)
            if r.pos != r.end:
                raise BinaryError(f"section {section.id} has {r.end - r.pos} bytes after its content")
    if len(info.func_types) > info.imported_funcs and SEC_CODE not in {s.id for s in sections}:
        raise BinaryError("function and code section have inconsistent lengths")
    _check_funcs(info, info.table_funcs, "a constant expression")
    if len(info.exports) + info.reserved_count() > wf.MAX_EXPORTS:
        raise BinaryError(f"{len(info.exports)} exports and {info.reserved_count()} for its hidden state "
                          f"(mutable globals, tables, functions a table may hold) are more than the "
                          f"limit of {wf.MAX_EXPORTS} exports")
    return info


def _check_funcs(info: ModuleInfo, indices: set[int], where: str) -> None:
    """``indices`` name functions that exist, and few enough to export (each one is)."""
    if len(indices) > wf.MAX_EXPORTS:
        raise BinaryError(f"{where} name more than {wf.MAX_EXPORTS} functions a table may hold")
    if indices and max(indices) >= len(info.func_types):
        raise BinaryError(f"{where} names function {max(indices)}, which does not exist")


def _parse_types(r: _Reader, info: ModuleInfo) -> None:
    start = r.pos
    offsets: array[int] = array("Q")
    for _ in range(r.count(wf.MAX_TYPES, "types")):
        offsets.append(r.pos - start)
        form = r.byte()
        if form != 0x60:
            raise BinaryError(f"unsupported type form {form:#x}")
        r.valtypes(wf.MAX_PARAMS, "parameters")
        r.valtypes(wf.MAX_RESULTS, "results")
    info.types = FuncTypes(r.data[start:r.end], offsets)


def _type_index(r: _Reader, info: ModuleInfo) -> int:
    index = r.uleb()
    if index >= len(info.types):
        raise BinaryError(f"type {index} does not exist")
    return index


def _table_type(r: _Reader, with_init: bool = False) -> tuple[int, int, int | None]:
    if with_init and r.peek() == 0x40:
        r.byte(), r.byte()
        reftype = r.valtype()
        low, high = r.limits()
        r.const_expr()
        return reftype, low, high
    reftype = r.valtype()
    low, high = r.limits()
    return reftype, low, high


def _parse_imports(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.count(wf.MAX_IMPORTS, "imports")):
        module, name, kind = r.name(), r.name(), r.byte()
        desc: object
        if kind == KIND_FUNC:
            desc = _type_index(r, info)
            info.func_types.append(desc)
            info.imported_funcs += 1
        elif kind == KIND_TABLE:
            desc = _table_type(r)
            info.imported_tables += 1
        elif kind == KIND_MEMORY:
            desc = r.limits()
            info.imported_memories += 1
        elif kind == KIND_GLOBAL:
            desc = (r.valtype(), r.byte())
            info.imported_globals += 1
        elif kind == KIND_TAG:
            desc = (r.byte(), _type_index(r, info))
        else:
            raise BinaryError(f"unknown import kind {kind}")
        info.imports.append((module, name, kind, desc))
    info.globals, info.memories = info.imported_globals, info.imported_memories
    if info.imported_tables > wf.MAX_TABLES or info.imported_memories > wf.MAX_MEMORIES:
        raise BinaryError(f"more than {wf.MAX_TABLES} tables or {wf.MAX_MEMORIES} memories")


def _parse_functions(r: _Reader, info: ModuleInfo) -> None:
    count = r.count(wf.MAX_FUNCTIONS - info.imported_funcs, "functions")
    head = r.data[r.pos:r.pos + count]
    if len(head) == count and (not head or max(head) < min(0x80, len(info.types))):
        # The common case (type indices below 128: one byte each), read at C speed.
        info.func_types.extend(head)
        r.pos += count
        return
    for _ in range(count):
        info.func_types.append(_type_index(r, info))


def _parse_tables(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.count(wf.MAX_TABLES - info.imported_tables, "tables")):
        index = info.imported_tables + len(info.tables)
        info.tables[index] = _table_type(r, with_init=True)


def _parse_memories(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.count(wf.MAX_MEMORIES - info.imported_memories, "memories")):
        limits = r.limits()
        if info.memory is None:
            info.memory = limits
        info.memories += 1


def _parse_globals(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.count(wf.MAX_GLOBALS - info.imported_globals, "globals")):
        valtype, mutable = r.valtype(), r.byte()
        r.const_expr(info.table_funcs)
        if len(info.table_funcs) > wf.MAX_EXPORTS:
            raise BinaryError(f"globals name more than {wf.MAX_EXPORTS} functions a table may hold")
        if mutable:
            info.mutable_globals[info.globals] = valtype
            if len(info.mutable_globals) > k32s.MAX_GLOBALS:   # what a snapshot carries at most
                raise BinaryError(f"more than {k32s.MAX_GLOBALS} mutable globals")
        info.globals += 1


def _parse_exports(r: _Reader, info: ModuleInfo) -> None:
    limits = {KIND_FUNC: len(info.func_types), KIND_TABLE: info.imported_tables + len(info.tables),
              KIND_MEMORY: info.memories, KIND_GLOBAL: info.globals}
    for _ in range(r.count(wf.MAX_EXPORTS, "exports")):
        name = r.name()
        kind, index = r.byte(), r.uleb()
        if kind > KIND_TAG:
            raise BinaryError(f"unknown export kind {kind}")
        if index >= limits.get(kind, index + 1):
            raise BinaryError(f"export {name} names {_KIND_NAMES[kind]} {index}, which does not exist")
        if name in info.exports:
            raise BinaryError(f"duplicate export name {name}")
        info.exports[name] = (kind, index)


_KIND_NAMES = {KIND_FUNC: "function", KIND_TABLE: "table", KIND_MEMORY: "memory", KIND_GLOBAL: "global",
               KIND_TAG: "tag"}


def _parse_elements(r: _Reader, info: ModuleInfo) -> None:
    for _ in range(r.count(wf.MAX_ELEMENT_SEGMENTS, "element segments")):
        flags = r.uleb()
        if flags > 7:
            raise BinaryError(f"unknown element segment flags {flags}")
        if flags & 0x02 and not flags & 0x01:
            r.uleb()                        # explicit table index
        if not flags & 0x01:
            r.const_expr()                  # active: offset expression
        if flags & 0x03:
            r.byte()                        # elemkind or reftype
        count = r.count(wf.MAX_TABLE_ENTRIES, "element segment items")
        items: set[int] = set()
        if flags & 0x04:
            for _ in range(count):
                r.const_expr(items)
        else:
            items.update(r.uleb() for _ in range(count))
        _check_funcs(info, items, "an element segment")
        info.table_funcs |= items
        _check_funcs(info, info.table_funcs, "element segments")


def _parse_code(r: _Reader, info: ModuleInfo) -> None:
    count = r.count(wf.MAX_FUNCTIONS, "function bodies")
    if count != len(info.func_types) - info.imported_funcs:
        raise BinaryError("function and code section have inconsistent lengths")
    for index in range(count):
        size = r.uleb()
        end = r.pos + size
        if end > r.end:
            raise BinaryError(f"function body {index} runs past the end of the code section")
        total = 0
        for _ in range(r.count(wf.MAX_FUNCTION_LOCALS, "local declarations")):
            total += r.uleb()
            r.valtype()
            if total > MAX_FUNCTION_LOCALS:
                raise BinaryError(f"function body {index} declares more than {MAX_FUNCTION_LOCALS} locals")
        if r.pos > end:
            raise BinaryError(f"the locals of function body {index} run past its end")
        r.pos = end


_PARSERS: dict[int, Callable[[_Reader, ModuleInfo], None]] = {
    SEC_TYPE: _parse_types, SEC_IMPORT: _parse_imports, SEC_FUNCTION: _parse_functions,
    SEC_TABLE: _parse_tables, SEC_MEMORY: _parse_memories, SEC_GLOBAL: _parse_globals,
    SEC_EXPORT: _parse_exports, SEC_ELEMENT: _parse_elements, SEC_CODE: _parse_code,
}


def _name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")
    return leb128.encode(len(raw)) + raw


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
    sections = wf.sections(data)
    addition = b"".join(_name_bytes(n) + bytes([k]) + leb128.encode(i) for n, k, i in extra)
    for sid, head, start, end in sections:
        if sid == SEC_EXPORT:
            r = _Reader(data, start, end)
            count = r.uleb()
            body = leb128.encode(count + len(extra)) + data[r.pos:end] + addition
            return data[:head] + bytes([SEC_EXPORT]) + leb128.encode(len(body)) + body + data[end:]
    insert_at = 8
    for sid, _head, _start, end in sections:
        if sid in _BEFORE_EXPORT:
            insert_at = end
    body = leb128.encode(len(extra)) + addition
    return data[:insert_at] + bytes([SEC_EXPORT]) + leb128.encode(len(body)) + body + data[insert_at:]
