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
  at the whole 64 KiB pages within the limit (:func:`memory_pages`): the pages a pod
  can grow to are exactly the bytes a restore under the same limit accepts, so a pod
  that grew to its cap still moves.  A limit below one page gives one page of which
  only the limit is backed (the pod checks that the rest stays zero).  Tables are
  bounded by the same limit (:func:`table_entries_within`).  A start function that outlives
  ``deadline`` raises CallFailed ("timeout"); a module that does not link or fit, or
  whose start function traps, raises InstantiateError.
- ``Instance.call(name, args, deadline)``: runs an export and returns its first result
  when that is an i32 (signed; None when it returns nothing or another type: a command
  pod's ``main`` returns its exit code); ``deadline`` is a
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
  ``table_entries()``: the entries of all tables, which the node counts in its heap.
- Cost: ``Engine.costs(compiled, info, size)`` says what a module costs the node that
  runs it, as (bytes once for all the pods of the module, bytes per instance besides its
  memory and tables), measured per engine; the node counts both in its heap (pwasm's
  decoded code is about 100 bytes an instruction: far more than the pages of a pod).

Engines are created by name (kube32.wasm.engines: ``create``), below which this module
lies: each engine module imports this one, and the registry imports an engine module
only when asked for, so a machine without wasmtime (a CPU it has no wheel for) runs pwasm.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from kube32.snapshot import NULL_FUNC

from .binary import ModuleInfo

__all__ = ["NULL_FUNC", "TABLE_ENTRY_BYTES", "Engine", "Instance", "CallFailed",
           "InstantiateError", "HostFunction", "memory_pages", "table_entries_within"]

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
    def call(self, name: str, args: Sequence[int], deadline: float | None) -> int | None: ...

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

    @abstractmethod
    def table_entries(self) -> int:
        """The entries of all the instance's tables (what they cost: TABLE_ENTRY_BYTES each)."""


class Engine(ABC):
    """One kubelet's engine: compiles modules and makes instances of them."""

    name: str = ""
    version: str = ""
    tag: str = ""                   # names compiled code and measured speed: engine, version, config
    # What a compiled module costs the node, per byte of module (wasmtime's native code and
    # metadata: 4 bytes a byte of counter.wasm, 18 of a 1 MiB module of code, in RSS), and
    # what an instance costs besides its memory and tables (its store: about 10 KiB).
    bytes_per_module_byte: int = 10
    instance_bytes: int = 12 << 10

    def __init__(self, cache_dir: Path | None = None) -> None:  # noqa: B027 - engines take their own
        """``cache_dir``: where the engine may keep what it compiled (None: nowhere)."""

    @property
    def runtime_version(self) -> str:
        """As a Node's nodeInfo.containerRuntimeVersion: ``pwasm://0.2a0``."""
        return f"{self.name}://{self.version}"

    @abstractmethod
    def compile(self, wasm: bytes, info: ModuleInfo, digest: str) -> Any: ...

    @abstractmethod
    def instantiate(self, compiled: Any, info: ModuleInfo, imports: Mapping[str, HostFunction],
                    memory_limit_bytes: int | None, deadline: float | None) -> Instance: ...

    def costs(self, compiled: Any, info: ModuleInfo, size: int) -> tuple[int, int]:
        """What the module costs the node: (bytes once for all its pods, bytes per instance
        besides its memory and tables)."""
        return size * self.bytes_per_module_byte, self.instance_bytes

    @abstractmethod
    def kernel(self, wasm: bytes) -> Callable[[int], object]:
        """The export ``run(n)`` of a module without imports, ready to time (warmed up
        where the engine compiles code on first use)."""

    def close(self) -> None:  # noqa: B027 - optional: an engine without threads has nothing to stop
        """Stop the engine's threads; its instances are not used afterwards."""


def memory_pages(limit_bytes: int) -> int:
    """The memory cap every engine applies: the whole pages within the limit, at least one
    (a limit below one page: one page of which only the limit is backed, as a board's)."""
    return max(1, limit_bytes // PAGE)


TABLE_ENTRY_BYTES = 8            # what a table entry costs a node (wasmtime's, pwasm's list slot)


def table_entries_within(limit_bytes: int, tables: int) -> int:
    """The entries each of a module's ``tables`` may hold under a memory limit: all its
    tables together hold at most the limit's worth of :data:`TABLE_ENTRY_BYTES` entries."""
    return limit_bytes // TABLE_ENTRY_BYTES // max(1, tables)
