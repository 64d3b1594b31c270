"""The engine of one kubelet: a wasmtime Engine with epoch interruption, a ticker
thread that advances the epoch, the compiled-module cache, and the MOPS kernel.

Invariants:
- A Module's sha256 is the digest of the bytes it was loaded from; the code that
  runs is the same module with reserved exports added (see binary.py).
- Compiled code is cached by (digest, engine config tag), in memory and, with a
  cache_dir, on disk as wasmtime's serialized form.  Serialized code is trusted
  only because the cache directory is the kubelet's own.
- FuncType objects belong to this Runtime's Engine; never share them across engines.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import wasmtime

from . import abi, binary
from .types import ImageError, Module

EPOCH_TICK_S = 0.005
CONFIG_TAG = f"wasmtime-{getattr(wasmtime, '__version__', 'x')}-epoch-v1"

MOPS_KERNEL_WAT = """
(module
  (func (export "run") (param $n i32) (result i32)
    (local $i i32) (local $x i32) (local $acc i32)
    (local.set $x (i32.const 12345))
    (block $done
      (loop $next
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 1664525)) (i32.const 1013904223)))
        (local.set $acc (i32.xor (local.get $acc) (i32.shr_u (local.get $x) (i32.const 7))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $next (i32.lt_u (local.get $i) (local.get $n)))))
    (local.get $acc)))
