"""What the kubelet's parts need of their node: :class:`KubeletOptions` and the
:class:`NodeServices` protocol.

The kubelet is made of parts that own their state - a :class:`~.pods.PodWorker` per pod,
the move prefetch (:class:`~.prefetch.Prefetcher`), the NodePort listeners
(:class:`~.nodeports.NodePorts`) - and the :class:`~.kubelet.Kubelet` that ties them to the
cluster.  A part is handed the node as :class:`NodeServices`: the few things it uses of
it, and nothing of the Kubelet's own state.  The Kubelet implements the protocol; a unit
test hands a part a fake node instead.

Invariants:

* This module is the bottom of the package: it imports nothing of kube32.kubelet, so
  every part may import it and none imports the Kubelet (``kubelet.py`` imports the parts,
  never the other way; tests/unit/test_kubelet_imports.py keeps it so).
* Each member is safe to call from the event loop only (a pod's threads reach the node
  through their :class:`~.podhost.PodHost`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Coroutine, Protocol

from .. import timing
from ..client import Client, EventRecorder
from ..wasm import Module, Pod, PodConfig


@dataclass(frozen=True)
class KubeletOptions:
    node_name: str
    host: str = "127.0.0.1"
    port: int = 0
    profile: str = "laptop"
    heap_bytes: int = 512 << 20
    driver_bytes: int = 0                # the heap drivers hold (display, SD, ...)
    devices: tuple[str, ...] = ()
    max_pods: int = 110
    interp_mops: float | None = None     # None: measure at boot (on the engine below)
    engine: str = "wasmtime"             # the Wasm engine: kube32.wasm.ENGINES
    control_plane: bool = False
    lease_interval: float = 10.0
    lease_duration: int = 40
    status_interval: float = 10.0        # how often the status is compared with the server's Node
    status_report_seconds: float = 300.0  # an unchanged status is written this often (nodeStatusReportFrequency)
    backoff_base: float = 10.0
    backoff_max: float = 300.0
    # A call that runs longer is ended (the pod fails and restarts per its policy).  Longer
    # than the longest freeze a checkpoint may wait (timeoutMs up to 60 s): a freeze that
    # gives up answers 504 and the pod keeps running, as the spec promises.
    call_timeout_ms: int = 120000
    start_timeout_ms: int = int(timing.START_TIMEOUT_SECONDS * 1000)   # the start function, k32_init
    log_lines: int = 1000
    frozen_max_seconds: float = timing.FROZEN_MAX_SECONDS   # a pod frozen for a move that never finished thaws
    faults: tuple[str, ...] = ()         # injected faults (kube32.testing.WORKER_FAULTS), for tests
    data_dir: Path | None = None         # image and compiled-code caches
    extra_labels: dict[str, str] = field(default_factory=dict)
    join: bool = True                    # trade the client's bootstrap token for the node's own (kubelet.join)
    insecure_http: bool = False          # serve the endpoint over plain HTTP (debugging only)


class NodeServices(Protocol):
    """The node, as a part of the kubelet sees it."""

    client: Client           # the node's own credentials (after the join)
    options: KubeletOptions
    ip: str                  # the node's address: its pods' hostIP and podIP, its NodePorts'
    events: EventRecorder    # Events as "kubelet" on this node

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, awaited when the node stops."""

    def node_changed(self) -> None:
        """Something the Node's status shows changed (free heap, pods): report it soon."""

    async def load_module(self, image: str, annotations: dict[str, str]) -> Module:
        """The pod image's module, pulled (or cached) and compiled (PullError, ImageError)."""

    async def config_for(self, pod: dict[str, Any]) -> PodConfig:
        """The PodConfig this node runs ``pod`` with (ConfigError when it cannot)."""

    def new_instance(self, module: Module, config: PodConfig) -> Pod:
        """A pod instance of ``module`` in this node's runtime, its memory capped at the
        node's free heap, with a :class:`~.podhost.PodHost` of its own (PodError)."""
