"""The kubelet's side of pod migration: ``/checkpoint``, ``/thaw`` and restores.

``POST /checkpoint/<ns>/<pod>/<container>?leave=running|frozen&timeoutMs=<ms>``
freezes the pod once its current call returns and answers its K32S snapshot,
streamed from linear memory (``Content-Length``, ``X-Kube32-Image-Sha256``,
``X-Kube32-Snapshot-Sha256``, ``X-Kube32-Pod-Time-Ms``, and
``X-Kube32-Frozen-At-Ms`` for the controller's freeze-to-running figure).  404
NotFound, 409 NotMovable with every blocker, 504 Timeout: the pod keeps running
in each.  ``leave=running`` thaws after the snapshot (also when the transfer
broke); ``leave=frozen`` keeps it frozen for a move, and a frozen pod gives the
same snapshot every time, so a failed transfer can be retried.

``?dryRun=All`` only checks: 409 NotMovable with every blocker, or 200 with an empty
``blockers`` list; the pod is never frozen (the control plane asks so for the node's
blockers when it found some of its own).  ``?eventsSeq=<n>`` (a move's, from the API
server): the snapshot is taken once this node has read topic line n, so it holds every
event published before the control plane began to hold the pod's events and none after
(kube32.apiserver.heldevents); ``X-Kube32-Held-Events`` says how many it holds.

``POST /thaw/<ns>/<pod>/<container>``: 200 ``{"thawed":true}``, or 404 when the
pod is not frozen.  Held events are delivered first (the runtime does that).

A pod left frozen by a move whose controller never came back is thawed after
:data:`FROZEN_MAX_SECONDS` while it is still bound here: no pod stays frozen forever.

Restore: a pod with ``kube32.io/restore-from`` streams
``GET .../checkpoints/<name>/data`` into a fresh instance (the reader checks
image, memory limit, globals, tables and trailer as the bytes arrive), then the
runtime restores clock and channels and calls ``k32_restored``.  Any failure is a
:class:`RestoreError` whose message begins "cannot restore the snapshot: ".
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from .. import movability
from ..client import CHECKPOINTS
from ..snapshot import Snapshot, SnapshotError
from ..wasm import CallTimeout, Pod, PodError

if TYPE_CHECKING:
    from .kubelet import Kubelet

log = logging.getLogger("kube32.kubelet.migration")

# Faults a test can inject into a worker (``kube32-sim worker --fault NAME``), for the
# reliability suite (tests/e2e/test_faults.py); none is on unless named:
# corrupt-restores flips one byte of every snapshot this node restores, as damage in
# transfer would; the real checks must then refuse it.  truncate-restores ends the
# download of every restore halfway.  hang-restores never finishes a restore (a target
# that never starts the replacement).  crash-restores fails every pod that would restore here
# before its restore begins, as a node whose runtime cannot load the module would: the
# container ends terminated with reason Error (not RestoreError) and is restarted with
# back-off.  slow-snapshots sends half of every snapshot taken for a move (leave=frozen)
# and then waits 8 s before the rest: a window to kill the node or the control plane
# mid-transfer, or to publish events, and shorter than the 10 s without a byte after
# which the API server gives up on the snapshot (kube32.apiserver.dataspace.Pace), so
# the move then completes.
FAULTS = ("corrupt-restores", "truncate-restores", "hang-restores", "crash-restores", "slow-snapshots")
CRASH_RESTORES_MESSAGE = "injected fault crash-restores: this node cannot load the module of a pod to restore"
SLOW_SNAPSHOT_PAUSE = 8.0

EVENTS_SEQ_WAIT = 2.0  # s: how long a snapshot waits for the topic line it must follow
DEFAULT_TIMEOUT_MS = 10000
MAX_TIMEOUT_MS = 60000
FROZEN_MAX_SECONDS = 300.0


class _Corrupting:
    """A stream that flips one byte past the header (fault injection)."""

    def __init__(self, inner: Any, at: int = 200) -> None:
        self.inner, self.at, self.pos = inner, at, 0

    async def read(self, n: int) -> bytes:
        data = await self.inner.read(n)
        if self.pos <= self.at < self.pos + len(data):
            i = self.at - self.pos
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        self.pos += len(data)
        return data


class _Truncating:
    """A stream that ends after ``limit`` bytes (fault injection)."""

    def __init__(self, inner: Any, limit: int = 4096) -> None:
        self.inner, self.left = inner, limit

    async def read(self, n: int) -> bytes:
        if self.left <= 0:
            return b""
        data = await self.inner.read(min(n, self.left))
        self.left -= len(data)
        return data


def _slow_writer(write: Any, total: int) -> Any:
    """``write`` that pauses once half of ``total`` bytes went out (fault injection)."""
    sent = 0

    async def slow(data: Any) -> None:
        nonlocal sent
        view = memoryview(data)
        half = total // 2
        if sent < half <= sent + len(view):
            cut = half - sent
            await write(view[:cut])
            sent += cut
            await asyncio.sleep(SLOW_SNAPSHOT_PAUSE)
            view = view[cut:]
        await write(view)
        sent += len(view)
    return slow


class RestoreError(Exception):
    """A restore that failed; the container ends terminated with reason RestoreError."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"cannot restore the snapshot: {cause}")


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _not_found(message: str) -> web.Response:
    return _json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                       "message": message, "code": 404})


