"""kube32.wasm: the engine inside every kubelet and the pod ABI (imports kube32.snapshot,
kube32.wasmformat and kube32.leb128 only).

Layers: pod.py (lifecycle, freeze, snapshot, restore) and hostcalls.py (the ABI's host
functions) run Wasm only through the engine seam, engine.py; an engine is
engine_wasmtime.py (compiled, the only module that touches wasmtime) or engine_pwasm.py
(a pure-Python interpreter, any CPU), made by name in engines.py.  A snapshot from either
restores on the other.

Public API (the kubelet codes against exactly this)::

    from kube32.wasm import (Runtime, Module, PodConfig, HttpRequest, HttpResponse, Pod,
                             PodFrozen, CallTimeout, ChannelRegistry, HostServices,
                             ImageError, PodError, ENGINES)

    rt = Runtime(cache_dir=None, engine="wasmtime")   # one per kubelet; engine one of ENGINES
                                          # ("wasmtime", "pwasm"; ValueError naming them, or
                                          # naming why one is not available here)
    rt.engine.name, rt.engine.runtime_version, rt.engine.tag   # "pwasm", "pwasm://0.2a0",
                                          # the tag naming its code and its measured speed
    engine_class(name)                    # ValueError as Runtime's, without making one
    mod = rt.load(wasm_bytes, expected_sha256=None)
        # -> Module(sha256, kind "request"|"command", entry_point, exports, size)
        # ImageError("image digest mismatch: expected ..., got ..."), or naming why the
        # module is no pod: not Wasm, does not compile, import outside the ABI,
        # wrong export signature, no k32_handle/k32_tick/k32_event/_start/app_main/main
    rt.measure_mops() -> float            # fixed i32 kernel on rt's engine, best of 5 in CPU time:
                                          # kube32.io/interp-mops
    rt.close()

    pod = Pod(rt, mod, PodConfig(namespace, name, container, env, topics, tick_interval_ms,
                                 assets, memory_limit_bytes, call_timeout_ms=10000), host)
    pod.on_exit = fn(exit_code, reason, message)   # the pod's thread ended by itself:
                                          # (0, "Completed", ..) a command pod returned;
                                          # (1, "Error", "k32_handle failed: <trap>") a trap
                                          # or call timeout.  Not called on stop(), nor for a
                                          # failure that start()/finish_restore() raise.
    pod.start()                           # instantiate, k32_init (PodError on a trap), ticks
    fut = pod.handle(HttpRequest(method, path, query, headers, body))
        # Future[HttpResponse]; raises PodFrozen at once while frozen or freezing
        # (answer 503 + Retry-After: 1), PodError when the pod is failed/stopped.
        # Pods without k32_handle (and command pods) answer 501.
    pod.deliver_event(topic, payload)     # held while frozen: at most 8, then dropped and
                                          # counted in pod.dropped_events
    pod.freeze(timeout_ms)                # waits for the current call; CallTimeout("call
                                          # k32_handle still running after <ms> ms") and the
                                          # pod keeps running.  PodError for command pods.
    pod.blockers() -> list[str]           # "open file <path> (descriptor <n>)",
                                          # "entry point _start runs on its own thread"
    writer = pod.snapshot()               # kube32.snapshot.SnapshotWriter; only while frozen;
                                          # memory pieces are zero-copy views of the
                                          # instance: keep it frozen until written.
                                          # PodError if not frozen or blocked.
    pod.thaw()                            # held events first; clock resumes from the freeze
    pod.stop()                            # interrupts a running call, joins the
                                          # thread, closes channels and files

    # restore, in a fresh pod of the same module and spec:
    reader = pod.prepare_restore()        # instantiates; SnapshotReader checking against
                                          # pod.module_shape(), memory streamed straight
                                          # into the new instance's memory
    snap = reader.read_from(sock)         # SnapshotError(cause=...) names each refusal
    pod.finish_restore(snap)              # globals, tables, clock, channels under the same
                                          # handles, k32_restored once, then held events

    pod.frozen, pod.dropped_events, pod.last_error, pod.memory_bytes,
    pod.state  # "created" | "starting" | "running" | "frozen" | "failed" | "exited" | "stopped"
    pod.pod_time_ms()                     # the pod clock (what k32_time_ms returns)

    class HostServices(Protocol):         # the kubelet implements it; called on pod threads
        channels: ChannelRegistry         # node-local; one per kubelet
        def log(self, pod, line: str) -> None
        def publish(self, pod, topic: str, payload: bytes) -> None
        def random_bytes(self, n: int) -> bytes   # optional; os.urandom when absent

The ABI itself is in docs/pod-abi.md, kube32/wasm/abi.py and sdk/c/k32.h.  Design
notes and invariants live in the docstrings of engine.py, runtime.py, pod.py, hostcalls.py,
binary.py, host.py and each engine module.
"""
from .abi import (
    K32_E2BIG, K32_EAGAIN, K32_EBADF, K32_EINTERNAL, K32_EINVAL, K32_ENOENT, K32_ENOSPC,
    K32_ESTATE, K32_OK,
)
from .engines import DEFAULT_ENGINE, ENGINES, engine_class
from .host import ChannelRegistry, Endpoint, HostServices
from .pod import Pod
from .runtime import Runtime
from .types import (
    CallTimeout, HttpRequest, HttpResponse, ImageError, Module, PodConfig, PodError, PodFrozen, StartTimeout,
)

__all__ = [
    "ENGINES", "DEFAULT_ENGINE", "engine_class", "Runtime", "Module", "PodConfig", "HttpRequest", "HttpResponse", "Pod",
    "PodFrozen",
    "CallTimeout", "StartTimeout", "ChannelRegistry", "Endpoint", "HostServices", "ImageError", "PodError",
    "K32_OK", "K32_EINVAL", "K32_ENOENT", "K32_EBADF", "K32_EAGAIN", "K32_ENOSPC",
    "K32_ESTATE", "K32_E2BIG", "K32_EINTERNAL",
]
