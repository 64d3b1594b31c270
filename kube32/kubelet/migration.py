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
``blockers`` list and ``sizeBytes``, the size the snapshot would have now; the pod is
never frozen (the control plane asks so for the node's blockers when it found some of
its own, and for the size to find room for the snapshot before the pod freezes).
``?eventsSeq=<n>`` (a move's, from the API server): the snapshot is taken once this
node has read topic line n, so it holds every event published before the control plane
began to hold the pod's events and none after (kube32.apiserver.heldevents);
``X-Kube32-Held-Events`` says how many it holds: all the events the pod had queued (the
freeze drops none) and those held since.

``POST /thaw/<ns>/<pod>/<container>``: 200 ``{"thawed":true}``, or 404 when the
pod is not frozen.  Held events are delivered first (the runtime does that).

``POST /images/pull?image=<ref>[&sha256=<hex>]``: pull and load a pod image now (the
caches keep it for the pod that follows): 200 ``{"image", "sha256"}`` with the module's
digest, 502 ``ErrImagePull`` when it cannot be pulled, 422 ``InvalidImage`` when it is no
pod or not the pinned digest.  A move asks its target this before it replaces the pod
(kube32.controllers.imagecheck).

A pod left frozen by a move whose controller never came back is thawed after
``KubeletOptions.frozen_max_seconds`` (300 s) while it is still bound here: no pod stays
frozen forever.

The freeze state is the pod's worker's (:meth:`~.pods.PodWorker.freeze`,
:meth:`~.pods.PodWorker.thaw`); the handlers take the node as a :class:`~.agent.NodeAgent`.
Restores are kube32.kubelet.restore's.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from .. import movability, testing, timing
from ..snapshot import SnapshotWriter
from ..terms import Header, StatusReason
from ..wasm import CallTimeout, ImageError, Pod, PodError
from .agent import NodeAgent
from .images import PIN_ANNOTATION, PullError
from .pods import PodWorker

log = logging.getLogger("kube32.kubelet.migration")

DEFAULT_TIMEOUT_MS = int(timing.FREEZE_TIMEOUT_SECONDS * 1000)
MAX_TIMEOUT_MS = int(timing.FREEZE_TIMEOUT_MAX_SECONDS * 1000)


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _failure(code: int, reason: str, message: str, **extra: Any) -> web.Response:
    """A Status of Failure (Kubernetes' shape), with ``extra`` fields (the blockers)."""
    return _json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                        "message": message, **extra, "code": code})


def _not_found(message: str) -> web.Response:
    return _failure(404, "NotFound", message)


def _bad_request(message: str) -> web.Response:
    return _failure(400, "BadRequest", message)


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


def _target(kl: NodeAgent, request: web.Request) -> tuple[PodWorker, Pod] | str:
    """The pod's worker and its running container, or why there is none (a 404)."""
    ns, name, container = (request.match_info[k] for k in ("ns", "pod", "container"))
    worker = kl.worker_by_name(ns, name)
    if worker is None or worker.terminating:
        return f'pod "{ns}/{name}" is not running on node "{kl.options.node_name}"'
    if container != worker.container:
        return f'pod "{ns}/{name}" has no container "{container}"'
    if worker.instance is None:
        return f'container "{container}" of pod "{ns}/{name}" is not running'
    return worker, worker.instance


def node_blockers(worker: PodWorker, inst: Pod) -> list[str]:
    """Every reason, the spec's and the node's, without repeats."""
    found = movability.spec_blockers(worker.pod, inst.module.exports) + inst.blockers()
    return list(dict.fromkeys(found))


