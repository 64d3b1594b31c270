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
an unreachable kubelet is 503, one that does not begin its answer within the freeze
timeout it was given and 5 s more (`answer_seconds`) is 504, and a transfer that breaks
is 502, all worded "the snapshot transfer from <node> failed: ...".

With several API servers on one etcd, the data stays where it was received; a GET
that comes to another API server is answered by the one holding it, streamed through
(kube32.apiserver.peers); losing that API server loses its data, as a restart does.

``PUT checkpoints/<name>/data?fromNode=<node>&pod=<pod>&container=<c>&reserve=true
[&waitSeconds=<n>]`` (no body, the same permissions) takes no snapshot yet: it asks the
node's dry run (``dryRun=All``: nothing freezes) its blockers and ``sizeBytes``, and
waits up to n seconds (0-60, default 0) in line for that much room in the space,
promised to the Checkpoint's next pull (`_reserve`).  200 ``{"sizeBytes", "message"}``;
the node's refusal as it answered (its blockers); 413 when larger than the space; 429
with Retry-After, its Status naming the cause ``WaitingForRoom`` when it stood in line
(and may again).  The Checkpoint controller asks so before the pod freezes.

How the space is shared, and when data goes, is kube32.apiserver.dataspace's: stored
data never exceeds the space; nothing goes for an upload before its bytes have all
arrived and checked out; a move's data stays until the move ends; bytes must keep
coming (408 "Timeout" for a PUT that sends too slowly, nothing stored); data that fits
only once moves in flight end waits in line for room (dataspace.Room): a pull's room is
promised before its node freezes the pod (``reserve=true``, or at once when its answer
comes, never waiting with the pod frozen), an upload's once its bytes are in.  A PUT
refused for room is 429 with Retry-After and says why: when the data cannot fit even
once every move in flight ended (dataspace.refusal, said before a byte is read), when no
room came within its patience (30 s for all its waits; dataspace.waiting: the moves in
flight that hold it, its place in line), or when uploads arriving hold their room for
that long (namespaces take it in turn).  The pulls take one snapshot at a time,
namespaces in turn (kube32.aio.FairShare): the next waits for the current one before it
asks its node, and a node that does not answer in time gives the slot up.

Invariants:

* Data lives outside the object store, in one space of ``capacity`` bytes (16 MiB in
  the simulator, 256 KiB on the board); a restart loses it and keeps the objects.
* Data larger than the whole space is refused with 413 before a byte is read.
* Data belongs to one Checkpoint uid: a Checkpoint deleted and created again
  under the same name has none, and deleting a Checkpoint drops its data - once the
  Checkpoint is gone (its finalizer ``kube32.io/checkpoint-protection`` holds it while a
  move or a restore needs it: kube32.apiserver.strategies.checkpoint).  A Checkpoint being
  deleted takes no new data (409).
* Data is replaced, and other data dropped for it, only once the new data is
  checked and its facts are written: a refused or broken upload leaves everything as
  it was.  One upload of a Checkpoint's data at a time (409 for a second); a user's
  PUT does not replace the data of a move in flight (409).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
from typing import TYPE_CHECKING, Any, Iterator

import aiohttp
from aiohttp import web

from .. import objects, testing, timing
from ..snapshot import TRAILER_SIZE, SnapshotError, SnapshotReader
from ..snapshot.parallel import prefault
from ..snapshot.writer import ASYNC_WRITE
from ..terms import GROUP, Cause, CheckpointPhase, Header
from . import apimetrics, authz, checkpointstatus, errors
from ..aio import FairShare
from .datafacts import DataFacts
from .dataspace import (BOARD_CAPACITY, IN_FLIGHT_PHASES, SIM_CAPACITY, Buffer, CheckpointDataSpace, Checkpoints,
                        Held, Pace,
                        PaceClock, Room, Stored, may_wait, refusal, to_drop, waiting)
from .eventbus import Hold
from .heldevents import HeldEvents
from .peers import PEER_HEADER, Peers
from .proxy import KubeletURL, check_suffix, kubelet_endpoint, kubelet_url
from .resources import Resource, by_plural
from .routing import Target

if TYPE_CHECKING:
    from .authz import Authorizer
    from .eventbus import EventBus
    from .proxy import KubeletProxy
    from .registry import Registry

