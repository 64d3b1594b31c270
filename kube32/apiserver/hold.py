"""Holding proxied requests through a move, so that a Service's clients see none (issue 24).

The spec has a frozen pod answer 503 with ``Retry-After: 1``; the pod still does, and
the proxies in front of it stop passing those answers on.  A *target* is what a
client named: a Service (its selector's pods; every NodePort forwards here too) or,
for a client that asks with ``Prefer: wait=<s>``, one pod (:mod:`kube32.holding`).

What is held, and only that (a pod runs no call while frozen, so such a request has
had no effect and may be sent again):

* a request the kubelet refused with the :data:`~kube32.holding.NOT_STARTED` mark, or
  one for which no connection to the kubelet could be made (nothing was sent);
* a request that found no Ready pod while one of the target's pods is frozen or
  between nodes: a Checkpoint naming it is ``Saving`` or ``Moving``, or the pod
  carries ``kube32.io/restore-from`` (a replacement, or a rollback, restoring).

A pod's own answer, a 503 included, goes back as it came.  A request whose body is
larger than :data:`MAX_BODY` streams as before and is never held: it gets the answer
it gets.  The body of a holdable request is read whole before the first send, the
one copy a second send needs.

Order.  Each target with held requests has one :class:`HoldQueue`, first in first
out.  While any request waits in it, every new request for the target joins it, so
none overtakes a held one; once all have gone to pods, new ones go straight on again
(those in flight are not waited for: they went first).  Its dispatcher hands the requests, first come first, to the Ready pods in
turn, each pod up to :data:`WINDOW` in flight (the rest wait for one of those to be
answered).  Not one at a time: with a round trip of 20-150 ms on a loaded control
plane, one at a time drains slower than 100 requests/s arrive, and the queue, which
new requests join, would not empty (bench_service_hold).  Requests in flight
together come from different clients, with no order between them; one client's
requests on one connection are sequential anyway (the next is read after the answer).

Bounds.  A held request waits until its deadline (the target's bound from when it
arrived), then gets the 503 it would have had: the kubelet's refusal as it came, or
the API server's ``no endpoints available`` with ``Retry-After: 1``.  A target holds
at most :data:`MAX_QUEUED` requests and :data:`MAX_QUEUED_BYTES` of bodies, all
targets at most :data:`MAX_TOTAL_BYTES`; a request that does not fit gets its 503 at
once.  Nothing waits unbounded: every wait has the request's deadline.

Waking.  While a queue lives it watches its pods and the namespace's Checkpoints
(:meth:`Registry.watch`): a pod turning Ready, a replacement, a rollback wakes the
dispatcher.  A pod that refused is not asked again until its object changed, or
:data:`RETRY_REFUSED` s passed (a thaw that wrote no status).

What it leaves: :class:`HoldStats` counters (:attr:`Holds.stats` and per target, for
a ``/metrics`` endpoint to read) and a ``RequestsHeld`` event on the Service (or pod):
at most one per :data:`EVENT_INTERVAL` per target, with the counts since the last.
"""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import datetime as dt
import itertools
import logging
import secrets
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from .. import movability
from ..holding import NOT_STARTED, not_started
from ..aio import wait_set
from . import errors
from .proxy import Unreached, ready_pods
from .registry import Registry
from .resources import by_plural
from .selectors import FieldSelector, LabelSelector

log = logging.getLogger("kube32.apiserver.hold")
Obj = dict[str, Any]

MAX_BODY = 64 << 10             # a body up to this is read whole and may be held
MAX_QUEUED = 1024               # held requests per target
WINDOW = 16                     # held requests in flight to one pod at once
MAX_QUEUED_BYTES = 4 << 20      # bytes of held bodies per target
MAX_TOTAL_BYTES = 32 << 20      # bytes of held bodies, every target
RETRY_REFUSED = 0.5             # s before a pod that refused, and did not change, is asked again
EVENT_INTERVAL = 10.0           # s: at most one RequestsHeld event per target so often
REFUSAL_TEXT = 4096             # bytes of a kubelet's refusal kept to answer with
REFUSAL_HEADERS = frozenset({"content-type", "retry-after", NOT_STARTED.lower()})
MOVING_PHASES = ("Saving", "Moving")
STATS_KEPT = 1024               # targets whose counters are kept


