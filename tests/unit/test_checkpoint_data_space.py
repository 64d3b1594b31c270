"""How the checkpoint data space is shared (kube32.apiserver.dataspace): what goes when
data does not fit, room in line (dataspace.Room) for data that fits once moves in flight
end - never beyond the space -, uploads that arrive slowly or side by side (their room
shared by namespace, kube32.aio.FairShare), and the data of a move in flight; the rules
alone, then through a real API server in this process."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube32 import timing
from kube32.aio import FairShare
from kube32.apiserver.dataspace import (CheckpointDataSpace, Held, Pace, Room, Standing, Stored, may_wait, refusal,
                                        standings, to_drop, waiting)
from tests.unit.test_checkpoint_data_wait import Server, in_loop, snapshot

ORD, PER, RES, FLY = Standing.ORDINARY, Standing.LATEST_PERIODIC, Standing.RESTORE_PENDING, Standing.MOVE_IN_FLIGHT


def held(*items: tuple[str, str, int, Standing]) -> list[Held]:
    """(uid, namespace, size, standing), oldest first."""
    return [Held(uid, ns, uid, size, age, standing) for age, (uid, ns, size, standing) in enumerate(items)]


def uids(dropped: list[Held] | None) -> list[str] | None:
    return None if dropped is None else [h.uid for h in dropped]


# --- what goes --------------------------------------------------------------------------

def test_the_oldest_goes_first_among_equals() -> None:
    space = held(("a", "ns", 30, ORD), ("b", "ns", 30, ORD), ("c", "ns", 30, ORD))
    assert uids(to_drop(space, "ns", 50, 100)) == ["a", "b"]
    assert uids(to_drop(space, "ns", 10, 100)) == []


def test_standings_go_in_order_and_a_move_in_flight_never() -> None:
    space = held(("fly", "ns", 40, FLY), ("res", "ns", 20, RES), ("per", "ns", 20, PER), ("ord", "ns", 20, ORD))
    assert uids(to_drop(space, "ns", 30, 100)) == ["ord", "per"]
    assert uids(to_drop(space, "ns", 60, 100)) == ["ord", "per", "res"]
    assert to_drop(space, "ns", 61, 100) is None, "only the move's data would make room"


def test_between_equal_holders_the_oldest_data_goes_first() -> None:
    space = held(("b-old", "b", 30, ORD), ("a-old", "a", 30, ORD), ("a-new", "a", 30, ORD), ("b-new", "b", 30, ORD))
    assert uids(to_drop(space, "c", 70, 150)) == ["b-old", "a-old"]


def test_the_largest_holder_gives_first() -> None:
    space = held(("small", "b", 10, ORD), ("big1", "c", 40, ORD), ("big2", "c", 40, ORD))
    assert uids(to_drop(space, "a", 20, 100)) == ["big1"]
    # The uploader's own data counts: it holds the most with what it stores.
    space = held(("theirs", "b", 30, ORD), ("mine", "a", 30, ORD))
    assert uids(to_drop(space, "a", 50, 100)) == ["mine"]


def test_another_namespaces_protected_data_goes_only_beyond_its_fair_share() -> None:
    # b's latest periodic checkpoints: 40 bytes, within its share of 100 / 2.
    space = held(("p1", "b", 20, PER), ("p2", "b", 20, PER), ("o", "b", 10, ORD))
    assert uids(to_drop(space, "a", 55, 100)) == ["o"]
    assert to_drop(space, "a", 70, 100) is None, "b keeps its share of recovery data"
    # Beyond its share (80 > 50), b gives its oldest until it is within.
    space = held(("p1", "b", 40, PER), ("p2", "b", 40, PER))
    assert uids(to_drop(space, "a", 30, 100)) == ["p1"]
    # A namespace's own protected data goes for its own data.
    space = held(("mine", "a", 40, PER), ("theirs", "b", 40, PER))
    assert uids(to_drop(space, "a", 50, 100)) == ["mine"]


def test_data_that_fits_once_moves_end_waits_and_other_data_is_refused_at_once() -> None:
    """a's move in flight holds 90 of the 100 bytes: nothing is lent beyond the space. b's
    30 bytes fit once the move ended (they wait for room); 60 more bytes of b's beside c's
    protected data within its share never fit (refused at once, saying why)."""
    space = held(("fly", "a", 90, FLY))
    assert to_drop(space, "b", 10, 100) == [], "it fits as it is"
    assert to_drop(space, "b", 30, 100) is None, "no room is lent beyond the space"
    assert may_wait(space, "b", 30, 100)
    space = held(("fly", "a", 50, FLY), ("per", "c", 45, PER))
    assert to_drop(space, "b", 60, 100) is None and not may_wait(space, "b", 60, 100)
    why = refusal(space, "b", 60, 100)
    assert "even once every move in flight ended" in why and "45 bytes of other namespaces' latest periodic" in why
    assert "fair share of the space, 50 bytes shared by 2 namespaces" in why, why


def test_the_wait_names_the_moves_that_hold_the_room_and_the_place_in_line() -> None:
    space = held(("fly", "a", 80, FLY), ("fly2", "a", 10, FLY), ("other", "c", 5, FLY))
    why = waiting(space, "b", 30, 100, (2, 3))
    assert "only once moves in flight end: they hold 95 bytes (namespace a 90 bytes, namespace c 5 bytes" in why
    assert "it is 2 of 3 in line for room" in why and "fair share (33 bytes)" in why, why


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 50), st.sampled_from(list(Standing))),
                max_size=12),
       st.sampled_from("abc"), st.integers(1, 100))
def test_what_goes_makes_room_and_never_more_than_may_go(items, ns, size) -> None:
    space = held(*((f"u{i}", n, s, k) for i, (n, s, k) in enumerate(items)))
    dropped = to_drop(space, ns, size, 100)
    if dropped is None:
        # Not even all that may go would make room, in the simplest reading of the rules:
        # everything but moves in flight and other namespaces' protected data.
        may_go = sum(h.size for h in space if h.standing is ORD or (h.standing is not FLY and h.namespace == ns))
        assert sum(h.size for h in space) - may_go + size > 100
        if not may_wait(space, ns, size, 100):
            assert "does not fit" in refusal(space, ns, size, 100)
        return
    after = sum(h.size for h in space) - sum(h.size for h in dropped) + size
    assert after <= 100, "never beyond the space"
    assert all(h.standing is not FLY for h in dropped)
    assert len({h.uid for h in dropped}) == len(dropped)
    if dropped:
        # Nothing goes that was not needed: without the last one it would not fit.
        assert sum(h.size for h in space) - sum(h.size for h in dropped[:-1]) + size > 100


def test_standings_come_from_the_checkpoints_and_the_pods() -> None:
    def ck(uid: str, phase: str, pod: str = "p", periodic: bool = False, **status: Any) -> dict[str, Any]:
        return {"metadata": {"uid": uid, "name": uid, "namespace": "ns",
                             "labels": {"kube32.io/trigger": "periodic"} if periodic else {}},
                "spec": {"podName": pod}, "status": {"phase": phase, **status}}

    def item(uid: str) -> tuple[str, Stored]:
        return uid, Stored(bytearray(1), "ns", uid, {})

    checkpoints = [ck("saving", "Saving"), ck("moving", "Moving"), ck("done", "Completed"),
                   ck("old-periodic", "Saved", periodic=True), ck("new-periodic", "Saved", periodic=True),
                   ck("other-pod", "Saved", pod="q", periodic=True), ck("named", "Saved"),
                   ck("rolled-back", "Failed", rollbackPodUID="pod-2"),
                   ck("named-periodic", "Saved", pod="r", periodic=True), ck("older-periodic", "Saved", pod="r",
                                                                            periodic=True)]
    pods = [{"metadata": {"namespace": "ns", "uid": "pod-1", "annotations": {"kube32.io/restore-from": "named"}}},
            {"metadata": {"namespace": "ns", "uid": "pod-2",
                          "annotations": {"kube32.io/restore-from": "rolled-back"}}},
            {"metadata": {"namespace": "ns", "uid": "pod-4",
                          "annotations": {"kube32.io/restore-from": "named-periodic"}}},
            {"metadata": {"namespace": "elsewhere", "uid": "pod-3",
                          "annotations": {"kube32.io/restore-from": "done"}}}]
    stored = [item(u) for u in ("saving", "moving", "done", "old-periodic", "new-periodic", "other-pod", "named",
                                "rolled-back", "gone", "older-periodic", "named-periodic")]
    assert standings(stored, checkpoints, pods) == {
        "saving": FLY, "moving": FLY, "rolled-back": FLY, "named": RES, "named-periodic": RES,
        "new-periodic": PER, "other-pod": PER, "old-periodic": ORD, "older-periodic": ORD, "done": ORD, "gone": ORD}


# --- room in line (dataspace.Room) -------------------------------------------------------

class Objects:
    """The Checkpoints a Room reads (each named by its uid), and no pods."""

    def __init__(self) -> None:
        self.phases: dict[str, tuple[str, str]] = {}  # uid -> (namespace, phase)

    def set(self, uid: str, ns: str, phase: str) -> None:
        self.phases[uid] = (ns, phase)

    async def look(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [{"metadata": {"uid": uid, "name": uid, "namespace": ns}, "spec": {"podName": uid},
                 "status": {"phase": phase}} for uid, (ns, phase) in self.phases.items()], []


def stored(space: CheckpointDataSpace, objs: Objects, uid: str, ns: str, size: int, phase: str) -> None:
    objs.set(uid, ns, phase)
    space.store(uid, Stored(bytearray(size), ns, uid, {}), [])


@in_loop
async def test_room_waits_for_moves_in_flight_and_no_namespace_beyond_its_share_goes_first() -> None:
    objs, space = Objects(), CheckpointDataSpace(100)
    room = Room(space, objs.look)
    stored(space, objs, "fly", "a", 90, "Moving")
    objs.set("b1", "b", "Pending")
    b1 = asyncio.ensure_future(room.reserve("b1", "b", "b1", 30, 10))
    await asyncio.sleep(0.05)
    assert not b1.done() and room.place("b1") == (1, 1)
    # 5 bytes fit as they are, but a would hold more than its share: it waits behind b.
    objs.set("a2", "a", "Pending")
    a2 = asyncio.ensure_future(room.reserve("a2", "a", "a2", 5, 10))
    # c stays within its share: it passes b.
    objs.set("c1", "c", "Pending")
    assert await room.reserve("c1", "c", "c1", 5, 0) is None
    await asyncio.sleep(0.05)
    assert not a2.done() and room.place("a2") == (2, 2)
    objs.set("fly", "a", "Completed")  # the move ended: its data may go now
    assert await asyncio.wait_for(b1, 2) is None and await asyncio.wait_for(a2, 2) is None
    assert list(room.reserved) == ["c1", "b1", "a2"], "b before a"
    # What is stored for them never exceeds the space: a's ended move's data goes.
    for uid, ns, size in (("b1", "b", 30), ("c1", "c", 5), ("a2", "a", 5)):
        going = to_drop(room.claims(uid), ns, size, 100)
        assert going is not None
        space.store(uid, Stored(bytearray(size), ns, uid, {}), going)
        room.release(uid)
        assert space.used <= 100
    assert space.stored("fly") is None and space.used == 40 and not room.busy()


@in_loop
async def test_a_wait_for_room_is_bounded_and_keeps_its_place_for_the_next_ask() -> None:
    objs, space = Objects(), CheckpointDataSpace(100)
    room = Room(space, objs.look)
    stored(space, objs, "fly", "a", 90, "Saving")
    objs.set("b1", "b", "Pending")
    objs.set("a2", "a", "Pending")
    started = time.monotonic()
    assert await room.reserve("b1", "b", "b1", 30, 0.2) == (1, 1), "it stood first of one"
    assert 0.2 <= time.monotonic() - started < 2
    # Between its asks its place stays: a, beyond its share, does not pass it meanwhile.
    a2 = asyncio.ensure_future(room.reserve("a2", "a", "a2", 5, 5))
    await asyncio.sleep(0.05)
    assert room.place("b1") == (1, 2) and room.place("a2") == (2, 2)
    objs.set("fly", "a", "Completed")
    assert await room.reserve("b1", "b", "b1", 30, 2) is None and await a2 is None
    assert list(room.reserved) == ["b1", "a2"]


@in_loop
async def test_a_place_in_line_nobody_asks_for_again_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "ROOM_LINGER_SECONDS", 0.1)
    objs, space = Objects(), CheckpointDataSpace(100)
    room = Room(space, objs.look)
    stored(space, objs, "fly", "a", 90, "Saving")
    objs.set("b1", "b", "Pending")
    assert await room.reserve("b1", "b", "b1", 30, 0.1) == (1, 1)
    await asyncio.sleep(0.3)
    assert room.place("b1") is None and not room.busy()


@in_loop
async def test_unused_room_is_let_go() -> None:
    objs, space = Objects(), CheckpointDataSpace(100)
    room = Room(space, objs.look)
    # Room promised to a Checkpoint that ended without its data, or went, is let go...
    for uid, end in (("b2", "Failed"), ("b3", None)):
        objs.set(uid, "b", "Pending")
        assert await room.reserve(uid, "b", uid, 5, 0) is None and room.holds(uid, 5)
        if end is None:
            del objs.phases[uid]
        else:
            objs.set(uid, "b", end)
        await room.look()
        assert not room.holds(uid, 1)
    # ... unless its data is arriving; and room held too long is let go too.
    objs.set("b4", "b", "Pending")
    assert await room.reserve("b4", "b", "b4", 5, 0) is None
    room.in_use.add("b4")
    objs.set("b4", "b", "Saved")
    await room.look()
    assert room.holds("b4", 5)
    room.in_use.discard("b4")
    objs.set("b5", "b", "Pending")
    assert await room.reserve("b5", "b", "b5", 5, 0) is None
    room.reserved["b5"].until = time.monotonic() - 1
    await room.look()
    assert not room.holds("b5", 1) and not room.holds("b4", 1) and room.used == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reserve", "store", "end", "delete"]), st.integers(0, 4),
                          st.integers(1, 70)), max_size=40))
def test_stored_data_never_exceeds_the_space_and_room_promised_is_there(ops) -> None:
    """Any run of snapshots asking for room, stored, their moves ending and their
    Checkpoints deleted: the data stored never exceeds the space, and data promised room
    always finds it (what may go for it does)."""
    async def run() -> None:
        objs, space = Objects(), CheckpointDataSpace(100)
        room = Room(space, objs.look)
        for op, i, size in ops:
            uid, ns = f"u{i}", "abc"[i % 3]
            if op == "reserve" and space.stored(uid) is None and uid not in objs.phases:
                objs.set(uid, ns, "Saving")
                await room.reserve(uid, ns, uid, size, 0)
            elif op == "store" and uid in room.reserved:
                r = room.reserved[uid]
                await room.look(fresh=True)
                # A Checkpoint that ended without its data lost its promise at that look
                # (room lets it go), and the room may be another's now: nothing to store.
                if uid in room.reserved:
                    going = to_drop(room.claims(uid), ns, r.size, 100)
                    assert going is not None, "room promised is there"
                    space.store(uid, Stored(bytearray(r.size), ns, uid, {}), going)
                    room.release(uid)
            elif op == "end" and uid in objs.phases:
                objs.set(uid, ns, "Completed")
            elif op == "delete":
                space.drop(uid)
                room.release(uid)
                objs.phases.pop(uid, None)
                room.admit()
            assert space.used <= 100
            claims = room.claims("")
            assert sum(h.size for h in claims if h.standing is FLY) <= 100, "what may not go fits"
    asyncio.run(run())


# --- room for uploads arriving, and their pace --------------------------------------------

@in_loop
async def test_uploads_arriving_wait_in_turn_and_waits_are_bounded() -> None:
    staging = FairShare(100)
    assert await staging.enter("a", 80, 1)
    second = asyncio.ensure_future(staging.enter("a", 50, 5))
    third = asyncio.ensure_future(staging.enter("a", 10, 5))  # would fit, but waits its turn
    await asyncio.sleep(0.05)
    assert not second.done() and not third.done()
    staging.leave("a", 80)
    assert await second and await third and staging.used == 60
    assert not await staging.enter("a", 50, 0.1), "no room within its patience"
    staging.leave("a", 50)
    staging.leave("a", 10)
    assert staging.used == 0 and await staging.enter("a", 100, 0)


@in_loop
async def test_a_namespaces_second_upload_waits_behind_every_other_namespaces_first() -> None:
    """The paced-upload attack: a's upload holds the room, a's second waits ahead of b's;
    when the room comes free b goes first (a was just served), then a's second."""
    staging = FairShare(100)
    assert await staging.enter("a", 100, 1)
    a2 = asyncio.ensure_future(staging.enter("a", 100, 5))
    await asyncio.sleep(0.01)
    b1 = asyncio.ensure_future(staging.enter("b", 10, 5))
    await asyncio.sleep(0.01)
    staging.leave("a", 100)
    assert await b1 and not a2.done(), "b first: a was served last"
    assert staging.held("b") == 10
    staging.leave("b", 10)
    assert await a2 and staging.held("a") == 100