async def checkpoint(kl: NodeAgent, request: web.Request) -> web.StreamResponse:
    params = parse_params(request.query)
    if isinstance(params, str):
        return _bad_request(params)
    leave, timeout_ms, events_seq, dry_run = params
    target = _target(kl, request)
    if isinstance(target, str):
        return _not_found(target)
    worker, inst = target
    blockers = node_blockers(worker, inst)
    if blockers:
        return _failure(409, StatusReason.NOT_MOVABLE, "the pod cannot move: " + "; ".join(blockers),
                        blockers=blockers)
    if dry_run:
        return _json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                           "message": "the pod can move", "blockers": [], "sizeBytes": inst.snapshot_size(),
                           "code": 200})
    # A move's snapshot holds every event published before the control plane began to hold
    # the pod's events (line eventsSeq of the topic stream), and none after it.
    if not await kl.topics_read(events_seq, timing.EVENTS_SEQ_WAIT):
        log.warning("taking the snapshot of %s/%s without topic line %d (the topic stream is behind or down)",
                    worker.namespace, worker.name, events_seq)
    try:
        await worker.freeze(inst, timeout_ms)
    except CallTimeout as e:
        return _failure(504, StatusReason.TIMEOUT, str(e), blockers=[str(e)])
    except PodError as e:
        return _failure(409, StatusReason.NOT_MOVABLE, str(e), blockers=[str(e)])
    thaw = leave == "running"
    try:
        writer = inst.snapshot()
        resp = web.StreamResponse(headers={
            "Content-Type": "application/octet-stream",
            Header.IMAGE_SHA256: inst.module.sha256,
            Header.POD_TIME_MS: str(writer.state.pod_time_ms),
            Header.FROZEN_AT_MS: str(writer.state.unix_time_ms),
            Header.HELD_EVENTS: str(len(writer.state.events)),
        })
        resp.content_length = writer.total_size
        # The trailer is known only at the end; a frozen pod's snapshot never changes,
        # so it is computed once per freeze and sent up front - unless the caller reads
        # it from the snapshot's own trailer (sha256=trailer: the API server's pull), when
        # the hash runs beside the send instead of a whole pass before it.
        if request.query.get("sha256") != "trailer":
            resp.headers[Header.SNAPSHOT_SHA256] = await _trailer(worker, writer)
        await resp.prepare(request)
        write = testing.snapshot_writer(kl.options.faults, resp.write, writer.total_size, for_move=not thaw)
        await writer.write_async(write)
        await resp.write_eof()
        return resp
    except PodError as e:
        thaw = True
        return _failure(409, StatusReason.NOT_MOVABLE, str(e), blockers=[str(e)])
    finally:
        if thaw and inst.frozen:
            await worker.thaw(inst)


async def _trailer(worker: PodWorker, writer: SnapshotWriter) -> str:
    """The snapshot's SHA-256, hashed once per frozen state: a frozen pod's memory, globals
    and tables never change, only the events held for it may grow."""
    events = writer.state.events
    cached = worker.snapshot_digest(events)
    if cached is not None:
        writer.sha256 = bytes.fromhex(cached)
        return cached
    digest = (await asyncio.to_thread(writer.digest)).hex()
    worker.keep_snapshot_digest(events, digest)
    return digest


async def thaw(kl: NodeAgent, request: web.Request) -> web.Response:
    target = _target(kl, request)
    if isinstance(target, str):
        return _not_found(target)
    worker, inst = target
    if not inst.frozen:
        return _not_found(f'pod "{worker.namespace}/{worker.name}" is not frozen')
    await worker.thaw(inst)
    return _json(200, {"thawed": True})


async def pull_image(kl: NodeAgent, request: web.Request) -> web.Response:
    image = request.query.get("image", "")
    if not image:
        return _bad_request("the image to pull is missing (?image=)")
    pin = request.query.get("sha256")
    try:
        module = await kl.load_module(image, {PIN_ANNOTATION: pin} if pin else {})
    except PullError as e:
        return _failure(502, StatusReason.ERR_IMAGE_PULL, str(e))
    except ImageError as e:
        return _failure(422, StatusReason.INVALID_IMAGE, f"image {image}: {e}")
    return _json(200, {"image": image, "sha256": module.sha256})


async def thaw_forgotten(kl: NodeAgent) -> None:
    """Thaw pods frozen for a move that never finished (the controller is gone)."""
    while True:
        await asyncio.sleep(timing.THAW_SWEEP_SECONDS)
        for worker in list(kl.workers.values()):
            since = worker.frozen_since
            inst = worker.instance
            if since is not None and inst is not None and inst.frozen and not worker.terminating \
                    and time.monotonic() - since > kl.options.frozen_max_seconds:
                log.warning("thawing %s/%s: frozen for a move for %.0f s", worker.namespace, worker.name,
                            time.monotonic() - since)
                await worker.thaw(inst)
