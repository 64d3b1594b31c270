"""The Node object and the Lease a kubelet keeps: what the cluster knows about this node.

* Labels: ``kubernetes.io/hostname``, ``kubernetes.io/os`` (``kube32``),
  ``kubernetes.io/arch`` (``wasm32``: what a pod's image needs, so every node takes
  every pod), ``kube32.io/profile``, ``kube32.io/engine`` (``wasmtime``, ``pwasm``) and,
  on the control plane's node, ``node-role.kubernetes.io/control-plane``.
* Status: addresses (InternalIP, Hostname), the kubelet endpoint port, capacity and
  allocatable (memory = heap; pods; ``hardware.kube32.io/<device>: 1`` per device),
  nodeInfo with every field filled (the kubernetes Python client refuses a
  nodeInfo with missing fields): ``architecture`` is the CPU the node runs on, in
  Kubernetes' names (``amd64``, ``arm64``, ...), ``containerRuntimeVersion`` its Wasm
  engine (``pwasm://0.2a0``), conditions Ready, MemoryPressure (True when the
  free heap is below :data:`MEMORY_PRESSURE_BYTES`), DiskPressure, PIDPressure.
* Annotations: ``kube32.io/free-heap`` (bytes), ``kube32.io/interp-mops`` and, when
  the kubelet measured that figure, ``kube32.io/interp-mops-measured-on``: a digest
  of the machine and the engine it measured on (:func:`measured_on`).  Nodes that
  measured on one machine with one engine run the same code on the same CPU, so the
  placement policy counts them as equally fast whatever their figures say.
* The Lease ``kube-node-lease/<node>`` is this node's heartbeat; the status is written
  when what the server holds differs from what the kubelet would report
  (:func:`status_differs`, :func:`annotations_to_write`: heartbeat and transition times
  aside), else every ``status_report_seconds`` (Kubernetes' ``nodeStatusReportFrequency``).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import platform
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from ..terms import NODE_LEASE_NAMESPACE, Annotation, Condition, KubeletScheme, Label, Resource

MEMORY_PRESSURE_BYTES = 24 << 10
# Where this machine's identity comes from, in order (the first one readable).
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/random/boot_id")
KUBELET_VERSION = "v1.32.4-kube32"
# platform.machine() -> the GOARCH name Kubernetes reports (others are reported as they are)
_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "i386": "386",
           "i686": "386", "armv7l": "arm", "armv6l": "arm", "ppc64le": "ppc64le", "s390x": "s390x",
           "riscv64": "riscv64", "mips64": "mips64le", "loongarch64": "loong64"}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class NodeFacts:
    name: str
    ip: str
    port: int
    profile: str
    heap_bytes: int
    driver_bytes: int
    devices: tuple[str, ...]
    max_pods: int
    control_plane: bool
    interp_mops: float
    boot_id: str
    runtime_version: str                # the engine, as nodeInfo.containerRuntimeVersion
    measured_on: str | None = None  # measured_on() when the kubelet measured interp_mops


def cpu_architecture() -> str:
    """This machine's CPU in Kubernetes' (Go's) names: amd64, arm64, arm, riscv64, ..."""
    machine = platform.machine().lower()
    return _GOARCH.get(machine, machine or "unknown")


def measured_on(engine: str) -> str:
    """This machine and ``engine`` as 16 hex digits.  The machine ID is hashed with a
    prefix of Kube32's own, as machine-id(5) asks of IDs shown to others."""
    machine = ""
    for path in MACHINE_ID_FILES:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                machine = f.read().strip()
        except OSError:
            continue
        if machine:
            break
    machine = machine or socket.gethostname()
    text = "\0".join((Annotation.INTERP_MOPS, machine, platform.machine(), engine))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def node_labels(f: NodeFacts) -> dict[str, str]:
    labels = {Label.HOSTNAME: f.name, Label.OS: "kube32", Label.ARCH: "wasm32", Label.BETA_OS: "kube32",
              Label.BETA_ARCH: "wasm32", Label.PROFILE: f.profile,
              Label.ENGINE: f.runtime_version.split("://")[0]}
    if f.control_plane:
        labels[Label.NODE_ROLE_CONTROL_PLANE] = ""
    return labels


def node_annotations(f: NodeFacts, free_heap: int) -> dict[str, str]:
    out = {Annotation.FREE_HEAP: str(free_heap), Annotation.INTERP_MOPS: f"{f.interp_mops:.2f}",
           Annotation.KUBELET_SCHEME: KubeletScheme.HTTP}
    if f.measured_on:
        out[Annotation.INTERP_MOPS_MEASURED_ON] = f.measured_on
    return out


def owned_annotations(f: NodeFacts, free_heap: int, scheme: str) -> dict[str, str | None]:
    """The annotations this kubelet owns and their values (None: must not be there)."""
    out: dict[str, str | None] = {Annotation.INTERP_MOPS_MEASURED_ON: None}
    out.update(node_annotations(f, free_heap))
    out[Annotation.KUBELET_SCHEME] = scheme
    return out


def annotations_to_write(held: dict[str, Any] | None, owned: dict[str, str | None]) -> dict[str, str | None]:
    """The merge patch of ``metadata.annotations`` that makes ``held`` (the Node the server
    holds; None: not known) show ``owned``: empty when it does already."""
    if held is None:
        return dict(owned)
    have = (held.get("metadata") or {}).get("annotations") or {}
    return {k: v for k, v in owned.items() if have.get(k) != v}


STATUS_FIELDS = ("addresses", "daemonEndpoints", "capacity", "allocatable", "nodeInfo")


def _condition_facts(conditions: Any) -> dict[Any, tuple[Any, Any, Any]]:
    return {c.get("type"): (c.get("status"), c.get("reason"), c.get("message"))
            for c in conditions or [] if isinstance(c, dict)}


def status_differs(held: dict[str, Any] | None, status: dict[str, Any]) -> str | None:
    """Why the Node the server holds (``held``; None: not known) does not show ``status``
    (what :func:`node_status` made), or None when it does: every condition's status, reason
    and message, and :data:`STATUS_FIELDS`; heartbeat and transition times are no change
    (as Kubernetes' kubelet's ``nodeStatusHasChanged``)."""
    if held is None:
        return "the Node the server holds is not known"
    have = held.get("status") or {}
    held_conditions = _condition_facts(have.get("conditions"))
    for type_, facts in _condition_facts(status.get("conditions")).items():
        was = held_conditions.get(type_)
        if was is None or was[0] != facts[0]:
            return f"{type_} is {was[0] if was else 'missing'}, not {facts[0]}"
        if was != facts:
            return f"{type_}'s reason or message changed"
    for name in STATUS_FIELDS:
        if have.get(name) != status.get(name):
            return f"its {name} changed"
    return None


def allocatable(f: NodeFacts) -> dict[str, str]:
    """What the node offers its pods (its Node's ``status.allocatable``)."""
    return _resources(f)


def _resources(f: NodeFacts) -> dict[str, str]:
    res = {"memory": str(f.heap_bytes), "pods": str(f.max_pods), "cpu": "1"}
    res.update({Resource.HARDWARE_PREFIX + d: "1" for d in f.devices})
    return res


def node_status(f: NodeFacts, free_heap: int, ready: bool = True,
                transitions: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """``transitions`` (condition type -> (status, since)) is kept by the caller so
    ``lastTransitionTime`` moves only when a condition's status does."""
    t = now()
    pressure = free_heap < MEMORY_PRESSURE_BYTES
    seen = transitions if transitions is not None else {}

    def cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, str]:
        status = "True" if ok else "False"
        if seen.get(type_, ("", ""))[0] != status:
            seen[type_] = (status, t)
        return {"type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": t, "lastTransitionTime": seen[type_][1]}
    return {
        "addresses": [{"type": "InternalIP", "address": f.ip}, {"type": "Hostname", "address": f.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": f.port}},
        "capacity": _resources(f), "allocatable": _resources(f),
        "nodeInfo": {"architecture": cpu_architecture(), "bootID": f.boot_id,
                     "containerRuntimeVersion": f.runtime_version,
                     "kernelVersion": f"kube32-{platform.release()}", "kubeProxyVersion": KUBELET_VERSION,
                     "kubeletVersion": KUBELET_VERSION,
                     "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, f"machine.{f.name}").hex,
                     "operatingSystem": "kube32", "osImage": f"Kube32 sim ({f.profile})",
                     "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"system.{f.name}"))},
        "conditions": [
            cond(Condition.MEMORY_PRESSURE, pressure,
                 "KubeletHasInsufficientMemory" if pressure else "KubeletHasSufficientMemory",
                 f"free heap {free_heap} bytes" + (f" is below {MEMORY_PRESSURE_BYTES}" if pressure else "")),
            cond(Condition.DISK_PRESSURE, False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond(Condition.PID_PRESSURE, False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond(Condition.READY, ready, "KubeletReady" if ready else "KubeletNotReady",
                 "kubelet is posting ready status" if ready else "kubelet is stopping"),
        ],
    }


def node_object(f: NodeFacts, free_heap: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f.name, "labels": node_labels(f), "annotations": node_annotations(f, free_heap)},
            "spec": {}, "status": node_status(f, free_heap)}


def lease_object(name: str, duration: int, node_uid: str | None, endpoint: str) -> dict[str, Any]:
    """``endpoint``: the kubelet's "ip:port", so that a join under this name can ask
    whether this kubelet still runs even after its Node was deleted."""
    md: dict[str, Any] = {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                          "annotations": {Annotation.KUBELET_ENDPOINT: endpoint}}
    if node_uid:
        md["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": md,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": micro_now()}}
