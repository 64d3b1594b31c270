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
one copy a second send needs, within ``kube32.serving.BODY_TIMEOUT`` (else 408), and
before the request takes any room here: a client slow to send holds nothing of a
Service's.

Order.  Each target with held requests has one :class:`HoldQueue`, first in first
out by arrival: a request's place is taken when it reaches the API server, so one that
was tried on a pod first and refused goes back before every later one.  While any
request waits in the queue or is in flight from it (to a pod that may refuse it and send
it back), every new request for the target joins it, so none overtakes a held one; once
all have been answered, new ones go straight on again.  Its dispatcher hands the
requests, first come first, to the Ready pods in turn, each pod up to :data:`WINDOW` in
flight (the rest wait for one of those to be answered).  Not one at a time: with a round
trip of 20-150 ms on a loaded control plane, one at a time drains slower than 100
requests/s arrive, and the queue, which new requests join, would not empty
(bench_service_hold).  A pod that refused and has not answered since is *probed*: it
gets the first waiting request alone, and nothing else is handed out until that one is
answered or has been in flight :data:`PROBE_WAIT` s (a refusal comes at once; a longer
wait means the pod took it), so a request it sends back never finds later ones gone
ahead to another pod.  The requests handed to one pod are numbered on a stream of the
queue's for that pod (header :data:`~kube32.holding.ORDER`, in the order handed out, a
request sent again gets a new number), and the pod's kubelet lets each in only after the
one before (kube32.kubelet.ordering): a window's requests, each on a connection of its
own, reached a replacement shuffled (``1, 9, 10, 7, 8, ..., 2``) before.  A request sent
straight on (nothing held) has no number and waits for none.

Bounds.  A held request waits until its deadline (the target's bound from when it
arrived), then gets the 503 it would have had: the kubelet's refusal as it came, or
the API server's ``no endpoints available`` with ``Retry-After: 1``.  A target holds
at most :data:`MAX_QUEUED` requests and :data:`MAX_QUEUED_BYTES` of bodies, all
targets at most :data:`MAX_TOTAL_QUEUED` and :data:`MAX_TOTAL_BYTES`, and one namespace
at most ``1/SHARES`` of those (:class:`NamespaceShare`): no tenant, however many
Services or pods it makes, fills the room of the others.  A request that does not fit
gets its 503 at once.  Nothing waits unbounded: every wait has the request's deadline.
A queue ends before the deadlines when nothing is left to wait for: its Service is
deleted (404 to every held request), no pod may answer (none Ready, or every Ready
one's kubelet unreachable at the last try) while no move is under way, for
:data:`GIVE_UP_AFTER` s (a source node gone mid-move), or the API server stops
(:meth:`Holds.stop_holding`: 503 with ``Retry-After: 1`` before its grace ends).

Waking.  While a queue lives it watches its pods, the namespace's Checkpoints and, for
a Service, the Service (:meth:`Registry.watch`; a Service's pods are those its
selector picks at each look, so a changed selector counts at once): a pod turning
Ready, a replacement, a rollback, a selector change wakes the dispatcher.  A pod that
refused is not asked again until its object changed, or
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

from .. import metrics, objects, serving
from ..aio import FairShare, wait_set
from ..holding import MAX_HELD_BODY, NOT_STARTED, ORDER, not_started, order_value
from ..terms import Annotation, CheckpointPhase, PodPhase
from . import errors
from .proxy import Unreached, ready_pods
from .registry import Registry
from .resources import by_plural
from .selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector

log = logging.getLogger("kube32.apiserver.hold")
Obj = dict[str, Any]

MAX_BODY = MAX_HELD_BODY        # a body up to this is read whole and may be held
MAX_QUEUED = 1024               # held requests per target
WINDOW = 16                     # held requests in flight to one pod at once
MAX_QUEUED_BYTES = 4 << 20      # bytes of held bodies per target
MAX_TOTAL_BYTES = 32 << 20      # bytes of held bodies, every target
MAX_TOTAL_QUEUED = 2048         # held requests, every target
SHARES = 4                      # a namespace holds at most 1/SHARES of the bytes and of the requests
GIVE_UP_AFTER = 1.0             # s with no pod that may answer and no move under way: the 503 then
RETRY_REFUSED = 0.5             # s before a pod that refused, and did not change, is asked again
PROBE_WAIT = 0.5                # s a probe of a pod that refused may take before the pod counts as taking requests
EVENT_INTERVAL = 10.0           # s: at most one RequestsHeld event per target so often
REFUSAL_TEXT = 4096             # bytes of a kubelet's refusal kept to answer with
REFUSAL_HEADERS = frozenset({"content-type", "retry-after", NOT_STARTED.lower()})
MOVING_PHASES = CheckpointPhase.IN_FLIGHT
STATS_KEPT = 1024               # targets whose counters are kept
HELD = metrics.REGISTRY.counter(
    "kube32_held_requests_total", "Proxied requests a frozen or moving pod could not take, by what was asked "
    "(kind: Service or Pod) and what came of them (outcome: held, sent, timed_out, not_holdable, gone).",
    ("kind", "outcome"))


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
    """What a client named: a Service (its pods: those its selector picks when a look is
    taken, so a changed selector counts at once) or one pod (``fields``).  ``labels``:
    a fixed selector instead of the Service's (None: the Service's)."""
    kind: str                       # "Service" or "Pod"
    namespace: str
    name: str
    labels: LabelSelector | None
    fields: FieldSelector | None
    involved: Obj                   # the object an event is about

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)

    @property
    def watched(self) -> tuple[tuple[str, LabelSelector | None, FieldSelector | None], ...]:
        """What a queue watches (plural, labels, fields): its pods, the Checkpoints, and
        the Service (a changed selector, a deletion)."""
        if self.fields is not None or self.labels is not None:
            return (("pods", self.labels, self.fields), ("checkpoints", None, None))
        named = parse_field_selector(f"metadata.name={self.name}")
        return (("pods", None, None), ("checkpoints", None, None), ("services", None, named))


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


