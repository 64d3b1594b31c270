"""The checkpoint data space: the control plane's memory for snapshots, and how it is shared.

The data of every Checkpoint, in every namespace, lives in one space of ``capacity``
bytes (16 MiB in the simulator, 256 KiB on the board: the spec's bound, not a target);
kube32.apiserver.checkpointdata serves it.  This module decides what it holds
(docs/security.md, "Checkpoint data"):

* **Stored data never exceeds the space.**  Nothing is lent beyond it: on the board
  there is no more memory.
* **Nothing goes for data that has not arrived.**  An upload is received into a buffer
  of its own and checked whole before it takes its place, dropping other data only
  then.  That buffer becomes the stored data (one copy, no second buffer), so until an
  upload is checked it and the data it may replace are both held: besides the space,
  uploads arriving take up to the space again (``staging``), and the control plane's own
  snapshot, one at a time, up to the space.
* **Uploads arriving share their room fairly** (kube32.aio.FairShare, by namespace): an
  upload that finds no room waits, and when room comes free the namespace holding the
  least of it goes first, then the one served longest ago.  So a namespace's second
  upload waits behind every other namespace's first: one namespace's uploads keep
  another's out only as long as those already arriving take.
* **Bytes must keep coming** (`Pace`): a minimum rate after a grace period, and no long
  pause, so no client holds room for long by sending slowly.
* **What goes first** when data does not fit (`to_drop`), by `Standing`: ordinary data,
  then each pod's latest periodic checkpoint (what node-loss recovery needs), then data
  a pending restore names; the data of a move in flight never goes.  Within a standing
  the namespace holding the most (the incoming data counted in its own) gives first,
  its oldest data first: the spec's "oldest other snapshots first", among equals.
* **Namespaces share fairly** (`fair_share`: the space divided by the namespaces holding
  data): another namespace's latest periodic checkpoints and pending restores go only
  while that namespace holds more than its share.
* **Room is given in line** (`Room`): data that does not fit now but would once the
  moves in flight ended (their data stays until then) waits for room, and is promised it
  (a reservation, counted as a move's data until the data comes) when its turn comes: a
  move's snapshot before its pod freezes (so a move waiting for room keeps its pod
  running), an upload once its bytes are in.  In line the namespace holding the least
  goes first (kube32.aio.FairShare), and while anyone waits no namespace that would hold
  more than its fair share gets room before it: a namespace whose moves hold the space
  keeps the others out only until those moves end (their freeze timeout, transfer and
  rollback window bound that), not by starting more.  Data that cannot fit even once
  every move in flight ended is refused at once (`refusal` says why), a wait that runs
  out of patience is refused saying where it stood (`waiting`), and nothing is dropped
  for either.

Invariants: stored data never exceeds ``capacity`` (`CheckpointDataSpace.store` asserts
it), and room is promised only where it fits beside all stored data that may not go and
all room promised before; eviction happens only in `CheckpointDataSpace.store`, for data
already checked; `to_drop`, `refusal`, `waiting` and `standings` are pure (the API
server reads the objects they judge).
"""
from __future__ import annotations

import asyncio
import heapq
import mmap
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any, Awaitable, Callable, Iterable, Mapping, Union

from .. import objects, timing
from ..aio import FairShare, Waiter
from ..terms import Annotation, CheckpointPhase, Label, Trigger

Obj = dict[str, Any]
Buffer = Union[bytearray, mmap.mmap]

SIM_CAPACITY = 16 * 1024 * 1024
BOARD_CAPACITY = 256 * 1024

IN_FLIGHT_PHASES = CheckpointPhase.IN_FLIGHT


class Standing(IntEnum):
    """How long data stays when the space is full: the lowest goes first."""

    ORDINARY = 0          # Saved, Completed, Failed Checkpoints; older periodic ones
    LATEST_PERIODIC = 1   # the newest stored periodic checkpoint of a pod
    RESTORE_PENDING = 2   # named by a pod's kube32.io/restore-from
    MOVE_IN_FLIGHT = 3    # Saving or Moving, or its rollback still restoring: never goes


@dataclass(frozen=True)
class Stored:
    data: Buffer
    namespace: str
    name: str
    facts: dict[str, Any]  # the snapshot's status facts (movability.SNAPSHOT_FACTS)


@dataclass(frozen=True)
class Held:
    """One Checkpoint's stored data, as eviction sees it."""

    uid: str
    namespace: str
    name: str
    size: int
    age: int  # the order data was stored in: lower is older
    standing: Standing