@in_loop
async def test_the_namespace_holding_the_least_goes_first_and_nobody_passes_it() -> None:
    staging = FairShare(100)
    assert await staging.enter("a", 60, 1) and await staging.enter("b", 30, 1)
    a2 = asyncio.ensure_future(staging.enter("a", 20, 5))
    b2 = asyncio.ensure_future(staging.enter("b", 20, 5))
    c1 = asyncio.ensure_future(staging.enter("c", 50, 5))
    await asyncio.sleep(0.01)
    staging.leave("b", 30)  # 40 free: c holds the least (nothing) but does not fit yet
    await asyncio.sleep(0.01)
    assert not a2.done() and not b2.done() and not c1.done(), "nobody passes the one whose turn it is"
    staging.leave("a", 60)
    assert await c1
    assert await b2 and await a2  # b holds nothing, a was served before b: b, then a
    assert staging.used == 90


@in_loop
async def test_one_snapshot_at_a_time_namespaces_in_turn() -> None:
    """The control plane's one snapshot slot: four turns of a's wait, b's goes next."""
    slot = FairShare(1)
    order: list[str] = []

    async def take(ns: str, i: int) -> None:
        async with slot.turn(ns):
            order.append(f"{ns}{i}")
            await asyncio.sleep(0.01)
    tasks = [asyncio.ensure_future(take("a", i)) for i in range(4)]
    await asyncio.sleep(0)
    tasks.append(asyncio.ensure_future(take("b", 0)))
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "a1", "a2", "a3"]
    assert not slot.busy()