__all__ = ["BOARD_CAPACITY", "SIM_CAPACITY", "CheckpointDataAPI", "CheckpointDataSpace", "Pace"]

log = logging.getLogger("kube32.apiserver.checkpointdata")

CHECK_STEP = 1 << 20  # bytes handed to the snapshot reader at a time
FORWARD_STEP = 256 << 10  # bytes received between wake-ups of GETs forwarding them


def _fresh_buffer(size: int) -> Buffer:
    """Room for one snapshot.  A private anonymous mapping, not a bytearray: a
    bytearray is zeroed (every page faulted in) before the first byte arrives,
    where these pages are faulted in by `prefault` beside the transfer."""
    if size < 1 << 20:
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


FACT_HEADERS = ((Header.SNAPSHOT_SHA256, "snapshotSha256"), (Header.IMAGE_SHA256, "imageSha256"),
                (Header.POD_TIME_MS, "podTimeMs"))


WAIT_MAX_SECONDS = timing.DATA_WAIT_MAX_SECONDS
def pull_lane(namespace: str, leave: str | None) -> str:
    """Whose turn a pull takes in the one-snapshot-at-a-time line: a namespace's moves
    (``leave=frozen``: a pod frozen, a drain waiting on it) take turns with its other
    snapshots (periodic saves), so a fleet's thousand periodic saves queued in one
    namespace do not hold a drain's moves behind them all (issue 25)."""
    return f"{namespace}/moves" if leave == "frozen" else namespace


STAGING_PATIENCE = 30.0  # seconds a PUT waits for room among the uploads arriving
RETRY_SECONDS = 5  # Retry-After of a PUT refused for room
REFUSAL_BYTES = 64 << 10  # the most of a node's refusal of a snapshot that is passed on


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


def answer_seconds(params: dict[str, str]) -> float:
    """How long a node may take to begin its answer to a snapshot request: the freeze
    timeout it was given (``timeoutMs``; the spec's default when none or not a number: the
    node refuses that itself) and timing.SNAPSHOT_ANSWER_SECONDS more."""
    try:
        seconds = int(params.get("timeoutMs", "")) / 1000
    except ValueError:
        seconds = timing.FREEZE_TIMEOUT_SECONDS
    return min(max(seconds, 0.0), timing.FREEZE_TIMEOUT_MAX_SECONDS) + timing.SNAPSHOT_ANSWER_SECONDS


async def _read_refusal(upstream: aiohttp.ClientResponse) -> bytes:
    """A node's refusal (a Status), at most REFUSAL_BYTES of it."""
    body = b""
    while len(body) < REFUSAL_BYTES and (chunk := await upstream.content.read(REFUSAL_BYTES - len(body))):
        body += chunk
    return body


def _held_count(header: str | None) -> int:
    """The number of events a node's snapshot holds (none said: none)."""
    try:
        return max(0, int(header or 0))
    except ValueError:
        return 0


def _check_not_deleted(ck: dict[str, Any]) -> None:
    """A Checkpoint being deleted takes no data (409): a move whose Checkpoint is deleted
    before its snapshot is stored fails before the replacement, and its pod thaws."""
    if ck["metadata"].get("deletionTimestamp"):
        raise errors.conflict("checkpoints", ck["metadata"]["name"], GROUP,
                              "the Checkpoint is being deleted: it takes no data")


async def _write_range(resp: web.StreamResponse, view: memoryview, start: int, end: int) -> None:
    for off in range(start, end, ASYNC_WRITE):  # each write is encrypted and sent whole
        await resp.write(view[off: min(off + ASYNC_WRITE, end)])