def by_uid(checkpoints: Checkpoints) -> Mapping[str, Obj]:
    """The Checkpoints by uid (a mapping already is: the API server keeps one)."""
    if isinstance(checkpoints, Mapping):
        return checkpoints
    return {str(objects.meta(ck).get("uid")): ck for ck in checkpoints}


def standings(stored: Iterable[tuple[str, Stored]], checkpoints: Checkpoints,
              pods: Iterable[Obj]) -> dict[str, Standing]:
    """The standing of each stored data (uid, oldest first), from the Checkpoints (or
    them by uid: then O(stored data + pods)) and the pods (those that name no
    ``restore-from`` may be left out).  Only the control plane writes Checkpoint status,
    so a user cannot make data in flight; a rollback counts as its move's while the pod
    it went back to (its uid in ``status.rollbackPodUID``) still waits to restore from it."""
    known = by_uid(checkpoints)
    restoring: dict[tuple[str, str], set[str]] = {}
    for pod in pods:
        md = objects.meta(pod)
        name = (md.get("annotations") or {}).get(Annotation.RESTORE_FROM)
        if name:
            restoring.setdefault((md.get("namespace", ""), name), set()).add(md.get("uid", ""))
    out: dict[str, Standing] = {}
    latest: dict[tuple[str, str], str] = {}  # (namespace, pod) -> uid of its newest stored periodic data
    for uid, item in stored:
        ck = known.get(uid)
        if ck is None:
            out[uid] = Standing.ORDINARY
            continue
        status = objects.status(ck)
        waiting = restoring.get((item.namespace, item.name), set())
        if status.get("phase") in IN_FLIGHT_PHASES or status.get("rollbackPodUID") in waiting:
            out[uid] = Standing.MOVE_IN_FLIGHT
        elif waiting:
            out[uid] = Standing.RESTORE_PENDING
        else:
            out[uid] = Standing.ORDINARY
        if objects.labels(ck).get(Label.TRIGGER) == Trigger.PERIODIC and status.get("phase") == CheckpointPhase.SAVED:
            latest[(item.namespace, str(objects.spec(ck).get("podName")))] = uid  # stored later: newer
    for uid in latest.values():
        out[uid] = max(out[uid], Standing.LATEST_PERIODIC)
    return out


def _holdings(held: Iterable[Held], namespace: str, size: int) -> tuple[Counter[str], Counter[str]]:
    """Bytes by namespace (``size`` more of ``namespace`` counted), and of them the data
    of moves in flight."""
    holding: Counter[str] = Counter()
    pinned: Counter[str] = Counter()
    for h in held:
        holding[h.namespace] += h.size
        if h.standing is Standing.MOVE_IN_FLIGHT:
            pinned[h.namespace] += h.size
    holding[namespace] += size
    return holding, pinned


def fair_share(holding: Counter[str], capacity: int) -> float:
    """Each namespace's fair share: the space divided by the namespaces holding data."""
    return capacity / max(1, sum(1 for v in holding.values() if v > 0))


def to_drop(held: Iterable[Held], namespace: str, size: int, capacity: int) -> list[Held] | None:
    """The data to drop, in order, so ``size`` more bytes of ``namespace`` fit in
    ``capacity`` beside ``held``; None when they cannot without data that may not go.
    O(n log n): the space may hold many small snapshots."""
    out, over = _drops(sorted(held, key=lambda h: h.age), namespace, size, capacity)
    return out if over <= 0 else None


def _drops(held: list[Held], namespace: str, size: int, capacity: int) -> tuple[list[Held], int]:
    """What goes, in order, until ``size`` more bytes of ``namespace`` fit in ``capacity``
    (or all that may go went), and how many bytes are over then."""
    holding, _ = _holdings(held, namespace, size)
    queues: dict[tuple[Standing, str], deque[Held]] = {}
    for h in held:
        if h.standing < Standing.MOVE_IN_FLIGHT:
            queues.setdefault((h.standing, h.namespace), deque()).append(h)
    over = sum(holding.values()) - capacity
    out: list[Held] = []

    def drop(q: deque[Held]) -> None:
        nonlocal over
        h = q.popleft()
        out.append(h)
        over -= h.size
        holding[h.namespace] -= h.size

    for standing in (Standing.ORDINARY, Standing.LATEST_PERIODIC, Standing.RESTORE_PENDING):
        # The largest holder first; between equal ones, the one with the oldest data.
        heap = [(-holding[ns], q[0].age, ns) for (s, ns), q in queues.items() if s is standing]
        heapq.heapify(heap)
        while over > 0 and heap:
            *_, ns = heapq.heappop(heap)
            q = queues[(standing, ns)]
            if standing > Standing.ORDINARY and ns != namespace and holding[ns] <= fair_share(holding, capacity):
                # The largest other holder is within its share, so every other one is (and
                # stays: shares only grow as holders leave): only the uploader's own goes.
                own = queues.get((standing, namespace), deque())
                while over > 0 and own:
                    drop(own)
                break
            drop(q)
            if q:
                heapq.heappush(heap, (-holding[ns], q[0].age, ns))
    return out, over