@in_loop
async def test_a_wait_given_up_lets_those_behind_it_in() -> None:
    slot = FairShare(10)
    assert await slot.enter("a", 10)
    first = asyncio.ensure_future(slot.enter("b", 10, 0.05))
    second = asyncio.ensure_future(slot.enter("c", 5, 5))
    assert not await first
    slot.leave("a", 10)
    assert await second and slot.used == 5


def test_the_pace_allows_a_grace_then_a_rate_and_no_long_pause() -> None:
    pace = Pace(grace=10, rate=1000, idle=3)
    clock = pace.clock()
    assert 2.9 < clock.allowance(0) <= 3
    clock.start -= 12  # 12 s in
    assert clock.allowance(1000) < 0, "1000 bytes in 12 s is under 1000 B/s after the 10 s grace"
    assert 2.9 < clock.allowance(5000) <= 3
    assert "came too slowly: 1000 of 9000 bytes in 12" in str(clock.too_slow(1000, 9000))


# --- through a real API server -----------------------------------------------------------

FAST = Pace(grace=0.5, rate=float(1 << 20), idle=0.5)


async def trickle(first: bytes, every: float, times: int):
    yield first
    for _ in range(times):
        await asyncio.sleep(every)
        yield b"\0"


@in_loop
async def test_a_slow_upload_drops_nothing_and_is_cut(tmp_path: Path) -> None:
    async with Server(tmp_path, capacity=1 << 20, pace=FAST) as s:
        keep = snapshot(b"\x01" * (400 << 10))
        await s.checkpoint("keep", "Saved", ns="other")
        assert await s.put("keep", keep, ns="other") == 200
        await s.checkpoint("slow", "Saved")
        started = time.monotonic()
        upload = asyncio.ensure_future(s.put_answer("slow", trickle(b"K32S", 0.2, 50), size=1 << 20))
        await asyncio.sleep(0.3)
        assert await s.get("keep", ns="other") == (200, keep), "nothing goes for bytes that did not come"
        # Another upload waits for the room the slow one holds, and then goes in.
        await s.checkpoint("next", "Saved")
        body = snapshot(b"\x02" * (700 << 10))
        status, answer = await s.put_answer("next", body)
        assert status == 200, answer
        status, answer = await upload
        assert status == 408 and answer["reason"] == "Timeout", answer
        assert "too slow" in answer["message"] and answer["message"].endswith("nothing was stored")
        assert time.monotonic() - started < 5
        assert (await s.get("slow"))[0] == 404
        assert await s.get("next") == (200, body)
        # The upload that was checked made its room: the other namespace's ordinary data went.
        assert (await s.get("keep", ns="other"))[0] == 404


