"""Checkpoint data: the snapshot bytes of a Checkpoint, held in the control plane's memory.

``PUT checkpoints/<name>/data`` takes a K32S snapshot (``application/octet-stream``
with a Content-Length), checks magic, version and trailer as it arrives (422 when
wrong, nothing stored), sets ``status.sizeBytes``, ``snapshotSha256``, ``imageSha256``
and ``podTimeMs`` from it and answers the Checkpoint.  ``GET`` answers the bytes, or
404 while the Checkpoint has none.  ``GET ?waitSeconds=<n>`` (0-60, default 0): while
the Checkpoint is ``Saving`` (its data on the way), the answer waits up to n seconds for an
upload or pull of the data to begin, then forwards the bytes as they arrive (the trailer
last, once the whole snapshot is checked and stored; a refused upload cuts the connection),
or answers as above when none begins or it is refused.  A move's target kubelet sends
its data GET this way as soon as it learns it is the target (kube32.kubelet.prefetch), so
the bytes reach it while the control plane receives them.

``PUT checkpoints/<name>/data?fromNode=<node>&pod=<pod>&container=<c>[&leave=running|
frozen][&timeoutMs=<ms>]`` (no body) has the API server take the snapshot itself: it
asks that node's kubelet ``POST /checkpoint/<ns>/<pod>/<c>`` (the caller needs
``create nodes/proxy`` on the node, as through the node proxy, besides ``update
checkpoints/data``) and streams the answer straight into the data, checked as above.
The snapshot then crosses the control plane once (one TLS read, one hash, one copy)
instead of proxy -> controller -> upload.  The answer carries the kubelet's
``X-Kube32-*`` headers (``X-Kube32-Frozen-At-Ms`` among them) and the Checkpoint with
the snapshot's facts in its status, which this request does not write: its caller does,
with its next status write (the Checkpoint controller's Moving or Saved), so a move's
critical path has one write fewer.  The data keeps its facts beside it: ``GET`` answers
their headers either way.  A kubelet that refuses
is answered as it answered, status and body, marked ``X-Kube32-From-Node: <node>``;
an unreachable kubelet is 503 and a transfer that breaks is 502, both worded "the
snapshot transfer from <node> failed: ...".

Invariants:

* Data lives outside the object store, in one space of ``capacity`` bytes (16 MiB in
  the simulator, 256 KiB on the board); a restart loses it and keeps the objects.
* Storing data that does not fit drops the oldest other data first; data larger
  than the whole space is refused with 413 before a byte is read.
* Data belongs to one Checkpoint uid: a Checkpoint deleted and created again
  under the same name has none, and deleting a Checkpoint drops its data.
* The space is never over-committed: an upload reserves its size before it reads,
  so two concurrent uploads cannot together exceed the capacity.
"""
from __future__ import annotations

import asyncio
import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import aiohttp
from aiohttp import web

from ..snapshot import TRAILER_SIZE, SnapshotError, SnapshotReader
from ..snapshot.parallel import prefault
from ..snapshot.writer import ASYNC_WRITE
from . import authz, checkpointstatus, errors
from .proxy import kubelet_base
from .resources import Resource

if TYPE_CHECKING:
    from .server import APIServer, Target

# Test-only fault (tests/e2e/test_faults.py): with KUBE32_TEST_FAULTS=corrupt-stored-data
# in the control plane's environment, the data of a Checkpoint labelled
# kube32.io/test-fault: corrupt-stored-data gets one byte flipped once it is stored and
# checked, as damage in storage would.  Off unless both are given.
TEST_FAULT_LABEL = "kube32.io/test-fault"
CORRUPT_STORED = "corrupt-stored-data"


def _corrupts(ck: dict[str, Any]) -> bool:
    return (CORRUPT_STORED in os.environ.get("KUBE32_TEST_FAULTS", "").split(",")
            and (ck["metadata"].get("labels") or {}).get(TEST_FAULT_LABEL) == CORRUPT_STORED)