def stopping() -> errors.APIError:
    """What a held request gets when the API server stops: nobody began it, send it again."""
    return errors.service_unavailable("the API server is stopping: send the request again", retry_after=1)


class NamespaceShare(FairShare):
    """Room for held requests (a count, or bytes of bodies) that no namespace fills: one
    holds at most ``1/SHARES`` of it, so :data:`SHARES` namespaces at least find room.  A
    hold never waits for room (:meth:`take` answers at once)."""

    def _fits(self, waiter: Any) -> bool:
        return (self.used + waiter.size <= self.capacity
                and self.held(waiter.key) + waiter.size <= self.capacity // SHARES)

    async def take(self, key: str, size: int) -> bool:
        return await self.enter(key, size, patience=0)


# Send this request to that pod, with these headers added: the kubelet's answer once its headers are in.
Send = Callable[[Obj, dict[str, str]], Awaitable[aiohttp.ClientResponse]]
Relay = Callable[[aiohttp.ClientResponse], Awaitable[web.StreamResponse]]


async def holdable_body(request: web.Request, limit: int = MAX_BODY) -> tuple[bool, Any]:
    """(True, bytes or None) for a body of at most ``limit`` bytes, read whole; else
    (False, a stream of the body) to be sent once, as it comes."""
    if not request.body_exists:
        return True, None
    if request.content_length is not None and request.content_length > limit:
        return False, request.content
    head = bytearray()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + serving.BODY_TIMEOUT   # as an object body's: no hold room is taken meanwhile
    while len(head) <= limit:
        try:
            chunk = await asyncio.wait_for(request.content.read(limit + 1 - len(head)), max(deadline - loop.time(), 0))
        except asyncio.TimeoutError:
            raise errors.request_timeout(f"the request body did not arrive whole within {serving.BODY_TIMEOUT:g}s "
                                         f"({len(head)} bytes came)") from None
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
    order: str = ""              # its number on the pod's stream (holding.ORDER), given with the pod
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
        self.bytes_room = NamespaceShare(MAX_TOTAL_BYTES)      # bytes of held bodies, by namespace
        self.count_room = NamespaceShare(MAX_TOTAL_QUEUED)     # held requests, by namespace
        self.stopping = False
        self._seq = itertools.count()
        self._rr = itertools.count()
        self._episodes: dict[tuple[str, str, str], _Episode] = {}
        self._last_event: dict[tuple[str, str, str], float] = {}
        self._event_timers: dict[tuple[str, str, str], asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()
        # pod uid -> (its resourceVersion, when, no connection could be made) at a refusal
        self._refused: dict[str, tuple[str, float, bool]] = {}
        # target -> requests tried on a pod first, in flight: arrival seq -> (pod uid, since)
        self.direct: dict[tuple[str, str, str], dict[int, tuple[str, float]]] = {}

    @property
    def bytes_held(self) -> int:
        """Bytes of held bodies, every target."""
        return self.bytes_room.used

    # --- counters ---------------------------------------------------------------
    def count(self, target: Target, field: str, n: int = 1) -> None:
        setattr(self.stats, field, getattr(self.stats, field) + n)
        HELD.inc(target.kind, field, amount=n)
        per = self.by_target.get(target.key)
        if per is None:
            if len(self.by_target) >= STATS_KEPT:
                del self.by_target[next(iter(self.by_target))]
            per = self.by_target[target.key] = HoldStats()
        setattr(per, field, getattr(per, field) + n)

    # --- the target's pods --------------------------------------------------------
    async def pods(self, target: Target) -> tuple[list[Obj], int]:
        """The target's pods now (a Service's by its selector now); a 404 for a Service
        that is gone."""
        if target.fields is not None:
            pod = await self.registry.try_get(by_plural("pods"), target.namespace, target.name)
            return ([pod] if pod is not None else []), 0
        labels = target.labels
        if labels is None:
            svc = await self.registry.try_get(by_plural("services"), target.namespace, target.name)
            if svc is None:
                raise errors.not_found("services", target.name)
            selector = objects.spec(svc).get("selector") or {}
            if not selector:
                return [], 0
            labels = parse_label_selector(",".join(f"{k}={v}" for k, v in selector.items()))
        return await self.registry.list(by_plural("pods"), target.namespace, labels)

    async def moving(self, target: Target, pods: list[Obj]) -> bool:
        """One of these pods is frozen for a Checkpoint or between nodes."""
        names = {p["metadata"]["name"] for p in pods}
        if target.fields is not None:
            names.add(target.name)
        ready = {id(p) for p in ready_pods(pods)}
        if any(Annotation.RESTORE_FROM in objects.annotations(p) and id(p) not in ready
               and objects.phase(p) not in PodPhase.TERMINAL for p in pods):
            return True   # a replacement (or a rollback) restoring
        if not names:
            return False
        cks, _ = await self.registry.list(by_plural("checkpoints"), target.namespace)
        return any(objects.spec(c).get("podName") in names
                   and objects.phase(c) in MOVING_PHASES for c in cks)

    def pick(self, pods: list[Obj]) -> Obj:
        return pods[next(self._rr) % len(pods)]

    # --- recent refusals --------------------------------------------------------------
    def refused_by(self, pod: Obj, unreached: bool = False) -> None:
        """``pod`` refused a request it never began (``unreached``: no connection to its
        kubelet could be made): not asked again until its object changes or
        :data:`RETRY_REFUSED` s pass."""
        md = pod["metadata"]
        now = time.monotonic()
        if len(self._refused) >= STATS_KEPT:
            self._refused = {k: v for k, v in self._refused.items() if now - v[1] < RETRY_REFUSED}
        self._refused[md.get("uid", "")] = (md.get("resourceVersion", ""), now, unreached)

    def unreachable(self, pod: Obj) -> bool:
        """The last request sent to ``pod``, unchanged since, found no kubelet to take it."""
        md = pod["metadata"]
        seen = self._refused.get(md.get("uid", ""))
        return seen is not None and seen[2] and seen[0] == md.get("resourceVersion", "")

    def may_answer(self, pods: list[Obj]) -> bool:
        """A Ready pod whose kubelet was not found gone at the last try."""
        return any(not self.unreachable(p) for p in ready_pods(pods))

    def refusing(self, pod: Obj, now: float) -> float | None:
        """Seconds until ``pod``, which refused lately and did not change since, is asked
        again; None when it may be asked now."""
        md = pod["metadata"]
        seen = self._refused.get(md.get("uid", ""))
        if seen is None or seen[0] != md.get("resourceVersion", "") or now - seen[1] >= RETRY_REFUSED:
            return None
        return seen[1] + RETRY_REFUSED - now

    def refused_at(self, pod: Obj) -> float | None:
        """When ``pod`` (its uid) last refused a request, if it has not answered one since."""
        seen = self._refused.get(pod["metadata"].get("uid", ""))
        return None if seen is None else seen[1]

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
        seq = next(self._seq)   # its place in a queue: taken now, kept through a first try
        refusal: Refusal | None = None
        queue = self.queues.get(target.key)
        behind = queue is not None and queue.pending()
        if not behind or (queue is not None and queue.stuck_since is not None):
            first = await self._first(target, no_pod)
            if first is not None and not behind:   # nothing held waits or is in flight: none to overtake
                upstream, refusal = await self._tried(target, seq, send, first)
                if upstream is not None:
                    return await relay(upstream)
                self.episode(target).pods.add(first["metadata"]["name"])
        if self.stopping:
            raise stopping()
        queue = self.queues.get(target.key)
        if queue is None:
            queue = self.queues[target.key] = HoldQueue(self, target)
        if refusal is not None:
            queue.refusal = refusal
        # One that joins without asking would have had what the last one asking got.
        return await queue.hold(seq, size, deadline, refusal or queue.refusal or Refusal(error=no_pod()), send,
                                relay)

    async def _tried(self, target: Target, seq: int, send: Send,
                     pod: Obj) -> tuple[aiohttp.ClientResponse | None, Refusal | None]:
        """:meth:`_attempt`, known to the target's queue while in flight: it may come back
        refused and then goes before every later request (the queue's barrier)."""
        flying = self.direct.setdefault(target.key, {})
        flying[seq] = (pod["metadata"].get("uid", ""), time.monotonic())
        try:
            return await self._attempt(send, pod)
        finally:
            flying.pop(seq, None)
            if not flying and self.direct.get(target.key) is flying:
                del self.direct[target.key]
            queue = self.queues.get(target.key)
            if queue is not None:
                queue.wake.set()

    async def _first(self, target: Target, no_pod: Callable[[], errors.APIError]) -> Obj | None:
        """The pod to try a new request on first, None to hold it; ``no_pod()`` raised when
        there is nothing to wait for (no pod that may answer, no move under way)."""
        pods, _ = await self.pods(target)
        first, _ = self.first_choice(pods)
        if first is None and not self.may_answer(pods) and not await self.moving(target, pods):
            # Nothing to wait for: a Service answers as today; the pod proxy sends to
            # its pod whatever its state, as it always does.
            first = pods[0] if target.fields is not None and pods and pods[0]["spec"].get("nodeName") else None
            if first is None:
                raise no_pod()
        return first

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

    async def _attempt(self, send: Send, pod: Obj,
                       headers: dict[str, str] | None = None) -> tuple[aiohttp.ClientResponse | None, Refusal | None]:
        """The pod's answer, or what refused the request before the pod began it (the
        pod is then remembered as refusing)."""
        try:
            upstream = await send(pod, headers or {})
        except Unreached as e:
            self.refused_by(pod, unreached=True)
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

    def stop_holding(self) -> None:
        """The API server stops: every held request gets its 503 with Retry-After now (before
        the server's grace ends and cuts it), none is held from now on."""
        self.stopping = True
        for queue in list(self.queues.values()):
            queue.end(Refusal(error=stopping()))

    async def close(self) -> None:
        self.stop_holding()
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
        self.final: Refusal | None = None       # what every waiting request gets: the queue ended
        self.stuck_since: float | None = None   # since when no pod may answer and no move is under way
        self.probe: _Held | None = None         # the one request in flight to a pod that refused lately
        self.probe_until = 0.0                  # when that pod counts as taking requests, the probe unanswered
        self.trusted: dict[str, float] = {}     # pod uid -> when a probe of it outlasted PROBE_WAIT
        self.streams: dict[str, list[Any]] = {}  # pod uid -> [its stream's token, the next number] (ORDER)
        self.bytes = 0
        self.wake = asyncio.Event()
        self.changed = True                     # the pods or Checkpoints changed since the last look
        self.task = asyncio.ensure_future(self._dispatch())

    def pending(self) -> bool:
        """Requests wait here or are in flight (from here, or tried first on a pod): a new
        one goes behind them."""
        return bool(self.waiting or self.busy or self.holds.direct.get(self.target.key))

    async def _barrier(self, now: float) -> tuple[float, float | None]:
        """The arrival seq no held request at or past may be handed out yet: the oldest
        request tried first on a pod and still in flight that may yet come back refused
        (its pod is a move's source, or refused lately, or it has been in flight less than
        :data:`PROBE_WAIT` s); and when the next of those stops counting by its age."""
        flying = self.holds.direct.get(self.target.key)
        if not flying:
            return float("inf"), None
        cks, _ = await self.holds.registry.list(by_plural("checkpoints"), self.target.namespace)
        sources = {objects.status(c).get("podUID") for c in cks if objects.phase(c) in MOVING_PHASES}
        barrier, expires = float("inf"), None
        for seq, (uid, since) in flying.items():
            young = now - since < PROBE_WAIT
            suspect = uid in self.holds._refused and self.holds._refused[uid][1] >= self.trusted.get(uid, -1.0)
            if young or uid in sources or suspect:
                barrier = min(barrier, seq)
                if young and not (uid in sources or suspect):
                    left = since + PROBE_WAIT - now
                    expires = left if expires is None else min(expires, left)
        return barrier, expires

    # --- the request's side ---------------------------------------------------------
    async def _fits(self, size: int) -> bool:
        """Room for one more held request of ``size`` body bytes: in this target's queue,
        in its namespace's share and in the server's (taken when True)."""
        if self.final is not None or len(self.waiting) >= MAX_QUEUED or self.bytes + size > MAX_QUEUED_BYTES:
            return False
        ns = self.target.namespace
        if not await self.holds.count_room.take(ns, 1):
            return False
        if not await self.holds.bytes_room.take(ns, size):
            self.holds.count_room.leave(ns, 1)
            return False
        return True

    async def hold(self, seq: int, size: int, deadline: float, refusal: Refusal, send: Send,
                   relay: Relay) -> web.StreamResponse:
        """Wait for a pod, send, and again while pods refuse; the 503 at the deadline."""
        holds, target = self.holds, self.target
        if not await self._fits(size):
            holds.count(target, "not_holdable")
            return (self.final or refusal).answer()
        held = _Held(seq, size, time.monotonic())
        self.bytes += size
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
                    return (self.final or refusal).answer()
                try:
                    upstream, why = await holds._attempt(send, pod, {ORDER: held.order})
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
            holds.bytes_room.leave(target.namespace, size)
            holds.count_room.leave(target.namespace, 1)
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
        if self.probe is held:
            self.probe = None
        self.wake.set()

    # --- the dispatcher ---------------------------------------------------------------
    def _free(self, pods: list[Obj], now: float) -> tuple[list[Obj], list[Obj], float | None]:
        """Ready pods with room for another held request that did not just refuse; those
        of them that refused before and have not answered since (to be probed); and when
        the next refusal expires."""
        free, suspect, expires = [], [], None
        for pod in ready_pods(pods):
            uid = pod["metadata"].get("uid", "")
            if self.busy.get(uid, 0) >= WINDOW:
                continue
            left = self.holds.refusing(pod, now)
            if left is not None:
                expires = left if expires is None else min(expires, left)
                continue
            refused = self.holds.refused_at(pod)
            if refused is not None and refused >= self.trusted.get(uid, -1.0):
                suspect.append(pod)
            else:
                free.append(pod)
        return free, suspect, expires

    def _grant(self, free: list[Obj], start: int, limit: int | None = None,
               barrier: float = float("inf")) -> list[_Held]:
        """Hand the waiting requests, first come first, to the free pods in turn, each
        pod up to :data:`WINDOW` in flight (at most ``limit`` of them, none that came
        after ``barrier``); those handed out."""
        i = 0
        granted: list[_Held] = []
        while free and self.waiting and (limit is None or len(granted) < limit) and self.waiting[0].seq < barrier:
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
            held.order = self._number(uid)
            held.turn.set_result(pod)
            granted.append(held)
        return granted

    def _number(self, uid: str) -> str:
        """The next number on ``uid``'s stream: handed out in arrival order, so the pod's
        kubelet lets them in in that order (kube32.kubelet.ordering)."""
        stream = self.streams.get(uid)
        if stream is None:
            stream = self.streams[uid] = [secrets.token_hex(8), 0]
        stream[1] += 1
        return order_value(stream[0], stream[1] - 1)

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
                        try:
                            pods, rev = await holds.pods(target)
                        except errors.APIError as e:   # the Service is gone: its answer now
                            self.end(Refusal(error=e))
                            continue
                        if not watches:
                            watches = [asyncio.ensure_future(self._watch(*what, rev)) for what in target.watched]
                    timeout = await self._look(pods)
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

    async def _look(self, pods: list[Obj]) -> float:
        """Hand out what the pods can take; give up when nothing is left to wait for (no
        pod that may answer and no move under way, for :data:`GIVE_UP_AFTER` s: a pod
        deleted, a source node gone mid-move).  The seconds until the next look is due."""
        holds, now = self.holds, time.monotonic()
        if not holds.may_answer(pods) and not await holds.moving(self.target, pods):
            self.stuck_since = self.stuck_since if self.stuck_since is not None else now
            if not pods or now - self.stuck_since >= GIVE_UP_AFTER:
                self._give_up()   # nothing left to wait for: the 503 now
                return 1.0
            return GIVE_UP_AFTER
        self.stuck_since = None
        if self.probe is not None:   # nothing goes out while a probe may yet come back refused
            if now < self.probe_until:
                return self.probe_until - now
            if self.probe.granted is not None:   # in flight that long: its pod took it
                self.trusted[self.probe.granted["metadata"].get("uid", "")] = now
                if len(self.trusted) > STATS_KEPT:
                    del self.trusted[next(iter(self.trusted))]
            self.probe = None
        free, suspect, expires = self._free(pods, now)
        barrier, aged = await self._barrier(now)
        if free:
            self._grant(free, next(holds._rr), barrier=barrier)
        elif suspect and self.waiting:
            self._probe(suspect[next(holds._rr) % len(suspect)], now, barrier)
        expires = min(x for x in (expires, aged, 1.0) if x is not None)
        return expires

    def _probe(self, pod: Obj, now: float, barrier: float) -> None:
        """The first waiting request alone to ``pod``, which refused lately."""
        for held in self._grant([pod], 0, limit=1, barrier=barrier):
            self.probe, self.probe_until = held, now + PROBE_WAIT

    def end(self, refusal: Refusal) -> None:
        """Every waiting request gets ``refusal`` now, and none joins any more."""
        self.final = refusal
        self._give_up()
        self.wake.set()

    def _give_up(self) -> None:
        for held in self.waiting:
            if not held.turn.done():
                held.turn.cancel()
        self.waiting.clear()

    async def _watch(self, plural: str, labels: LabelSelector | None, fields: FieldSelector | None,
                     rev: int) -> None:
        """Wake the dispatcher at every change of what the target watches (its pods, the
        namespace's Checkpoints, its Service); started from the revision of the
        dispatcher's first list."""
        target = self.target
        res = by_plural(plural)
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