def _bad_request(message: str) -> web.Response:
    return _json(400, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "BadRequest",
                       "message": message, "code": 400})


def parse_params(query: Any) -> tuple[str, int, int, bool] | str:
    """(leave, timeoutMs, eventsSeq, dryRun), or the message of a 400."""
    dry_run = query.get("dryRun")
    if dry_run not in (None, "All"):
        return f'dryRun must be "All", not "{dry_run}"'
    leave = query.get("leave", "running")
    if leave not in ("running", "frozen"):
        return f'leave must be "running" or "frozen", not "{leave}"'
    raw = query.get("timeoutMs", str(DEFAULT_TIMEOUT_MS))
    try:
        timeout = int(raw)
    except ValueError:
        return f'timeoutMs must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}, not "{raw}"'
    if not 1 <= timeout <= MAX_TIMEOUT_MS:
        return f"timeoutMs must be from 1 to {MAX_TIMEOUT_MS} ms, not {timeout}"
    raw = query.get("eventsSeq", "0")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return f'eventsSeq must be the number of a topic line (0 or more), not "{raw}"'
    return leave, timeout, int(raw), dry_run == "All"


def _target(kl: "Kubelet", request: web.Request):
    ns, name, container = (request.match_info[k] for k in ("ns", "pod", "container"))
    worker = kl.worker_by_name(ns, name)
    if worker is None or worker.terminating:
        return None, f'pod "{ns}/{name}" is not running on node "{kl.options.node_name}"'
    if container != worker.container:
        return None, f'pod "{ns}/{name}" has no container "{container}"'
    if worker.instance is None:
        return None, f'container "{container}" of pod "{ns}/{name}" is not running'
    return worker, ""


def node_blockers(worker: Any, inst: Pod) -> list[str]:
    """Every reason, the spec's and the node's, without repeats."""
    found = movability.spec_blockers(worker.pod, inst.module.exports) + inst.blockers()
    return list(dict.fromkeys(found))


