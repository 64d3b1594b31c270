"""The pwasm engine: a WebAssembly interpreter in pure Python, for every CPU Python runs on.

pwasm (pinned in pyproject.toml) decodes a module into Python objects and runs it
in its interpreter; in its "auto" mode (:data:`MODE`) a function called more than
twice is translated to Python source and runs as a Python function.  Linear memory
is a ``bytearray``, globals and tables are Python objects reachable by index, so
this engine needs no rewritten module and no FFI.

Design and invariants:
- Interruption: every instance has its own :class:`_Limits`; pwasm checks it every
  ``check_interval`` units of work (calls and loop iterations).  A call's deadline
  is pwasm's own (``Limits.set_deadline``); ``interrupt()`` sets a flag the same
  check reads, so it works from any thread, is sticky, and ends a call within about
  a thousand loop iterations.  Wasm here runs under the GIL: pods on this engine
  share one core's worth of the kubelet's Python.
- Exact bits: i32/i64 globals are unsigned ints inside pwasm; an f32 NaN is kept as
  pwasm's F32NaN (its ``bits``), an f64 as the Python float that holds its 64 bits;
  funcrefs are function objects, mapped to their index in the module's function
  index space, restricted (as on every engine) to the functions an element segment
  names.
- Memory: ``memory_view()`` is a memoryview of the bytearray itself.  A bytearray
  cannot grow while a view of it is alive; the pod drops its views before any call,
  and if some view still lives when the pod's code grows memory, growth is tried
  again for up to :data:`GROW_WAIT_S` and then fails as ``memory.grow`` fails (-1),
  never as a trap.
- Validation: pwasm does not type-check; :mod:`.pwasm_validate` does, on the
  instructions pwasm decoded, so a module is refused at load as wasmtime refuses it.
- Bounds before allocation: a module's initial memory is checked against the memory
  limit, and its tables against :data:`MAX_TABLE_ELEMENTS`, before pwasm allocates
  them (pwasm allocates first).
- pwasm caches the Python it generates on the decoded module (shared by the pods
  of one image) and, with a cache_dir, on disk under ``<cache_dir>/pwasm``: code
  loaded from there is trusted only because the directory is the kubelet's own.
  pwasm's cache directory is process-wide (``pwasm.codegen.CACHE_DIR``): the last
  engine created sets it, and without a cache_dir nothing goes to disk.
"""
from __future__ import annotations

import gc
import importlib.metadata
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pwasm
from pwasm import codegen
from pwasm.numeric import f32_from_bits, f32_to_bits
from pwasm.runtime import Limits, MemoryInstance

from . import abi, binary
from .binary import F32, F64, FUNCREF, I32, I64
from .engine import (
    NULL_FUNC, PAGE, CallFailed, Engine, HostFunction, Instance, InstantiateError, memory_pages,
)
from .pwasm_validate import Invalid, validate
from .types import ImageError, PodError

VERSION = importlib.metadata.version("pwasm")
MODE = "auto"                  # pwasm's: interpreted first, hot functions as generated Python
CONFIG_TAG = f"pwasm-{VERSION}-{MODE}-v1"
MAX_TABLE_ELEMENTS = 1 << 20
GROW_WAIT_S = 0.1              # how long memory.grow waits for a view of the memory to go
# Every Wasm call is a Python call: deep Wasm recursion needs a Python recursion limit
# well above the default 1000 (pwasm's own sandbox asks for 20,000).
RECURSION_LIMIT = 20_000

_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")


class _Limits(Limits):
    """pwasm's limits plus a sticky interrupt flag, read at every limits check."""

    __slots__ = ("interrupted",)

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False

    def refill(self) -> None:
        if self.interrupted:
            raise pwasm.Timeout("interrupted")
        super().refill()


class _Memory(MemoryInstance):
    """pwasm's memory whose growth fails (-1) rather than raising while a view of it lives."""

    def grow(self, delta: int) -> int:
        deadline = time.monotonic() + GROW_WAIT_S
        while True:
            try:
                return super().grow(delta)
            except BufferError:
                # A view still lives: one held by a reference cycle, or a snapshot's the
                # thread that wrote it is about to drop (a thaw races its last step).
                gc.collect()
                if time.monotonic() >= deadline:
                    return -1
                time.sleep(0.001)


class PwasmEngine(Engine):
    name = "pwasm"
    version = VERSION
    tag = CONFIG_TAG

    def __init__(self, cache_dir: Path | None = None) -> None:
        codegen.CACHE_DIR = str(Path(cache_dir) / "pwasm") if cache_dir is not None else None
        if sys.getrecursionlimit() < RECURSION_LIMIT:
            sys.setrecursionlimit(RECURSION_LIMIT)

    def compile(self, wasm: bytes, info: binary.ModuleInfo, digest: str) -> Any:
        for index, (_reftype, low, _high) in info.tables.items():
            if low > MAX_TABLE_ELEMENTS:
                raise ImageError(f"module does not compile: table {index} starts with {low} elements "
                                 f"(this engine allows {MAX_TABLE_ELEMENTS})")
        try:
            module = pwasm.decode_module(wasm)
            for func in module.funcs:
                func.body          # pwasm decodes bodies lazily: find bad code now, not in a call
        except Exception as exc:  # noqa: BLE001 - any decoder failure means the same thing
            raise ImageError(f"module does not compile: {_message(exc)}") from None
        try:
            validate(module)
        except Invalid as exc:
            raise ImageError(f"module does not compile: {exc}") from None
        return module

    def instantiate(self, compiled: Any, info: binary.ModuleInfo, imports: Mapping[str, HostFunction],
                    memory_limit_bytes: int | None, deadline: float | None) -> "PwasmInstance":
        return PwasmInstance(compiled, info, imports, memory_limit_bytes, deadline)

    def kernel(self, wasm: bytes) -> Callable[[int], object]:
        instance = pwasm.instantiate(pwasm.decode_module(wasm), {}, limits=_Limits(), mode=MODE)
        run = instance.exports["run"]
        for _ in range(3):   # past pwasm's tier-up: time the code hot functions run as
            run(1)
        return run