@in_loop
async def test_a_moves_data_stays_until_the_move_ends(tmp_path: Path) -> None:
    async with Server(tmp_path, capacity=1 << 20, pace=FAST) as s:
        move = snapshot(b"\x03" * (300 << 10))
        await s.checkpoint("mv", "Saving")
        assert await s.put("mv", move) == 200
        await s.set_phase("mv", "Moving")
        await s.checkpoint("filler", "Saved", ns="other")
        s.api.data.patience = 1.0
        started = time.monotonic()
        status, answer = await s.put_answer("filler", snapshot(b"\x04" * (800 << 10)), ns="other")
        assert status == 429 and "no room came within 1 s" in answer["message"], answer
        assert "moves in flight end: they hold 307" in answer["message"] and "namespace default 307" in \
            answer["message"], answer
        assert answer["details"]["causes"][0]["reason"] == "WaitingForRoom", answer
        assert 1 <= time.monotonic() - started < 5
        assert (await s.get("filler", ns="other"))[0] == 404
        # Nor does a user's PUT replace it while it moves.
        status, answer = await s.put_answer("mv", snapshot(b"\x05" * 100))
        assert status == 409 and "a move's data stays until the move ends" in answer["message"], answer
        assert await s.get("mv") == (200, move)
        # Once the move ended, its data is ordinary and goes for what needs its room.
        await s.set_phase("mv", "Completed")
        assert (await s.put_answer("filler", snapshot(b"\x04" * (800 << 10)), ns="other"))[0] == 200
        assert (await s.get("mv"))[0] == 404