@dataclasses.dataclass
class HoldStats:
    """Counters of held requests (what a ``/metrics`` endpoint exposes)."""
    held: int = 0           # requests that waited in a queue
    sent: int = 0           # held requests a pod then answered
    timed_out: int = 0      # held requests answered 503: the bound passed, or no pod was left
    not_holdable: int = 0   # refused requests that could not be held (queue or bytes full)
    gone: int = 0           # held requests whose client went away first


@dataclasses.dataclass(frozen=True)
class Target:
    """What a client named: a Service's pods (``labels``) or one pod (``fields``)."""
    kind: str                       # "Service" or "Pod"
    namespace: str
    name: str
    labels: LabelSelector | None
    fields: FieldSelector | None
    involved: Obj                   # the object an event is about

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)


@dataclasses.dataclass
class Refusal:
    """What a request that could not be served would have got: a kubelet's marked
    answer (status, headers, text) or the API server's own error."""
    status: int = 503
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    error: errors.APIError | None = None

    def answer(self) -> web.Response:
        if self.error is not None:
            raise self.error
        return web.Response(status=self.status, body=self.body, headers=self.headers)


# Send this request to that pod: the kubelet's answer once its headers are in.
Send = Callable[[Obj], Awaitable[aiohttp.ClientResponse]]
Relay = Callable[[aiohttp.ClientResponse], Awaitable[web.StreamResponse]]


async def holdable_body(request: web.Request, limit: int = MAX_BODY) -> tuple[bool, Any]:
    """(True, bytes or None) for a body of at most ``limit`` bytes, read whole; else
    (False, a stream of the body) to be sent once, as it comes."""
    if not request.body_exists:
        return True, None
    if request.content_length is not None and request.content_length > limit:
        return False, request.content
    head = bytearray()
    while len(head) <= limit:
        chunk = await request.content.read(limit + 1 - len(head))
        if not chunk:
            return True, bytes(head)
        head += chunk

    async def rest() -> AsyncIterator[bytes]:
        yield bytes(head)
        async for chunk in request.content.iter_chunked(1 << 16):
            yield chunk
    return False, rest()


def _rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(eq=False)
class _Held:
    seq: int
    size: int
    arrived: float
    granted: Obj | None = None   # the pod the dispatcher gave it, until it was sent there
    turn: asyncio.Future = dataclasses.field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def __lt__(self, other: "_Held") -> bool:
        return self.seq < other.seq


@dataclasses.dataclass
class _Episode:
    """What happened since a target's last RequestsHeld event."""
    held: int = 0
    sent: int = 0
    timed_out: int = 0
    longest_ms: int = 0
    pods: set[str] = dataclasses.field(default_factory=set)