async def checkpoint(kl: "Kubelet", request: web.Request) -> web.StreamResponse:
    params = parse_params(request.query)
    if isinstance(params, str):
        return _bad_request(params)
    leave, timeout_ms, events_seq, dry_run = params
    worker, why = _target(kl, request)
    if worker is None:
        return _not_found(why)
    inst = worker.instance
    blockers = node_blockers(worker, inst)
    if blockers:
        return _json(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotMovable",
                           "message": "the pod cannot move: " + "; ".join(blockers), "blockers": blockers,
                           "code": 409})
    if dry_run:
        return _json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                           "message": "the pod can move", "blockers": [], "code": 200})
    # A move's snapshot holds every event published before the control plane began to hold
    # the pod's events (line eventsSeq of the topic stream), and none after it.
    if not await kl.topics_read(events_seq, EVENTS_SEQ_WAIT):
        log.warning("taking the snapshot of %s/%s without topic line %d (the topic stream is behind or down)",
                    worker.namespace, worker.name, events_seq)
    was_frozen = inst.frozen
    dropped = inst.dropped_events
    try:
        await asyncio.to_thread(inst.freeze, timeout_ms)
    except CallTimeout as e:
        return _json(504, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Timeout",
                           "message": str(e), "blockers": [str(e)], "code": 504})
    except PodError as e:
        return _json(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotMovable",
                           "message": str(e), "blockers": [str(e)], "code": 409})
    kl.count_dropped(worker, inst.dropped_events - dropped)  # a frozen pod keeps 8 of those queued
    if not was_frozen:
        worker.frozen_since = time.monotonic()
        kl.pod_frozen_changed(worker.uid)
    thaw = leave == "running"
    try:
        writer = inst.snapshot()
        resp = web.StreamResponse(headers={
            "Content-Type": "application/octet-stream",
            "X-Kube32-Image-Sha256": inst.module.sha256,
            "X-Kube32-Pod-Time-Ms": str(writer.state.pod_time_ms),
            "X-Kube32-Frozen-At-Ms": str(writer.state.unix_time_ms),
            "X-Kube32-Held-Events": str(len(writer.state.events)),
        })
        resp.content_length = writer.total_size
        # The trailer is known only at the end; a frozen pod's snapshot never changes,
        # so it is computed once per freeze and sent up front - unless the caller reads
        # it from the snapshot's own trailer (sha256=trailer: the API server's pull), when
        # the hash runs beside the send instead of a whole pass before it.
        if request.query.get("sha256") != "trailer":
            resp.headers["X-Kube32-Snapshot-Sha256"] = await _trailer(worker, writer)
        await resp.prepare(request)
        write = resp.write
        if "slow-snapshots" in kl.options.faults and not thaw:
            write = _slow_writer(write, writer.total_size)
        await writer.write_async(write)
        await resp.write_eof()
        return resp
    except PodError as e:
        thaw = True
        return _json(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotMovable",
                           "message": str(e), "blockers": [str(e)], "code": 409})
    finally:
        if thaw and inst.frozen:
            await _thaw(kl, worker, inst)


async def _trailer(worker: Any, writer: Any) -> str:
    """The snapshot's SHA-256, hashed once per frozen state: a frozen pod's memory, globals
    and tables never change, only the events held for it may grow."""
    key = (worker.frozen_since, writer.state.events)
    cached = worker.snapshot_digest
    if cached is not None and cached[0] == key:
        writer.sha256 = bytes.fromhex(cached[1])
        return cached[1]
    digest = (await asyncio.to_thread(writer.digest)).hex()
    worker.snapshot_digest = (key, digest)
    return digest


async def _thaw(kl: "Kubelet", worker: Any, inst: Pod) -> None:
    try:
        await asyncio.to_thread(inst.thaw)
    except PodError:
        return
    worker.frozen_since = None
    kl.pod_frozen_changed(worker.uid)


async def thaw(kl: "Kubelet", request: web.Request) -> web.Response:
    worker, why = _target(kl, request)
    if worker is None:
        return _not_found(why)
    if not worker.instance.frozen:
        return _not_found(f'pod "{worker.namespace}/{worker.name}" is not frozen')
    await _thaw(kl, worker, worker.instance)
    return _json(200, {"thawed": True})