@in_loop
async def test_an_upload_waits_for_the_room_a_move_holds_and_the_mover_cannot_pass_it(tmp_path: Path) -> None:
    """The pinning attack: a's move in flight holds nearly the whole space.  b's snapshot
    waits for room (nothing is lent beyond the space); a's next upload, which fits in what
    is left but would keep a beyond its fair share, waits behind b's; once the move ends b
    goes first, then a, and the space never holds more than its capacity."""
    async with Server(tmp_path, capacity=1 << 20, pace=FAST) as s:
        big = snapshot(b"\x09" * (900 << 10))
        await s.checkpoint("mv", "Saving", ns="a")
        assert await s.put("mv", big, ns="a") == 200
        await s.set_phase("mv", "Moving", ns="a")
        await s.checkpoint("mine", "Saved", ns="b")
        body = snapshot(b"\x0a" * (200 << 10))
        waiter = asyncio.ensure_future(s.put_answer("mine", body, ns="b"))
        await asyncio.sleep(0.5)
        assert not waiter.done() and s.space.used <= s.space.capacity
        await s.checkpoint("more", "Saved", ns="a")
        small = snapshot(b"\x0b" * (50 << 10))
        assert s.space.used + len(small) <= s.space.capacity, "it would fit as it is"
        mover = asyncio.ensure_future(s.put_answer("more", small, ns="a"))
        await asyncio.sleep(0.5)
        assert not mover.done(), "a, beyond its share, gets no room while b waits"
        assert await s.get("mv", ns="a") == (200, big), "a move's data stays until the move ends"
        await s.set_phase("mv", "Completed", ns="a")
        status, answer = await asyncio.wait_for(waiter, 5)
        assert status == 200, answer
        assert (await asyncio.wait_for(mover, 5))[0] == 200
        assert await s.get("mine", ns="b") == (200, body) and await s.get("more", ns="a") == (200, small)
        assert (await s.get("mv", ns="a"))[0] == 404, "a's ended move's data went for b's"
        assert s.space.used <= s.space.capacity