class Holds:
    """Every target's queue; one per API server."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.stats = HoldStats()
        self.by_target: dict[tuple[str, str, str], HoldStats] = {}
        self.queues: dict[tuple[str, str, str], HoldQueue] = {}
        self.bytes_held = 0
        self._seq = itertools.count()
        self._rr = itertools.count()
        self._episodes: dict[tuple[str, str, str], _Episode] = {}
        self._last_event: dict[tuple[str, str, str], float] = {}
        self._event_timers: dict[tuple[str, str, str], asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()
        self._refused: dict[str, tuple[str, float]] = {}  # pod uid -> (its resourceVersion, when) at a refusal

    # --- counters ---------------------------------------------------------------
    def count(self, target: Target, field: str, n: int = 1) -> None:
        setattr(self.stats, field, getattr(self.stats, field) + n)
        per = self.by_target.get(target.key)
        if per is None:
            if len(self.by_target) >= STATS_KEPT:
                del self.by_target[next(iter(self.by_target))]
            per = self.by_target[target.key] = HoldStats()
        setattr(per, field, getattr(per, field) + n)

    # --- the target's pods --------------------------------------------------------
    async def pods(self, target: Target) -> tuple[list[Obj], int]:
        if target.fields is not None:
            pod = await self.registry.try_get(by_plural("pods"), target.namespace, target.name)
            return ([pod] if pod is not None else []), 0
        return await self.registry.list(by_plural("pods"), target.namespace, target.labels)

    async def moving(self, target: Target, pods: list[Obj]) -> bool:
        """One of these pods is frozen for a Checkpoint or between nodes."""
        names = {p["metadata"]["name"] for p in pods}
        if target.fields is not None:
            names.add(target.name)
        ready = {id(p) for p in ready_pods(pods)}
        if any(movability.RESTORE_FROM in (p["metadata"].get("annotations") or {}) and id(p) not in ready
               and (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded") for p in pods):
            return True   # a replacement (or a rollback) restoring
        if not names:
            return False
        cks, _ = await self.registry.list(by_plural("checkpoints"), target.namespace)
        return any((c.get("spec") or {}).get("podName") in names
                   and (c.get("status") or {}).get("phase") in MOVING_PHASES for c in cks)

    def pick(self, pods: list[Obj]) -> Obj:
        return pods[next(self._rr) % len(pods)]

    # --- recent refusals --------------------------------------------------------------
    def refused_by(self, pod: Obj) -> None:
        """``pod`` refused a request it never began: not asked again until its object
        changes or :data:`RETRY_REFUSED` s pass."""
        md = pod["metadata"]
        now = time.monotonic()
        if len(self._refused) >= STATS_KEPT:
            self._refused = {k: v for k, v in self._refused.items() if now - v[1] < RETRY_REFUSED}
        self._refused[md.get("uid", "")] = (md.get("resourceVersion", ""), now)

    def refusing(self, pod: Obj, now: float) -> float | None:
        """Seconds until ``pod``, which refused lately and did not change since, is asked
        again; None when it may be asked now."""
        md = pod["metadata"]
        seen = self._refused.get(md.get("uid", ""))
        if seen is None or seen[0] != md.get("resourceVersion", "") or now - seen[1] >= RETRY_REFUSED:
            return None
        return seen[1] + RETRY_REFUSED - now

    def answered_by(self, pod: Obj) -> None:
        self._refused.pop(pod["metadata"].get("uid", ""), None)

    def first_choice(self, pods: list[Obj]) -> tuple[Obj | None, bool]:
        """A Ready pod to send a new request to (round robin, none that refused lately),
        and whether any pod is Ready."""
        now = time.monotonic()
        ready = ready_pods(pods)
        usable = [p for p in ready if self.refusing(p, now) is None]
        return (self.pick(usable) if usable else None), bool(ready)

    # --- one request --------------------------------------------------------------
    async def serve(self, target: Target, bound: float, size: int, send: Send, relay: Relay,
                    no_pod: Callable[[], errors.APIError]) -> web.StreamResponse:
        """Serve one holdable request, held while the target's pods cannot take it (see the
        module).  ``no_pod`` is the error of a target with no pod to send to, as today."""
        deadline = time.monotonic() + bound
        refusal: Refusal | None = None
        queue = self.queues.get(target.key)
        if queue is None or not queue.waiting:   # nothing held waits: none to overtake
            pods, _ = await self.pods(target)
            first, any_ready = self.first_choice(pods)
            if first is None and not any_ready and not await self.moving(target, pods):
                # Nothing to wait for: a Service answers as today; the pod proxy sends to
                # its pod whatever its state, as it always does.
                first = pods[0] if target.fields is not None and pods and pods[0]["spec"].get("nodeName") else None
                if first is None:
                    raise no_pod()
            if first is not None:
                upstream, refusal = await self._attempt(send, first)
                if upstream is not None:
                    return await relay(upstream)
                self.episode(target).pods.add(first["metadata"]["name"])
        queue = self.queues.get(target.key)
        if queue is None:
            queue = self.queues[target.key] = HoldQueue(self, target)
        if refusal is not None:
            queue.refusal = refusal
        # One that joins without asking would have had what the last one asking got.
        return await queue.hold(size, deadline, refusal or queue.refusal or Refusal(error=no_pod()), send, relay)

    async def once(self, target: Target, sending: Awaitable[aiohttp.ClientResponse]) -> aiohttp.ClientResponse:
        """A request that cannot be held (its body streams): its answer as it comes,
        counted when it was a refusal that holding would have saved."""
        try:
            upstream = await sending
        except Unreached:
            self.count(target, "not_holdable")
            raise
        if upstream.status == 503 and not_started(upstream.headers):
            self.count(target, "not_holdable")
        return upstream

    async def _attempt(self, send: Send, pod: Obj) -> tuple[aiohttp.ClientResponse | None, Refusal | None]:
        """The pod's answer, or what refused the request before the pod began it (the
        pod is then remembered as refusing)."""
        try:
            upstream = await send(pod)
        except Unreached as e:
            self.refused_by(pod)
            return None, Refusal(error=e)
        if upstream.status == 503 and not_started(upstream.headers):
            self.refused_by(pod)
            keep = {k: v for k, v in upstream.headers.items() if k.lower() in REFUSAL_HEADERS}
            try:
                body = await upstream.content.read(REFUSAL_TEXT)
            except (aiohttp.ClientError, OSError):
                body = b""
            finally:
                upstream.release()
            return None, Refusal(upstream.status, keep, body)
        self.answered_by(pod)
        return upstream, None

    # --- events -------------------------------------------------------------------
    def episode(self, target: Target) -> _Episode:
        ep = self._episodes.get(target.key)
        if ep is None:
            ep = self._episodes[target.key] = _Episode()
        return ep

    def queue_done(self, target: Target) -> None:
        """A target's queue emptied: its event now, or when the interval allows."""
        if target.key in self._event_timers:
            return
        wait = self._last_event.get(target.key, -EVENT_INTERVAL) + EVENT_INTERVAL - time.monotonic()
        if wait <= 0:
            self._spawn(self._record(target))
        else:
            self._event_timers[target.key] = asyncio.get_running_loop().call_later(
                wait, lambda: self._spawn(self._record(target)))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, target: Target) -> None:
        self._event_timers.pop(target.key, None)
        if target.key in self.queues:
            return   # still holding: its queue's end comes back here
        ep = self._episodes.pop(target.key, None)
        if ep is None or not ep.held:
            return
        self._last_event[target.key] = time.monotonic()
        if len(self._last_event) > STATS_KEPT:
            del self._last_event[next(iter(self._last_event))]
        pods = ", ".join(sorted(ep.pods)[:5]) + (" ..." if len(ep.pods) > 5 else "")
        what = f"pod {pods}" if len(ep.pods) == 1 else f"pods {pods}" if ep.pods else "its pods"
        message = (f"Held {ep.held} request{'s' if ep.held != 1 else ''} while {what} could not take them "
                   f"(frozen or moving): {ep.sent} sent on, {ep.timed_out} answered 503 when the hold ended; "
                   f"longest hold {ep.longest_ms} ms")
        current = await self.registry.try_get(by_plural("services" if target.kind == "Service" else "pods"),
                                              target.namespace, target.name)
        md = (current or target.involved)["metadata"]   # a moved pod's event names the pod it is now
        now = _rfc3339()
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": f"{target.name}.{secrets.token_hex(8)}", "namespace": target.namespace},
                 "involvedObject": {"kind": target.kind, "apiVersion": "v1", "name": target.name,
                                    "namespace": target.namespace, "uid": md.get("uid", ""),
                                    "resourceVersion": md.get("resourceVersion", "")},
                 "reason": "RequestsHeld", "message": message,
                 "type": "Warning" if ep.timed_out else "Normal",
                 "source": {"component": "kube-apiserver"}, "reportingComponent": "kube-apiserver",
                 "reportingInstance": "", "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            await self.registry.create(by_plural("events"), target.namespace, event)
        except Exception as e:  # noqa: BLE001 - events are best effort
            log.warning("cannot record RequestsHeld for %s %s/%s: %s", target.kind, target.namespace,
                        target.name, e)

    async def close(self) -> None:
        for timer in self._event_timers.values():
            timer.cancel()
        for queue in list(self.queues.values()):
            queue.task.cancel()
        for task in list(self._tasks):
            task.cancel()


