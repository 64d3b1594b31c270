"""The engines by name: which module and class each is, and the one way to make one.

kube32.wasm.engine is the seam both engines implement; this registry lies above it and
above them: it names each engine's module as a string and imports it only when that
engine is asked for (a machine without wasmtime, a CPU it has no wheel for, still runs
pwasm), so no engine module is loaded by importing the seam, and no import goes in a
circle (the seam never names its implementations).
"""
from __future__ import annotations

import importlib
from pathlib import Path

from .engine import Engine

__all__ = ["ENGINES", "DEFAULT_ENGINE", "create", "engine_class"]

# name -> "module:class"; a module is imported only when its engine is created.
ENGINES: dict[str, str] = {
    "wasmtime": "kube32.wasm.engine_wasmtime:WasmtimeEngine",
    "pwasm": "kube32.wasm.engine_pwasm:PwasmEngine",
}
DEFAULT_ENGINE = "wasmtime"


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
