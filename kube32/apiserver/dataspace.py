"""The checkpoint data space: the control plane's memory for snapshots, and how it is shared.

The data of every Checkpoint, in every namespace, lives in one space of ``capacity``
bytes (16 MiB in the simulator, 256 KiB on the board); kube32.apiserver.checkpointdata
serves it.  This module decides what it holds (docs/security.md, "Checkpoint data"):

* **Nothing goes for data that has not arrived.**  An upload is received into a buffer
  of its own and checked whole before it takes its place, dropping other data only
  then.  That buffer becomes the stored data (one copy, no second buffer), so until an
  upload is checked it and the data it may replace are both held: besides the space,
  uploads arriving take up to the space again (`Staging`, first come first served),
  and the control plane's own snapshot, one at a time, up to the space.
* **Bytes must keep coming** (`Pace`): a minimum rate after a grace period, and no long
  pause, so no client holds room for long by sending slowly.
* **What goes first** when data does not fit (`to_drop`), by `Standing`: ordinary data,
  then each pod's latest periodic checkpoint (what node-loss recovery needs), then data
  a pending restore names; the data of a move in flight never goes.  Within a standing
  the namespace holding the most (the incoming data counted in its own) gives first,
  its oldest data first: the spec's "oldest other snapshots first", among equals.
* **Namespaces share fairly**: another namespace's latest periodic checkpoints and
  pending restores go only while that namespace holds more than its fair share (the
  space divided by the namespaces holding data).  Data that does not fit without what
  may not go is refused, and nothing is dropped for it.

Invariants: stored data never exceeds ``capacity``; eviction happens only in
`CheckpointDataSpace.store`, for data already checked; `to_drop` and `standings` are
pure (the API server reads the objects they judge).
"""
from __future__ import annotations

import asyncio
import heapq
import mmap
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable, Union

from .. import movability

Obj = dict[str, Any]
Buffer = Union[bytearray, mmap.mmap]

SIM_CAPACITY = 16 * 1024 * 1024
BOARD_CAPACITY = 256 * 1024

IN_FLIGHT_PHASES = ("Saving", "Moving")


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


def standings(stored: Iterable[tuple[str, Stored]], checkpoints: Iterable[Obj],
              pods: Iterable[Obj]) -> dict[str, Standing]:
    """The standing of each stored data (uid, oldest first), from the Checkpoints and the
    pods.  Only the control plane writes Checkpoint status, so a user cannot make data
    in flight; a rollback counts as its move's while the pod it went back to (its uid in
    ``status.rollbackPodUID``) still waits to restore from it."""
    by_uid = {(ck.get("metadata") or {}).get("uid"): ck for ck in checkpoints}
    restoring: dict[tuple[str, str], set[str]] = {}
    for pod in pods:
        md = pod.get("metadata") or {}
        name = (md.get("annotations") or {}).get(movability.RESTORE_FROM)
        if name:
            restoring.setdefault((md.get("namespace", ""), name), set()).add(md.get("uid", ""))
    out: dict[str, Standing] = {}
    latest: dict[tuple[str, str], str] = {}  # (namespace, pod) -> uid of its newest stored periodic data
    for uid, item in stored:
        ck = by_uid.get(uid)
        if ck is None:
            out[uid] = Standing.ORDINARY
            continue
        status = ck.get("status") or {}
        waiting = restoring.get((item.namespace, item.name), set())
        if status.get("phase") in IN_FLIGHT_PHASES or status.get("rollbackPodUID") in waiting:
            out[uid] = Standing.MOVE_IN_FLIGHT
        elif waiting:
            out[uid] = Standing.RESTORE_PENDING
        else:
            out[uid] = Standing.ORDINARY
        if (ck["metadata"].get("labels") or {}).get(movability.TRIGGER) == "periodic" and status.get("phase") == "Saved":
            latest[(item.namespace, str((ck.get("spec") or {}).get("podName")))] = uid  # stored later: newer
    for uid in latest.values():
        out[uid] = max(out[uid], Standing.LATEST_PERIODIC)
    return out


