"""The wasmtime engine: compiled code, Wasm running without the GIL.  Every use of
wasmtime's private FFI (``wasmtime._ffi``) is in this module.

Design and invariants:
- One wasmtime Engine per kubelet, with epoch interruption; a ticker thread
  advances the epoch every :data:`EPOCH_TICK_S`.  An instance arms its deadline in
  chunks of :data:`EPOCH_CHUNK_MS`; at each chunk its epoch callback (on the calling
  thread) traps the call when the instance was interrupted or the call's deadline
  passed, else extends the deadline.  An interrupt takes effect within one chunk.
- The embedding API reaches exports only, so the code that runs is the module with
  reserved exports added (binary.add_exports): ``__k32_g<i>`` for every mutable
  global, ``__k32_t<i>`` for every table, ``__k32_f<i>`` for every function an
  element segment names (funcrefs map to function indices through these), and
  ``__k32_memory``.
- Compiled code is cached by (digest, :data:`CONFIG_TAG`), in memory by the runtime
  and, with a cache_dir, on disk as wasmtime's serialized form.  Serialized code is
  trusted only because the cache directory is the kubelet's own.
- Host functions are raw ("unchecked") funcs: the ABI's functions never raise, which
  also keeps clear of wasmtime-py's process-wide LAST_EXCEPTION.
- FuncType objects belong to this Engine; never share them across engines (that
  aborts the process).
- Globals are read and written as raw bits (wasmtime_val_t), never as Python floats.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import wasmtime
from wasmtime import _ffi as ffi

from . import abi, binary
from .binary import F32, F64, FUNCREF, I32, I64
from .engine import (
    NULL_FUNC, PAGE, CallFailed, Engine, HostFunction, Instance, InstantiateError, memory_pages,
    table_entries_within,
)
from .types import ImageError, PodError

EPOCH_TICK_S = 0.005
EPOCH_CHUNK_MS = 100
VERSION = importlib.metadata.version("wasmtime")
CONFIG_TAG = f"wasmtime-{VERSION}-epoch-v1"

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_VALKIND = {I32: 0, I64: 1, F32: 2, F64: 3, FUNCREF: 5}

_EpochCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t, ctypes.POINTER(ffi.wasmtime_context_t), ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint8))
_NO_FINALIZER = ctypes.cast(0, ctypes.CFUNCTYPE(None, ctypes.c_void_p))


def _signed32(v: int) -> int:
    v &= _MASK32
    return v - (1 << 32) if v & 0x80000000 else v


def _signed64(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v & (1 << 63) else v


_E = TypeVar("_E")


def _export(exports: Any, name: str, kind: type[_E]) -> _E:
    """The instance's export ``name``, which must be a ``kind`` (the reserved exports are
    ours: anything else is a module we rewrote wrongly)."""
    ext = exports[name]
    if not isinstance(ext, kind):
        raise InstantiateError(f"export {name} is {type(ext).__name__}, not {kind.__name__}")
    return ext


class WasmtimeEngine(Engine):
    name = "wasmtime"
    version = VERSION
    tag = CONFIG_TAG

    def __init__(self, cache_dir: Path | None = None) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._functypes: dict[tuple, wasmtime.FuncType] = {}
        self._closed = threading.Event()
        self._ticker = threading.Thread(target=self._tick_epoch, name="k32-epoch", daemon=True)
        self._ticker.start()

    # -- epoch ------------------------------------------------------------------------
    def _tick_epoch(self) -> None:
        while not self._closed.wait(EPOCH_TICK_S):
            self.engine.increment_epoch()

    @staticmethod
    def ticks_for_ms(ms: float) -> int:
        return max(1, int(ms / (EPOCH_TICK_S * 1000)) + 1)

    def close(self) -> None:
        self._closed.set()
        self._ticker.join(timeout=1)

    def functype(self, params: tuple[int, ...], results: tuple[int, ...]) -> wasmtime.FuncType:
        key = (params, results)
        with self._lock:
            ft = self._functypes.get(key)
            if ft is None:
                vt = {I32: wasmtime.ValType.i32(), I64: wasmtime.ValType.i64()}
                ft = wasmtime.FuncType([vt[p] for p in params], [vt[r] for r in results])
                self._functypes[key] = ft
            return ft

    # -- modules ------------------------------------------------------------------------
    def compile(self, wasm: bytes, info: binary.ModuleInfo, digest: str) -> wasmtime.Module:
        path = self.cache_dir / f"{digest}-{CONFIG_TAG}.cwasm" if self.cache_dir else None
        if path is not None and path.exists():
            try:
                return wasmtime.Module.deserialize(self.engine, path.read_bytes())
            except Exception:
                path.unlink(missing_ok=True)   # stale or damaged: compile afresh
        rewritten = binary.add_exports(wasm, binary.reserved_exports(info))
        try:
            compiled = wasmtime.Module(self.engine, rewritten)
        except Exception as exc:
            raise ImageError(f"module does not compile: {first_line(exc)}") from None
        if path is not None:
            # A name of this writer's own: other processes may share the cache directory.
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(compiled.serialize())
            tmp.replace(path)
        return compiled

    def instantiate(self, compiled: wasmtime.Module, info: binary.ModuleInfo,
                    imports: Mapping[str, HostFunction], memory_limit_bytes: int | None,
                    deadline: float | None) -> "WasmtimeInstance":
        return WasmtimeInstance(self, compiled, info, imports, memory_limit_bytes, deadline)

    def kernel(self, wasm: bytes) -> Callable[[int], object]:
        store = wasmtime.Store(self.engine)
        store.set_epoch_deadline(1 << 40)
        module = wasmtime.Module(self.engine, wasm)
        run = _export(wasmtime.Instance(store, module, []).exports(store), "run", wasmtime.Func)
        return lambda n: run(store, n)


class WasmtimeInstance(Instance):
    """One wasmtime Store and Instance (see the module docstring)."""

    def __init__(self, engine: WasmtimeEngine, compiled: wasmtime.Module, info: binary.ModuleInfo,
                 imports: Mapping[str, HostFunction], memory_limit_bytes: int | None,
                 deadline: float | None) -> None:
        self._engine = engine
        store = wasmtime.Store(engine.engine)
        if memory_limit_bytes is not None:
            store.set_limits(memory_size=memory_pages(memory_limit_bytes) * PAGE, memories=1,
                             table_elements=table_entries_within(memory_limit_bytes, len(info.tables)))
        self._store = store
        self._ctx = store._context()
        self._keep: list[Any] = []   # ctypes callbacks that must outlive the store
        self._interrupted = False
        self._deadline = deadline
        self._reason: str | None = None   # why the epoch callback ended the current call
        callback = _EpochCallback(self._on_epoch)
        self._keep.append(callback)
        ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, None, _NO_FINALIZER)
        funcs = [self._host_func(name, imports[name]) for (_m, name, _k, _d) in info.imports]
        store.set_epoch_deadline(engine.ticks_for_ms(EPOCH_CHUNK_MS))
        try:
            instance = wasmtime.Instance(store, compiled, funcs)
        except Exception as exc:
            if self._reason is not None:
                raise CallFailed(self._reason, self._reason) from None
            raise InstantiateError(first_line(exc)) from None
        exports = instance.exports(store)
        self._memory = _export(exports, binary.MEMORY_EXPORT, wasmtime.Memory)
        self._funcs: dict[str, wasmtime.Func] = {}
        for name, (kind, _index) in info.exports.items():
            if kind == binary.KIND_FUNC:
                ext = exports[name]
                if isinstance(ext, wasmtime.Func):
                    self._funcs[name] = ext
        # Results per export, read once: the raw values array holds params and results.
        self._results = {name: tuple(str(r) for r in f.type(store).results) for name, f in self._funcs.items()}
        self.functions = frozenset(self._funcs)
        self._globals = {i: _export(exports, f"__k32_g{i}", wasmtime.Global) for i in info.mutable_globals}
        self._tables = {i: _export(exports, f"__k32_t{i}", wasmtime.Table) for i in info.tables}
        self._table_funcs = {i: _export(exports, f"__k32_f{i}", wasmtime.Func) for i in info.table_funcs}
        self._func_index = {
            ffi.wasmtime_func_to_raw(self._ctx, ctypes.byref(f._func)): i for i, f in self._table_funcs.items()}

    def _host_func(self, name: str, impl: HostFunction) -> wasmtime.Func:
        params, results = abi.IMPORTS[name]
        nparams = len(params)
        wide = results == (I64,)

        def trampoline(env: Any, caller: Any, vals: Any, nvals: int) -> int:
            try:
                result = impl(*[vals[i].i32 for i in range(nparams)])
            except BaseException:  # noqa: BLE001 - nothing may escape into Wasm
                result = abi.K32_EINTERNAL
            try:
                if wide:
                    vals[0].i64 = _signed64(result)
                else:
                    vals[0].i32 = _signed32(result)
            except BaseException:  # noqa: BLE001
                pass
            return 0

        callback = ffi.wasmtime_func_unchecked_callback_t(trampoline)
        self._keep.append(callback)
        raw = ffi.wasmtime_func_t()
        ffi.wasmtime_func_new_unchecked(
            self._ctx, self._engine.functype(params, results).ptr(), callback, None, _NO_FINALIZER,
            ctypes.byref(raw))
        return wasmtime.Func._from_raw(raw)

    # -- interruption ---------------------------------------------------------------------
    def _on_epoch(self, ctx: Any, data: Any, delta: Any, kind: Any) -> int:
        try:
            if self._interrupted:
                return self._end("interrupted")
            if self._deadline is not None and time.monotonic() >= self._deadline:
                return self._end("timeout")
            delta[0] = self._engine.ticks_for_ms(EPOCH_CHUNK_MS)
            kind[0] = 0
            return 0
        except BaseException:  # noqa: BLE001
            return self._end("interrupted")

    def _end(self, reason: str) -> int:
        self._reason = reason
        err = ffi.wasmtime_error_new(ctypes.create_string_buffer(reason.encode()))
        return ctypes.cast(err, ctypes.c_void_p).value or 0

    def interrupt(self) -> None:
        self._interrupted = True

    # -- calls ------------------------------------------------------------------------------
    def call(self, name: str, args: Sequence[int], deadline: float | None) -> int | None:
        func = self._funcs[name]
        results = self._results[name]
        if self._interrupted:
            raise CallFailed("interrupted", "interrupted")
        self._deadline = deadline
        self._reason = None
        vals = (ffi.wasmtime_val_raw_t * max(1, len(args), len(results)))()
        for i, a in enumerate(args):
            vals[i].i64 = 0
            vals[i].i32 = a
        chunk = EPOCH_CHUNK_MS if deadline is None else \
            min(EPOCH_CHUNK_MS, max(0.0, (deadline - time.monotonic()) * 1000))
        trap = ctypes.POINTER(ffi.wasm_trap_t)()
        ffi.wasmtime_context_set_epoch_deadline(self._ctx, self._engine.ticks_for_ms(chunk))
        error = ffi.wasmtime_func_call_unchecked(self._ctx, ctypes.byref(func._func), vals, len(vals),
                                                 ctypes.byref(trap))
        if error:
            message = first_line(wasmtime.WasmtimeError._from_ptr(error))
        elif trap:
            message = first_line(wasmtime.Trap._from_ptr(trap))
        else:
            return int(vals[0].i32) if results[:1] == ("i32",) else None
        raise CallFailed(self._reason or "trap", message)

    # -- memory -------------------------------------------------------------------------------
    def _mem(self) -> tuple[int, int]:
        ref = ctypes.byref(self._memory._memory)
        addr = ctypes.cast(ffi.wasmtime_memory_data(self._ctx, ref), ctypes.c_void_p).value or 0
        return addr, ffi.wasmtime_memory_data_size(self._ctx, ref)

    def memory_size(self) -> int:
        return ffi.wasmtime_memory_data_size(self._ctx, ctypes.byref(self._memory._memory))

    def grow_memory(self, pages: int) -> bool:
        prev = ctypes.c_uint64(0)
        error = ffi.wasmtime_memory_grow(self._ctx, ctypes.byref(self._memory._memory), pages, ctypes.byref(prev))
        if error:
            wasmtime.WasmtimeError._from_ptr(error)   # takes ownership: freed with the object
            return False
        return True

    def memory_view(self) -> memoryview:
        addr, size = self._mem()
        if size == 0 or not addr:
            return memoryview(bytearray())
        return memoryview((ctypes.c_ubyte * size).from_address(addr)).cast("B")

    def read(self, ptr: int, length: int) -> bytes | None:
        addr, size = self._mem()
        if ptr < 0 or length < 0 or ptr + length > size:
            return None
        return ctypes.string_at(addr + ptr, length) if length else b""

    def write(self, ptr: int, data: bytes) -> bool:
        addr, size = self._mem()
        if ptr < 0 or ptr + len(data) > size:
            return False
        if data:
            ctypes.memmove(addr + ptr, data, len(data))
        return True

    # -- globals and tables ------------------------------------------------------------------------
    def get_global(self, index: int, valtype: int) -> int:
        val = ffi.wasmtime_val_t()
        ffi.wasmtime_global_get(self._ctx, ctypes.byref(self._globals[index]._global), ctypes.byref(val))
        if valtype in (I32, F32):
            return val.of.i32 & _MASK32
        if valtype in (I64, F64):
            return val.of.i64 & _MASK64
        if valtype == FUNCREF:
            return self._funcref_index(val.of.funcref)
        raise PodError(f"global {index} has a value type the snapshot cannot hold ({valtype:#x})")

    def set_global(self, index: int, valtype: int, bits: int) -> None:
        target = self._globals[index]
        if valtype == FUNCREF:
            target.set_value(self._store, None if bits == NULL_FUNC else self._table_funcs[bits])
            return
        val = ffi.wasmtime_val_t()
        val.kind = _VALKIND[valtype]  # type: ignore[assignment]  # a ctypes field takes the int
        if valtype in (I32, F32):
            val.of.i32 = _signed32(bits)
        else:
            val.of.i64 = _signed64(bits)
        error = ffi.wasmtime_global_set(self._ctx, ctypes.byref(target._global), ctypes.byref(val))
        if error:
            raise PodError(f"cannot restore global {index}: {first_line(wasmtime.WasmtimeError._from_ptr(error))}")

    def _funcref_index(self, func: Any) -> int:
        if func.store_id == 0:
            return NULL_FUNC
        index = self._func_index.get(ffi.wasmtime_func_to_raw(self._ctx, ctypes.byref(func)))
        if index is None:
            raise PodError("a table or global holds a function no element segment names")
        return index

    def get_table(self, index: int) -> tuple[int, ...]:
        ref = ctypes.byref(self._tables[index]._table)
        entries = []
        for i in range(ffi.wasmtime_table_size(self._ctx, ref)):
            val = ffi.wasmtime_val_t()
            ffi.wasmtime_table_get(self._ctx, ref, i, ctypes.byref(val))
            entries.append(self._funcref_index(val.of.funcref))
        return tuple(entries)

    def table_entries(self) -> int:
        return sum(ffi.wasmtime_table_size(self._ctx, ctypes.byref(t._table)) for t in self._tables.values())

    def set_table(self, index: int, entries: Sequence[int]) -> None:
        table = self._tables[index]
        size = table.size(self._store)
        if len(entries) > size:
            try:
                table.grow(self._store, len(entries) - size, None)
            except Exception as exc:
                raise PodError(f"cannot restore: table {index} cannot hold {len(entries)} entries: "
                               f"{first_line(exc)}") from None
        for i, entry in enumerate(entries):
            table.set(self._store, i, None if entry == NULL_FUNC else self._table_funcs[entry])


def first_line(exc: BaseException) -> str:
    """The cause of a wasmtime error without its backtrace."""
    text = str(exc).strip()
    if "Caused by:" in text:
        causes = [line.strip() for line in text.split("Caused by:", 1)[1].splitlines() if line.strip()]
        causes = [c.split(":", 1)[1].strip() if c[:1].isdigit() and ":" in c else c for c in causes]
        return "; ".join(causes)
    return text.splitlines()[0] if text else type(exc).__name__