class HoldQueue:
    """One target's held requests, first in first out, and the dispatcher that hands
    each to a Ready pod (see the module's Order)."""

    def __init__(self, holds: Holds, target: Target) -> None:
        self.holds = holds
        self.target = target
        self.waiting: list[_Held] = []          # by arrival (seq)
        self.busy: dict[str, int] = {}          # pod uid -> held requests in flight to it
        self.refusal: Refusal | None = None     # the latest a pod gave one of these requests
        self.bytes = 0
        self.wake = asyncio.Event()
        self.changed = True                     # the pods or Checkpoints changed since the last look
        self.task = asyncio.ensure_future(self._dispatch())

    # --- the request's side ---------------------------------------------------------
    def _fits(self, size: int) -> bool:
        return (len(self.waiting) < MAX_QUEUED and self.bytes + size <= MAX_QUEUED_BYTES
                and self.holds.bytes_held + size <= MAX_TOTAL_BYTES)

    async def hold(self, size: int, deadline: float, refusal: Refusal, send: Send,
                   relay: Relay) -> web.StreamResponse:
        """Wait for a pod, send, and again while pods refuse; the 503 at the deadline."""
        holds, target = self.holds, self.target
        if not self._fits(size):
            holds.count(target, "not_holdable")
            return refusal.answer()
        held = _Held(next(holds._seq), size, time.monotonic())
        self.bytes += size
        holds.bytes_held += size
        holds.count(target, "held")
        holds.episode(target).held += 1
        bisect.insort(self.waiting, held)
        self.wake.set()
        try:
            while True:
                pod = await self._turn(held, deadline)
                if pod is None:
                    holds.count(target, "timed_out")
                    holds.episode(target).timed_out += 1
                    return refusal.answer()
                try:
                    upstream, why = await holds._attempt(send, pod)
                finally:
                    self._sent(held)
                if upstream is not None:
                    holds.count(target, "sent")
                    holds.episode(target).sent += 1
                    return await relay(upstream)
                assert why is not None
                refusal = self.refusal = why
                holds.episode(target).pods.add(pod["metadata"]["name"])
                held.turn = asyncio.get_running_loop().create_future()
                bisect.insort(self.waiting, held)   # back in its place: first of those after it
        except asyncio.CancelledError:
            holds.count(target, "gone")
            raise
        finally:
            if held.granted is not None:   # given a pod, gone before it was sent
                self._sent(held)
            episode = holds.episode(target)
            episode.longest_ms = max(episode.longest_ms, int((time.monotonic() - held.arrived) * 1000))
            if held in self.waiting:
                self.waiting.remove(held)
            self.bytes -= size
            holds.bytes_held -= size
            self.wake.set()

    async def _turn(self, held: _Held, deadline: float) -> Obj | None:
        """The pod the dispatcher gave this request, or None at its deadline."""
        remaining = deadline - time.monotonic()
        if remaining > 0 and not held.turn.done():
            await asyncio.wait({held.turn}, timeout=remaining)
        if held.turn.done() and not held.turn.cancelled():
            return held.turn.result()
        held.turn.cancel()   # the deadline, or the dispatcher gave up
        return None

    def _sent(self, held: _Held) -> None:
        """The pod ``held`` went to answered, refused or failed: it may take the next."""
        if held.granted is not None:
            uid = held.granted["metadata"].get("uid", "")
            self.busy[uid] -= 1
            if not self.busy[uid]:
                del self.busy[uid]
            held.granted = None
        self.wake.set()

    # --- the dispatcher ---------------------------------------------------------------
    def _free(self, pods: list[Obj], now: float) -> tuple[list[Obj], float | None]:
        """Ready pods with room for another held request that did not just refuse; and
        when the next refusal expires."""
        free, expires = [], None
        for pod in ready_pods(pods):
            if self.busy.get(pod["metadata"].get("uid", ""), 0) >= WINDOW:
                continue
            left = self.holds.refusing(pod, now)
            if left is not None:
                expires = left if expires is None else min(expires, left)
                continue
            free.append(pod)
        return free, expires

    def _grant(self, free: list[Obj], start: int) -> None:
        """Hand the waiting requests, first come first, to the free pods in turn, each
        pod up to :data:`WINDOW` in flight."""
        i = 0
        while free and self.waiting:
            held = self.waiting.pop(0)
            if held.turn.done():
                continue   # at its deadline: it answers on its own
            pod = free[(start + i) % len(free)]
            uid = pod["metadata"].get("uid", "")
            self.busy[uid] = self.busy.get(uid, 0) + 1
            if self.busy[uid] >= WINDOW:
                free.remove(pod)
            else:
                i += 1
            held.granted = pod
            held.turn.set_result(pod)

    async def _dispatch(self) -> None:
        holds, target = self.holds, self.target
        watches: list[asyncio.Task] = []
        pods: list[Obj] = []
        try:
            while self.waiting or self.busy:
                self.wake.clear()
                timeout = 1.0
                if self.waiting:
                    if self.changed:   # else the last look still holds: a request ended or came
                        self.changed = False
                        pods, rev = await holds.pods(target)
                        if not watches:
                            watches = [asyncio.ensure_future(self._watch(kind, rev))
                                       for kind in ("pods", "checkpoints")]
                    free, expires = self._free(pods, time.monotonic())
                    if free:
                        self._grant(free, next(holds._rr))
                    elif not pods and not await holds.moving(target, pods):
                        self._give_up()   # nothing left to wait for: the 503 now
                    if expires is not None:
                        timeout = expires
                await wait_set(self.wake, timeout)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the held requests get their 503, the server goes on
            log.exception("holding requests for %s %s/%s failed", target.kind, target.namespace, target.name)
            self._give_up()
        finally:
            if holds.queues.get(target.key) is self:
                del holds.queues[target.key]
            for w in watches:
                w.cancel()
            holds.queue_done(target)

    def _give_up(self) -> None:
        for held in self.waiting:
            if not held.turn.done():
                held.turn.cancel()
        self.waiting.clear()

    async def _watch(self, plural: str, rev: int) -> None:
        """Wake the dispatcher at every change of the target's pods or the namespace's
        Checkpoints; started from the revision of the dispatcher's first list."""
        target = self.target
        res = by_plural(plural)
        labels, fields = (target.labels, target.fields) if plural == "pods" else (None, None)
        while True:
            try:
                async for _ in self.holds.registry.watch(res, target.namespace, labels, fields,
                                                        str(rev) if rev else None):
                    self.changed = True
                    self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a compacted or broken watch starts again
                log.debug("hold watch of %s in %s ended: %s", plural, target.namespace, e)
            await asyncio.sleep(0.2)
            _, rev = await self.holds.registry.list(res, target.namespace, labels, fields)
            self.changed = True
            self.wake.set()
