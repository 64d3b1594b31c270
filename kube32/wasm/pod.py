"""One running pod: its instance, its call thread, freeze/thaw, snapshot and restore.

Design and invariants:
- Every pod has one call thread that owns the wasmtime Store once the pod runs.
  Calls (k32_init, k32_handle, k32_tick, k32_event, k32_restored) run one at a time
  on it; Wasm runs without the GIL, so pods run in parallel.  Before the thread
  starts (instantiate, restore), the caller's thread owns the store.
- Host functions are raw ("unchecked") wasmtime funcs: they never raise into Wasm
  (every body is wrapped; a Python failure becomes K32_EINTERNAL), which also keeps
  clear of wasmtime-py's process-wide LAST_EXCEPTION.
- Interruption: the engine's epoch advances every 5 ms.  The deadline is armed
  before every call in chunks; at each chunk the epoch callback (on this pod's
  thread) traps the call if the pod is stopping or the call outlived
  config.call_timeout_ms, else extends the deadline.  Command pods have no call
  timeout.
- Frozen means: no call runs and none starts; ticks stop; events are held (at most
  8, later ones dropped and counted); handle() raises PodFrozen.  The pod clock
  stops at the freeze, so the same frozen pod gives the same snapshot every time;
  thaw resumes the clock from that value and delivers held events first.
- Pod clock: k32_time_ms = monotonic ms + offset.  Start sets it to 0, a restore to
  the snapshot's pod time: it never goes backward.
- A trap (or call timeout) ends the pod: state "failed", last_error set, pending
  requests fail with PodError, and on_exit(1, "Error", message) is called - except
  for the k32_init / k32_restored that start() / finish_restore() wait for, whose
  failure is raised to the caller as PodError instead.
"""
from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

import wasmtime
from wasmtime import _ffi as ffi

from kube32 import snapshot as k32s

from . import abi, binary
from .host import Endpoint, HostServices, random_bytes
from .runtime import Runtime
from .types import CallTimeout, HttpRequest, HttpResponse, Module, PodConfig, PodError, PodFrozen

PAGE = 65536
EPOCH_CHUNK_MS = 100
MAX_QUEUED_EVENTS = 1024
_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1

_VALKIND = {abi.I32: 0, abi.I64: 1, 0x7D: 2, 0x7C: 3, 0x70: 5}

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


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _Exchange:
    """The request of the running k32_handle call and the response it builds."""

    __slots__ = ("request", "status", "headers", "body")

    def __init__(self, request: HttpRequest) -> None:
        self.request = request
        self.status = 200
        self.headers: list[tuple[str, str]] = []
        self.body = bytearray()

    def response(self) -> HttpResponse:
        return HttpResponse(self.status, tuple(self.headers), bytes(self.body))


class _File:
    __slots__ = ("path", "data", "pos")

    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.data, self.pos = path, data, 0