@in_loop
async def test_another_namespaces_latest_periodic_checkpoint_keeps_its_share(tmp_path: Path) -> None:
    async with Server(tmp_path, capacity=1 << 20, pace=FAST) as s:
        periodic = snapshot(b"\x06" * (300 << 10))
        await s.checkpoint("p-1", "Saved", ns="b", pod="web", labels={"kube32.io/trigger": "periodic"})
        assert await s.put("p-1", periodic, ns="b") == 200
        await s.checkpoint("big", "Saved")
        status, answer = await s.put_answer("big", snapshot(b"\x07" * (900 << 10)))
        assert status == 429 and "fair share" in answer["message"], answer
        assert await s.get("p-1", ns="b") == (200, periodic)
        assert (await s.put_answer("big", snapshot(b"\x07" * (600 << 10))))[0] == 200, "what fits beside it goes in"


@in_loop
async def test_one_upload_of_a_checkpoints_data_at_a_time(tmp_path: Path) -> None:
    async with Server(tmp_path, pace=FAST) as s:
        await s.checkpoint("ck", "Saved")
        body = snapshot(b"\x08" * 1000)
        first = asyncio.ensure_future(s.put_answer("ck", trickle(body[:100], 0.05, 0), size=len(body)))
        await asyncio.sleep(0.2)
        status, answer = await s.put_answer("ck", body)
        assert status == 409 and "arriving in another upload" in answer["message"], answer
        assert (await first)[0] == 408
        assert (await s.put_answer("ck", body))[0] == 200


@pytest.mark.parametrize("size", [17 << 20])
@in_loop
async def test_too_large_is_refused_before_a_byte_is_read(tmp_path: Path, size: int) -> None:
    async with Server(tmp_path, pace=FAST) as s:
        await s.checkpoint("ck", "Saved")
        status, answer = await s.put_answer("ck", trickle(b"K32S", 1, 0), size=size)
        assert status == 413 and "more than the 16777216 bytes" in answer["message"], answer


def test_moves_take_turns_with_other_snapshots_of_their_namespace() -> None:
    # Issue 25: a thousand periodic saves queued in one namespace held a drain's moves
    # behind them all in the one-snapshot-at-a-time line.
    from kube32.apiserver.checkpointdata import pull_lane
    assert pull_lane("default", "frozen") != pull_lane("default", None) == pull_lane("default", "running")
    assert pull_lane("a", "frozen") != pull_lane("b", "frozen")