def once_moves_end(held: Iterable[Held]) -> list[Held]:
    """``held`` as it would be once every move in flight ended: their data ordinary."""
    return [replace(h, standing=Standing.ORDINARY) if h.standing is Standing.MOVE_IN_FLIGHT else h for h in held]


def may_wait(held: Iterable[Held], namespace: str, size: int, capacity: int) -> bool:
    """Whether ``size`` more bytes of ``namespace`` fit once the moves in flight ended
    (so waiting for room is worth it; else `refusal`)."""
    return to_drop(once_moves_end(held), namespace, size, capacity) is not None


def refusal(held: Iterable[Held], namespace: str, size: int, capacity: int) -> str:
    """Why ``size`` more bytes of ``namespace`` cannot be stored even once every move in
    flight ended (`may_wait` said no), judged on what stays once all that may go went."""
    ordered = sorted(once_moves_end(held), key=lambda h: h.age)
    going = {h.uid for h in _drops(ordered, namespace, size, capacity)[0]}
    staying = [h for h in ordered if h.uid not in going]
    holding, _ = _holdings(staying, namespace, size)
    holders = sum(1 for v in holding.values() if v > 0)
    protected = sum(h.size for h in staying if h.namespace != namespace
                    and h.standing in (Standing.LATEST_PERIODIC, Standing.RESTORE_PENDING))
    return (f"the snapshot of {size} bytes does not fit in the checkpoint data space of {capacity} bytes, "
            f"even once every move in flight ended, beside the data that may not go for it: {protected} bytes "
            "of other namespaces' latest periodic checkpoints and pending restores (they go only beyond their "
            f"namespace's fair share of the space, {int(fair_share(holding, capacity))} bytes shared by "
            f"{holders} namespaces holding data); retry later")


def waiting(held: Iterable[Held], namespace: str, size: int, capacity: int,
            place: tuple[int, int] | None) -> str:
    """Why ``size`` more bytes of ``namespace`` wait for room, and where they stand in line
    (``place``: theirs, of how many; None: not in line)."""
    holding, pinned = _holdings(held, namespace, size)
    flying = ", ".join(f"namespace {ns} {v} bytes" for ns, v in pinned.most_common(3))
    line = "" if place is None else (
        f"; it is {place[0]} of {place[1]} in line for room, and no namespace beyond its fair share "
        f"({int(fair_share(holding, capacity))} bytes) gets room before it")
    return (f"the snapshot of {size} bytes fits in the checkpoint data space of {capacity} bytes only once "
            f"moves in flight end: they hold {sum(pinned.values())} bytes ({flying}: their data, or room "
            f"promised to it, stays until the move ends){line}")


