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
  cannot grow while a view of it is alive; the pod drops its views before any call
  and releases its snapshots' at the thaw, and if some view still lives when the
  pod's code grows memory, growth is tried again for up to :data:`GROW_WAIT_S` and
  then fails as ``memory.grow`` fails (-1), never as a trap.
- Bounds of a running pod: tables hold at most their share of the memory limit
  (engine.table_entries_within, as pwasm's ``max_size``, set before the start
  function runs: the engine takes the start function off the decoded module and runs
  it itself); the call stack, Python frames on the heap, holds at most the memory
  limit's worth of frames (:data:`STACK_FLOOR_BYTES` at least), each costing what its own
  function declares: the frames of ordinary functions are counted (at the cost of the
  largest of them) with the deadline, and a function declaring more than
  :data:`BIG_FRAME_LOCALS` locals (never translated: it stays in pwasm's interpreter)
  checks the bytes of the whole stack at its every call, so one big function, called or
  not, does not shrink the stack of the small ones; a function of more than
  :data:`MAX_TRANSLATED_INSTRUCTIONS` is never translated to Python (CPython's compile()
  holds the GIL throughout, unbounded by any deadline) and stays interpreted.
- Validation: pwasm does not type-check; :mod:`.pwasm_validate` does, on the
  instructions pwasm decoded, so a module is refused at load as wasmtime refuses it.
- Bounds before allocation: a module's initial memory is checked against the memory
  limit, and its tables against :data:`MAX_TABLE_ELEMENTS`, before pwasm allocates
  them (pwasm allocates first).  pwasm decodes a module into Python objects, about 45
  bytes per byte of real code and up to 100 for a function of ``nop``s, in seconds of
  Python per MiB: a module over :data:`MAX_MODULE_BYTES` is refused before pwasm sees
  it, so one costs the node 100 MiB at most (a board's module is tens of KiB).
- Cost to the node (:meth:`PwasmEngine.costs`, measured with tracemalloc on CPython 3.11):
  a decoded module is about :data:`DECODED_BYTES_PER_INSTRUCTION` per instruction and
  :data:`DECODED_BYTES_PER_FUNCTION` per function; the Python generated for a hot function
  (kept on the module) :data:`TRANSLATED_BYTES_PER_INSTRUCTION` and
  :data:`TRANSLATED_BYTES_PER_FUNCTION` more, reserved for every function that may be
  translated; an instance :data:`INSTANCE_BYTES` and :data:`INSTANCE_BYTES_PER_FUNCTION`
  (its function objects and their translated closures) besides its memory and tables.
  counter.wasm (11 KiB, 5,000 instructions) costs about 0.9 MiB, a 1 MiB module of code
  about 100 MiB: the node counts this in its heap, not only its pods' pages.
- pwasm caches the Python it generates on the decoded module (shared by the pods
  of one image, freed with it; its source, which pwasm puts in the process-wide
  ``linecache``, is dropped when the module goes) and, with a cache_dir, on disk under
  ``<cache_dir>/pwasm``: code loaded from there is trusted only because the directory
  is the kubelet's own.
  pwasm's cache directory is process-wide (``pwasm.codegen.CACHE_DIR``): the last
  engine created sets it, and without a cache_dir nothing goes to disk.
"""
from __future__ import annotations

import gc
import importlib.metadata
import linecache
import struct
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator, Mapping, Sequence

import pwasm
from pwasm import codegen
from pwasm.numeric import f32_from_bits, f32_to_bits
from pwasm.executor import execute, invoke
from pwasm.runtime import Limits, MemoryInstance, WasmFunction

from . import abi, binary
from .binary import F32, F64, FUNCREF, I32, I64
from .engine import (
    NULL_FUNC, PAGE, CallFailed, Engine, HostFunction, Instance, InstantiateError, memory_pages,
    table_entries_within,
)
from .pwasm_validate import Invalid, validate
from .types import ImageError, PodError

VERSION = importlib.metadata.version("pwasm")
MODE = "auto"                  # pwasm's: interpreted first, hot functions as generated Python
CONFIG_TAG = f"pwasm-{VERSION}-{MODE}-v1"
MAX_TABLE_ELEMENTS = 1 << 20
MAX_MODULE_BYTES = 1 << 20     # what pwasm may decode (see "Bounds before allocation")
GROW_WAIT_S = 0.1              # how long memory.grow waits for a view of the memory to go
# Every Wasm call is a Python call: deep Wasm recursion needs a Python recursion limit
# well above the default 1000 (pwasm's own sandbox asks for 20,000).
RECURSION_LIMIT = 20_000
# A function of more instructions than this is never translated to Python: CPython's
# compile() holds the GIL for the whole of it (about 4 us an instruction, 40 ms here)
# and checks no deadline, so a big function would stall the node (its Lease, its API).
MAX_TRANSLATED_INSTRUCTIONS = 10_000
# The call stack: every Wasm frame is a Python frame on the heap.  A frame costs about
# FRAME_BYTES plus SLOT_BYTES per parameter and local of its function; a call may hold
# its memory limit's worth of frames, at least STACK_FLOOR_BYTES' worth (a pod with a small
# limit still calls), and never more than the recursion limit allows.  A function of more
# than BIG_FRAME_LOCALS locals (a frame of 12 KiB or more) is a big one: its calls check
# the stack's bytes; the others are counted at the cost of the largest of them.
FRAME_BYTES = 512
SLOT_BYTES = 48
STACK_FLOOR_BYTES = 16 << 20
BIG_FRAME_LOCALS = 256
# Units of work (calls, loop iterations) between two checks: pwasm's 1000, fewer for a
# module of big frames, so the stack grows at most STACK_SLACK_BYTES past its bound
# between two checks.
CHECK_INTERVAL = 1000
STACK_SLACK_BYTES = 4 << 20
# What pwasm's objects cost (measured: tracemalloc, CPython 3.11 x86_64, modules of 1 to
# 20,000 functions; see "Cost to the node").
DECODED_BYTES_PER_INSTRUCTION = 100
DECODED_BYTES_PER_FUNCTION = 240
TRANSLATED_BYTES_PER_INSTRUCTION = 35
TRANSLATED_BYTES_PER_FUNCTION = 3300
INSTANCE_BYTES = 12 << 10
INSTANCE_BYTES_PER_FUNCTION = 730

_EXECUTE_CODE = execute.__code__   # the frame of a Wasm function in pwasm's interpreter
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")


def _depth() -> int:
    """The Python frames of the calling thread."""
    frame: FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


class _Limits(Limits):
    """pwasm's limits plus a sticky interrupt flag and a bound on the call stack, read at
    every limits check (every :data:`CHECK_INTERVAL` calls or loop iterations)."""

    __slots__ = ("interrupted", "max_frames", "base_frames", "stack_bytes", "frame_bytes", "big_frames")

    def __init__(self, max_frames: int | None = None, check_interval: int = CHECK_INTERVAL,
                 stack_bytes: int = 0, frame_bytes: int = FRAME_BYTES) -> None:
        super().__init__(check_interval=check_interval)
        self.interrupted = False
        self.max_frames = max_frames
        self.base_frames = 0           # the frames below the running call
        self.stack_bytes = stack_bytes  # what the call stack may hold
        self.frame_bytes = frame_bytes  # what a frame of an ordinary function costs
        self.big_frames: dict[int, int] = {}   # id of a big function's WasmFunction -> its frame's cost

    def check_stack(self) -> None:
        """A big function is being called: the bytes of the frames above the running call's
        base (a big function's its own, every other frame an ordinary one's) fit the bound."""
        chain = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            chain.append(frame)
            frame = frame.f_back
        used = 0
        big = self.big_frames
        for frame in chain[:max(0, len(chain) - self.base_frames)]:
            cost = self.frame_bytes
            if frame.f_code is _EXECUTE_CODE:
                cost = big.get(id(frame.f_locals.get("func")), cost)
            used += cost
        del chain
        if used > self.stack_bytes:
            raise pwasm.TrapError(f"call stack exhausted (its frames would hold about {used} bytes, more than "
                                  f"the {self.stack_bytes} the pod's memory limit holds)")

    def refill(self) -> None:
        if self.interrupted:
            raise pwasm.Timeout("interrupted")
        if self.max_frames is not None:
            try:   # deeper than the bound? (a walk in C, not in Python)
                sys._getframe(self.base_frames + self.max_frames + 1)
            except ValueError:
                pass
            else:
                raise pwasm.TrapError(f"call stack exhausted (more than {self.max_frames} frames, "
                                      "what the pod's memory limit holds)")
        super().refill()


class _FrameGuard:
    """A big function's zeroed locals, as pwasm's interpreter adds them to the frame at each
    of its calls (``local += code.zeros``): taking them checks the stack first."""

    __slots__ = ("zeros", "limits")

    def __init__(self, zeros: list, limits: _Limits) -> None:
        self.zeros = zeros
        self.limits = limits

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Iterator[Any]:
        self.limits.check_stack()
        return iter(self.zeros)


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


@dataclass(frozen=True, eq=False)
class _Compiled:
    """A decoded, validated module; its start function (taken off the module, which pwasm
    would run before the instance's bounds are set), what a frame of its ordinary functions
    costs at most and what each big function's does (by the id of its decoded Function);
    what it costs the node (PwasmEngine.costs)."""
    module: Any
    start: int | None
    frame_bytes: int
    big_frames: dict[int, int]
    cost_bytes: int
    instance_bytes: int


def _forget_source(in_memory: str, cache_dir: str | None, digest: str) -> None:
    """The module is gone: drop the Python source pwasm kept for its tracebacks, held in
    the process-wide ``linecache`` under the names of its generated files (``<pwasm ID
    ...>``, or files of its digest under the cache directory)."""
    def its(name: str) -> bool:
        return name.startswith(in_memory) or (cache_dir is not None and name.startswith(cache_dir)
                                              and digest in name)
    for name in [n for n in list(linecache.cache) if its(n)]:
        linecache.cache.pop(name, None)


class PwasmEngine(Engine):
    name = "pwasm"
    version = VERSION
    tag = CONFIG_TAG

    def __init__(self, cache_dir: Path | None = None) -> None:
        codegen.CACHE_DIR = str(Path(cache_dir) / "pwasm") if cache_dir is not None else None
        if sys.getrecursionlimit() < RECURSION_LIMIT:
            sys.setrecursionlimit(RECURSION_LIMIT)

    def compile(self, wasm: bytes, info: binary.ModuleInfo, digest: str) -> Any:
        if len(wasm) > MAX_MODULE_BYTES:
            raise ImageError(f"module does not compile: it is {len(wasm)} bytes, more than this engine's "
                             f"limit of {MAX_MODULE_BYTES} bytes (pwasm holds about 100 bytes of Python "
                             "objects per byte of code; the wasmtime engine takes larger modules)")
        for index, (_reftype, low, _high) in info.tables.items():
            if low > MAX_TABLE_ELEMENTS:
                raise ImageError(f"module does not compile: table {index} starts with {low} elements "
                                 f"(this engine allows {MAX_TABLE_ELEMENTS})")
        try:
            module = pwasm.decode_module(wasm)
            for func in module.funcs:
                _ = func.body      # pwasm decodes bodies lazily: find bad code now, not in a call
        except Exception as exc:  # noqa: BLE001 - any decoder failure means the same thing
            raise ImageError(f"module does not compile: {_decode_message(exc)}") from None
        try:
            validate(module)
        except Invalid as exc:
            raise ImageError(f"module does not compile: {exc}") from None
        start, module.start = module.start, None   # run by PwasmInstance once its bounds are set
        ordinary, big = 0, {}
        cost = len(wasm)
        for func in module.funcs:
            slots = len(func.locals) + len(module.types[func.type_idx].params)
            size = len(func.body)
            cost += DECODED_BYTES_PER_FUNCTION + DECODED_BYTES_PER_INSTRUCTION * size
            if len(func.locals) > BIG_FRAME_LOCALS:
                big[id(func)] = FRAME_BYTES + SLOT_BYTES * slots
            else:
                ordinary = max(ordinary, slots)
                if size <= MAX_TRANSLATED_INSTRUCTIONS:
                    cost += TRANSLATED_BYTES_PER_FUNCTION + TRANSLATED_BYTES_PER_INSTRUCTION * size
        per_instance = INSTANCE_BYTES + INSTANCE_BYTES_PER_FUNCTION * len(info.func_types)
        compiled = _Compiled(module, start, FRAME_BYTES + SLOT_BYTES * ordinary, big, cost, per_instance)
        weakref.finalize(compiled, _forget_source, f"<pwasm {id(module):x} ", codegen.CACHE_DIR, digest[:32])
        return compiled

    def costs(self, compiled: Any, info: binary.ModuleInfo, size: int) -> tuple[int, int]:
        return compiled.cost_bytes, compiled.instance_bytes

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

    def __init__(self, compiled: _Compiled, info: binary.ModuleInfo, imports: Mapping[str, HostFunction],
                 memory_limit_bytes: int | None, deadline: float | None) -> None:
        stack_bytes = max(STACK_FLOOR_BYTES, memory_limit_bytes or 0)
        limits = _Limits(max_frames=max(1, min(RECURSION_LIMIT, stack_bytes // compiled.frame_bytes)),
                         check_interval=max(1, min(CHECK_INTERVAL, STACK_SLACK_BYTES // compiled.frame_bytes)),
                         stack_bytes=stack_bytes, frame_bytes=compiled.frame_bytes)
        table_cap = MAX_TABLE_ELEMENTS
        if memory_limit_bytes is not None:
            pages = memory_pages(memory_limit_bytes)
            if info.memory is not None and info.memory[0] > pages:
                raise InstantiateError(f"initial memory of {info.memory[0]} pages exceeds the limit of {pages}")
            limits.max_memory = pages * PAGE
            table_cap = min(table_cap, table_entries_within(memory_limit_bytes, len(info.tables)))
            for index, (_reftype, low, _high) in info.tables.items():
                if low > table_cap:
                    raise InstantiateError(f"table {index} starts with {low} entries, more than the "
                                           f"{table_cap} its memory limit allows")
        limits.set_deadline(deadline)
        self._limits = limits
        try:
            self._instance = pwasm.instantiate(compiled.module, {abi.IMPORT_MODULE: dict(imports)},
                                               limits=limits, mode=MODE)
        except Exception as exc:  # noqa: BLE001 - a link error
            raise InstantiateError(_message(exc)) from None
        inst = self._instance
        memory = inst.memories[0]
        memory.__class__ = _Memory
        self._memory: MemoryInstance = memory
        for table in inst.tables:     # pwasm reads max_size at every table.grow
            table.max_size = table_cap if table.max_size is None else min(table_cap, table.max_size)
        for func in inst.functions:
            if not isinstance(func, WasmFunction):
                continue
            if len(func.func.body) > MAX_TRANSLATED_INSTRUCTIONS:   # stays interpreted
                func.countdown = 0
            cost = compiled.big_frames.get(id(func.func))
            if cost is not None:      # interpreted, its every call checking the stack's bytes
                func.countdown = 0
                code = func.code if func.code is not None else func.compile()
                code.zeros = _FrameGuard(code.zeros, limits)
                limits.big_frames[id(func)] = cost
        if compiled.start is not None:
            self._start(compiled.start)
        self._exports = {name: inst.exports[name] for name, (kind, _i) in info.exports.items()
                         if kind == binary.KIND_FUNC}
        self.functions = frozenset(self._exports)
        self._i32_result = {name for name in self._exports
                            if (sig := info.signature_of_export(name)) is not None and sig.results[:1] == (I32,)}
        self._table_funcs = {i: inst.functions[i] for i in info.table_funcs}
        self._func_index = {id(f): i for i, f in self._table_funcs.items()}

    def _start(self, index: int) -> None:
        limits = self._limits
        limits.base_frames = _depth()
        try:
            invoke(self._instance.functions[index], [])
        except pwasm.Timeout:
            kind = "interrupted" if limits.interrupted else "timeout"
            raise CallFailed(kind, kind) from None
        except RecursionError:
            raise InstantiateError("the start function exhausted the call stack") from None
        except Exception as exc:  # noqa: BLE001 - a trap in the start function
            raise InstantiateError(_message(exc)) from None

    # -- calls ------------------------------------------------------------------------------
    def call(self, name: str, args: Sequence[int], deadline: float | None) -> int | None:
        func = self._exports[name]
        limits = self._limits
        if limits.interrupted:
            raise CallFailed("interrupted", "interrupted")
        limits.set_deadline(deadline)
        limits.base_frames = _depth()
        try:
            result = func(*args)
        except pwasm.Timeout:
            kind = "interrupted" if limits.interrupted else "timeout"
            raise CallFailed(kind, kind) from None
        except pwasm.TrapError as exc:
            raise CallFailed("trap", f"wasm trap: {_message(exc)}") from None
        except RecursionError:
            raise CallFailed("trap", "wasm trap: call stack exhausted") from None
        except Exception as exc:  # noqa: BLE001 - the interpreter failed: the call did not return
            raise CallFailed("trap", f"engine error: {type(exc).__name__}: {_message(exc)}") from None
        if name not in self._i32_result:
            return None
        first = result[0] if isinstance(result, (list, tuple)) else result
        return _signed32(first) if isinstance(first, int) else None

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

    def table_entries(self) -> int:
        return sum(len(t.elements) for t in self._instance.tables)

    def set_table(self, index: int, entries: Sequence[int]) -> None:
        table = self._instance.tables[index]
        if len(entries) > table.size and table.grow(len(entries) - table.size, None) == -1:
            raise PodError(f"cannot restore: table {index} cannot hold {len(entries)} entries")
        for i, entry in enumerate(entries):
            table.set(i, None if entry == NULL_FUNC else self._table_funcs[entry])


def _decode_message(exc: BaseException) -> str:
    """pwasm's decoder's refusal, naming SIMD where pwasm only names the byte (a v128
    value type: a SIMD module, which wasmtime nodes run)."""
    text = _message(exc)
    if "value type" in text.lower() and "0x7b" in text.lower():
        return f"SIMD (a v128 value) is not supported by this engine ({text}; wasmtime nodes run SIMD)"
    return text


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _signed32(v: int) -> int:
    """An i32 as the signed value wasmtime gives (the interpreter may hand back its bits)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v