"""
# mul, add, shr_u, xor, add, lt_u, br_if: the operations one iteration counts.
MOPS_OPS_PER_ITERATION = 7
MOPS_RUNS = 5                 # the figure is the best of these runs
MOPS_RUN_SECONDS = 0.04       # CPU time of one run
MOPS_MAX_ITERATIONS = 1 << 30


class Runtime:
    def __init__(self, cache_dir: Path | None = None) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._modules: dict[str, Module] = {}
        self._building: dict[str, threading.Lock] = {}   # digest -> the lock of its one compile
        self._lock = threading.Lock()
        self._functypes: dict[tuple, wasmtime.FuncType] = {}
        self._closed = threading.Event()
        self._ticker = threading.Thread(target=self._tick_epoch, name="k32-epoch", daemon=True)
        self._ticker.start()

    # -- epoch ------------------------------------------------------------------
    def _tick_epoch(self) -> None:
        while not self._closed.wait(EPOCH_TICK_S):
            self.engine.increment_epoch()

    def ticks_for_ms(self, ms: float) -> int:
        return max(1, int(ms / (EPOCH_TICK_S * 1000)) + 1)

    def close(self) -> None:
        self._closed.set()
        self._ticker.join(timeout=1)

    # -- types -------------------------------------------------------------------
    def functype(self, params: tuple[int, ...], results: tuple[int, ...]) -> wasmtime.FuncType:
        key = (params, results)
        with self._lock:
            ft = self._functypes.get(key)
            if ft is None:
                vt = {abi.I32: wasmtime.ValType.i32(), abi.I64: wasmtime.ValType.i64()}
                ft = wasmtime.FuncType([vt[p] for p in params], [vt[r] for r in results])
                self._functypes[key] = ft
            return ft

    # -- loading -----------------------------------------------------------------
    def load(self, wasm: bytes, expected_sha256: str | None = None) -> Module:
        wasm = bytes(wasm)
        digest = hashlib.sha256(wasm).hexdigest()
        if expected_sha256 is not None and expected_sha256.lower() != digest:
            raise ImageError(f"image digest mismatch: expected {expected_sha256.lower()}, got {digest}")
        with self._lock:
            cached = self._modules.get(digest)
            building = self._building.setdefault(digest, threading.Lock())
        if cached is not None:
            return cached
        # One compile per digest: pods of the same image starting together wait for it.
        with building:
            with self._lock:
                cached = self._modules.get(digest)
            if cached is not None:
                return cached
            try:
                info = binary.parse(wasm)
            except binary.BinaryError as exc:
                raise ImageError(f"not a valid WebAssembly module: {exc}") from None
            kind, entry = classify(info)
            compiled = self._compile(digest, wasm, info)
            module = Module(
                sha256=digest, kind=kind, entry_point=entry,
                exports=frozenset(info.exports), size=len(wasm),
                compiled=compiled, info=info, engine_id=id(self.engine),
            )
            with self._lock:
                self._modules[digest] = module
            return module

    def _compile(self, digest: str, wasm: bytes, info: binary.ModuleInfo) -> wasmtime.Module:
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
            raise ImageError(f"module does not compile: {_first_line(exc)}") from None
        if path is not None:
            # A name of this writer's own: other processes may share the cache directory.
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(compiled.serialize())
            tmp.replace(path)
        return compiled

    # -- speed -------------------------------------------------------------------
    def measure_mops(self) -> float:
        """Millions of i32 operations per second of the fixed kernel: the best of
        :data:`MOPS_RUNS` runs of about :data:`MOPS_RUN_SECONDS` each, timed in the CPU
        time of this thread.  Wall time counts the time other processes hold the CPU
        (a loaded machine halved the figure), so two identical nodes could differ
        twice over; the thread's CPU time counts only the kernel's own instructions,
        and the best run drops the ones a cache flush or an interrupt slowed."""
        store = wasmtime.Store(self.engine)
        store.set_epoch_deadline(1 << 40)
        module = wasmtime.Module(self.engine, wasmtime.wat2wasm(MOPS_KERNEL_WAT))
        run = wasmtime.Instance(store, module, []).exports(store)["run"]

        def cpu_seconds(n: int) -> float:
            start = time.thread_time()
            run(store, n)
            return max(time.thread_time() - start, 1e-9)

        n = 100_000
        elapsed = cpu_seconds(n)
        while elapsed < MOPS_RUN_SECONDS / 4 and n < MOPS_MAX_ITERATIONS:
            n = min(MOPS_MAX_ITERATIONS, n * 4)
            elapsed = cpu_seconds(n)
        n = max(1, min(MOPS_MAX_ITERATIONS, int(n * MOPS_RUN_SECONDS / elapsed)))
        best = min(cpu_seconds(n) for _ in range(MOPS_RUNS))
        return n * MOPS_OPS_PER_ITERATION / best / 1e6


def classify(info: binary.ModuleInfo) -> tuple[str, str | None]:
    """("request"|"command", entry point) or ImageError naming what is wrong."""
    for name in info.exports:
        if name.startswith(binary.RESERVED_PREFIX):
            raise ImageError(f"export {name} uses the reserved prefix {binary.RESERVED_PREFIX}")
    for module, name, kind, desc in info.imports:
        if module != abi.IMPORT_MODULE or kind != binary.KIND_FUNC or name not in abi.IMPORTS:
            raise ImageError(f"import {module}.{name} is not part of the pod ABI")
        sig = info.types[desc]  # type: ignore[index]
        if (sig.params, sig.results) != abi.IMPORTS[name]:
            raise ImageError(f"import {module}.{name} has the wrong signature")
    if info.memory is None:
        raise ImageError("module defines no linear memory")
    if info.imported_memories:
        raise ImageError("module imports its memory; a pod must define its own")
    entry = next((e for e in abi.ENTRY_POINTS if info.signature_of_export(e) is not None), None)
    for name, (params, results) in abi.EXPORTS.items():
        sig = info.signature_of_export(name)
        if name in info.exports and (sig is None or (sig.params, sig.results) != (params, results)):
            raise ImageError(f"export {name} has the wrong signature")
    if entry is not None:
        sig = info.signature_of_export(entry)
        if sig is not None and (any(p not in (abi.I32, abi.I64) for p in sig.params) or len(sig.results) > 1):
            raise ImageError(f"entry point {entry} has an unsupported signature")
        return "command", entry
    if any(e in info.exports for e in abi.REQUEST_EXPORTS):
        return "request", None
    raise ImageError("module exports none of k32_handle, k32_tick, k32_event, _start, app_main, main")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