class CheckpointDataSpace:
    """The bytes of every Checkpoint's snapshot, within ``capacity``, by uid."""

    def __init__(self, capacity: int = SIM_CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()  # uid -> data, oldest first
        self._ages: dict[str, int] = {}
        self._stored_count = 0
        self.used = 0  # bytes of stored data
        self.staging = FairShare(capacity)  # room for uploads arriving, beside the space

    def stored(self, uid: str) -> Stored | None:
        return self._items.get(uid)

    def items(self) -> list[tuple[str, Stored]]:
        """(uid, data), oldest first."""
        return list(self._items.items())

    def by_namespace(self) -> Counter[str]:
        """Bytes stored, by namespace."""
        out: Counter[str] = Counter()
        for item in self._items.values():
            out[item.namespace] += len(item.data)
        return out

    def held(self, uid: str, standing: dict[str, Standing], unknown: Standing = Standing.ORDINARY) -> list[Held]:
        """Every stored data but ``uid``'s own (which the new data replaces), as eviction sees
        it; data ``standing`` does not know stands as ``unknown``."""
        return [Held(u, s.namespace, s.name, len(s.data), self._ages[u], standing.get(u, unknown))
                for u, s in self._items.items() if u != uid]

    def store(self, uid: str, item: Stored, dropping: Iterable[Held]) -> None:
        """``item`` becomes ``uid``'s data (the newest), ``dropping`` goes (see `to_drop`)."""
        for h in dropping:
            self.drop(h.uid)
        self.drop(uid)
        self._stored_count += 1
        self._items[uid] = item
        self._ages[uid] = self._stored_count
        self.used += len(item.data)
        assert self.used <= self.capacity, "stored checkpoint data beyond the space"

    def drop(self, uid: str) -> None:
        item = self._items.pop(uid, None)
        if item is not None:
            self.used -= len(item.data)
            del self._ages[uid]


@dataclass
class Reservation:
    """Room promised to a Checkpoint's data before it is stored."""

    namespace: str
    name: str
    size: int
    until: float  # time.monotonic() after which it is let go unless its data is on its way


Checkpoints = Union[Mapping[str, Obj], Iterable[Obj]]   # every Checkpoint, or them by uid
# -> (every Checkpoint or them by uid, read-only; the pods, or only those that name a restore-from)
Look = Callable[[], Awaitable[tuple[Checkpoints, list[Obj]]]]


@dataclass
class _Ask:
    """A snapshot's place in line (its task waits in the Room until it is given room)."""

    size: int
    task: asyncio.Future[bool]
    linger: asyncio.TimerHandle | None = None  # its end, when nobody asks for it meanwhile


class Room(FairShare):
    """Room in the space promised to data before it is stored, in line by namespace
    (see the module doc): a `Reservation` per Checkpoint uid, counted as a move's data
    in flight (it may not go) by every later judgement, until the data is stored
    (`release`), the Checkpoint ends or goes, or ``timing.ROOM_HOLD_SECONDS`` pass.

    What may go depends on Checkpoints and pods this module does not see (a move ends):
    `look` reads them (``look`` given by the API server), and a waiter looks again every
    ``timing.ROOM_LOOK_SECONDS``.  Data stored since the last look stands as a move's
    (it may not go) until the next one.  ``in_use``: uids whose data is arriving, whose
    reservation is never let go under them."""

    def __init__(self, space: CheckpointDataSpace, look: Look) -> None:
        super().__init__(space.capacity)
        self.space = space
        self._read = look
        self.standing: dict[str, Standing] = {}
        self.reserved: dict[str, Reservation] = {}
        self.in_use: set[str] = set()
        self._asks: dict[str, _Ask] = {}  # uid -> its place in line, kept between its asks
        self._looking: asyncio.Future[None] | None = None

    # --- judging ---------------------------------------------------------------------
    def claims(self, uid: str) -> list[Held]:
        """Stored data and room promised, but ``uid``'s own (the new data replaces it)."""
        held = self.space.held(uid, self.standing, unknown=Standing.MOVE_IN_FLIGHT)
        return held + [Held(u, r.namespace, r.name, r.size, 0, Standing.MOVE_IN_FLIGHT)
                       for u, r in self.reserved.items() if u != uid]

    def fits_as_is(self, uid: str, size: int) -> bool:
        """Whether ``size`` bytes for ``uid`` fit beside everything stored and promised, dropping nothing."""
        old = self.space.stored(uid)
        others = sum(r.size for u, r in self.reserved.items() if u != uid)
        return self.space.used - (len(old.data) if old is not None else 0) + others + size <= self.capacity

    def holds(self, uid: str, size: int) -> bool:
        """Whether ``size`` bytes are promised to ``uid``'s data."""
        r = self.reserved.get(uid)
        return r is not None and r.size >= size

    def _fits(self, waiter: Waiter) -> bool:
        uid = waiter.tag[0]
        return self.fits_as_is(uid, waiter.size) or \
            to_drop(self.claims(uid), waiter.key, waiter.size, self.capacity) is not None

    def _claimed(self) -> Counter[str]:
        """Bytes stored and promised, by namespace."""
        return self.space.by_namespace() + self._held

    def _holding(self, key: str) -> int:
        return self._claimed()[key]

    def _may_pass(self, waiter: Waiter, blocked: Waiter) -> bool:
        """Only a namespace that stays within its fair share with it passes one waiting: the
        space divided by the namespaces holding data or room, or waiting for it."""
        claimed = self._claimed()
        claimants = {ns for ns, v in claimed.items() if v > 0} | set(self._queues) | {waiter.key}
        return claimed[waiter.key] + waiter.size <= self.capacity / len(claimants)

    # --- reservations ------------------------------------------------------------------
    async def reserve(self, uid: str, namespace: str, name: str, size: int,
                      patience: float) -> tuple[int, int] | None:
        """Room for ``size`` bytes of Checkpoint ``uid``'s data (``namespace``/``name``): None
        once promised; when it did not come within ``patience`` seconds, where it stood in
        line then (its place, of how many).  That place is kept for the next ask of the same
        data for timing.ROOM_LINGER_SECONDS (an asker that asks again does not lose it)."""
        if self.holds(uid, size):
            return None
        loop = asyncio.get_running_loop()
        ask = self._asks.get(uid)
        if ask is None or ask.task.done() or ask.size != size:
            self._end_ask(uid)
            self.release(uid)
            if self._queues or not self.fits_as_is(uid, size):
                await self.look()
            ask = self._asks[uid] = _Ask(size, asyncio.ensure_future(self.enter(namespace, size, tag=(uid, name))))
            await asyncio.sleep(0)  # it enters at once when it may
        elif ask.linger is not None:
            ask.linger.cancel()
            ask.linger = None
        deadline = loop.time() + patience
        place = self.place(uid) or (1, 1)
        try:
            while not ask.task.done() and (left := deadline - loop.time()) > 0:
                await asyncio.wait({ask.task}, timeout=min(timing.ROOM_LOOK_SECONDS, left))
                if not ask.task.done():
                    await self.look()
                    place = self.place(uid) or place
        except BaseException:
            self._end_ask(uid)  # the asker went: so does its place
            raise
        if ask.task.done():
            if self._asks.get(uid) is ask:
                del self._asks[uid]
            return None if not ask.task.cancelled() and ask.task.result() else place
        ask.linger = loop.call_later(timing.ROOM_LINGER_SECONDS, self._end_ask, uid)
        return place

    def _end_ask(self, uid: str) -> None:
        """``uid``'s place in line goes (room given to it just then goes back)."""
        ask = self._asks.pop(uid, None)
        if ask is not None:
            if ask.linger is not None:
                ask.linger.cancel()
            ask.task.cancel()

    def place(self, uid: str) -> tuple[int, int] | None:
        """``uid``'s place in line, of how many, or None when it does not wait."""
        line = self.line()
        return next(((i + 1, len(line)) for i, w in enumerate(line) if w.tag[0] == uid), None)

    def release(self, uid: str) -> None:
        """The room promised to ``uid``'s data is not needed (any more): its data was
        stored, or will not be."""
        r = self.reserved.pop(uid, None)
        if r is not None:
            self.leave(r.namespace, r.size)

    def _take(self, waiter: Waiter) -> None:
        super()._take(waiter)
        uid, name = waiter.tag
        self.reserved[uid] = Reservation(waiter.key, name, waiter.size, time.monotonic() + timing.ROOM_HOLD_SECONDS)

    def _give_back(self, waiter: Waiter) -> None:
        self.release(waiter.tag[0])

    async def look(self, fresh: bool = False) -> None:
        """Read again what each data's standing is, let go of room promised to Checkpoints
        that ended or went (or held too long), and let waiters in.  One look at a time
        serves every caller, unless ``fresh`` (one that began after this call)."""
        if fresh:
            await self._look()
            return
        if self._looking is None or self._looking.done():
            self._looking = asyncio.ensure_future(self._look())
        await asyncio.shield(self._looking)

    async def _look(self) -> None:
        checkpoints, pods = await self._read()
        known = by_uid(checkpoints)
        self.standing = standings(self.space.items(), known, pods)
        now = time.monotonic()
        for uid, r in list(self.reserved.items()):
            ck = known.get(uid)
            live = ck is not None and objects.phase(ck) not in CheckpointPhase.FINISHED
            if uid not in self.in_use and (not live or now > r.until):
                self.release(uid)
        self.admit()


@dataclass(frozen=True)
class Pace:
    """How fast an upload's bytes must come: after ``grace`` seconds, at ``rate`` bytes a
    second on average since its start, and never ``idle`` seconds without any."""

    grace: float = 10.0
    rate: float = float(1 << 20)
    idle: float = timing.SNAPSHOT_STALL_SECONDS

    def clock(self) -> "PaceClock":
        return PaceClock(self, time.monotonic())

    def rule(self) -> str:
        return (f"checkpoint data must come at {self.rate / (1 << 20):g} MiB/s after its first "
                f"{self.grace:g} s, never {self.idle:g} s without a byte")


@dataclass
class PaceClock:
    pace: Pace
    start: float

    def allowance(self, received: int) -> float:
        """Seconds the next bytes may take, after ``received``; 0 or less: too slow."""
        due = self.start + self.pace.grace + received / self.pace.rate
        return min(self.pace.idle, due - time.monotonic())

    def too_slow(self, received: int, size: int) -> TimeoutError:
        return TimeoutError(f"the snapshot came too slowly: {received} of {size} bytes in "
                            f"{time.monotonic() - self.start:.1f} s ({self.pace.rule()})")