class PwasmInstance(Instance):
    """One pwasm instance (see the module docstring)."""

    def __init__(self, module: Any, info: binary.ModuleInfo, imports: Mapping[str, HostFunction],
                 memory_limit_bytes: int | None, deadline: float | None) -> None:
        limits = _Limits()
        if memory_limit_bytes is not None:
            pages = memory_pages(memory_limit_bytes)
            if info.memory is not None and info.memory[0] > pages:
                raise InstantiateError(f"initial memory of {info.memory[0]} pages exceeds the limit of {pages}")
            limits.max_memory = pages * PAGE
        limits.set_deadline(deadline)
        self._limits = limits
        try:
            self._instance = pwasm.instantiate(module, {abi.IMPORT_MODULE: dict(imports)}, limits=limits, mode=MODE)
        except pwasm.Timeout:
            kind = "interrupted" if limits.interrupted else "timeout"
            raise CallFailed(kind, kind) from None
        except Exception as exc:  # noqa: BLE001 - a link error or a trap in the start function
            raise InstantiateError(_message(exc)) from None
        inst = self._instance
        memory = inst.memories[0]
        memory.__class__ = _Memory
        self._memory: MemoryInstance = memory
        self._exports = {name: inst.exports[name] for name, (kind, _i) in info.exports.items()
                         if kind == binary.KIND_FUNC}
        self.functions = frozenset(self._exports)
        self._table_funcs = {i: inst.functions[i] for i in info.table_funcs}
        self._func_index = {id(f): i for i, f in self._table_funcs.items()}

    # -- calls ------------------------------------------------------------------------------
    def call(self, name: str, args: Sequence[int], deadline: float | None) -> None:
        func = self._exports[name]
        limits = self._limits
        if limits.interrupted:
            raise CallFailed("interrupted", "interrupted")
        limits.set_deadline(deadline)
        try:
            func(*args)
        except pwasm.Timeout:
            kind = "interrupted" if limits.interrupted else "timeout"
            raise CallFailed(kind, kind) from None
        except pwasm.TrapError as exc:
            raise CallFailed("trap", f"wasm trap: {_message(exc)}") from None
        except RecursionError:
            raise CallFailed("trap", "wasm trap: call stack exhausted") from None
        except Exception as exc:  # noqa: BLE001 - the interpreter failed: the call did not return
            raise CallFailed("trap", f"engine error: {type(exc).__name__}: {_message(exc)}") from None

    def interrupt(self) -> None:
        self._limits.interrupted = True

    # -- memory -------------------------------------------------------------------------------
    def memory_size(self) -> int:
        return len(self._memory.data)

    def grow_memory(self, pages: int) -> bool:
        return self._memory.grow(pages) != -1

    def memory_view(self) -> memoryview:
        return memoryview(self._memory.data)

    def read(self, ptr: int, length: int) -> bytes | None:
        data = self._memory.data
        if ptr < 0 or length < 0 or ptr + length > len(data):
            return None
        return bytes(data[ptr:ptr + length])

    def write(self, ptr: int, data: bytes) -> bool:
        mem = self._memory.data
        if ptr < 0 or ptr + len(data) > len(mem):
            return False
        mem[ptr:ptr + len(data)] = data
        return True

    # -- globals and tables ------------------------------------------------------------------------
    def get_global(self, index: int, valtype: int) -> int:
        value = self._instance.globals[index].value
        if valtype == I32:
            return value & 0xFFFFFFFF
        if valtype == I64:
            return value & 0xFFFFFFFFFFFFFFFF
        if valtype == F32:
            return f32_to_bits(value)
        if valtype == F64:
            return _U64.unpack(_F64.pack(value))[0]
        if valtype == FUNCREF:
            return self._funcref_index(value)
        raise PodError(f"global {index} has a value type the snapshot cannot hold ({valtype:#x})")

    def set_global(self, index: int, valtype: int, bits: int) -> None:
        glob = self._instance.globals[index]
        if valtype in (I32, I64):
            glob.value = bits
        elif valtype == F32:
            glob.value = f32_from_bits(bits)
        elif valtype == F64:
            glob.value = _F64.unpack(_U64.pack(bits))[0]
        elif valtype == FUNCREF:
            glob.value = None if bits == NULL_FUNC else self._table_funcs[bits]
        else:
            raise PodError(f"cannot restore global {index}: value type {valtype:#x}")

    def _funcref_index(self, func: Any) -> int:
        if func is None:
            return NULL_FUNC
        index = self._func_index.get(id(func))
        if index is None:
            raise PodError("a table or global holds a function no element segment names")
        return index

    def get_table(self, index: int) -> tuple[int, ...]:
        return tuple(self._funcref_index(f) for f in self._instance.tables[index].elements)

    def set_table(self, index: int, entries: Sequence[int]) -> None:
        table = self._instance.tables[index]
        if len(entries) > table.size and table.grow(len(entries) - table.size, None) == -1:
            raise PodError(f"cannot restore: table {index} cannot hold {len(entries)} entries")
        for i, entry in enumerate(entries):
            table.set(i, None if entry == NULL_FUNC else self._table_funcs[entry])


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
