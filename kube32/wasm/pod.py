"""One running pod: its instance, its call thread, freeze/thaw, snapshot and restore.

This module holds the pod lifecycle and imports no engine: it runs Wasm through the
engine seam (engine.py) of its Runtime, and the ABI's host functions are hostcalls.py.

Design and invariants:
- Every pod has one call thread that owns the engine instance once the pod runs.
  Calls (k32_init, k32_handle, k32_tick, k32_event, k32_restored) run one at a time
  on it.  Before the thread starts (instantiate, restore), the caller's thread owns
  the instance.
- Interruption: every call has a deadline (config.call_timeout_ms; none for a command
  pod's entry point), enforced by the engine; stop() interrupts the instance, which
  ends the running call and every later one.
- Events wait in one queue, in the order they came: a running pod's holds up to
  MAX_QUEUED_EVENTS events and MAX_QUEUED_EVENT_BYTES of topics and payloads; later ones
  are dropped and counted (dropped_events).
- Frozen means: no call runs and none starts; ticks stop; events that arrive are held
  while fewer than 8 wait (those it had queued count), later ones dropped and counted;
  handle() raises PodFrozen.  The freeze drops nothing: the events the pod had queued
  are its own and the snapshot carries them all.  The pod clock stops at the freeze, so
  the same frozen pod gives the same snapshot every time; thaw resumes the clock from
  that value and delivers held events first.
- Pod clock: k32_time_ms = monotonic ms + offset.  Start sets it to 0, a restore to
  the snapshot's pod time: it never goes backward.
- A snapshot holds state as the engines give it, exact bits and function indices,
  so a pod saved on one engine restores on another.  The function indices of a
  snapshot's tables and funcref globals are checked against the module here, for
  every engine alike.
- Memory limit: the engines cap memory at the whole pages within it; below one page the
  pod has one page of which only the limit is backed, and a call (or the module's data)
  that leaves a byte past the limit fails as a trap would, so a snapshot (the limit's
  bytes) holds all the pod keeps.  footprint_bytes (memory, table entries and what the
  instance costs its engine) is what the node's heap counts for the pod, beside its
  module's own cost (Module.cost_bytes, once per module).
- A snapshot's writer holds a view of the memory: the thaw releases it (a bytearray
  memory cannot grow while a view lives).
- A command pod's entry point that returns an i32 returns its exit code (its low 8 bits,
  as a process's exit status): 0 is on_exit(0, "Completed", ...), any other
  on_exit(code, "Error", ...); one that returns nothing exits 0.
- A trap (or call timeout) ends the pod: state "failed", last_error set, pending
  requests fail with PodError, and on_exit(1, "Error", message) is called - except
  for the k32_init / k32_restored that start() / finish_restore() wait for, whose
  failure is raised to the caller as PodError instead.
- A start is bounded: the module's start function and k32_init / k32_restored run within
  the config's start timeout (PodConfig.start_timeout_ms, the call timeout when None);
  past it start() / finish_restore() raise StartTimeout (a PodError) naming which.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

from kube32 import snapshot as k32s
from kube32.terms import ContainerReason

from . import abi, binary
from .engine import NULL_FUNC, TABLE_ENTRY_BYTES, CallFailed, Instance, InstantiateError, memory_pages
from .host import HostServices
from .hostcalls import Exchange, HostCalls, now_ms
from .runtime import Runtime
from .types import CallTimeout, HttpRequest, HttpResponse, Module, PodConfig, PodError, PodFrozen, StartTimeout

PAGE = 65536
# The events (and bytes of topics and payloads) a pod's queue holds at most: a snapshot
# carries the queue whole, so these are K32S v1's bounds of its EVENTS section.
MAX_QUEUED_EVENTS = k32s.MAX_EVENTS
MAX_QUEUED_EVENT_BYTES = k32s.MAX_EVENT_BYTES


def _event_size(topic: str, payload: bytes) -> int:
    return len(topic.encode()) + len(payload)


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
        self._result: int | None = None   # what the last call returned (an i32; see _call)
        self.dropped_events = 0
        self.frozen = False
        self._freezing = False
        self._cond = threading.Condition()
        self._busy: str | None = None
        self._events: deque[tuple[str, bytes]] = deque()
        self._event_bytes = 0  # the topics and payloads in _events (_event_size)
        self._requests: deque[tuple[HttpRequest, Future]] = deque()
        self._first_job: str | None = None
        self._first_done = threading.Event()
        self._first_error: str | None = None
        self._first_timed_out = False     # the first call failed by its start timeout
        self._timed_out = False           # the last _call ended by its deadline
        self._stopping = False
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock_offset = -now_ms()
        self._frozen_at: tuple[int, int] | None = None   # (pod time, unix time) at the freeze
        self._next_tick: float | None = None
        self._memory_bytes = 0
        self._table_bytes = 0
        self._instance: Instance | None = None
        self._writers: list[k32s.SnapshotWriter] = []   # snapshots of this freeze: released at the thaw
        self._funcs: frozenset[str] = frozenset()
        self._calls = HostCalls(self, config, host, self._clock, self._stop_event)

    # -- public properties --------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    @property
    def footprint_bytes(self) -> int:
        """What the pod costs its node's heap: its linear memory, its tables and what its
        instance costs the engine (Module.instance_bytes); its module's own cost
        (Module.cost_bytes) is the node's, once for all the pods of the module."""
        return self._memory_bytes + self._table_bytes + self.module.instance_bytes

    @property
    def key(self) -> str:
        return f"{self.config.namespace}/{self.config.name}/{self.config.container}"

    def pod_time_ms(self) -> int:
        with self._cond:
            if self._frozen_at is not None:
                return self._frozen_at[0]
        return self._clock()

    def _clock(self) -> int:
        return now_ms() + self._clock_offset

    # -- instantiation -------------------------------------------------------------
    def _instantiate(self) -> None:
        if self._instance is not None:
            raise PodError("pod was already started")
        info: binary.ModuleInfo = self.module.info
        limit = self.config.memory_limit_bytes
        timeout = self._start_timeout_ms()
        imports = self._calls.functions(name for (_m, name, _k, _d) in info.imports)
        try:
            instance = self.runtime.engine.instantiate(
                self.module.compiled, info, imports, limit, time.monotonic() + timeout / 1000)
        except (CallFailed, InstantiateError) as exc:
            message = str(exc)
            if isinstance(exc, CallFailed) and exc.kind == "timeout":
                raise StartTimeout(f"cannot instantiate the module: its start function did not return within "
                                   f"the start timeout of {timeout} ms") from None
            if limit is not None and info.memory and info.memory[0] > memory_pages(limit):
                message = (f"memory limit of {limit} bytes holds {memory_pages(limit)} whole pages of 64 KiB, "
                           f"below the module's initial memory of {info.memory[0]} pages "
                           f"({info.memory[0] * PAGE} bytes)")
            raise PodError(f"cannot instantiate the module: {message}") from None
        self._instance = instance
        self._calls.instance = instance
        if self._stopping:          # stop() came while the instance was being made
            instance.interrupt()
        self._funcs = frozenset(n for n in (*abi.EXPORTS, *abi.ENTRY_POINTS) if n in instance.functions)
        self._update_memory_bytes()
        unbacked = self._unbacked_error()
        if unbacked is not None:
            raise PodError(f"cannot instantiate the module: its data segments write {unbacked}")

    def _start_timeout_ms(self) -> int:
        start = self.config.start_timeout_ms
        return self.config.call_timeout_ms if start is None else start

    # -- calling Wasm -----------------------------------------------------------------
    def _call(self, name: str, *args: int, timeout_ms: int | None = None) -> str | None:
        """Run export *name* (within ``timeout_ms``, by default the call timeout); None, or
        the error message of a trap or timeout (``_timed_out`` then says which)."""
        self._timed_out = False
        if name not in self._funcs:
            return None
        assert self._instance is not None
        timeout = self.config.call_timeout_ms if timeout_ms is None else timeout_ms
        deadline = None if name in abi.ENTRY_POINTS else time.monotonic() + timeout / 1000
        error = None
        self._result = None
        try:
            self._result = self._instance.call(name, args, deadline)
        except CallFailed as exc:
            self._timed_out = exc.kind == "timeout"
            what = "the call timeout" if timeout_ms is None else "the start timeout"
            error = {"timeout": f"call {name} exceeded {what} of {timeout} ms",
                     "interrupted": "pod stopped"}.get(exc.kind, exc.message)
        self._update_memory_bytes()
        if error is None:
            unbacked = self._unbacked_error()
            error = None if unbacked is None else f"the pod wrote {unbacked}"
        return error

    def _unbacked_error(self) -> str | None:
        """A pod whose memory limit is below one page has one page of which only the limit
        is backed (a snapshot holds the limit, a board has no more): what it kept past the
        limit would be lost by a move, so a call that leaves a byte there fails (as a trap).
        None when nothing lies past the limit; else where the first byte is."""
        limit = self.config.memory_limit_bytes
        instance = self._instance
        if limit is None or limit >= PAGE or instance is None:
            return None
        rest = instance.read(limit, max(0, instance.memory_size() - limit)) or b""
        kept = rest.lstrip(b"\0")
        if not kept:
            return None
        return (f"byte {limit + len(rest) - len(kept)} of its memory, past its memory limit of {limit} bytes "
                f"(a limit below one 64 KiB page backs only the limit)")

    def _update_memory_bytes(self) -> None:
        instance = self._instance
        size = instance.memory_size() if instance is not None else 0
        limit = self.config.memory_limit_bytes
        self._memory_bytes = min(size, limit) if limit is not None and limit < PAGE else size
        self._table_bytes = instance.table_entries() * TABLE_ENTRY_BYTES if instance is not None else 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Instantiate, run k32_init (PodError on a trap, StartTimeout past the start
        timeout), then serve and tick."""
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
            raise (StartTimeout if self._first_timed_out else PodError)(self._first_error)

    def stop(self) -> None:
        """Interrupt a running call, end the thread, close channels and files."""
        with self._cond:
            self._stopping = True
            self._stop_event.set()
            self._cond.notify_all()
        if self._instance is not None:
            self._instance.interrupt()
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
        self._calls.close()

    # -- the call thread -----------------------------------------------------------------------
    def _run(self) -> None:
        first = self._first_job
        if self.module.kind == "command":
            self._run_command()
            return
        first_call = "k32_init" if first == "init" else "k32_restored"
        with self._cond:
            self._busy = first_call
        error = self._call(first_call, timeout_ms=self._start_timeout_ms())
        with self._cond:
            self._busy = None
            self._cond.notify_all()
        if error is not None:
            self._first_timed_out = self._timed_out
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
                        self._event_bytes -= _event_size(topic, payload)
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
            exchange = self._calls.exchange = Exchange(req)
            try:
                error = self._call("k32_handle")
                if error is None:
                    fut.set_result(exchange.response())
                else:
                    fut.set_exception(PodError(f"k32_handle failed: {error}"))
                return error
            finally:
                self._calls.exchange = None
        if name == "k32_event":
            _, topic, payload = job
            event = self._calls.event = (topic.encode(), payload)
            try:
                return self._call("k32_event", len(event[0]), len(payload))
            finally:
                self._calls.event = None
        return self._call(name)

    def _run_command(self) -> None:
        with self._cond:
            self.state = "running"
        entry = self.module.entry_point
        assert entry is not None   # a command pod's module has one (kube32.wasm.runtime.classify)
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
        result = self._result
        if result is None:
            self._notify_exit(0, ContainerReason.COMPLETED, f"{entry} returned")
        else:   # as a process's exit status: its low 8 bits (POSIX), Kubernetes' reasons
            code = result & 0xFF
            self._notify_exit(code, ContainerReason.COMPLETED if code == 0 else ContainerReason.ERROR,
                              f"{entry} returned {result}")

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
        self._notify_exit(1, ContainerReason.ERROR, message)

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
            # Frozen, an event is held only while fewer than 8 wait; freezing (the current
            # call ends first) the pod still runs, and queues as a running pod does.
            limit = abi.MAX_HELD_EVENTS if self.frozen else MAX_QUEUED_EVENTS
            size = _event_size(topic, payload)
            if len(self._events) >= limit or self._event_bytes + size > MAX_QUEUED_EVENT_BYTES:
                self.dropped_events += 1
                return
            self._events.append((topic, bytes(payload)))
            self._event_bytes += size
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
            self._frozen_at = (self._clock(), int(time.time() * 1000))
            self._freezing = False
            self.frozen = True
            self.state = "frozen"
            pending = list(self._requests)
            self._requests.clear()
        for _req, fut in pending:
            _fail(fut, PodFrozen("pod is frozen"))

    def thaw(self) -> None:
        with self._cond:
            if not self.frozen or self._frozen_at is None:
                raise PodError("pod is not frozen")
            self._clock_offset = self._frozen_at[0] - now_ms()
            self._frozen_at = None
            # The snapshots' views of the memory go now, not when their writers are
            # collected: the pod's own memory.grow must not find its memory held.
            for writer in self._writers:
                writer.release()
            self._writers.clear()
            self.frozen = False
            self.state = "running"
            if self._next_tick is not None:
                self._next_tick = time.monotonic() + self.config.tick_interval_ms / 1000  # type: ignore[operator]
            self._cond.notify_all()

    def blockers(self) -> list[str]:
        if self.module.kind == "command":
            return [self._entry_blocker()]
        return self._unsaved_globals() + self._calls.open_files()

    def _unsaved_globals(self) -> list[str]:
        """Mutable globals K32S cannot carry (an externref is a host's reference; a v128
        has no K32S type): the pod cannot be saved or moved, said as a blocker, not a 500."""
        kinds = {0x6F: "externref", 0x7B: "v128"}
        return [f"mutable global {index} is of type {kinds.get(valtype, f'0x{valtype:02X}')}, which a "
                f"snapshot cannot carry (K32S holds {', '.join(k32s.VALTYPE_NAMES.values())} globals)"
                for index, valtype in sorted(self.module.info.mutable_globals.items())
                if valtype not in k32s.VALTYPE_NAMES]

    def _entry_blocker(self) -> str:
        return f"entry point {self.module.entry_point} runs on its own thread"

    # -- snapshot ----------------------------------------------------------------------------------
    def snapshot(self) -> "k32s.SnapshotWriter":
        """The pod's K32S snapshot; only while frozen.  The memory pieces are views of
        the instance's linear memory: keep the pod frozen until the writer is done (the
        thaw releases the writer's view)."""
        with self._cond:
            if not self.frozen or self._frozen_at is None:
                raise PodError("pod is not frozen")
            blockers = self.blockers()
            if blockers:
                raise PodError("pod cannot move: " + "; ".join(blockers))
            pod_time, unix_time = self._frozen_at
            events = tuple(k32s.HeldEvent(t, p) for t, p in self._events)
            channels = self._calls.channel_states()
        instance = self._instance
        assert instance is not None
        info: binary.ModuleInfo = self.module.info
        view = instance.memory_view()
        memory_bytes = self._memory_bytes
        state = k32s.PodState(
            image_sha256=bytes.fromhex(self.module.sha256),
            memory_bytes=memory_bytes,
            memory_pages=len(view) // PAGE,
            pod_time_ms=pod_time,
            unix_time_ms=unix_time,
            globals=tuple(k32s.GlobalState(i, vt, instance.get_global(i, vt))
                          for i, vt in sorted(info.mutable_globals.items())),
            tables=tuple(k32s.TableState(i, instance.get_table(i)) for i in sorted(info.tables)),
            channels=channels,
            events=events,
        )
        writer = k32s.SnapshotWriter(state, view[:memory_bytes])
        view.release()
        with self._cond:
            self._writers.append(writer)
        return writer

    def snapshot_size(self) -> int:
        """The size a snapshot taken now would have, without a freeze (the control plane
        finds room for it before the pod freezes).  Exact but for what may change before
        the freeze: the memory or a table growing, events arriving, channels opening."""
        with self._cond:
            events = tuple(k32s.HeldEvent(t, p) for t, p in self._events)
            channels = self._calls.channel_states()
            memory_bytes = self._memory_bytes
        info: binary.ModuleInfo = self.module.info
        return k32s.snapshot_size(k32s.PodState(
            image_sha256=bytes.fromhex(self.module.sha256), memory_bytes=memory_bytes,
            memory_pages=-(-memory_bytes // PAGE), pod_time_ms=0, unix_time_ms=0,
            globals=tuple(k32s.GlobalState(i, vt, 0) for i, vt in sorted(info.mutable_globals.items())),
            tables=tuple(k32s.TableState(i, (0,) * info.tables[i][1]) for i in sorted(info.tables)),
            channels=channels, events=events))

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
        instance = self._instance
        assert instance is not None
        current = instance.memory_size() // PAGE
        if header.memory_pages > current and not instance.grow_memory(header.memory_pages - current):
            raise k32s.SnapshotError(
                f"the pod's memory limit gives fewer bytes than the snapshot holds "
                f"({header.memory_pages} pages of 64 KiB)", "memory-limit")
        view = instance.memory_view()
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
        instance = self._instance
        assert instance is not None
        info: binary.ModuleInfo = self.module.info
        for g in state.globals:
            if info.mutable_globals.get(g.index) != g.valtype:
                raise PodError(f"cannot restore: global {g.index} does not match the module")
            if g.valtype == binary.FUNCREF:
                self._check_function(f"global {g.index}", g.bits)
            instance.set_global(g.index, g.valtype, g.bits)
        for t in state.tables:
            if t.index not in info.tables:
                raise PodError(f"cannot restore: table {t.index} does not match the module")
            for entry in t.entries:
                self._check_function(f"table {t.index}", entry)
            instance.set_table(t.index, t.entries)
        self._clock_offset = state.pod_time_ms - now_ms()
        try:
            try:
                self._calls.reopen_channels(state.channels)
            except ValueError as e:
                raise PodError(f"cannot restore: {e}") from None
            for ev in state.events:
                self.deliver_event(ev.topic, ev.payload)
            self._update_memory_bytes()
            self._launch("restored")
        except BaseException:
            # A restore that fails gives back what it registered on the node (its channels)
            # now, not when someone stops the instance.
            self._close_node_resources()
            raise

    def _check_function(self, where: str, index: int) -> None:
        if index != NULL_FUNC and index not in self.module.info.table_funcs:
            raise PodError(f"cannot restore: {where} names function {index}, which no element segment names")


def _fail(fut: Future, exc: BaseException) -> None:
    if not fut.done():
        try:
            fut.set_exception(exc)
        except Exception:  # noqa: BLE001 - raced with another completion
            pass
