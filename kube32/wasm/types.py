"""Plain values and errors of the pod runtime's public API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


class ImageError(Exception):
    """A module that cannot run as a pod: digest mismatch, not Wasm, does not
    compile, or does not follow the pod ABI.  str(err) names the cause."""


class PodError(Exception):
    """A pod operation failed: a call trapped, a state does not allow it, a
    restore did not fit.  str(err) names the cause."""


class StartTimeout(PodError):
    """The module's start function, ``k32_init`` or ``k32_restored`` did not return within
    the start timeout: the container never started (Kubernetes' ``StartError``)."""


class PodFrozen(PodError):
    """The pod is frozen (or freezing): the kubelet answers 503 with Retry-After: 1."""


class CallTimeout(PodError):
    """freeze() gave up: the current call outlasted the timeout.  str(err) is the
    blocker text "call <export> still running after <ms> ms"; the pod keeps running."""


@dataclass(frozen=True)
class Module:
    sha256: str                      # hex digest of the original bytes
    kind: str                        # "request" | "command"
    entry_point: str | None          # _start / app_main / main for command pods
    exports: frozenset[str]          # the module's own exports (reserved ones excluded)
    size: int                        # bytes of the original module
    compiled: Any = field(default=None, repr=False, compare=False)   # the engine's (Engine.compile)
    info: Any = field(default=None, repr=False, compare=False)       # binary.ModuleInfo
    engine_id: int = field(default=0, repr=False, compare=False)     # id() of the engine that compiled it
    # What it costs the node (Engine.costs): once for all its pods, and per instance besides
    # the instance's memory and tables.
    cost_bytes: int = 0
    instance_bytes: int = 0


@dataclass(frozen=True)
class PodConfig:
    namespace: str
    name: str
    container: str = "main"
    env: Mapping[str, str] = field(default_factory=dict)
    topics: tuple[str, ...] = ()
    tick_interval_ms: int | None = None
    assets: Mapping[str, bytes] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    call_timeout_ms: int = 10000
    # The start function and k32_init (or k32_restored) must return within this (None: the
    # call timeout); past it the start fails with StartTimeout.
    start_timeout_ms: int | None = None


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
