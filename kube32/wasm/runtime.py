"""The runtime of one kubelet: its engine (engine.py: wasmtime or pwasm), the module
cache, the pod ABI check, and the MOPS kernel.

Invariants:
- A Module's sha256 is the digest of the bytes it was loaded from; classification
  against the ABI is the same for every engine (the engine only compiles).
- One compile per digest: modules are cached in memory by digest, and the engine
  may keep its compiled code on disk under cache_dir (its own business).
- A Module belongs to the Runtime (engine) that loaded it.
"""
from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

from . import abi, binary
from .engine import DEFAULT_ENGINE, create
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


class Runtime:
    def __init__(self, cache_dir: Path | None = None, engine: str = DEFAULT_ENGINE) -> None:
        """ValueError naming the engines when ``engine`` is none of them (or is not
        available on this machine)."""
        self.engine = create(engine, Path(cache_dir) if cache_dir is not None else None)
        self._modules: dict[str, Module] = {}
        self._building: dict[str, threading.Lock] = {}   # digest -> the lock of its one compile
        self._lock = threading.Lock()

    def close(self) -> None:
        self.engine.close()

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
            compiled = self.engine.compile(wasm, info, digest)
            module = Module(
                sha256=digest, kind=kind, entry_point=entry,
                exports=frozenset(info.exports), size=len(wasm),
                compiled=compiled, info=info, engine_id=id(self.engine),
            )
            with self._lock:
                self._modules[digest] = module
            return module

    # -- speed -------------------------------------------------------------------
    def measure_mops(self) -> float:
        """Run the fixed kernel for ~0.3 s; millions of i32 operations per second."""
        run = self.engine.kernel(MOPS_KERNEL_WASM)
        n = 1_000_000
        while True:
            start = time.perf_counter()
            run(n)
            elapsed = time.perf_counter() - start
            if elapsed >= 0.1 or n >= 1 << 30:
                break
            n = min(1 << 30, int(n * max(2.0, 0.25 / max(elapsed, 1e-6))))
        return n * MOPS_OPS_PER_ITERATION / elapsed / 1e6


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