class CheckpointDataAPI:
    """The ``data`` subresource's handlers (:meth:`get`, :meth:`put`), which the API server
    enters in its subresource table; :meth:`close` when it stops."""

    def __init__(self, registry: "Registry", events: "EventBus", authorizer: "Authorizer",
                 kubelets: "KubeletProxy", space: CheckpointDataSpace, pace: Pace | None = None,
                 patience: float = STAGING_PATIENCE) -> None:
        self.registry, self.authorizer, self.kubelets = registry, authorizer, kubelets
        self.space = space
        self.pace = pace or Pace()
        self.patience = patience
        # GETs waiting for data on its way (waitSeconds), and data being received, by (namespace, name)
        self._waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self._arriving: dict[tuple[str, str], Arriving] = {}
        self._uploading: set[tuple[str, str]] = set()  # one upload or pull of a Checkpoint's data at a time
        # The control plane takes one snapshot at a time, namespaces in turn (FairShare).
        self._pulls = FairShare(1)
        self._storing = asyncio.Lock()  # what goes for data is decided and done in one step
        # What each stored data's standing depends on, kept from the store's watch (started
        # by start(); until then a look lists, as it did).
        self.facts = DataFacts(registry, registry.shared_decode)
        self.room = Room(space, self._read_objects)  # room promised to data before it is stored, in line
        self.held_events = HeldEvents(registry, events)
        self.peers: Peers | None = None  # the other API servers, when they share the store (APIServer.join_peers)
        registry.before_delete["checkpoints"] = self._on_delete
        # A Checkpoint being deleted takes no data: GETs waiting for some look again.
        registry.delete_marked["checkpoints"] = lambda _res, ck: self._settled(
            ck["metadata"].get("namespace"), ck["metadata"]["name"])

    async def start(self) -> None:
        """Follow what the data's standings read (kube32.apiserver.datafacts)."""
        await self.facts.start()

    async def close(self) -> None:
        await self.facts.close()
        await self.held_events.close()

    async def _read_objects(self) -> tuple[Checkpoints, list[dict[str, Any]]]:
        """Every Checkpoint and the pods that restore from one: what the standing of each
        data depends on (kube32.apiserver.datafacts: from the watch, not a list of every pod)."""
        return await self.facts.read()

    async def _on_delete(self, res: Resource, obj: dict[str, Any]) -> None:
        self.space.drop(obj["metadata"]["uid"])
        self.room.release(obj["metadata"]["uid"])
        self.room.admit()
        self._settled(obj["metadata"].get("namespace"), obj["metadata"]["name"])

    async def get(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None and t.namespace is not None
        wait = wait_seconds(request.query)
        found, held_by_peer = await self._here_or_at_a_peer(request, t, wait)
        if held_by_peer is not None:
            return await self._relay(request, held_by_peer)
        if found is None:
            raise errors.APIError(404, "NotFound", f'checkpoint "{t.name}" has no data',
                                  details={"name": t.name, "group": GROUP, "kind": "checkpoints"})
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

    async def _here_or_at_a_peer(self, request: web.Request, t: "Target", wait: float
                                 ) -> tuple[Stored | Arriving | None, aiohttp.ClientResponse | None]:
        """The data here, or another API server's answer with it (kube32.apiserver.peers):
        both are looked for at once, so waiting for data on its way costs no more when it
        goes to a peer.  A peer's own question is answered from here only."""
        local = asyncio.ensure_future(self._stored_or_wait(t, wait))
        peers = self.peers
        if peers is None or PEER_HEADER in request.headers:
            return await local, None
        remote = asyncio.ensure_future(peers.first_holder(request.path, request.query_string))
        pending: set[asyncio.Future[Any]] = {local, remote}
        chosen = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if local in done and local.result() is not None:
                    return local.result(), None
                if remote in done and remote.result() is not None:
                    chosen = remote.result()
                    return None, chosen
            return None, None
        finally:
            for task in (local, remote):
                task.cancel()
            answer: Any = (await asyncio.gather(local, remote, return_exceptions=True))[1]
            if isinstance(answer, aiohttp.ClientResponse) and answer is not chosen:
                answer.close()  # a peer had it too, but ours is served

    @staticmethod
    async def _relay(request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        """Stream a peer's answer through; a peer's stream that breaks cuts this one."""
        headers = {k: v for k, v in upstream.headers.items() if k.lower().startswith(Header.PREFIX.lower())}
        resp = web.StreamResponse(headers={**headers, "Content-Type": "application/octet-stream"})
        resp.content_length = upstream.content_length
        try:
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_chunked(1 << 16):
                    await resp.write(chunk)
            except (aiohttp.ClientError, OSError) as e:
                if request.transport is not None:
                    request.transport.close()
                raise ConnectionResetError(f"the peer's data stream broke: {e}") from None
            await resp.write_eof()
            return resp
        finally:
            upstream.close()

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

    async def _stored_or_wait(self, t: Target, wait: float) -> Stored | Arriving | None:
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
            ck = await self.registry.get(t.res, t.namespace, t.name)
            found = self._found(key, ck, wait > 0)
            if found is not None or objects.phase(ck) != CheckpointPhase.SAVING or wait <= 0 \
                    or ck["metadata"].get("deletionTimestamp"):  # no data comes for it any more
                return found
            await asyncio.wait([woken], timeout=wait)
        finally:
            waiters = self._waiting.get(key, set())
            waiters.discard(woken)
            if not waiters:
                self._waiting.pop(key, None)
        return self._found(key, await self.registry.get(t.res, t.namespace, t.name), True)

    def _found(self, key: tuple[str, str], ck: dict[str, Any], arriving: bool) -> Stored | Arriving | None:
        uid = ck["metadata"]["uid"]
        stored = self.space.stored(uid)
        if stored is not None or not arriving or testing.corrupts_stored_data(ck):  # served from storage only
            return stored
        on_way = self._arriving.get(key)
        return on_way if on_way is not None and on_way.uid == uid and not on_way.failed else None

    def _settled(self, namespace: str | None, name: str | None) -> None:
        """An upload or pull of this Checkpoint's data began, or ended (stored or not):
        waiting GETs look again."""
        for waiter in self._waiting.get((namespace or "", name or ""), ()):
            if not waiter.done():
                waiter.set_result(None)

    async def put(self, request: web.Request, t: Target) -> web.StreamResponse:
        try:
            return await self._put(request, t)
        finally:
            self._settled(t.namespace, t.name)

    async def _put(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        if request.query.get("fromNode"):
            return await self._pull(request, t)
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype != "application/octet-stream":
            raise errors.unsupported_media_type(ctype or "<none>", ("application/octet-stream",))
        size = request.content_length
        if size is None:
            raise errors.APIError(411, "LengthRequired", "checkpoint data needs a Content-Length")
        ck = await self.registry.get(t.res, t.namespace, t.name)
        self._check_size(size)
        ns = t.namespace or ""
        with self._one_upload(t, ck, by_user=True):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.patience  # for room among the uploads arriving, then in the space
            await self._may_fit(ck, size)  # refused before a byte is read when it cannot fit even then
            staging = self.space.staging
            if not await staging.enter(ns, size, self.patience):
                raise errors.too_many_requests(
                    f"checkpoint data space is busy: uploads arriving held {staging.used} of the "
                    f"{staging.capacity} bytes of room for data on its way ({staging.held(ns)} of them namespace "
                    f"{ns}'s) for {self.patience:g} s; namespaces take that room in turn; retry", RETRY_SECONDS)
            try:
                return web.json_response(await self._store(t, ck, size, request.content,
                                                           patience=max(0.0, deadline - loop.time()),
                                                           given=self.patience))
            except TimeoutError as e:
                raise errors.request_timeout(f"{e}; nothing was stored") from None
            finally:
                staging.leave(ns, size)

    def _check_size(self, size: int) -> None:
        if size > self.space.capacity:
            raise errors.too_large(f"the snapshot is {size} bytes, more than the {self.space.capacity} bytes "
                                   "the control plane has for all checkpoint data")

    @contextlib.contextmanager
    def _one_upload(self, t: Target, ck: dict[str, Any], by_user: bool) -> Iterator[None]:
        """The upload or pull of ``ck``'s data, the only one at a time; a user's does not
        replace a move's data while the move is under way (its target restores from it)."""
        assert t.name is not None
        key = (t.namespace or "", t.name)
        if key in self._uploading:
            raise errors.conflict("checkpoints", t.name, GROUP,
                                  "its data is arriving in another upload; retry once that one ends")
        _check_not_deleted(ck)
        phase = objects.phase(ck)
        if by_user and phase in IN_FLIGHT_PHASES and self.space.stored(ck["metadata"]["uid"]) is not None:
            raise errors.conflict("checkpoints", t.name, GROUP,
                                  f"it is {phase}: a move's data stays until the move ends")
        uid = ck["metadata"]["uid"]
        self._uploading.add(key)
        self.room.in_use.add(uid)  # the room promised to it is not let go while its data comes
        try:
            yield
        finally:
            self._uploading.discard(key)
            self.room.in_use.discard(uid)

    async def _may_fit(self, ck: dict[str, Any], size: int) -> None:
        """429 at once when ``size`` bytes of ``ck``'s data cannot fit even once every move
        in flight ended (kube32.apiserver.dataspace.refusal says why): no wait helps them."""
        uid, ns = ck["metadata"]["uid"], ck["metadata"].get("namespace", "")
        room = self.room
        if room.fits_as_is(uid, size):
            return
        await room.look(fresh=True)
        claims = room.claims(uid)
        if not may_wait(claims, ns, size, self.space.capacity):
            raise errors.too_many_requests(refusal(claims, ns, size, self.space.capacity), RETRY_SECONDS)

    async def _in_line(self, ck: dict[str, Any], size: int, patience: float, given: float | None = None) -> None:
        """Room for ``size`` bytes of ``ck``'s data promised (kube32.apiserver.dataspace.Room),
        waiting in line up to ``patience`` seconds for it; 429 when they cannot fit even once
        every move in flight ended, or when their turn did not come in time (with the cause
        ``WaitingForRoom`` and where they stood, and the whole wait ``given``, when it was
        more than what was left)."""
        md = ck["metadata"]
        uid, ns = md["uid"], md.get("namespace", "")
        if self.room.holds(uid, size):
            return
        await self._may_fit(ck, size)
        stood = await self.room.reserve(uid, ns, md["name"], size, patience)
        if stood is None:
            return
        why = waiting(self.room.claims(uid), ns, size, self.space.capacity, stood)
        raise errors.APIError(429, "TooManyRequests",
                              f"no room came within {given if given is not None else patience:.3g} s: {why}; retry",
                              details={"retryAfterSeconds": RETRY_SECONDS,
                                       "causes": [{"reason": Cause.WAITING_FOR_ROOM, "message": why}]},
                              headers={"Retry-After": str(RETRY_SECONDS)})

    async def _room_for(self, ck: dict[str, Any], size: int) -> list[Held]:
        """The data that goes so ``size`` bytes of ``ck``'s fit beside all other data and
        room promised (none when they fit as it is; see kube32.apiserver.dataspace); 429
        when they cannot, which room promised to them (`_in_line`) makes rare."""
        uid, ns = ck["metadata"]["uid"], ck["metadata"].get("namespace", "")
        capacity, room = self.space.capacity, self.room
        if room.fits_as_is(uid, size):
            return []
        await room.look(fresh=True)
        claims = room.claims(uid)
        going = to_drop(claims, ns, size, capacity)
        if going is None:
            raise errors.too_many_requests(refusal(claims, ns, size, capacity) if not may_wait(
                claims, ns, size, capacity) else waiting(claims, ns, size, capacity, None) + "; retry later",
                RETRY_SECONDS)
        return going

    async def _store(self, t: Target, ck: dict[str, Any], size: int, stream: Any,
                     write_facts: bool = True, patience: float = 0.0,
                     given: float | None = None) -> dict[str, Any]:
        """Receive ``size`` bytes of ``stream`` as ``ck``'s data; returns the Checkpoint with
        the snapshot's facts in its status (written to the store only with ``write_facts``).
        Nothing else changes unless the whole snapshot arrived and checked out.  Room for it
        is promised in line (`_in_line`): a pull's before its node froze the pod, an upload's
        once its bytes are in (waiting up to ``patience`` seconds), so room is never held for
        bytes that have not come.  ``given``: the whole wait the request was given, of which
        ``patience`` is what is left (the 429 names the whole)."""
        uid = ck["metadata"]["uid"]
        try:
            return await self._receive_and_store(t, ck, size, stream, write_facts, patience, given)
        finally:
            self.room.release(uid)  # stored (it takes its own room now), or not at all

    async def _receive_and_store(self, t: Target, ck: dict[str, Any], size: int, stream: Any,
                                 write_facts: bool, patience: float, given: float | None) -> dict[str, Any]:
        assert t.name is not None
        uid, ns = ck["metadata"]["uid"], t.namespace or ""
        key = (ns, t.name)
        data, snap, arriving = await self._receive(stream, size, key, uid)
        facts = {"sizeBytes": size, "snapshotSha256": snap.sha256.hex(),
                 "imageSha256": snap.header.image_sha256.hex(), "podTimeMs": snap.header.pod_time_ms}

        def set_facts(obj: dict[str, Any]) -> dict[str, Any]:
            if obj["metadata"]["uid"] != uid:
                raise errors.conflict("checkpoints", str(t.name), GROUP,
                                      "the Checkpoint was replaced during the upload")
            _check_not_deleted(obj)
            checkpointstatus.stored(obj.setdefault("status", {}), facts)
            return obj
        try:
            await self._in_line(ck, size, patience, given)
            async with self._storing:
                going = await self._room_for(ck, size)
                out = await self.registry.mutate(t.res, t.namespace, t.name, set_facts,
                                                        subresource="status") \
                    if write_facts else set_facts(await self.registry.get(t.res, t.namespace, t.name))
                testing.stored_data(ck, data)
                self.space.store(uid, Stored(data, ns, t.name, facts), going)
                apimetrics.snapshot_stored(size)
                log.info("checkpoint data of %s/%s stored: %d bytes; the checkpoint data space holds %d of its "
                         "%d bytes", ns, t.name, size, self.space.used, self.space.capacity)
        except BaseException:
            self._arrived(key, arriving, stored=False)
            raise
        self._arrived(key, arriving, stored=True)
        for h in going:
            log.info("checkpoint data of %s/%s (%d bytes) dropped for %s/%s's", h.namespace,
                     h.name, h.size, ns, t.name)
        # The Checkpoints whose data made room say so (checkpointstatus: their facts go).
        await checkpointstatus.dropped(self.registry, [(h.namespace, h.name, h.uid) for h in going],
                                       lambda u: self.space.stored(u) is not None)
        return out

    async def _pull(self, request: web.Request, t: Target) -> web.StreamResponse:
        """The snapshot taken from the node by the API server itself (see the module doc)."""
        assert t.name is not None and t.namespace is not None
        q = request.query
        node, pod, container = q.get("fromNode", ""), q.get("pod", ""), q.get("container", "")
        if not pod or not container or any("/" in v for v in (node, pod, container)):
            raise errors.bad_request("fromNode needs pod and container (names, without '/')")
        path = f"checkpoint/{t.namespace}/{pod}/{container}"
        check_suffix(path)   # no dot segments for names: the node's URL names this pod alone
        attrs = authz.request_attributes(request["user"], "POST", f"/api/v1/nodes/{node}/proxy/{path}", {})
        allowed, reason = await self.authorizer.authorize(attrs)
        if not allowed:
            raise authz.forbidden(attrs, reason)
        reserve = q.get("reserve")
        if reserve is not None:
            if reserve != "true":
                raise errors.bad_request(f'reserve must be "true", not "{reserve}"')
            return await self._reserve(t, node, path, wait_seconds(q))
        # sha256=trailer: the kubelet need not hash the whole snapshot before its first byte
        # for an X-Kube32-Snapshot-Sha256 header; the reader below checks the trailer anyway.
        params = {**{k: q[k] for k in ("leave", "timeoutMs") if k in q}, "sha256": "trailer"}
        # The slot is taken before the node freezes its pod (the next pull waits, its pod not
        # frozen), and held while the node answers in time (see `answer_seconds`).
        async with self._pulls.turn(pull_lane(t.namespace, q.get("leave"))):
            ck = await self.registry.get(t.res, t.namespace, t.name)
            with self._one_upload(t, ck, by_user=False):
                node_obj = await self.registry.get(by_plural("nodes"), None, node)
                target = kubelet_url(kubelet_endpoint(node_obj), path.split("/"))
                hold = None
                if q.get("leave") == "frozen":
                    # A move: the pod's events are held here from now until it runs again, and
                    # the node takes the snapshot once it has read every event published before.
                    hold, seq = await self.held_events.begin(t.namespace, pod, ck)
                    params["eventsSeq"] = str(seq)
                return await self._pull_from(t, ck, node, target, params, hold)

    async def _reserve(self, t: Target, node: str, path: str, wait: float) -> web.StreamResponse:
        """``reserve=true``: room for the snapshot the node would take now, promised to the
        Checkpoint's next pull (see the module doc).  The node's dry run says its size and
        its blockers; nothing freezes."""
        assert t.name is not None
        ck = await self.registry.get(t.res, t.namespace, t.name)
        node_obj = await self.registry.get(by_plural("nodes"), None, node)
        target = kubelet_url(kubelet_endpoint(node_obj), path.split("/"))
        failed = f"asking {node} for the size of the snapshot failed"
        try:
            async with asyncio.timeout(timing.SNAPSHOT_ANSWER_SECONDS):
                async with self.kubelets.request("POST", target, params={"dryRun": "All"}) as upstream:
                    status, body = upstream.status, await _read_refusal(upstream)
                    ctype = upstream.headers.get("Content-Type", "application/json")
        except TimeoutError:
            raise errors.APIError(504, "Timeout", f"{failed}: the node did not answer within "
                                                  f"{timing.SNAPSHOT_ANSWER_SECONDS:g} s") from None
        except (aiohttp.ClientError, OSError) as e:
            raise errors.service_unavailable(f"{failed}: error trying to reach the kubelet: {e}") from None
        if status != 200:
            return web.Response(status=status, body=body, headers={"Content-Type": ctype, Header.FROM_NODE: node})
        try:
            size = json.loads(body)["sizeBytes"]
            if not isinstance(size, int) or size < 0:
                raise ValueError(size)
        except (ValueError, KeyError, TypeError):
            raise errors.APIError(502, "BadGateway", f"{failed}: its answer does not say it (sizeBytes)") from None
        self._check_size(size)
        await self._in_line(ck, size, wait)
        return web.json_response({"sizeBytes": size, "message": (
            f"room for {size} bytes is promised to the next snapshot of checkpoint {t.name} for "
            f"{timing.ROOM_HOLD_SECONDS:g} s")})

    async def _pull_from(self, t: Target, ck: dict[str, Any], node: str, target: KubeletURL,
                         params: dict[str, str], hold: Hold | None) -> web.StreamResponse:
        failed = f"the snapshot transfer from {node} failed"
        waited = answer_seconds(params)
        answer_by = asyncio.get_running_loop().time() + waited
        late = errors.APIError(504, "Timeout", f"{failed}: the node did not answer within {waited:g} s (the "
                                               f"freeze timeout it was given and {timing.SNAPSHOT_ANSWER_SECONDS:g} s)")
        try:
            async with asyncio.timeout_at(answer_by):
                upstream = await self.kubelets.request("POST", target, params=params,
                                                       timeout=aiohttp.ClientTimeout(total=None, sock_read=120))
        except TimeoutError:
            raise late from None
        except (aiohttp.ClientError, OSError) as e:
            raise errors.service_unavailable(f"{failed}: error trying to reach the kubelet: {e}") from None
        async with upstream:
            passed = {k: v for k, v in upstream.headers.items() if k.lower().startswith(Header.PREFIX.lower())}
            if upstream.status != 200:
                try:
                    async with asyncio.timeout_at(answer_by):
                        body = await _read_refusal(upstream)
                except TimeoutError:
                    raise late from None
                except (aiohttp.ClientError, OSError) as e:
                    raise errors.APIError(502, "BadGateway", f"{failed}: {e or type(e).__name__}") from None
                if hold is not None:
                    self.held_events.let_go(hold)  # the node refused: the pod runs on, not frozen
                return web.Response(status=upstream.status, body=body, headers={
                    **passed, "Content-Type": upstream.headers.get("Content-Type", "application/json"),
                    Header.FROM_NODE: node})
            if hold is not None:
                hold.in_snapshot(_held_count(upstream.headers.get(Header.HELD_EVENTS)))
            size = upstream.content_length
            if size is None:
                raise errors.APIError(502, "BadGateway", f"{failed}: the node sent a snapshot without a "
                                                         "Content-Length")
            self._check_size(size)
            # Promised before the node froze the pod (`_reserve`), else now or never: a frozen
            # pod does not wait for room.
            await self._in_line(ck, size, 0)
            try:
                out = await self._store(t, ck, size, upstream.content, write_facts=False)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                raise errors.APIError(502, "BadGateway", f"{failed}: {e or type(e).__name__}") from None
        passed[Header.SNAPSHOT_SHA256] = out["status"]["snapshotSha256"]  # checked, from the trailer
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