async def thaw_forgotten(kl: "Kubelet") -> None:
    """Thaw pods frozen for a move that never finished (the controller is gone)."""
    while True:
        await asyncio.sleep(5)
        for worker in list(kl.workers.values()):
            since = getattr(worker, "frozen_since", None)
            inst = worker.instance
            if since is not None and inst is not None and inst.frozen and not worker.terminating \
                    and time.monotonic() - since > getattr(kl.options, 'frozen_max_seconds', FROZEN_MAX_SECONDS):
                log.warning("thawing %s/%s: frozen for a move for %.0f s", worker.namespace, worker.name,
                            time.monotonic() - since)
                await _thaw(kl, worker, inst)


class DataRequest:
    """A restore's ``GET .../checkpoints/<name>/data``: sent by the move's prefetch (with
    ``wait_seconds``, before the data is stored; kube32.kubelet.prefetch), or else once
    the pod's module is loaded, so that its round trip through the API server overlaps
    the pod's config and the instantiation.  ``close`` releases an answer nobody read
    (idempotent)."""

    def __init__(self, kl: "Kubelet", namespace: str, checkpoint_name: str, wait_seconds: int = 0) -> None:
        self.checkpoint_name = checkpoint_name
        params = {"waitSeconds": str(wait_seconds)} if wait_seconds else None
        self.response: asyncio.Future[aiohttp.ClientResponse] = asyncio.ensure_future(kl.client.request(
            "GET", CHECKPOINTS.path(namespace, checkpoint_name, "data"), params=params,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=60 + wait_seconds)))

    async def close(self) -> None:
        if not self.response.done():
            self.response.cancel()
        await asyncio.wait([self.response])
        if not self.response.cancelled() and self.response.exception() is None:
            self.response.result().release()


async def restore(kl: "Kubelet", instance: Pod, request: DataRequest) -> None:
    """Stream the Checkpoint's data into ``instance`` and finish the restore."""
    await finish(instance, await read_into(kl, instance, request))


async def read_into(kl: "Kubelet", instance: Pod, request: DataRequest) -> Snapshot:
    """Make ``instance`` (on a thread, while the data's answer comes) and stream the data
    into it: everything of a restore but :func:`finish`."""
    prepared = asyncio.ensure_future(asyncio.to_thread(instance.prepare_restore))
    try:
        return await _read(kl, request, prepared)
    finally:
        await asyncio.wait([prepared])  # never hand back an instance still being made
        if not prepared.cancelled():
            prepared.exception()  # seen: reported above, or superseded by the request's failure


async def finish(instance: Pod, snap: Snapshot) -> None:
    """Globals, tables, clock and channels; ``k32_restored``; the held events."""
    try:
        await asyncio.to_thread(instance.finish_restore, snap)
    except (PodError, SnapshotError) as e:
        raise RestoreError(str(e)) from None


async def _read(kl: "Kubelet", request: DataRequest, prepared: "asyncio.Future[Any]") -> Snapshot:
    checkpoint_name = request.checkpoint_name
    try:
        async with await request.response as r:
            try:
                reader = await prepared
            except PodError as e:
                raise RestoreError(str(e)) from None
            if r.status == 404:
                raise RestoreError(f"checkpoint {checkpoint_name} has no data (lost with a control plane "
                                   "restart, or dropped to make room)")
            if r.status != 200:
                raise RestoreError(f"the checkpoint's data could not be read: {r.status} {(await r.text())[:200]}")
            faults = kl.options.faults
            if "hang-restores" in faults:
                await asyncio.Event().wait()
            stream = r.content
            if "corrupt-restores" in faults:
                stream = _Corrupting(stream)
            if "truncate-restores" in faults:
                stream = _Truncating(stream)
            return await reader.read_async(stream)
    except SnapshotError as e:
        raise RestoreError(str(e)) from None
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise RestoreError(f"the checkpoint's data could not be read: {e}") from None
