"""The Kubelet: one node's agent.

``Kubelet(client, options[, runtime[, node_watch]])``; ``await start()`` measures the interpreter
(unless given; once per runtime: a fleet's nodes share one, kube32.sim.fleet), opens
the endpoint, registers the Node (a Node of its name that exists is taken over, and
what its last self-drain did is undone: kube32.kubelet.drain.rejoin), starts the
Lease, the pod informer (``fieldSelector spec.nodeName=<node>``), the Checkpoint informer of moves
toward the node (kube32.kubelet.prefetch), the topic subscription, the watch of its own
Node (kube32.kubelet.nodewatch: its own, ``metadata.name=<node>``, or a fleet's shared
one) and the status loop; ``await stop()`` stops every pod and marks the Node NotReady.

* Node status, as Kubernetes' kubelet with its ``nodeStatusReportFrequency``: the Lease
  is the heartbeat (every ``lease_interval``); every ``status_interval`` (and soon after
  a change: free heap, a pod, an event of its Node) the status it would report is
  compared with the Node the server holds, and written when they differ (a condition the
  node lifecycle marked Unknown is put back at once), else every ``status_report_seconds``.

Invariants:

* Pods are keyed by UID.  :meth:`_reconcile` compares the informer's pods with
  the running workers after every event: a UID that left the watch (deleted, or
  bound elsewhere: the filtered watch sends DELETED) is stopped and its object is
  never written again; a pod marked for deletion is stopped, then deleted with
  grace 0 and a UID precondition, so a replacement of the same name is never
  deleted.  That happens once per UID: a pod that stays (its finalizers pending)
  is not deleted again (a DELETE that failed otherwise is tried at the next event).
* The Kubelet ties its parts to the cluster and owns none of their state: a
  :class:`~.pods.PodWorker` per pod (its container, status and freeze state), the move
  prefetch (:class:`~.prefetch.Prefetcher`, the workers' source of restore plans), the
  NodePort listeners.  They reach the node through :class:`~.nodeapi.NodeServices`, which
  the Kubelet implements; the endpoint and the drain through :class:`~.agent.NodeAgent`
  (the node with its pods).  No part imports this module.
* Each pod instance has a :class:`~.podhost.PodHost` of its own: logs go to its worker's
  ring buffer, publishes go to the API server's topic bus (so pods on every node hear
  them), and one ChannelRegistry serves the node's pods.
* A kubelet given a ``runtime`` (a fleet's nodes: one engine and one module cache for
  all of them) shares it and never closes it; everything else it owns - its client
  (credentials, source address, connections), endpoint and certificate, pods and heap.
* Free heap = heap - drivers' share - what the node's pods cost: their linear memories,
  tables and instances, and once per module the engine's compiled module
  (Module.cost_bytes: pwasm's decoded code is about 100 bytes an instruction).  A pod
  whose module and instance do not fit in what is free does not start: it fails naming
  both costs and the free heap (a move's restore there fails, and rolls back).  Modules
  no pod uses are kept for restarts up to a quarter of the heap.
* Admission, as Kubernetes' kubelet admits: a pod bound here that would push the
  node's active pods' requests past its allocatable (memory, pod count, devices:
  :mod:`kube32.podfit`, the scheduler's own reading) is not run; it ends ``Failed``
  with reason ``OutOf<resource>`` and "Pod was rejected: Node didn't have enough
  resource: ...", and a Warning Event says so.  New pods are admitted oldest first.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import random
import math
import time
import uuid
from typing import Any, Coroutine, Iterable

from aiohttp import web

from .. import objects, serving
from ..aio import wait_set
from ..client import LEASES, NODES, PODS, ApiError, Client, EventRecorder, Informer
from ..podfit import allocatable, pod_requests, shortfalls
from ..terms import NODE_LEASE_NAMESPACE, Annotation, KubeletScheme, PodPhase, PodReason
from ..timing import MOVED_AWAY_SECONDS
from ..urlpath import group_path
from ..wasm import ChannelRegistry, Module, Pod, PodConfig, PodError, Runtime
from ..wasm.abi import MAX_HELD_EVENTS
from ..wasm.engine import PAGE
from ..wasm.pod import MAX_QUEUED_EVENT_BYTES, MAX_QUEUED_EVENTS
from . import drain
from . import node as nodeinfo
from . import join as node_join
from . import migration
from .images import ImagePuller, expected_digest
from .nodeapi import KubeletOptions
from .nodewatch import NodeWatch
from .nodeports import NodePorts
from .podhost import PodHost
from .podspec import pod_config
from .pods import PodWorker
from .prefetch import Prefetcher
from .server import build_app, server_ssl

__all__ = ["Kubelet", "KubeletOptions"]

LEASE_RETRY_FIRST = 0.2   # seconds before a failed Lease renewal is tried again (doubling)
LEASE_JITTER = 0.04       # a renewal's interval is drawn from [interval, interval * 1.04]
log = logging.getLogger("kube32.kubelet")



class Kubelet:
    def __init__(self, client: Client, options: KubeletOptions, runtime: Runtime | None = None,
                 node_watch: NodeWatch | None = None) -> None:
        self.client = client
        self.options = options
        self.ip = options.host if options.host not in ("0.0.0.0", "") else "127.0.0.1"
        # Requests leave from the node's own address, as a board's do: the API server
        # signs the node's certificate for the address its join came from.
        client.source_address = node_join.own_address(options.host)
        cache = options.data_dir
        if runtime is not None and runtime.engine.name != options.engine:
            raise ValueError(f"the shared runtime runs {runtime.engine.name}, node {options.node_name} "
                             f"asks for {options.engine}")
        self._owns_runtime = runtime is None
        self.runtime = runtime if runtime is not None else Runtime(cache / "compiled" if cache else None,
                                                                   engine=options.engine,
                                                                   kept_bytes=options.heap_bytes // 4)
        self.images = ImagePuller(client, cache / "images" if cache else None)
        self.events = EventRecorder(client, "kubelet", options.node_name)
        self.channels = ChannelRegistry()
        self.workers: dict[str, PodWorker] = {}        # uid -> worker
        self.informer = Informer(client, PODS, field_selector=f"spec.nodeName={options.node_name}")
        # Its Node as the server holds it: its own watch, or a fleet's shared one (nodewatch).
        self._owns_node_watch = node_watch is None
        self.node_watch = node_watch if node_watch is not None else NodeWatch(options.node_name)
        self._status_written_at = -math.inf   # monotonic: the last status write
        self.nodeports = NodePorts(self)
        self.prefetch = Prefetcher(self)  # moves toward this node: their data asked for early
        self.port = 0
        self.scheme = KubeletScheme.HTTP
        self.interp_mops = 0.0
        self.facts: nodeinfo.NodeFacts | None = None
        self.node_uid: str | None = None
        self._stopping: set[str] = set()
        self._rejected: set[str] = set()   # uids refused at admission (their Failed status may lag)
        self._terminated: set[str] = set()  # pods marked for deletion this node stopped (and deleted)
        self.moved_away: dict[tuple[str, str], float] = {}  # (ns, name) -> when it left frozen
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()   # strong refs: the loop keeps only weak ones
        self._runner: web.AppRunner | None = None
        self._node_dirty = asyncio.Event()
        self._drop_lock = asyncio.Lock()  # EventsDropped records, in order
        self._last_free: int | None = None
        self._transitions: dict[str, tuple[str, str]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.subscribed = asyncio.Event()
        self.topic_seq = 0                   # the number of the latest topic line read (kube32.apiserver.eventbus)
        self._topic_read = asyncio.Event()   # set by each line read

    # --- start and stop -----------------------------------------------------------
    async def start(self) -> None:
        o = self.options
        self.loop = asyncio.get_running_loop()
        measured = None
        if o.interp_mops is not None:
            self.interp_mops = o.interp_mops
        else:
            self.interp_mops = await asyncio.to_thread(self.runtime.speed)
            measured = nodeinfo.measured_on(self.runtime.engine.tag)
        ssl_ctx = None
        if o.join:
            # Its address (for clients that dial it) and its node's name: the API server
            # verifies a kubelet by the name of the node it means to reach.
            creds = await node_join.join(self.client, o.node_name, [self.ip, o.node_name],
                                         serving_cert=not o.insecure_http)
            if creds.certificate:
                ssl_ctx = server_ssl(node_join.server_context(
                    creds, o.data_dir if o.data_dir and o.data_dir.is_dir() else None), creds.ca)
        self.scheme = KubeletScheme.HTTPS if ssl_ctx is not None else KubeletScheme.HTTP
        self._runner = serving.GuardedRunner(build_app(self), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, o.host, o.port, reuse_address=True, ssl_context=ssl_ctx)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.facts = nodeinfo.NodeFacts(o.node_name, self.ip, self.port, o.profile, o.heap_bytes,
                                        o.driver_bytes, tuple(o.devices), o.max_pods, o.control_plane,
                                        self.interp_mops, str(uuid.uuid4()),
                                        runtime_version=self.runtime.engine.runtime_version, measured_on=measured)
        try:
            await self._register()
        except BaseException:
            # Its endpoint goes with it: a fleet that goes on without this node must not
            # keep its address and port.
            await self._runner.cleanup()
            self._runner = None
            raise
        self.informer.add_handler(lambda *_: self._reconcile())
        self.node_watch.follow(o.node_name, self._node_dirty.set)
        if self._owns_node_watch:
            self.node_watch.start(self.client.sibling(pool=1))
        self._tasks += [self.informer.start(),
                        asyncio.create_task(self._lease_loop(), name="kubelet-lease"),
                        asyncio.create_task(self._status_loop(), name="kubelet-status"),
                        asyncio.create_task(self._topic_loop(), name="kubelet-topics"),
                        asyncio.create_task(migration.thaw_forgotten(self), name="kubelet-thaw"),
                        self.nodeports.start(), *self.prefetch.start()]
        log.info("kubelet %s serving on %s:%d (%s, interp-mops %.2f)", o.node_name, self.ip, self.port,
                 self.runtime.engine.runtime_version, self.interp_mops)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.informer.stop()
        self.node_watch.forget(self.options.node_name)
        if self._owns_node_watch:
            await self.node_watch.stop()
        await self.prefetch.stop()
        await self.nodeports.stop()
        await asyncio.gather(*(w.stop() for w in list(self.workers.values())), return_exceptions=True)
        self.workers.clear()
        # After the workers: what they spawned while stopping (their Events) is awaited too,
        # as spawn promises; and what those spawned in turn.
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        try:
            assert self.facts is not None
            status = nodeinfo.node_status(self.facts, self.free_heap(), False, self._transitions)
            await self.client.patch(NODES, self.options.node_name, {"status": status}, type="strategic",
                                    subresource="status")
        except (ApiError, AssertionError) as e:
            log.debug("cannot mark the node NotReady: %s", e)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.images.close()
        if self._owns_runtime:
            self.runtime.close()

    # --- the Node and its Lease -----------------------------------------------------
    def _instances(self) -> list[Pod]:
        """Every instance on the node: its pods' and the moves' prepared ones."""
        return [w.instance for w in self.workers.values() if w.instance is not None] + self.prefetch.instances()

    def free_heap(self) -> int:
        instances = self._instances()
        used = sum(inst.footprint_bytes for inst in instances)
        used += sum({inst.module.sha256: inst.module.cost_bytes for inst in instances}.values())
        return max(0, self.options.heap_bytes - self.options.driver_bytes - used)

    async def load_module(self, image: str, annotations: dict[str, str]) -> Module:
        """The pod image's module: pulled (or from the cache) and compiled (once per digest)."""
        data = await self.images.pull(image, annotations)
        return await asyncio.to_thread(self.runtime.load, data, expected_digest(image, annotations))

    async def config_for(self, pod: dict[str, Any]) -> PodConfig:
        """The PodConfig this node runs ``pod`` with (ConfigError when it cannot)."""
        return await pod_config(self.client, pod, self.ip, self.options.call_timeout_ms,
                                self.options.start_timeout_ms)

    def new_instance(self, module: Module, config: PodConfig) -> Pod:
        """An instance of ``module`` for this pod; PodError naming the costs when what the
        module and its instance cost the engine does not fit in the free heap."""
        return Pod(self.runtime, module, self._within_heap(module, config), PodHost(self.channels, self._publish_soon))

    def _within_heap(self, module: Module, config: PodConfig) -> PodConfig:
        """A pod's linear memory comes out of the node's heap: it may not grow past what
        is free once its module (when no other pod holds it) and its instance are counted
        (a board has no more), whatever its own limit says."""
        free = self.free_heap()
        held = any(inst.module.sha256 == module.sha256 for inst in self._instances())
        engine = self.runtime.engine.name
        need = module.instance_bytes + (0 if held else module.cost_bytes)
        memory = module.info.memory if module.info is not None else None
        initial = memory[0] * PAGE if memory else 0
        if config.memory_limit_bytes is not None:
            initial = min(initial, config.memory_limit_bytes)
        if need + initial > free:
            module_cost = ("is held already" if held else
                           f"costs the {engine} engine {module.cost_bytes} bytes (once for its pods here)")
            raise PodError(f"the node's heap cannot hold this pod: its module ({module.size} bytes) {module_cost}, "
                           f"an instance {module.instance_bytes} bytes and its initial memory {initial} bytes, "
                           f"and {free} bytes of the node's heap are free")
        free -= need
        limit = config.memory_limit_bytes
        if limit is None or limit > free:
            return dataclasses.replace(config, memory_limit_bytes=max(free, 1))
        return config

    @property
    def reported_free_heap(self) -> int | None:
        return self._last_free

    def node_changed(self) -> None:
        self._node_dirty.set()

    def bound_pods(self) -> list[dict[str, Any]]:
        return self.informer.list()

    async def _register(self) -> None:
        assert self.facts is not None
        obj = nodeinfo.node_object(self.facts, self.free_heap())
        obj["metadata"]["labels"].update(self.options.extra_labels)
        obj["metadata"]["annotations"][Annotation.KUBELET_SCHEME] = self.scheme
        try:
            out = await self.client.create(NODES, obj)
        except ApiError as e:
            if e.code != 409:
                raise
            md = obj["metadata"]
            # A merge patch keeps what it does not name: a figure given now drops the
            # machine an earlier boot measured on.
            annotations = {Annotation.INTERP_MOPS_MEASURED_ON: None, **md["annotations"]}
            out = await self.client.patch(NODES, self.options.node_name,
                                          {"metadata": {"labels": md["labels"], "annotations": annotations}})
            out = await self.client.patch(NODES, self.options.node_name, {"status": obj["status"]},
                                          type="strategic", subresource="status")
            await drain.rejoin(self.client, self.options.node_name)
        self.node_uid = out["metadata"].get("uid")
        self.node_watch.wrote(out)

    async def _write_node_status(self) -> None:
        """Compare what the server holds of the Node with what this node would report, and
        write what differs (the annotations it owns, its status); an unchanged status only
        every ``status_report_seconds`` (the Lease is the heartbeat).  Nothing known of the
        server's Node (its watch not listed yet, or no Node): written as before."""
        assert self.facts is not None
        name = self.options.node_name
        free = self.free_heap()
        held = self.node_watch.held(name)
        annotations = nodeinfo.annotations_to_write(
            held, nodeinfo.owned_annotations(self.facts, free, self.scheme))
        if annotations:
            out = await self.client.patch(NODES, name, {"metadata": {"annotations": annotations}})
            self.node_watch.wrote(out)
            held = self.node_watch.held(name)
        self._last_free = free
        self._follow_transitions(held)
        status = nodeinfo.node_status(self.facts, free, True, self._transitions)
        why = nodeinfo.status_differs(held, status)
        due = time.monotonic() - self._status_written_at >= self.options.status_report_seconds
        if why is None and not due:
            return
        if why is not None and held is not None:
            log.debug("node %s: writing its status: %s", name, why)
        # Strategic, as Kubernetes' kubelet patches its status: conditions merge by type, so
        # those another component owns (node-problem-detector's) stay.
        out = await self.client.patch(NODES, name, {"status": status}, type="strategic", subresource="status")
        self._status_written_at = time.monotonic()
        self.node_watch.wrote(out)

    def _follow_transitions(self, held: dict[str, Any] | None) -> None:
        """A condition the server shows with another status (Unknown: the node lifecycle
        marked it) transitions again when this node reports its own: its
        ``lastTransitionTime`` is then, not when this node last changed it."""
        for c in objects.status(held or {}).get("conditions") or []:
            seen = self._transitions.get(c.get("type", ""))
            if seen is not None and seen[0] != c.get("status"):
                del self._transitions[c["type"]]

    async def _status_loop(self) -> None:
        while True:
            self._node_dirty.clear()   # before: a change seen while writing is looked at again
            try:
                await self._write_node_status()
            except ApiError as e:
                # A refused token (401) is said once, by the Lease loop, with what to do.
                log.log(logging.DEBUG if e.code == 401 else logging.WARNING, "cannot report node status: %s", e)
            if await wait_set(self._node_dirty, self.options.status_interval):
                await asyncio.sleep(0.2)   # coalesce a burst of changes into one write

    async def _lease_loop(self) -> None:
        name = self.options.node_name
        interval = self.options.lease_interval
        refused = False
        retry = LEASE_RETRY_FIRST
        while True:
            began = time.monotonic()
            try:
                await self._renew_lease(name)
                refused = False
                retry = LEASE_RETRY_FIRST
                # The next renewal an interval after this one began, not after it ended: on
                # a busy loop (a fleet starting 10,000 pods) a renewal that took seconds must
                # not push every later one back, two of them past the grace period (issue 25).
                # Jittered by up to 4%, as Kubernetes' lease controller (JitterUntil 0.04):
                # a thousand boards started together do not renew together for ever.
                due = interval * (1 + LEASE_JITTER * random.random())
                await asyncio.sleep(max(due - (time.monotonic() - began), 0.0))
                continue
            except ApiError as e:
                if e.code == 401 and not refused:
                    # Said once, plainly: each renewal after it would only repeat the 401.
                    log.error("node %s: the API server no longer accepts this node's token (401): the node was "
                              "joined again (kube32-sim worker or fleet under this name) or its token revoked; "
                              "this kubelet cannot report until it is restarted with the bootstrap kubeconfig",
                              name)
                refused = e.code == 401
                if not refused:   # the first failure of a run of them is a warning, its retries not
                    log.log(logging.WARNING if retry == LEASE_RETRY_FIRST else logging.DEBUG,
                            "cannot renew the node lease: %s", e)
            if refused:
                await asyncio.sleep(interval)
                continue
            # As Kubernetes' lease controller retries a failed update at once: again soon
            # (0.2 s, doubling), never later than the next renewal was due.
            await asyncio.sleep(min(retry, interval))
            retry = min(retry * 2, interval)

    async def _renew_lease(self, name: str) -> None:
        """One request per renewal, as the kubelet's lease controller does once it has its
        Lease: a patch, and a create only when there is none (a GET before each patch
        doubled what a fleet of nodes asks of the API server at rest)."""
        lease = nodeinfo.lease_object(name, self.options.lease_duration, self.node_uid, f"{self.ip}:{self.port}")
        try:
            # The annotation rides along: a Lease left by an earlier run names its old port.
            await self.client.patch(LEASES, name, {"metadata": {"annotations": lease["metadata"]["annotations"]},
                                                   "spec": lease["spec"]}, NODE_LEASE_NAMESPACE)
        except ApiError as e:
            if e.code != 404:
                raise
            await self.client.create(LEASES, lease, NODE_LEASE_NAMESPACE)

    # --- pods -----------------------------------------------------------------------
    def worker_by_name(self, ns: str, name: str) -> PodWorker | None:
        found = [w for w in self.workers.values() if w.namespace == ns and w.name == name]
        live = [w for w in found if not w.terminating]
        return (live or found)[0] if found else None

    def _reconcile(self) -> None:
        pods = sorted(self.bound_pods(), key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                                           p["metadata"]["name"]))
        desired = {p["metadata"]["uid"]: p for p in pods}
        self._rejected &= desired.keys()
        self._terminated &= desired.keys()
        for uid, worker in list(self.workers.items()):
            if uid not in desired and uid not in self._stopping:
                self._stopping.add(uid)
                self.spawn(self._stop_worker(worker))
        for uid, pod in desired.items():
            existing = self.workers.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                # Stopped once: a pod that stays (a finalizer pending) is not deleted again
                # at every event of this node's pods.
                if uid not in self._stopping and uid not in self._terminated:
                    self._stopping.add(uid)
                    self.spawn(self._terminate(pod, existing))
            elif existing is not None:
                existing.update(pod)
            elif (objects.phase(pod) not in PodPhase.TERMINAL
                  and uid not in self._stopping and uid not in self._rejected):
                refusal = self._admission(pod)
                if refusal is None:
                    self.workers[uid] = PodWorker(self, self.prefetch, pod)
                else:
                    self._rejected.add(uid)
                    self.spawn(self._reject(pod, *refusal))

    def _admission(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        """Why this node cannot run ``pod`` next to its active pods, as (reason, message)
        in Kubernetes' words; None when it fits."""
        assert self.facts is not None
        active = [w.pod for w in self.workers.values() if w.phase not in PodPhase.TERMINAL]
        used: dict[str, Any] = {}
        for other in active:
            for name, amount in pod_requests(other).items():
                used[name] = used.get(name, 0) + amount
        short = shortfalls(pod, allocatable(nodeinfo.allocatable(self.facts)), used, len(active))
        if not short:
            return None
        first = short[0]   # Kubernetes reports the first failed predicate
        return (f"{PodReason.OUT_OF}{first.resource}",
                f"Node didn't have enough resource: {first.resource}, requested: {math.ceil(first.requested)}, "
                f"used: {math.ceil(first.used)}, capacity: {math.floor(first.capacity)}")

    async def _reject(self, pod: dict[str, Any], reason: str, message: str) -> None:
        md = pod["metadata"]
        log.warning("pod %s/%s rejected: %s", md["namespace"], md["name"], message)
        status = {"phase": PodPhase.FAILED, "reason": reason, "message": f"Pod was rejected: {message}"}
        try:
            await self.client.patch(PODS, md["name"], [
                {"op": "test", "path": "/metadata/uid", "value": md["uid"]},
                {"op": "add", "path": "/status", "value": status}], md["namespace"],
                type="json", subresource="status")
        except ApiError as e:
            log.warning("cannot mark pod %s/%s rejected: %s", md["namespace"], md["name"], e)
        await self.events.record(pod, "Warning", reason, message)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_worker(self, worker: PodWorker) -> None:
        left_frozen = worker.frozen_since is not None
        try:
            await worker.stop()
        finally:
            self.workers.pop(worker.uid, None)
            self._stopping.discard(worker.uid)
            if left_frozen:
                self._left_frozen(worker.namespace, worker.name)
            self.node_changed()

    def _left_frozen(self, ns: str, name: str) -> None:
        """A frozen pod was unbound from this node: a move replaced it elsewhere."""
        now = time.monotonic()
        self.moved_away = {k: t for k, t in self.moved_away.items() if now - t < MOVED_AWAY_SECONDS}
        self.moved_away[(ns, name)] = now

    def moved_away_lately(self, ns: str, name: str) -> bool:
        """A request for this pod that still reached this node raced with its move (it was
        routed while the pod was frozen here): the caller is told to ask again."""
        at = self.moved_away.get((ns, name))
        return at is not None and time.monotonic() - at < MOVED_AWAY_SECONDS

    async def _terminate(self, pod: dict[str, Any], worker: PodWorker | None) -> None:
        md = pod["metadata"]
        if worker is not None:
            await worker.stop()
            self.workers.pop(worker.uid, None)
            self.node_changed()
        try:
            await self.client.delete(PODS, md["name"], md["namespace"], grace_period=0, uid=md["uid"])
            self._terminated.add(md["uid"])
        except ApiError as e:
            if e.code in (404, 409):
                self._terminated.add(md["uid"])
            else:
                log.warning("cannot delete pod %s/%s: %s", md["namespace"], md["name"], e)
        finally:
            self._stopping.discard(md["uid"])

    def _publish_soon(self, ns: str, topic: str, payload: bytes, source: str) -> None:
        """A pod's publish, from its thread (kube32.kubelet.podhost)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(lambda: self.spawn(self.publish_async(ns, topic, payload, source)))

    # --- topics ------------------------------------------------------------------------
    async def publish_async(self, ns: str, topic: str, payload: bytes, source: str = "") -> None:
        try:
            # A pod names the topic: each of its "/"-parts one checked segment, so no topic
            # makes the node send its publish anywhere but the topic bus.
            path = group_path("namespaces", ns, "topics", *topic.split("/"))
            async with self.client.request("POST", path, params={"source": source}, data=payload,
                                           headers={"Content-Type": "application/octet-stream"}) as r:
                if r.status >= 300:
                    log.warning("publish to %s/%s refused: %s", ns, topic, (await r.text())[:200])
        except Exception as e:  # noqa: BLE001 - events are best effort
            log.warning("cannot publish to %s/%s: %s", ns, topic, e)

    def deliver(self, ns: str, topic: str, payload: bytes, source: str,
                held: Iterable[str] = (), to: str | None = None) -> int:
        """An event to this node's pods that hear its topic, but never to its publisher nor
        to a pod the control plane holds it for (``held``: names of pods under a move).  A
        held event released (``to``: a uid) goes to that pod only."""
        n = 0
        for worker in list(self.workers.values()):
            inst = worker.instance
            if (inst is None or worker.namespace != ns or topic not in inst.config.topics
                    or source == f"pod/{worker.uid}" or worker.name in held
                    or (to is not None and worker.uid != to)):
                continue
            dropped = inst.dropped_events
            inst.deliver_event(topic, payload)
            self.count_dropped(worker, inst.dropped_events - dropped)
            n += 1
        return n

    def count_dropped(self, worker: PodWorker, count: int) -> None:
        """``count`` events for the pod were dropped (a frozen or moving pod takes more only
        while fewer than 8 wait, a running one queues 1024 or 1 MiB of topics and payloads):
        they show as the pod's Warning event EventsDropped, whose count (``kubectl get
        events``, ``kubectl describe pod``) is the number dropped."""
        if count <= 0:
            return

        async def record() -> None:
            async with self._drop_lock:  # one after another: each bumps the same Event's count
                await self.events.record(
                    worker.pod, "Warning", "EventsDropped",
                    f"Events for the pod were dropped: at most {MAX_HELD_EVENTS} wait for a pod while it is "
                    "frozen or moving, counting those it had queued (it keeps them all), "
                    f"{MAX_QUEUED_EVENTS} ({MAX_QUEUED_EVENT_BYTES >> 20} MiB of topics and payloads) while it "
                    "runs (the count is the number dropped)", count)
        self.spawn(record())

    async def topics_read(self, seq: int, timeout: float) -> bool:
        """Wait until the topic line ``seq`` has been read (every event published before it
        has then been delivered here); False after ``timeout`` s (the subscription is down:
        no event reaches this node then)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.topic_seq < seq:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._topic_read.clear()
            await wait_set(self._topic_read, remaining)
        return True

    async def _topic_loop(self) -> None:
        backoff = 0.1
        while True:
            try:
                async for line in self.client.stream_lines(group_path("topicevents"), {"watch": "true"}):
                    self._on_topic_line(line)
                    backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - reconnect after any failure
                log.debug("topic subscription: %s", e)
            self.subscribed.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _on_topic_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            return
        if not isinstance(ev, dict):
            return
        self._read_line(ev.get("seq"))
        kind = ev.get("type")
        if kind == "SUBSCRIBED":
            self.subscribed.set()
            return
        to = ev.get("to")
        if kind == "DROPPED":
            worker = self.workers.get(to) if isinstance(to, str) else None
            count = ev.get("count")
            if worker is not None and isinstance(count, int):
                self.count_dropped(worker, count)
            return
        try:
            payload = base64.b64decode(ev.get("payload", ""))
        except ValueError:
            return
        held = ev.get("held") or ()
        self.deliver(ev.get("namespace", ""), ev.get("topic", ""), payload, ev.get("source", ""),
                     held if isinstance(held, list) else (), to if isinstance(to, str) else None)

    def _read_line(self, seq: Any) -> None:
        """Each line is numbered one after the last (a SUBSCRIBED line numbers the latest
        before it: after a reconnection, or a control plane restart, the count starts there)."""
        if isinstance(seq, int):
            self.topic_seq = seq
            self._topic_read.set()