SIM_CAPACITY = 16 * 1024 * 1024
BOARD_CAPACITY = 256 * 1024


Buffer = Union[bytearray, mmap.mmap]
CHECK_STEP = 1 << 20  # bytes handed to the snapshot reader at a time
FORWARD_STEP = 256 << 10  # bytes received between wake-ups of GETs forwarding them


def _fresh_buffer(size: int) -> Buffer:
    """Room for one snapshot.  A private anonymous mapping, not a bytearray: a
    bytearray is zeroed (every page faulted in) before the first byte arrives,
    where these pages are faulted in by `prefault` beside the transfer."""
    if size < 1 << 20:
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


FACT_HEADERS = (("X-Kube32-Snapshot-Sha256", "snapshotSha256"), ("X-Kube32-Image-Sha256", "imageSha256"),
                ("X-Kube32-Pod-Time-Ms", "podTimeMs"))


WAIT_MAX_SECONDS = 60


def wait_seconds(query: Any) -> float:
    """``waitSeconds`` of a data GET: 0 (the default) to 60."""
    raw = query.get("waitSeconds", "0")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= WAIT_MAX_SECONDS:
        raise errors.bad_request(f'waitSeconds must be a whole number of seconds from 0 to {WAIT_MAX_SECONDS}, '
                                 f'not "{raw}"')
    return float(value)


@dataclass(frozen=True)
class Stored:
    data: Buffer
    name: str
    facts: dict[str, Any]  # the snapshot's status facts (movability.SNAPSHOT_FACTS)


class Arriving:
    """Data being received: how far it got, for GETs that forward it as it comes."""

    def __init__(self, uid: str, view: memoryview) -> None:
        self.uid = uid
        self.view = view
        self.received = 0
        self.ended = False      # checked and stored, or failed
        self.failed = False
        self._progress: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def advanced(self, received: int) -> None:
        self.received = received
        self._wake()

    def end(self, failed: bool) -> None:
        self.ended, self.failed = True, failed
        self._wake()

    def _wake(self) -> None:
        if not self._progress.done():
            self._progress.set_result(None)
        self._progress = asyncio.get_running_loop().create_future()

    def forwardable(self) -> int:
        """How many bytes may be forwarded: all once the data is checked and stored; before
        that, all but the trailer, so a reader never gets a whole snapshot this control
        plane refused."""
        return len(self.view) if self.ended and not self.failed else \
            min(self.received, len(self.view) - TRAILER_SIZE)

    async def beyond(self, sent: int) -> None:
        """Until more than ``sent`` bytes may be forwarded, or the data failed."""
        while self.forwardable() <= sent and not self.failed:
            await asyncio.shield(self._progress)


