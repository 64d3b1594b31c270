"""The runtime of one kubelet: its engine (engine.py: wasmtime or pwasm), the module
cache, the pod ABI check, and the MOPS kernel.

Invariants:
- A Module's sha256 is the digest of the bytes it was loaded from; classification
  against the ABI is the same for every engine (the engine only compiles).
- One compile per digest at a time: modules are cached in memory by digest while a pod
  uses them, and the :data:`KEPT_MODULES` last loaded besides (a pod's restart finds
  its module compiled) as long as they cost the node at most :data:`KEPT_BYTES`
  (pwasm's decoded modules cost hundreds of bytes a byte: a big one goes with its pod);
  no more, so distinct modules one after another (an image whose host answers new
  bytes at each pull) cannot add up, and a deleted pod's big module does not stay.  The engine may keep its compiled
  code on disk under cache_dir (its own business).
- A Module belongs to the Runtime (engine) that loaded it.
- A Runtime may serve many kubelets at once (a fleet: kube32.sim.fleet): loads and the
  speed measurement are thread-safe, and the speed is measured once per Runtime
  (:meth:`Runtime.speed`), so a thousand nodes on one engine do not each spend a
  fifth of a second of CPU at boot on the same figure.
"""
from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path

from . import abi, binary
from .engines import DEFAULT_ENGINE, create
from .types import ImageError, Module

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
# MOPS_KERNEL_WAT in the binary format (every engine reads this; the unit tests check
# that it is the same module).
MOPS_KERNEL_WASM = bytes.fromhex(
    "0061736d0100000001060160017f017f030201000707010372756e00000a3d013b01037f41b9e0002102"
    "024003402002418dcce5006c41dfe6bbe3036a210220032002410776732103200141016a210120012000"
    "490d000b0b20030b0029046e616d65021101000400016e0101690201780303616363030f0100020004"
    "646f6e6501046e657874")
# mul, add, shr_u, xor, add, lt_u, br_if: the operations one iteration counts.
MOPS_OPS_PER_ITERATION = 7
MOPS_RUNS = 5                 # the figure is the best of these runs
MOPS_RUN_SECONDS = 0.04       # CPU time of one run
MOPS_MAX_ITERATIONS = 1 << 30
KEPT_MODULES = 8              # modules no pod uses that stay compiled, the last loaded,
KEPT_BYTES = 64 << 20         # and what they cost the node (Module.cost_bytes) at most


class Runtime:
    def __init__(self, cache_dir: Path | None = None, engine: str = DEFAULT_ENGINE,
                 kept_bytes: int = KEPT_BYTES) -> None:
        """ValueError naming the engines when ``engine`` is none of them (or is not
        available on this machine).  ``kept_bytes``: what the modules no pod uses may cost
        (Module.cost_bytes), at most :data:`KEPT_BYTES`."""
        self.engine = create(engine, Path(cache_dir) if cache_dir is not None else None)
        self.kept_bytes = min(kept_bytes, KEPT_BYTES)
        # Every module a pod holds (weakly: it goes with its last pod) and the last loaded.
        self._modules: weakref.WeakValueDictionary[str, Module] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[str, Module] = OrderedDict()
        self._building: dict[str, threading.Lock] = {}   # digest -> the lock of its one compile
        self._lock = threading.Lock()
        self._speed: float | None = None
        self._speed_lock = threading.Lock()

    def close(self) -> None:
        self.engine.close()

    # -- loading -----------------------------------------------------------------
    def load(self, wasm: bytes, expected_sha256: str | None = None) -> Module:
        wasm = bytes(wasm)
        digest = hashlib.sha256(wasm).hexdigest()
        if expected_sha256 is not None and expected_sha256.lower() != digest:
            raise ImageError(f"image digest mismatch: expected {expected_sha256.lower()}, got {digest}")
        with self._lock:
            cached = self._cached(digest)
            building = self._building.setdefault(digest, threading.Lock())
        if cached is not None:
            return cached
        # One compile per digest: pods of the same image starting together wait for it.
        try:
            with building:
                with self._lock:
                    cached = self._cached(digest)
                return cached if cached is not None else self._compile(wasm, digest)
        finally:
            with self._lock:
                if not building.locked():
                    self._building.pop(digest, None)

    def _cached(self, digest: str) -> Module | None:
        """Under ``_lock``: the module of ``digest`` if it is still here, now the last used."""
        module = self._modules.get(digest)
        if module is not None:
            self._recent[digest] = module
            self._recent.move_to_end(digest)
            while len(self._recent) > KEPT_MODULES or (
                    self._recent and sum(m.cost_bytes for m in self._recent.values()) > self.kept_bytes):
                self._recent.popitem(last=False)
        return module

    def _compile(self, wasm: bytes, digest: str) -> Module:
        try:
            info = binary.parse(wasm)
        except binary.BinaryError as exc:
            raise ImageError(f"not a valid WebAssembly module: {exc}") from None
        kind, entry = classify(info)
        compiled = self.engine.compile(wasm, info, digest)
        cost, per_instance = self.engine.costs(compiled, info, len(wasm))
        module = Module(
            sha256=digest, kind=kind, entry_point=entry,
            exports=frozenset(info.exports), size=len(wasm),
            compiled=compiled, info=info, engine_id=id(self.engine),
            cost_bytes=cost, instance_bytes=per_instance,
        )
        with self._lock:
            self._modules[digest] = module
            self._cached(digest)
        return module

    # -- speed -------------------------------------------------------------------
    def speed(self) -> float:
        """:meth:`measure_mops`, measured at the first call and the same figure after it
        (one engine, one machine: every node sharing this runtime reports it)."""
        with self._speed_lock:
            if self._speed is None:
                self._speed = self.measure_mops()
            return self._speed

    def measure_mops(self) -> float:
        """Millions of i32 operations per second of the fixed kernel: the best of
        :data:`MOPS_RUNS` runs of about :data:`MOPS_RUN_SECONDS` each, timed in the CPU
        time of this thread.  Wall time counts the time other processes hold the CPU
        (a loaded machine halved the figure), so two identical nodes could differ
        twice over; the thread's CPU time counts only the kernel's own instructions,
        and the best run drops the ones a cache flush or an interrupt slowed."""
        run = self.engine.kernel(MOPS_KERNEL_WASM)

        def cpu_seconds(n: int) -> float:
            start = time.thread_time()
            run(n)
            return max(time.thread_time() - start, 1e-9)

        n = 10_000
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
        sig = info.types[desc] if isinstance(desc, int) else None
        if sig is None:
            raise ImageError(f"import {module}.{name} has no function type")
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