def to_drop(held: Iterable[Held], namespace: str, size: int, capacity: int) -> list[Held] | None:
    """The data to drop, in order, so ``size`` more bytes of ``namespace`` fit in
    ``capacity`` beside ``held``; None when they cannot without data that may not go.
    O(n log n): the space may hold many small snapshots."""
    holding: Counter[str] = Counter()
    queues: dict[tuple[Standing, str], deque[Held]] = {}
    for h in sorted(held, key=lambda h: h.age):
        holding[h.namespace] += h.size
        if h.standing < Standing.MOVE_IN_FLIGHT:
            queues.setdefault((h.standing, h.namespace), deque()).append(h)
    holding[namespace] += size
    over = sum(holding.values()) - capacity
    holders = sum(1 for v in holding.values() if v > 0)
    out: list[Held] = []

    def drop(q: deque[Held]) -> None:
        nonlocal over, holders
        h = q.popleft()
        out.append(h)
        over -= h.size
        holding[h.namespace] -= h.size
        if holding[h.namespace] == 0:
            holders -= 1

    for standing in (Standing.ORDINARY, Standing.LATEST_PERIODIC, Standing.RESTORE_PENDING):
        # The largest holder first; between equal ones, the one with the oldest data.
        heap = [(-holding[ns], q[0].age, ns) for (s, ns), q in queues.items() if s is standing]
        heapq.heapify(heap)
        while over > 0 and heap:
            *_, ns = heapq.heappop(heap)
            q = queues[(standing, ns)]
            if standing > Standing.ORDINARY and ns != namespace and holding[ns] <= capacity / max(holders, 1):
                # The largest other holder is within its share, so every other one is (and
                # stays: shares only grow as holders leave): only the uploader's own goes.
                own = queues.get((standing, namespace), deque())
                while over > 0 and own:
                    drop(own)
                break
            drop(q)
            if q:
                heapq.heappush(heap, (-holding[ns], q[0].age, ns))
    return out if over <= 0 else None


class CheckpointDataSpace:
    """The bytes of every Checkpoint's snapshot, within ``capacity``, by uid."""

    def __init__(self, capacity: int = SIM_CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()  # uid -> data, oldest first
        self._ages: dict[str, int] = {}
        self._stored_count = 0
        self.used = 0  # bytes of stored data
        self.staging = Staging(capacity)

    def stored(self, uid: str) -> Stored | None:
        return self._items.get(uid)

    def items(self) -> list[tuple[str, Stored]]:
        """(uid, data), oldest first."""
        return list(self._items.items())

    def fits(self, uid: str, size: int) -> bool:
        """Whether ``size`` bytes for ``uid`` fit without dropping other data."""
        old = self._items.get(uid)
        return self.used - (len(old.data) if old is not None else 0) + size <= self.capacity

    def held(self, uid: str, standing: dict[str, Standing]) -> list[Held]:
        """Every stored data but ``uid``'s own (which the new data replaces), as eviction sees it."""
        return [Held(u, s.namespace, s.name, len(s.data), self._ages[u], standing.get(u, Standing.ORDINARY))
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
        assert self.used <= self.capacity

    def drop(self, uid: str) -> None:
        item = self._items.pop(uid, None)
        if item is not None:
            self.used -= len(item.data)
            del self._ages[uid]


class Staging:
    """Room for uploads while they arrive: ``capacity`` bytes at once, first come first
    served.  An upload that finds no room waits its turn (a slow one ahead of it is cut
    by its `Pace`), up to a patience of its own."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def enter(self, size: int, patience: float) -> bool:
        """Take ``size`` bytes of room; False when none came within ``patience`` seconds."""
        if not self._queue and self.used + size <= self.capacity:
            self.used += size
            return True
        entry = (size, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(entry[1]), patience)
        except BaseException as e:
            if entry[1].done():  # given room just as the wait ended
                self.leave(size)
            else:
                entry[1].cancel()
                self._queue.remove(entry)
                self._admit()  # those behind it may fit now
            if isinstance(e, TimeoutError):
                return False
            raise
        return True

    def leave(self, size: int) -> None:
        self.used -= size
        self._admit()

    def _admit(self) -> None:
        while self._queue and self.used + self._queue[0][0] <= self.capacity:
            size, turn = self._queue.popleft()
            self.used += size
            turn.set_result(None)


@dataclass(frozen=True)
class Pace:
    """How fast an upload's bytes must come: after ``grace`` seconds, at ``rate`` bytes a
    second on average since its start, and never ``idle`` seconds without any."""

    grace: float = 10.0
    rate: float = float(1 << 20)
    idle: float = 10.0

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