class CheckpointDataSpace:
    """The bytes of every Checkpoint's snapshot, oldest first, within ``capacity``."""

    def __init__(self, capacity: int = SIM_CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()  # uid -> data, oldest first
        self._reserved = 0

    @property
    def used(self) -> int:
        return sum(len(s.data) for s in self._items.values()) + self._reserved

    def reserve(self, uid: str, size: int) -> list[str]:
        """Make room for ``size`` bytes; returns the names whose data was dropped."""
        if size > self.capacity:
            raise errors.too_large(f"the snapshot is {size} bytes, more than the {self.capacity} bytes "
                                   "the control plane has for all checkpoint data")
        dropped = []
        self.drop(uid)
        while self.used + size > self.capacity and self._items:
            _, old = self._items.popitem(last=False)
            dropped.append(old.name)
        if self.used + size > self.capacity:
            raise errors.too_many_requests("checkpoint data space is busy with other uploads; retry", 1)
        self._reserved += size
        return dropped

    def release(self, size: int) -> None:
        self._reserved -= size

    def commit(self, uid: str, name: str, data: Buffer, facts: dict[str, Any]) -> None:
        self._reserved -= len(data)
        self._items[uid] = Stored(data, name, facts)

    def stored(self, uid: str) -> Stored | None:
        return self._items.get(uid)

    def drop(self, uid: str) -> None:
        self._items.pop(uid, None)


async def _write_range(resp: web.StreamResponse, view: memoryview, start: int, end: int) -> None:
    for off in range(start, end, ASYNC_WRITE):  # each write is encrypted and sent whole
        await resp.write(view[off: min(off + ASYNC_WRITE, end)])


class CheckpointDataAPI:
    """The ``data`` subresource handlers, plugged into the API server."""

    def __init__(self, server: "APIServer", space: CheckpointDataSpace) -> None:
        self.server = server
        self.space = space
        # GETs waiting for data on its way (waitSeconds), and data being received, by (namespace, name)
        self._waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self._arriving: dict[tuple[str, str], Arriving] = {}
        server.sub_handlers[("checkpoints", "data", "GET")] = self.get
        server.sub_handlers[("checkpoints", "data", "PUT")] = self.put
        server.registry.before_delete["checkpoints"] = self._on_delete

    async def _on_delete(self, res: Resource, obj: dict[str, Any]) -> None:
        self.space.drop(obj["metadata"]["uid"])
        self._settled(obj["metadata"].get("namespace"), obj["metadata"]["name"])

    async def get(self, request: web.Request, t: "Target") -> web.StreamResponse:
        assert t.name is not None and t.namespace is not None
        wait = wait_seconds(request.query)
        found = await self._stored_or_wait(t, wait)
        if found is None:
            raise errors.APIError(404, "NotFound", f'checkpoint "{t.name}" has no data',
                                  details={"name": t.name, "group": "kube32.io", "kind": "checkpoints"})
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        if isinstance(found, Arriving):
            resp.content_length = len(found.view)
            await resp.prepare(request)
            await self._forward(request, resp, found)
            return resp
        view = memoryview(found.data)
        resp.content_length = len(view)
        for header, field in FACT_HEADERS:
            resp.headers[header] = str(found.facts[field])
        await resp.prepare(request)
        await _write_range(resp, view, 0, len(view))
        await resp.write_eof()
        return resp

    @staticmethod
    async def _forward(request: web.Request, resp: web.StreamResponse, arriving: Arriving) -> None:
        """Send data as it is received (a move's target reads it while it is stored).  The
        bytes are the ones being checked and stored; the trailer goes last, once the whole
        snapshot is checked and stored.  If the upload fails, the connection is cut: the
        reader sees a truncated body, never a short one nor a snapshot refused here."""
        sent, size = 0, len(arriving.view)
        while sent < size:
            await arriving.beyond(sent)
            if arriving.failed:
                if request.transport is not None:
                    request.transport.close()
                raise ConnectionResetError("the upload being forwarded failed")
            end = arriving.forwardable()
            await _write_range(resp, arriving.view, sent, end)
            sent = end
        await resp.write_eof()

    async def _stored_or_wait(self, t: "Target", wait: float) -> Stored | Arriving | None:
        """The Checkpoint's data; while the Checkpoint is Saving (its data on the way), the
        data as it arrives, first waiting up to ``wait`` seconds for an upload or pull of it
        to begin, or to end refused."""
        assert t.name is not None and t.namespace is not None
        key = (t.namespace, t.name)
        # Registered before the read: an upload that begins or ends while the read waits
        # still wakes us.
        woken = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, set()).add(woken)
        try:
            ck = await self.server.registry.get(t.res, t.namespace, t.name)
            found = self._found(key, ck, wait > 0)
            if found is not None or (ck.get("status") or {}).get("phase") != "Saving" or wait <= 0:
                return found
            await asyncio.wait([woken], timeout=wait)
        finally:
            waiters = self._waiting.get(key, set())
            waiters.discard(woken)
            if not waiters:
                self._waiting.pop(key, None)
        return self._found(key, await self.server.registry.get(t.res, t.namespace, t.name), True)

    def _found(self, key: tuple[str, str], ck: dict[str, Any], arriving: bool) -> Stored | Arriving | None:
        uid = ck["metadata"]["uid"]
        stored = self.space.stored(uid)
        if stored is not None or not arriving or _corrupts(ck):  # a storage fault is served from storage
            return stored
        on_way = self._arriving.get(key)
        return on_way if on_way is not None and on_way.uid == uid and not on_way.failed else None

    def _settled(self, namespace: str | None, name: str | None) -> None:
        """An upload or pull of this Checkpoint's data began, or ended (stored or not):
        waiting GETs look again."""
        for waiter in self._waiting.get((namespace or "", name or ""), ()):
            if not waiter.done():
                waiter.set_result(None)

    async def put(self, request: web.Request, t: "Target") -> web.StreamResponse:
        try:
            return await self._put(request, t)
        finally:
            self._settled(t.namespace, t.name)

    async def _put(self, request: web.Request, t: "Target") -> web.StreamResponse:
        assert t.name is not None
        if request.query.get("fromNode"):
            return await self._pull(request, t)
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype != "application/octet-stream":
            raise errors.unsupported_media_type(ctype or "<none>")
        size = request.content_length
        if size is None:
            raise errors.APIError(411, "LengthRequired", "checkpoint data needs a Content-Length")
        ck = await self.server.registry.get(t.res, t.namespace, t.name)
        return web.json_response(await self._store(t, ck, size, request.content))

    async def _store(self, t: "Target", ck: dict[str, Any], size: int, stream: Any,
                     write_facts: bool = True) -> dict[str, Any]:
        """Receive ``size`` bytes of ``stream`` as ``ck``'s data; returns the Checkpoint with
        the snapshot's facts in its status (written to the store only with ``write_facts``)."""
        assert t.name is not None
        uid = ck["metadata"]["uid"]
        dropped = self.space.reserve(uid, size)
        # The Checkpoints whose data made room say so (checkpointstatus: their facts go).
        await checkpointstatus.dropped(self.server.registry, dropped, lambda u: self.space.stored(u) is not None)
        try:
            data = await self._receive(stream, size, (t.namespace or "", t.name), uid)
        except BaseException:
            self.space.release(size)
            raise
        snap = data[1]
        facts = {"sizeBytes": size, "snapshotSha256": snap.sha256.hex(),
                 "imageSha256": snap.header.image_sha256.hex(), "podTimeMs": snap.header.pod_time_ms}

        def set_facts(obj: dict[str, Any]) -> dict[str, Any]:
            if obj["metadata"]["uid"] != uid:
                raise errors.conflict("checkpoints", t.name, "kube32.io", "the Checkpoint was replaced during the upload")
            checkpointstatus.stored(obj.setdefault("status", {}), facts)
            return obj
        key, arriving = (t.namespace or "", t.name), data[2]
        try:
            out = await self.server.registry.mutate(t.res, t.namespace, t.name, set_facts, subresource="status") \
                if write_facts else set_facts(await self.server.registry.get(t.res, t.namespace, t.name))
        except BaseException:
            self.space.release(size)
            self._arrived(key, arriving, stored=False)
            raise
        if _corrupts(ck):
            data[0][len(data[0]) // 2] ^= 0xFF
        self.space.commit(uid, t.name, data[0], facts)
        self._arrived(key, arriving, stored=True)
        return out

    async def _pull(self, request: web.Request, t: "Target") -> web.StreamResponse:
        """The snapshot taken from the node by the API server itself (see the module doc)."""
        assert t.name is not None and t.namespace is not None
        q = request.query
        node, pod, container = q.get("fromNode", ""), q.get("pod", ""), q.get("container", "")
        if not pod or not container or any("/" in v for v in (node, pod, container)):
            raise errors.bad_request("fromNode needs pod and container (names, without '/')")
        path = f"checkpoint/{t.namespace}/{pod}/{container}"
        attrs = authz.request_attributes(request["user"], "POST", f"/api/v1/nodes/{node}/proxy/{path}", {})
        allowed, reason = await self.server.authorizer.authorize(attrs)
        if not allowed:
            raise authz.forbidden(attrs, reason)
        ck = await self.server.registry.get(t.res, t.namespace, t.name)
        # sha256=trailer: the kubelet need not hash the whole snapshot before its first byte
        # for an X-Kube32-Snapshot-Sha256 header; the reader below checks the trailer anyway.
        params = {**{k: q[k] for k in ("leave", "timeoutMs") if k in q}, "sha256": "trailer"}
        url = f"{kubelet_base(await self.server._node(node))}/{path}"
        kubelets = self.server.kubelets
        failed = f"the snapshot transfer from {node} failed"
        try:
            upstream = await kubelets.session.post(url, params=params, headers=kubelets.auth_headers(url),
                                                   allow_redirects=False,
                                                   timeout=aiohttp.ClientTimeout(total=None, sock_read=120))
        except (aiohttp.ClientError, OSError) as e:
            raise errors.service_unavailable(f"{failed}: error trying to reach the kubelet: {e}") from None
        async with upstream:
            passed = {k: v for k, v in upstream.headers.items() if k.lower().startswith("x-kube32-")}
            if upstream.status != 200:
                body = await upstream.read()
                return web.Response(status=upstream.status, body=body, headers={
                    **passed, "Content-Type": upstream.headers.get("Content-Type", "application/json"),
                    "X-Kube32-From-Node": node})
            if upstream.content_length is None:
                raise errors.APIError(502, "BadGateway", f"{failed}: the node sent a snapshot without a "
                                                         "Content-Length")
            try:
                out = await self._store(t, ck, upstream.content_length, upstream.content, write_facts=False)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                raise errors.APIError(502, "BadGateway", f"{failed}: {e or type(e).__name__}") from None
        passed["X-Kube32-Snapshot-Sha256"] = out["status"]["snapshotSha256"]  # checked, from the trailer
        return web.json_response(out, headers=passed)

    async def _receive(self, stream: Any, size: int, key: tuple[str, str],
                       uid: str) -> tuple[Buffer, Any, Arriving]:
        buf = _fresh_buffer(size)
        view = memoryview(buf)
        prefaulting = prefault(view)
        reader = SnapshotReader(total_size=size)
        # GETs waiting for this data forward it as it arrives (see _forward).
        arriving = self._arriving[key] = Arriving(uid, view)
        self._settled(*key)
        pos = checked = told = 0
        try:
            # readchunk: each piece as it arrived (iter_any and read(n) join the pieces
            # they find buffered into a new bytes object first).
            while chunk := (await stream.readchunk())[0]:
                n = len(chunk)
                if pos + n > size:
                    raise errors.bad_request("the body is longer than its Content-Length")
                view[pos: pos + n] = chunk
                pos += n
                if pos - checked >= CHECK_STEP or pos == size:
                    if pos == size:
                        await reader.settled()  # so the trailer's check does not wait on the hash
                    # The buffer is written once: the reader's hash reads it in place, on its thread.
                    reader.feed(view[checked: pos], stable=True)
                    checked = pos
                if pos - told >= FORWARD_STEP or pos == size:
                    arriving.advanced(pos)
                    told = pos
            if pos < size:
                raise SnapshotError("the snapshot ends before its trailer (truncated)", "truncated")
            snap = reader.finish()
        except BaseException as e:
            self._arrived(key, arriving, stored=False)
            if isinstance(e, SnapshotError):
                raise errors.APIError(422, "Invalid", f"the snapshot is not valid: {e}") from None
            raise
        finally:
            if prefaulting is not None:
                prefaulting.set()
        return buf, snap, arriving

    def _arrived(self, key: tuple[str, str], arriving: Arriving, stored: bool) -> None:
        """The data being received is stored, or will not be: forwarders finish or cut."""
        arriving.end(failed=not stored)
        if self._arriving.get(key) is arriving:
            del self._arriving[key]
