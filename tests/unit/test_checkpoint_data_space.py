"""How the checkpoint data space is shared (kube32.apiserver.dataspace): what goes when
data does not fit, uploads that arrive slowly or side by side, and the data of a move in
flight; the rules alone, then through a real API server in this process."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube32.apiserver.dataspace import Held, Pace, Staging, Standing, Stored, standings, to_drop
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
        return
    assert sum(h.size for h in space) - sum(h.size for h in dropped) + size <= 100
    assert all(h.standing is not FLY for h in dropped)
    assert len({h.uid for h in dropped}) == len(dropped)
    # Nothing goes that was not needed: without the last one it would not fit.
    if dropped:
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


# --- room for uploads arriving, and their pace --------------------------------------------

@in_loop
async def test_staging_is_first_come_first_served_and_waits_are_bounded() -> None:
    staging = Staging(100)
    assert await staging.enter(80, 1)
    second = asyncio.ensure_future(staging.enter(50, 5))
    third = asyncio.ensure_future(staging.enter(10, 5))  # would fit, but waits its turn
    await asyncio.sleep(0.05)
    assert not second.done() and not third.done()
    staging.leave(80)
    assert await second and await third and staging.used == 60
    assert not await staging.enter(50, 0.1), "no room within its patience"
    staging.leave(50)
    staging.leave(10)
    assert staging.used == 0 and await staging.enter(100, 0)


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
        status, answer = await s.put_answer("filler", snapshot(b"\x04" * (800 << 10)), ns="other")
        assert status == 429 and "moves in flight" in answer["message"], answer
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
