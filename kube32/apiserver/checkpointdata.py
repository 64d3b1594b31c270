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
instead of proxy -> controller -> upload.  With ``leave=frozen`` (a move) the pod's events
are held from then on until it runs again (kube32.apiserver.heldevents): the kubelet is
asked with ``eventsSeq``, the topic line the hold began after, and its
``X-Kube32-Held-Events`` says how many events the snapshot holds.  The answer carries the kubelet's
``X-Kube32-*`` headers (``X-Kube32-Frozen-At-Ms`` among them) and the Checkpoint with
the snapshot's facts in its status, which this request does not write: its caller does,
with its next status write (the Checkpoint controller's Moving or Saved), so a move's
critical path has one write fewer.  The data keeps its facts beside it: ``GET`` answers
their headers either way.  A kubelet that refuses
is answered as it answered, status and body, marked ``X-Kube32-From-Node: <node>``;
an unreachable kubelet is 503 and a transfer that breaks is 502, both worded "the
snapshot transfer from <node> failed: ...".

How the space is shared, and when data goes, is kube32.apiserver.dataspace's: nothing
goes for an upload before its bytes have all arrived and checked out; a move's data
stays until the move ends; bytes must keep coming (408 "Timeout" for a PUT that sends
too slowly, nothing stored).  A PUT refused for room is 429 with Retry-After: when the
data cannot fit beside what may not go for it (said before a byte is read), or when
uploads arriving hold all the room for longer than its patience (30 s).  The pulls take
one snapshot at a time: the next waits for the current one before it asks its node.

Invariants:

* Data lives outside the object store, in one space of ``capacity`` bytes (16 MiB in
  the simulator, 256 KiB on the board); a restart loses it and keeps the objects.
* Data larger than the whole space is refused with 413 before a byte is read.
* Data belongs to one Checkpoint uid: a Checkpoint deleted and created again
  under the same name has none, and deleting a Checkpoint drops its data.
* Data is replaced, and other data dropped for it, only once the new data is
  checked and its facts are written: a refused or broken upload leaves everything as
  it was.  One upload of a Checkpoint's data at a time (409 for a second); a user's
  PUT does not replace the data of a move in flight (409).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
from typing import TYPE_CHECKING, Any, Iterator

import aiohttp
import yarl
from aiohttp import web

from ..snapshot import TRAILER_SIZE, SnapshotError, SnapshotReader
from ..snapshot.parallel import prefault
from ..snapshot.writer import ASYNC_WRITE
from . import authz, checkpointstatus, errors
from .dataspace import (BOARD_CAPACITY, IN_FLIGHT_PHASES, SIM_CAPACITY, Buffer, CheckpointDataSpace, Held, Pace,
                        PaceClock, Standing, Stored, standings, to_drop)
from .eventbus import Hold
from .heldevents import HeldEvents
from .proxy import check_suffix, kubelet_base, kubelet_url
from .resources import Resource, by_plural

if TYPE_CHECKING:
    from .server import APIServer, Target

__all__ = ["BOARD_CAPACITY", "SIM_CAPACITY", "CheckpointDataAPI", "CheckpointDataSpace", "Pace"]

log = logging.getLogger("kube32.apiserver.checkpointdata")

# Test-only fault (tests/e2e/test_faults.py): with KUBE32_TEST_FAULTS=corrupt-stored-data
# in the control plane's environment, the data of a Checkpoint labelled
# kube32.io/test-fault: corrupt-stored-data gets one byte flipped once it is stored and
# checked, as damage in storage would.  Off unless both are given.
TEST_FAULT_LABEL = "kube32.io/test-fault"
CORRUPT_STORED = "corrupt-stored-data"


def _corrupts(ck: dict[str, Any]) -> bool:
    return (CORRUPT_STORED in os.environ.get("KUBE32_TEST_FAULTS", "").split(",")
            and (ck["metadata"].get("labels") or {}).get(TEST_FAULT_LABEL) == CORRUPT_STORED)


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
STAGING_PATIENCE = 30.0  # seconds a PUT waits for room among the uploads arriving
RETRY_SECONDS = 5  # Retry-After of a PUT refused for room


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


def _held_count(header: str | None) -> int:
    """The number of events a node's snapshot holds (none said: none)."""
    try:
        return max(0, int(header or 0))
    except ValueError:
        return 0


async def _write_range(resp: web.StreamResponse, view: memoryview, start: int, end: int) -> None:
    for off in range(start, end, ASYNC_WRITE):  # each write is encrypted and sent whole
        await resp.write(view[off: min(off + ASYNC_WRITE, end)])


class CheckpointDataAPI:
    """The ``data`` subresource handlers, plugged into the API server."""

    def __init__(self, server: "APIServer", space: CheckpointDataSpace, pace: Pace = Pace(),
                 patience: float = STAGING_PATIENCE) -> None:
        self.server = server
        self.space = space
        self.pace = pace
        self.patience = patience
        # GETs waiting for data on its way (waitSeconds), and data being received, by (namespace, name)
        self._waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self._arriving: dict[tuple[str, str], Arriving] = {}
        self._uploading: set[tuple[str, str]] = set()  # one upload or pull of a Checkpoint's data at a time
        self._pulling = asyncio.Lock()  # the control plane takes one snapshot at a time
        self._storing = asyncio.Lock()  # what goes for data is decided and done in one step
        self.held_events = HeldEvents(server.registry, server.events)
        server.app.on_cleanup.append(lambda _app: self.held_events.close())
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
        self._check_size(size)
        with self._one_upload(t, ck, by_user=True):
            await self._room_for(ck, size)  # refused before a byte is read when it cannot fit
            staging = self.space.staging
            if not await staging.enter(size, self.patience):
                raise errors.too_many_requests(
                    f"checkpoint data space is busy: uploads arriving hold {staging.used} of its "
                    f"{staging.capacity} bytes of room for data on its way; retry", RETRY_SECONDS)
            try:
                return web.json_response(await self._store(t, ck, size, request.content))
            except TimeoutError as e:
                raise errors.request_timeout(f"{e}; nothing was stored") from None
            finally:
                staging.leave(size)

    def _check_size(self, size: int) -> None:
        if size > self.space.capacity:
            raise errors.too_large(f"the snapshot is {size} bytes, more than the {self.space.capacity} bytes "
                                   "the control plane has for all checkpoint data")

    @contextlib.contextmanager
    def _one_upload(self, t: "Target", ck: dict[str, Any], by_user: bool) -> Iterator[None]:
        """The upload or pull of ``ck``'s data, the only one at a time; a user's does not
        replace a move's data while the move is under way (its target restores from it)."""
        assert t.name is not None
        key = (t.namespace or "", t.name)
        if key in self._uploading:
            raise errors.conflict("checkpoints", t.name, "kube32.io",
                                  "its data is arriving in another upload; retry once that one ends")
        phase = (ck.get("status") or {}).get("phase")
        if by_user and phase in IN_FLIGHT_PHASES and self.space.stored(ck["metadata"]["uid"]) is not None:
            raise errors.conflict("checkpoints", t.name, "kube32.io",
                                  f"it is {phase}: a move's data stays until the move ends")
        self._uploading.add(key)
        try:
            yield
        finally:
            self._uploading.discard(key)

    async def _room_for(self, ck: dict[str, Any], size: int) -> list[Held]:
        """The data that goes so ``size`` bytes of ``ck``'s fit (none when they fit as it
        is; see kube32.apiserver.dataspace); 429 when they cannot fit beside what may
        not go for them."""
        uid, ns = ck["metadata"]["uid"], ck["metadata"].get("namespace", "")
        space = self.space
        if space.fits(uid, size):
            return []
        checkpoints, _ = await self.server.registry.list(by_plural("checkpoints"), None)
        pods, _ = await self.server.registry.list(by_plural("pods"), None)
        held = space.held(uid, standings(space.items(), checkpoints, pods))
        going = to_drop(held, ns, size, space.capacity)
        if going is None:
            in_flight = sum(h.size for h in held if h.standing is Standing.MOVE_IN_FLIGHT)
            others = sum(h.size for h in held if h.namespace != ns
                         and h.standing in (Standing.LATEST_PERIODIC, Standing.RESTORE_PENDING))
            raise errors.too_many_requests(
                f"the snapshot of {size} bytes does not fit in the checkpoint data space of {space.capacity} "
                f"bytes beside the data that may not go for it: {in_flight} bytes of moves in flight (they "
                f"stay until their moves end) and {others} bytes of other namespaces' latest periodic "
                "checkpoints and pending restores (they go only beyond their namespace's fair share of the "
                "space); retry later", RETRY_SECONDS)
        return going

    async def _store(self, t: "Target", ck: dict[str, Any], size: int, stream: Any,
                     write_facts: bool = True) -> dict[str, Any]:
        """Receive ``size`` bytes of ``stream`` as ``ck``'s data; returns the Checkpoint with
        the snapshot's facts in its status (written to the store only with ``write_facts``).
        Nothing else changes unless the whole snapshot arrived and checked out."""
        assert t.name is not None
        uid, ns = ck["metadata"]["uid"], t.namespace or ""
        key = (ns, t.name)
        data, snap, arriving = await self._receive(stream, size, key, uid)
        facts = {"sizeBytes": size, "snapshotSha256": snap.sha256.hex(),
                 "imageSha256": snap.header.image_sha256.hex(), "podTimeMs": snap.header.pod_time_ms}

        def set_facts(obj: dict[str, Any]) -> dict[str, Any]:
            if obj["metadata"]["uid"] != uid:
                raise errors.conflict("checkpoints", t.name, "kube32.io", "the Checkpoint was replaced during the upload")
            checkpointstatus.stored(obj.setdefault("status", {}), facts)
            return obj
        try:
            async with self._storing:
                going = await self._room_for(ck, size)
                out = await self.server.registry.mutate(t.res, t.namespace, t.name, set_facts,
                                                        subresource="status") \
                    if write_facts else set_facts(await self.server.registry.get(t.res, t.namespace, t.name))
                if _corrupts(ck):
                    data[len(data) // 2] ^= 0xFF
                self.space.store(uid, Stored(data, ns, t.name, facts), going)
        except BaseException:
            self._arrived(key, arriving, stored=False)
            raise
        self._arrived(key, arriving, stored=True)
        for h in going:
            log.info("checkpoint data of %s/%s (%d bytes) dropped for %s/%s's", h.namespace,
                     h.name, h.size, ns, t.name)
        # The Checkpoints whose data made room say so (checkpointstatus: their facts go).
        await checkpointstatus.dropped(self.server.registry, [(h.namespace, h.name, h.uid) for h in going],
                                       lambda u: self.space.stored(u) is not None)
        return out

    async def _pull(self, request: web.Request, t: "Target") -> web.StreamResponse:
        """The snapshot taken from the node by the API server itself (see the module doc)."""
        assert t.name is not None and t.namespace is not None
        q = request.query
        node, pod, container = q.get("fromNode", ""), q.get("pod", ""), q.get("container", "")
        if not pod or not container or any("/" in v for v in (node, pod, container)):
            raise errors.bad_request("fromNode needs pod and container (names, without '/')")
        path = f"checkpoint/{t.namespace}/{pod}/{container}"
        check_suffix(path)   # no dot segments for names: the node's URL names this pod alone
        attrs = authz.request_attributes(request["user"], "POST", f"/api/v1/nodes/{node}/proxy/{path}", {})
        allowed, reason = await self.server.authorizer.authorize(attrs)
        if not allowed:
            raise authz.forbidden(attrs, reason)
        # sha256=trailer: the kubelet need not hash the whole snapshot before its first byte
        # for an X-Kube32-Snapshot-Sha256 header; the reader below checks the trailer anyway.
        params = {**{k: q[k] for k in ("leave", "timeoutMs") if k in q}, "sha256": "trailer"}
        async with self._pulling:  # taken before the node freezes its pod: the next pull waits
            ck = await self.server.registry.get(t.res, t.namespace, t.name)
            with self._one_upload(t, ck, by_user=False):
                url = kubelet_url(kubelet_base(await self.server._node(node)), path.split("/"))
                hold = None
                if q.get("leave") == "frozen":
                    # A move: the pod's events are held here from now until it runs again, and
                    # the node takes the snapshot once it has read every event published before.
                    hold, seq = await self.held_events.begin(t.namespace, pod, ck)
                    params["eventsSeq"] = str(seq)
                return await self._pull_from(t, ck, node, url, params, hold)

    async def _pull_from(self, t: "Target", ck: dict[str, Any], node: str, url: yarl.URL,
                         params: dict[str, str], hold: Hold | None) -> web.StreamResponse:
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
            if hold is not None:
                hold.in_snapshot(_held_count(upstream.headers.get("X-Kube32-Held-Events")))
            size = upstream.content_length
            if size is None:
                raise errors.APIError(502, "BadGateway", f"{failed}: the node sent a snapshot without a "
                                                         "Content-Length")
            self._check_size(size)
            await self._room_for(ck, size)
            try:
                out = await self._store(t, ck, size, upstream.content, write_facts=False)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                raise errors.APIError(502, "BadGateway", f"{failed}: {e or type(e).__name__}") from None
        passed["X-Kube32-Snapshot-Sha256"] = out["status"]["snapshotSha256"]  # checked, from the trailer
        return web.json_response(out, headers=passed)

    async def _receive(self, stream: Any, size: int, key: tuple[str, str],
                       uid: str) -> tuple[Buffer, Any, Arriving]:
        """The snapshot's bytes, checked as they come, into a buffer of their own (which
        becomes the stored data); TimeoutError when they come slower than ``self.pace``."""
        buf = _fresh_buffer(size)
        view = memoryview(buf)
        prefaulting = prefault(view)
        reader = SnapshotReader(total_size=size)
        # GETs waiting for this data forward it as it arrives (see _forward).
        arriving = self._arriving[key] = Arriving(uid, view)
        self._settled(*key)
        clock = self.pace.clock()
        pos = checked = told = 0
        try:
            while chunk := await self._next_chunk(stream, clock, pos, size):
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

    @staticmethod
    async def _next_chunk(stream: Any, clock: PaceClock, received: int, size: int) -> bytes:
        """The next piece as it arrived (readchunk: iter_any and read(n) join the pieces they
        find buffered into a new bytes object first), b"" at the end; in time or TimeoutError."""
        allowance = clock.allowance(received)
        if allowance <= 0:
            raise clock.too_slow(received, size)
        try:
            async with asyncio.timeout(allowance):
                return (await stream.readchunk())[0]
        except TimeoutError:
            raise clock.too_slow(received, size) from None

    def _arrived(self, key: tuple[str, str], arriving: Arriving, stored: bool) -> None:
        """The data being received is stored, or will not be: forwarders finish or cut."""
        arriving.end(failed=not stored)
        if self._arriving.get(key) is arriving:
            del self._arriving[key]