class Pod:
    def __init__(self, runtime: Runtime, module: Module, config: PodConfig, host: HostServices) -> None:
        if module.engine_id != id(runtime.engine):
            raise PodError("module was loaded by another runtime")
        self.runtime = runtime
        self.module = module
        self.config = config
        self.host = host
        self.on_exit: Callable[[int, str, str], None] | None = None
        self.state = "created"
        self.last_error: str | None = None
        self.dropped_events = 0
        self.frozen = False
        self._freezing = False
        self._cond = threading.Condition()
        self._busy: str | None = None
        self._events: deque[tuple[str, bytes]] = deque()
        self._requests: deque[tuple[HttpRequest, Future]] = deque()
        self._first_job: str | None = None
        self._first_done = threading.Event()
        self._first_error: str | None = None
        self._stopping = False
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock_offset = -_now_ms()
        self._frozen_at: tuple[int, int] | None = None   # (pod time, unix time) at the freeze
        self._next_tick: float | None = None
        self._call_deadline: float | None = None
        self._call_timeout_message = ""
        self._exchange: _Exchange | None = None
        self._event: tuple[bytes, bytes] | None = None
        self._channels: dict[int, Endpoint] = {}
        self._next_channel = 1
        self._files: dict[int, _File] = {}
        self._next_fd = abi.FIRST_FD
        self._memory_bytes = 0
        self._store: wasmtime.Store | None = None
        self._keep: list[Any] = []   # ctypes callbacks that must outlive the store

    # -- public properties --------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    @property
    def key(self) -> str:
        return f"{self.config.namespace}/{self.config.name}/{self.config.container}"

    def pod_time_ms(self) -> int:
        with self._cond:
            if self._frozen_at is not None:
                return self._frozen_at[0]
        return _now_ms() + self._clock_offset

    # -- instantiation -------------------------------------------------------------
    def _instantiate(self) -> None:
        if self._store is not None:
            raise PodError("pod was already started")
        info: binary.ModuleInfo = self.module.info
        store = wasmtime.Store(self.runtime.engine)
        limit = self.config.memory_limit_bytes
        if limit is not None:
            store.set_limits(memory_size=max(PAGE, -(-limit // PAGE) * PAGE), memories=1)
        self._store = store
        self._ctx = store._context()
        callback = _EpochCallback(self._on_epoch)
        self._keep.append(callback)
        ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, None, _NO_FINALIZER)
        imports = [self._host_func(name) for (_m, name, _k, _d) in info.imports]
        store.set_epoch_deadline(self.runtime.ticks_for_ms(self.config.call_timeout_ms))
        self._call_deadline = time.monotonic() + self.config.call_timeout_ms / 1000
        self._call_timeout_message = f"instantiation exceeded the call timeout of {self.config.call_timeout_ms} ms"
        try:
            instance = wasmtime.Instance(store, self.module.compiled, imports)
        except Exception as exc:
            message = _first_line(exc)
            if limit is not None and info.memory and info.memory[0] * PAGE > limit:
                message = (f"memory limit of {limit} bytes is below the module's initial memory "
                           f"of {info.memory[0] * PAGE} bytes")
            raise PodError(f"cannot instantiate the module: {message}") from None
        exports = instance.exports(store)
        self._memory = exports[binary.MEMORY_EXPORT]
        self._funcs: dict[str, Any] = {}
        for name in list(abi.EXPORTS) + list(abi.ENTRY_POINTS):
            if name in self.module.exports:
                ext = exports[name]
                if isinstance(ext, wasmtime.Func):
                    self._funcs[name] = ext
        self._globals = {i: exports[f"__k32_g{i}"] for i in info.mutable_globals}
        self._tables = {i: exports[f"__k32_t{i}"] for i in info.tables}
        self._table_funcs = {i: exports[f"__k32_f{i}"] for i in info.table_funcs}
        self._func_index = {
            ffi.wasmtime_func_to_raw(self._ctx, ctypes.byref(f._func)): i for i, f in self._table_funcs.items()}
        self._update_memory_bytes()

    def _host_func(self, name: str) -> wasmtime.Func:
        params, results = abi.IMPORTS[name]
        impl = getattr(self, "_h_" + name)
        nparams = len(params)
        wide = results == (abi.I64,)

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
            self._ctx, self.runtime.functype(params, results).ptr(), callback, None, _NO_FINALIZER, ctypes.byref(raw))
        return wasmtime.Func._from_raw(raw)

    def _on_epoch(self, ctx: Any, data: Any, delta: Any, kind: Any) -> int:
        try:
            if self._stopping:
                return self._epoch_error("pod stopped")
            if self._call_deadline is not None and time.monotonic() >= self._call_deadline:
                return self._epoch_error(self._call_timeout_message)
            delta[0] = self.runtime.ticks_for_ms(EPOCH_CHUNK_MS)
            kind[0] = 0
            return 0
        except BaseException:  # noqa: BLE001
            return self._epoch_error("interrupted")

    @staticmethod
    def _epoch_error(message: str) -> int:
        raw = message.encode()
        err = ffi.wasmtime_error_new(ctypes.create_string_buffer(raw))
        return ctypes.cast(err, ctypes.c_void_p).value or 0

    # -- calling Wasm -----------------------------------------------------------------
    def _call(self, name: str, *args: int) -> str | None:
        """Run export *name*; None, or the error message of a trap or timeout."""
        func = self._funcs.get(name)
        if func is None:
            return None
        command = name in abi.ENTRY_POINTS
        timeout = self.config.call_timeout_ms
        self._call_deadline = None if command else time.monotonic() + timeout / 1000
        self._call_timeout_message = f"call {name} exceeded the call timeout of {timeout} ms"
        vals = (ffi.wasmtime_val_raw_t * max(1, len(args)))()
        for i, a in enumerate(args):
            vals[i].i64 = 0
            vals[i].i32 = a
        trap = ctypes.POINTER(ffi.wasm_trap_t)()
        ffi.wasmtime_context_set_epoch_deadline(self._ctx, self.runtime.ticks_for_ms(min(timeout, EPOCH_CHUNK_MS)))
        error = ffi.wasmtime_func_call_unchecked(self._ctx, ctypes.byref(func._func), vals, len(vals), ctypes.byref(trap))
        self._update_memory_bytes()
        if error:
            return _first_line(wasmtime.WasmtimeError._from_ptr(error))
        if trap:
            return _first_line(wasmtime.Trap._from_ptr(trap))
        return None

    def _update_memory_bytes(self) -> None:
        size = ffi.wasmtime_memory_data_size(self._ctx, ctypes.byref(self._memory._memory))
        limit = self.config.memory_limit_bytes
        self._memory_bytes = min(size, limit) if limit is not None and limit < PAGE else size

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Instantiate, run k32_init (PodError on a trap), then serve and tick."""
        self._instantiate()
        self._launch("init")

    def _launch(self, first_job: str) -> None:
        self._first_job = first_job
        self.state = "starting"
        now = time.monotonic()
        if self.config.tick_interval_ms and "k32_tick" in self._funcs:
            self._next_tick = now + self.config.tick_interval_ms / 1000
        self._thread = threading.Thread(target=self._run, name=f"pod {self.key}", daemon=True)
        self._thread.start()
        if self.module.kind == "command":
            return
        self._first_done.wait()
        if self._first_error is not None:
            self._thread.join(timeout=5)
            raise PodError(self._first_error)

    def stop(self) -> None:
        """Interrupt a running call, end the thread, close channels and files."""
        with self._cond:
            self._stopping = True
            self._stop_event.set()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._cond:
            if self.state not in ("failed", "exited"):
                self.state = "stopped"
            pending = list(self._requests)
            self._requests.clear()
        for _req, fut in pending:
            _fail(fut, PodError("pod stopped"))
        self._close_node_resources()

    def _close_node_resources(self) -> None:
        for endpoint in list(self._channels.values()):
            endpoint.close()
        self._channels.clear()
        self._files.clear()

    # -- the call thread -----------------------------------------------------------------------
    def _run(self) -> None:
        first = self._first_job
        if self.module.kind == "command":
            self._run_command()
            return
        first_call = "k32_init" if first == "init" else "k32_restored"
        with self._cond:
            self._busy = first_call
        error = self._call(first_call)
        with self._cond:
            self._busy = None
            self._cond.notify_all()
        if error is not None:
            self._first_error = f"{'k32_init' if first == 'init' else 'k32_restored'} failed: {error}"
            self.state = "failed"
            self.last_error = self._first_error
            self._first_done.set()
            return
        with self._cond:
            if self.state == "starting":
                self.state = "running"
        self._first_done.set()
        while True:
            job = self._next_job()
            if job is None:
                return
            error = self._run_job(job)
            with self._cond:
                self._busy = None
                self._cond.notify_all()
            if error is not None:
                self._fail(job[0], error)
                return

    def _next_job(self) -> tuple | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                if not self.frozen and not self._freezing:
                    if self._events:
                        topic, payload = self._events.popleft()
                        self._busy = "k32_event"
                        return ("k32_event", topic, payload)
                    if self._requests:
                        req, fut = self._requests.popleft()
                        if not fut.set_running_or_notify_cancel():
                            continue
                        self._busy = "k32_handle"
                        return ("k32_handle", req, fut)
                    if self._next_tick is not None and time.monotonic() >= self._next_tick:
                        interval = self.config.tick_interval_ms / 1000  # type: ignore[operator]
                        self._next_tick = max(self._next_tick + interval, time.monotonic())
                        self._busy = "k32_tick"
                        return ("k32_tick",)
                wait = None
                if self._next_tick is not None and not self.frozen and not self._freezing:
                    wait = max(0.0, self._next_tick - time.monotonic())
                self._cond.wait(wait)

    def _run_job(self, job: tuple) -> str | None:
        name = job[0]
        if name == "k32_handle":
            _, req, fut = job
            self._exchange = _Exchange(req)
            try:
                error = self._call("k32_handle")
                if error is None:
                    fut.set_result(self._exchange.response())
                else:
                    fut.set_exception(PodError(f"k32_handle failed: {error}"))
                return error
            finally:
                self._exchange = None
        if name == "k32_event":
            _, topic, payload = job
            self._event = (topic.encode(), payload)
            try:
                return self._call("k32_event", len(self._event[0]), len(payload))
            finally:
                self._event = None
        return self._call(name)

    def _run_command(self) -> None:
        with self._cond:
            self.state = "running"
        entry = self.module.entry_point
        sig = self.module.info.signature_of_export(entry)
        error = self._call(entry, *([0] * len(sig.params)))
        if self._stopping:
            return
        if error is not None:
            self._fail(entry, error)
            return
        with self._cond:
            self.state = "exited"
        self._close_node_resources()
        self._notify_exit(0, "Completed", f"{entry} returned")

    def _fail(self, call: str, error: str) -> None:
        if self._stopping:
            return
        message = f"{call} failed: {error}"
        with self._cond:
            self.state = "failed"
            self.last_error = message
            pending = list(self._requests)
            self._requests.clear()
            self._cond.notify_all()
        for _req, fut in pending:
            _fail(fut, PodError(message))
        self._close_node_resources()
        self._notify_exit(1, "Error", message)

    def _notify_exit(self, code: int, reason: str, message: str) -> None:
        if self.on_exit is not None:
            try:
                self.on_exit(code, reason, message)
            except Exception:  # noqa: BLE001 - the kubelet's callback must not kill the thread silently
                pass

    # -- requests and events ----------------------------------------------------------------------
    def handle(self, req: HttpRequest) -> "Future[HttpResponse]":
        fut: Future[HttpResponse] = Future()
        if self.module.kind == "command" or "k32_handle" not in self.module.exports:
            fut.set_result(HttpResponse(501, (("Content-Type", "text/plain"),), b"this pod does not serve HTTP\n"))
            return fut
        with self._cond:
            if self.frozen or self._freezing:
                raise PodFrozen("pod is frozen")
            if self.state not in ("running", "starting"):
                raise PodError(f"pod is {self.state}" + (f": {self.last_error}" if self.last_error else ""))
            self._requests.append((req, fut))
            self._cond.notify_all()
        return fut

    def deliver_event(self, topic: str, payload: bytes) -> None:
        if "k32_event" not in self.module.exports or self.module.kind == "command":
            return
        with self._cond:
            limit = abi.MAX_HELD_EVENTS if (self.frozen or self._freezing) else MAX_QUEUED_EVENTS
            if len(self._events) >= limit:
                self.dropped_events += 1
                return
            self._events.append((topic, bytes(payload)))
            self._cond.notify_all()

    # -- freeze and thaw -------------------------------------------------------------------------
    def freeze(self, timeout_ms: int) -> None:
        if self.module.kind == "command":
            raise PodError(self._entry_blocker())
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            if self.frozen:
                return
            if self.state not in ("running", "starting"):
                raise PodError(f"cannot freeze a pod that is {self.state}")
            self._freezing = True
            while self._busy is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    busy = self._busy
                    self._freezing = False
                    self._cond.notify_all()
                    raise CallTimeout(f"call {busy} still running after {timeout_ms} ms")
                self._cond.wait(remaining)
            if self.state not in ("running", "starting"):
                self._freezing = False
                raise PodError(f"cannot freeze a pod that is {self.state}")
            self._frozen_at = (_now_ms() + self._clock_offset, int(time.time() * 1000))
            self._freezing = False
            self.frozen = True
            self.state = "frozen"
            while len(self._events) > abi.MAX_HELD_EVENTS:
                self._events.pop()
                self.dropped_events += 1
            pending = list(self._requests)
            self._requests.clear()
        for _req, fut in pending:
            _fail(fut, PodFrozen("pod is frozen"))

    def thaw(self) -> None:
        with self._cond:
            if not self.frozen or self._frozen_at is None:
                raise PodError("pod is not frozen")
            self._clock_offset = self._frozen_at[0] - _now_ms()
            self._frozen_at = None
            self.frozen = False
            self.state = "running"
            if self._next_tick is not None:
                self._next_tick = time.monotonic() + self.config.tick_interval_ms / 1000  # type: ignore[operator]
            self._cond.notify_all()

    def blockers(self) -> list[str]:
        if self.module.kind == "command":
            return [self._entry_blocker()]
        with self._cond:
            return [f"open file {f.path} (descriptor {fd})" for fd, f in sorted(self._files.items())]

    def _entry_blocker(self) -> str:
        return f"entry point {self.module.entry_point} runs on its own thread"

    # -- snapshot ----------------------------------------------------------------------------------
    def snapshot(self) -> "k32s.SnapshotWriter":
        """The pod's K32S snapshot; only while frozen.  The memory pieces are views of
        the instance's linear memory: keep the pod frozen until the writer is done."""
        with self._cond:
            if not self.frozen or self._frozen_at is None:
                raise PodError("pod is not frozen")
            blockers = self.blockers() if self.module.kind == "command" else [
                f"open file {f.path} (descriptor {fd})" for fd, f in sorted(self._files.items())]
            if blockers:
                raise PodError("pod cannot move: " + "; ".join(blockers))
            pod_time, unix_time = self._frozen_at
            events = tuple(k32s.HeldEvent(t, p) for t, p in self._events)
            channels = tuple(k32s.ChannelState(h, e.name) for h, e in sorted(self._channels.items()))
        view = self._memory_view()
        memory_bytes = self._memory_bytes
        state = k32s.PodState(
            image_sha256=bytes.fromhex(self.module.sha256),
            memory_bytes=memory_bytes,
            memory_pages=len(view) // PAGE,
            pod_time_ms=pod_time,
            unix_time_ms=unix_time,
            globals=tuple(self._read_global(i, vt) for i, vt in sorted(self.module.info.mutable_globals.items())),
            tables=tuple(self._read_table(i) for i in sorted(self._tables)),
            channels=channels,
            events=events,
        )
        return k32s.SnapshotWriter(state, view[:memory_bytes])

    def _memory_view(self) -> memoryview:
        """Zero-copy view of linear memory; stale after any grow or call."""
        ref = ctypes.byref(self._memory._memory)
        size = ffi.wasmtime_memory_data_size(self._ctx, ref)
        addr = ctypes.cast(ffi.wasmtime_memory_data(self._ctx, ref), ctypes.c_void_p).value
        if size == 0 or not addr:
            return memoryview(bytearray())
        return memoryview((ctypes.c_ubyte * size).from_address(addr)).cast("B")

    def _read_global(self, index: int, valtype: int) -> "k32s.GlobalState":
        val = ffi.wasmtime_val_t()
        ffi.wasmtime_global_get(self._ctx, ctypes.byref(self._globals[index]._global), ctypes.byref(val))
        if valtype in (abi.I32, 0x7D):
            bits = val.of.i32 & _MASK32
        elif valtype in (abi.I64, 0x7C):
            bits = val.of.i64 & _MASK64
        elif valtype == 0x70:
            bits = self._funcref_index(val.of.funcref)
        else:
            raise PodError(f"global {index} has a value type the snapshot cannot hold ({valtype:#x})")
        return k32s.GlobalState(index, valtype, bits)

    def _funcref_index(self, func: Any) -> int:
        if func.store_id == 0:
            return k32s.NULL_FUNC
        raw = ffi.wasmtime_func_to_raw(self._ctx, ctypes.byref(func))
        index = self._func_index.get(raw)
        if index is None:
            raise PodError("a table or global holds a function no element segment names")
        return index

    def _read_table(self, index: int) -> "k32s.TableState":
        table = self._tables[index]
        ref = ctypes.byref(table._table)
        entries = []
        for i in range(ffi.wasmtime_table_size(self._ctx, ref)):
            val = ffi.wasmtime_val_t()
            ffi.wasmtime_table_get(self._ctx, ref, i, ctypes.byref(val))
            entries.append(self._funcref_index(val.of.funcref))
        return k32s.TableState(index, tuple(entries))

    # -- restore ---------------------------------------------------------------------------------
    def module_shape(self) -> "k32s.ModuleShape":
        info: binary.ModuleInfo = self.module.info
        limits = []
        if self.config.memory_limit_bytes is not None:
            limits.append(self.config.memory_limit_bytes)
        if info.memory and info.memory[1] is not None:
            limits.append(info.memory[1] * PAGE)
        return k32s.ModuleShape(
            image_sha256=bytes.fromhex(self.module.sha256),
            memory_limit_bytes=min(limits) if limits else None,
            globals=dict(info.mutable_globals),
            tables={i: (low, high) for i, (_rt, low, high) in info.tables.items()},
        )

    def prepare_restore(self) -> "k32s.SnapshotReader":
        """Instantiate and return a reader that streams memory into the instance."""
        if self.module.kind == "command":
            raise PodError(f"cannot restore: {self._entry_blocker()}")
        self._instantiate()
        return k32s.SnapshotReader(self.module_shape(), self._restore_target)

    def _restore_target(self, header: "k32s.Header") -> memoryview:
        ref = ctypes.byref(self._memory._memory)
        current = ffi.wasmtime_memory_size(self._ctx, ref)
        if header.memory_pages > current:
            prev = ctypes.c_uint64(0)
            error = ffi.wasmtime_memory_grow(self._ctx, ref, header.memory_pages - current, ctypes.byref(prev))
            if error:
                wasmtime.WasmtimeError._from_ptr(error)
                raise k32s.SnapshotError(
                    f"the pod's memory limit gives fewer bytes than the snapshot holds "
                    f"({header.memory_pages} pages of 64 KiB)", "memory-limit")
        view = self._memory_view()
        if len(view) < header.memory_bytes:
            raise k32s.SnapshotError(
                f"the pod's memory limit gives fewer bytes than the snapshot holds ({header.memory_bytes})",
                "memory-limit")
        return view[:header.memory_bytes]

    def finish_restore(self, snapshot: "k32s.Snapshot") -> None:
        """Globals, tables, clock, channels; k32_restored once; then held events."""
        state = snapshot.state
        if state.image_sha256.hex() != self.module.sha256:
            raise PodError("cannot restore: the snapshot was taken from another module")
        for g in state.globals:
            self._write_global(g)
        for t in state.tables:
            self._write_table(t)
        self._clock_offset = state.pod_time_ms - _now_ms()
        for ch in state.channels:
            self._channels[ch.handle] = self.host.channels.open(self.config.namespace, ch.name)
        self._next_channel = max([self._next_channel] + [h + 1 for h in self._channels])
        for ev in state.events:
            self.deliver_event(ev.topic, ev.payload)
        self._update_memory_bytes()
        self._launch("restored")

    def _write_global(self, g: "k32s.GlobalState") -> None:
        target = self._globals.get(g.index)
        if target is None or self.module.info.mutable_globals[g.index] != g.valtype:
            raise PodError(f"cannot restore: global {g.index} does not match the module")
        val = ffi.wasmtime_val_t()
        val.kind = _VALKIND[g.valtype]
        if g.valtype in (abi.I32, 0x7D):
            val.of.i32 = _signed32(g.bits)
        elif g.valtype in (abi.I64, 0x7C):
            val.of.i64 = _signed64(g.bits)
        else:
            self._table_funcs  # funcref globals go through the Func API
            wasmtime_func = None if g.bits == k32s.NULL_FUNC else self._table_funcs[g.bits]
            self._globals[g.index].set_value(self._store, wasmtime_func)
            return
        error = ffi.wasmtime_global_set(self._ctx, ctypes.byref(target._global), ctypes.byref(val))
        if error:
            raise PodError(f"cannot restore global {g.index}: {_first_line(wasmtime.WasmtimeError._from_ptr(error))}")

    def _write_table(self, t: "k32s.TableState") -> None:
        table = self._tables.get(t.index)
        if table is None:
            raise PodError(f"cannot restore: table {t.index} does not match the module")
        size = table.size(self._store)
        if len(t.entries) > size:
            table.grow(self._store, len(t.entries) - size, None)
        for i, entry in enumerate(t.entries):
            if entry != k32s.NULL_FUNC and entry not in self._table_funcs:
                raise PodError(f"cannot restore: table {t.index} names function {entry}, which no element segment names")
            table.set(self._store, i, None if entry == k32s.NULL_FUNC else self._table_funcs[entry])

    # -- memory helpers for host functions ------------------------------------------------------------
    def _mem(self) -> tuple[int, int]:
        ref = ctypes.byref(self._memory._memory)
        addr = ctypes.cast(ffi.wasmtime_memory_data(self._ctx, ref), ctypes.c_void_p).value or 0
        return addr, ffi.wasmtime_memory_data_size(self._ctx, ref)

    def _read(self, ptr: int, length: int) -> bytes | None:
        if ptr < 0 or length < 0:
            return None
        addr, size = self._mem()
        if ptr + length > size:
            return None
        return ctypes.string_at(addr + ptr, length) if length else b""

    def _text(self, ptr: int, length: int) -> str | None:
        raw = self._read(ptr, length)
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _put(self, ptr: int, length: int, value: bytes) -> int:
        """Copy up to *length* bytes of *value* to *ptr*; the full length of value."""
        if ptr < 0 or length < 0:
            return abi.K32_EINVAL
        addr, size = self._mem()
        n = min(length, len(value))
        if ptr + n > size:
            return abi.K32_EINVAL
        if n:
            ctypes.memmove(addr + ptr, value, n)
        return len(value)

    # -- host functions (module "k32"); each returns an int and never raises ---------------------------
    def _h_k32_time_ms(self) -> int:
        return _now_ms() + self._clock_offset

    def _h_k32_sleep_ms(self, ms: int) -> int:
        if ms > 0 and self._stop_event.wait(ms / 1000):
            return abi.K32_ESTATE
        return abi.K32_OK

    def _h_k32_log(self, ptr: int, length: int) -> int:
        raw = self._read(ptr, length)
        if raw is None:
            return abi.K32_EINVAL
        self.host.log(self, raw.decode("utf-8", "replace").rstrip("\n"))
        return abi.K32_OK

    def _h_k32_env(self, nptr: int, nlen: int, buf: int, length: int) -> int:
        name = self._text(nptr, nlen)
        if name is None:
            return abi.K32_EINVAL
        value = self.config.env.get(name)
        if value is None:
            return abi.K32_ENOENT
        return self._put(buf, length, value.encode())

    def _h_k32_random(self, buf: int, length: int) -> int:
        if length < 0 or length > abi.MAX_MESSAGE:
            return abi.K32_E2BIG if length > 0 else abi.K32_EINVAL
        return self._put(buf, length, random_bytes(self.host, length))

    def _request(self) -> HttpRequest | None:
        return self._exchange.request if self._exchange is not None else None

    def _h_k32_req_method(self, buf: int, length: int) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else self._put(buf, length, req.method.encode())

    def _h_k32_req_path(self, buf: int, length: int) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else self._put(buf, length, req.path.encode())

    def _h_k32_req_query(self, buf: int, length: int) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else self._put(buf, length, req.query.encode())

    def _h_k32_req_header(self, nptr: int, nlen: int, buf: int, length: int) -> int:
        req = self._request()
        if req is None:
            return abi.K32_ESTATE
        name = self._text(nptr, nlen)
        if name is None:
            return abi.K32_EINVAL
        wanted = name.lower()
        for key, value in req.headers:
            if key.lower() == wanted:
                return self._put(buf, length, value.encode())
        return abi.K32_ENOENT

    def _h_k32_req_headers(self, buf: int, length: int) -> int:
        req = self._request()
        if req is None:
            return abi.K32_ESTATE
        return self._put(buf, length, "".join(f"{k}: {v}\n" for k, v in req.headers).encode())

    def _h_k32_req_body_len(self) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else len(req.body)

    def _h_k32_req_body(self, buf: int, length: int, offset: int) -> int:
        req = self._request()
        if req is None:
            return abi.K32_ESTATE
        if offset < 0 or length < 0:
            return abi.K32_EINVAL
        chunk = req.body[offset:offset + length]
        n = self._put(buf, length, chunk)
        return n

    def _h_k32_resp_status(self, code: int) -> int:
        if self._exchange is None:
            return abi.K32_ESTATE
        if not 100 <= code <= 599:
            return abi.K32_EINVAL
        self._exchange.status = code
        return abi.K32_OK

    def _h_k32_resp_header(self, nptr: int, nlen: int, vptr: int, vlen: int) -> int:
        if self._exchange is None:
            return abi.K32_ESTATE
        name, value = self._text(nptr, nlen), self._text(vptr, vlen)
        if not name or value is None or any(c in name + value for c in "\r\n") or ":" in name:
            return abi.K32_EINVAL
        self._exchange.headers.append((name, value))
        return abi.K32_OK

    def _h_k32_resp_body(self, ptr: int, length: int) -> int:
        if self._exchange is None:
            return abi.K32_ESTATE
        raw = self._read(ptr, length)
        if raw is None:
            return abi.K32_EINVAL
        if len(self._exchange.body) + len(raw) > abi.MAX_RESPONSE_BODY:
            return abi.K32_E2BIG
        self._exchange.body += raw
        return len(raw)

    def _h_k32_event_topic(self, buf: int, length: int) -> int:
        if self._event is None:
            return abi.K32_ESTATE
        return self._put(buf, length, self._event[0])

    def _h_k32_event_payload(self, buf: int, length: int, offset: int) -> int:
        if self._event is None:
            return abi.K32_ESTATE
        if offset < 0 or length < 0:
            return abi.K32_EINVAL
        return self._put(buf, length, self._event[1][offset:offset + length])

    def _h_k32_publish(self, tptr: int, tlen: int, pptr: int, plen: int) -> int:
        topic = self._text(tptr, tlen)
        payload = self._read(pptr, plen)
        if not topic or payload is None:
            return abi.K32_EINVAL
        if plen > abi.MAX_MESSAGE:
            return abi.K32_E2BIG
        self.host.publish(self, topic, payload)
        return abi.K32_OK

    def _h_kube32_channel_open(self, nptr: int, nlen: int) -> int:
        name = self._text(nptr, nlen)
        if not name or len(name.encode()) > 255:
            return abi.K32_EINVAL
        if len(self._channels) >= abi.MAX_CHANNELS:
            return abi.K32_ENOSPC
        handle = self._next_channel
        self._next_channel += 1
        self._channels[handle] = self.host.channels.open(self.config.namespace, name)
        return handle

    def _h_kube32_channel_send(self, handle: int, ptr: int, length: int) -> int:
        endpoint = self._channels.get(handle)
        if endpoint is None:
            return abi.K32_EBADF
        if length > abi.MAX_MESSAGE:
            return abi.K32_E2BIG
        message = self._read(ptr, length)
        if message is None:
            return abi.K32_EINVAL
        return endpoint.send(message)

    def _h_kube32_channel_receive(self, handle: int, buf: int, length: int) -> int:
        endpoint = self._channels.get(handle)
        if endpoint is None:
            return abi.K32_EBADF
        size = endpoint.next_length()
        if size is None:
            return abi.K32_EAGAIN
        if size > length:
            return size            # too small: the message stays queued
        if buf < 0 or buf + size > self._mem()[1]:
            return abi.K32_EINVAL
        message = endpoint.receive()
        return self._put(buf, length, message or b"")

    def _h_kube32_channel_close(self, handle: int) -> int:
        endpoint = self._channels.pop(handle, None)
        if endpoint is None:
            return abi.K32_EBADF
        endpoint.close()
        return abi.K32_OK

    def _h_k32_fs_open(self, ptr: int, length: int) -> int:
        path = self._text(ptr, length)
        if path is None or ".." in path.split("/"):   # never climb out of a volume
            return abi.K32_EINVAL
        assets = self.config.assets
        data = assets.get(path)
        if data is None:
            data = assets.get(path.lstrip("/"))
        if data is None:
            return abi.K32_ENOENT
        if len(self._files) >= abi.MAX_OPEN_FILES:
            return abi.K32_ENOSPC
        with self._cond:
            fd = self._next_fd
            self._next_fd += 1
            self._files[fd] = _File(path, bytes(data))
        return fd

    def _h_k32_fs_size(self, fd: int) -> int:
        f = self._files.get(fd)
        return abi.K32_EBADF if f is None else len(f.data)

    def _h_k32_fs_read(self, fd: int, buf: int, length: int) -> int:
        f = self._files.get(fd)
        if f is None:
            return abi.K32_EBADF
        if length < 0:
            return abi.K32_EINVAL
        chunk = f.data[f.pos:f.pos + length]
        n = self._put(buf, length, chunk)
        if n >= 0:
            f.pos += n
        return n

    def _h_k32_fs_close(self, fd: int) -> int:
        with self._cond:
            f = self._files.pop(fd, None)
        return abi.K32_EBADF if f is None else abi.K32_OK


def _fail(fut: Future, exc: BaseException) -> None:
    if not fut.done():
        try:
            fut.set_exception(exc)
        except Exception:  # noqa: BLE001 - raced with another completion
            pass


def _first_line(exc: BaseException) -> str:
    """The cause of a wasmtime error without its backtrace."""
    text = str(exc).strip()
    if "Caused by:" in text:
        causes = [line.strip() for line in text.split("Caused by:", 1)[1].splitlines() if line.strip()]
        causes = [c.split(":", 1)[1].strip() if c[:1].isdigit() and ":" in c else c for c in causes]
        return "; ".join(causes)
    return text.splitlines()[0] if text else type(exc).__name__
