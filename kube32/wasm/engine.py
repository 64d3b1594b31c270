"""The engine seam: what a pod needs from a WebAssembly engine, and nothing more.

As runwasi's ``Engine`` trait, one small interface stands between the pod lifecycle
(pod.py: calls, freeze, snapshot, restore) and the code that runs Wasm.  Two engines
implement it:

- ``wasmtime`` (engine_wasmtime.py): compiled to native code, Wasm runs without the
  GIL; all of wasmtime's private FFI lives in that one module.
- ``pwasm`` (engine_pwasm.py): a pure-Python interpreter, so it runs wherever Python
  does (any CPU), at a board's order of speed.

The ABI's host functions (hostcalls.py) are the same Python code for every engine;
an engine only adapts their calling convention.  A snapshot taken on one engine
restores on the other: everything a snapshot holds goes through this interface as
exact bits, never through a Python float.

Interface (what an engine promises):

- ``Engine.compile(wasm, info, digest)`` loads and validates a module (ImageError,
  naming the cause, when it cannot run); the result is shared by every instance.
- ``Engine.instantiate(compiled, info, imports, memory_limit_bytes, deadline)``: a
  fresh instance whose imports are the ABI's host functions (name -> callable taking
  the signed i32 arguments and returning an int; it never raises).  Memory is capped
  at the limit rounded up to whole 64 KiB pages.  A start function that outlives
  ``deadline`` raises CallFailed ("timeout"); a module that does not link or fit, or
  whose start function traps, raises InstantiateError.
- ``Instance.call(name, args, deadline)``: runs an export; ``deadline`` is a
  ``time.monotonic()`` value or None.  Raises CallFailed with kind "trap",
  "timeout" (the deadline passed) or "interrupted" (``interrupt()``).
- ``Instance.interrupt()`` may be called from any thread; it is sticky: the running
  call and every later one end with kind "interrupted" (the pod is stopping).
- Memory: ``memory_size()`` in bytes, ``grow_memory(pages)``, ``read``/``write`` with
  bounds checks (None / False when a range leaves memory, never a trap), and
  ``memory_view()``: the linear memory itself as a writable memoryview, no copy.  A
  view is valid until the memory grows or a call runs; callers drop it before.
- State by index, hidden ones included (clang's ``__stack_pointer`` is exported by
  nobody): ``get_global(index, valtype)`` / ``set_global(index, valtype, bits)`` as
  raw bits (f32 and f64 NaN payloads kept), funcrefs as the function's index or
  NULL_FUNC; ``get_table(index)`` / ``set_table(index, entries)`` as function indices.
  The pod checks a snapshot's function indices against the module before it sets them.

Engines are created by name (:func:`create`); each engine module is imported only when
asked for, so a machine without wasmtime (a CPU it has no wheel for) runs pwasm.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from kube32.snapshot import NULL_FUNC

from .binary import ModuleInfo

__all__ = ["ENGINES", "DEFAULT_ENGINE", "NULL_FUNC", "Engine", "Instance", "CallFailed",
           "InstantiateError", "HostFunction", "create", "engine_class"]

# name -> "module:class"; a module is imported only when its engine is created.
ENGINES: dict[str, str] = {
    "wasmtime": "kube32.wasm.engine_wasmtime:WasmtimeEngine",
    "pwasm": "kube32.wasm.engine_pwasm:PwasmEngine",
}
DEFAULT_ENGINE = "wasmtime"
PAGE = 65536

HostFunction = Callable[..., int]


class CallFailed(Exception):
    """A call (or a start function) did not return.  ``kind`` is "trap" (``message``
    says why), "timeout" (its deadline passed) or "interrupted" (``interrupt()``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class InstantiateError(Exception):
    """The module does not link or does not fit its limits; str() names the cause."""


class Instance(ABC):
    """One instance of a module (see the module docstring for the contract)."""

    functions: frozenset[str]       # the exported functions that can be called

    @abstractmethod
    def call(self, name: str, args: Sequence[int], deadline: float | None) -> None: ...

    @abstractmethod
    def interrupt(self) -> None: ...

    @abstractmethod
    def memory_size(self) -> int: ...

    @abstractmethod
    def grow_memory(self, pages: int) -> bool: ...

    @abstractmethod
    def memory_view(self) -> memoryview: ...

    @abstractmethod
    def read(self, ptr: int, length: int) -> bytes | None: ...

    @abstractmethod
    def write(self, ptr: int, data: bytes) -> bool: ...

    @abstractmethod
    def get_global(self, index: int, valtype: int) -> int: ...

    @abstractmethod
    def set_global(self, index: int, valtype: int, bits: int) -> None: ...

    @abstractmethod
    def get_table(self, index: int) -> tuple[int, ...]: ...

    @abstractmethod
    def set_table(self, index: int, entries: Sequence[int]) -> None: ...


class Engine(ABC):
    """One kubelet's engine: compiles modules and makes instances of them."""

    name: str = ""
    version: str = ""
    tag: str = ""                   # names compiled code and measured speed: engine, version, config

    @property
    def runtime_version(self) -> str:
        """As a Node's nodeInfo.containerRuntimeVersion: ``pwasm://0.2a0``."""
        return f"{self.name}://{self.version}"

    @abstractmethod
    def compile(self, wasm: bytes, info: ModuleInfo, digest: str) -> Any: ...

    @abstractmethod
    def instantiate(self, compiled: Any, info: ModuleInfo, imports: Mapping[str, HostFunction],
                    memory_limit_bytes: int | None, deadline: float | None) -> Instance: ...

    @abstractmethod
    def kernel(self, wasm: bytes) -> Callable[[int], object]:
        """The export ``run(n)`` of a module without imports, ready to time (warmed up
        where the engine compiles code on first use)."""

    def close(self) -> None:
        """Stop the engine's threads; its instances are not used afterwards."""


def memory_pages(limit_bytes: int) -> int:
    """The memory cap every engine applies: the limit rounded up to whole pages, at least one."""
    return max(1, -(-limit_bytes // PAGE))


def engine_class(name: str) -> type[Engine]:
    """The class of the engine called ``name``; ValueError naming the choices, or naming
    why it is not available on this machine (its package has no build for this CPU)."""
    target = ENGINES.get(name)
    if target is None:
        raise ValueError(f'unknown engine "{name}" (choose one of: {", ".join(ENGINES)})')
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, RuntimeError, OSError) as exc:  # wasmtime raises RuntimeError on a CPU it has no build for
        raise ValueError(f'engine "{name}" is not available on this machine: {exc}') from None
    return getattr(module, class_name)


def create(name: str, cache_dir: Path | None = None) -> Engine:
    """The engine called ``name`` (ValueError as :func:`engine_class`)."""
    return engine_class(name)(cache_dir)
