"""Issue 25, what the 1,000-node drain and loss found: in the snapshot slot a move or a
requested Save goes before every periodic Save; a status write guarded against a change
is not refused for a mark alone; a Node's allocatable is parsed once a version."""
from __future__ import annotations

import asyncio

from kube32.controllers.checkpoint import SnapshotTurns, _same_but_marks
from kube32.terms import Label, Trigger


def ck(name: str, periodic: bool = False, ns: str = "default") -> dict:
    labels = {Label.TRIGGER: Trigger.PERIODIC} if periodic else {Label.TRIGGER: Trigger.EVICTION}
    return {"metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", "labels": labels},
            "spec": {"podName": name, "action": "Save" if periodic else "Move"}, "status": {"phase": "Pending"}}


def test_moves_go_before_periodic_saves_that_came_first() -> None:
    async def main() -> list[str]:
        turns, order = SnapshotTurns(1), []
        await turns.enter("holder", 1)

        async def take(c: dict) -> None:
            async with turns.turn(SnapshotTurns.key(c)):
                order.append(c["metadata"]["name"])
                await asyncio.sleep(0)
        waiting = [asyncio.create_task(take(c)) for c in
                   (ck("p1", True), ck("p2", True), ck("m1"), ck("p3", True), ck("m2"), ck("o1", ns="other"))]
        await asyncio.sleep(0.01)
        turns.leave("holder", 1)
        await asyncio.gather(*waiting)
        return order
    order = asyncio.run(main())
    assert set(order[:3]) == {"m1", "m2", "o1"} and order.index("m1") < order.index("m2")
    assert set(order[3:]) == {"p1", "p2", "p3"}


def test_a_mark_alone_is_no_change_to_a_guarded_write() -> None:
    a = ck("m")
    marked = {**a, "metadata": {**a["metadata"], "annotations": {"kube32.io/eviction-answered": "true"},
                                "resourceVersion": "9"}}
    assert _same_but_marks(a, marked)
    assert not _same_but_marks(a, {**a, "status": {"phase": "Failed"}})
    assert not _same_but_marks(a, {**a, "metadata": {**a["metadata"], "deletionTimestamp": "2026-12-04T00:00:00Z"}})
    assert not _same_but_marks(a, {**a, "spec": {"podName": "m", "action": "Save"}})


def test_a_nodes_allocatable_is_parsed_once_a_version() -> None:
    from kube32.podfit import node_allocatable
    node = {"metadata": {"uid": "n-1", "resourceVersion": "5"},
            "status": {"allocatable": {"memory": "512Ki", "pods": "16"}}}
    first = node_allocatable(node)
    assert node_allocatable(node) is first and first["pods"] == 16
    changed = {"metadata": {"uid": "n-1", "resourceVersion": "6"}, "status": {"allocatable": {"pods": "8"}}}
    assert node_allocatable(changed)["pods"] == 8
    unversioned = {"status": {"allocatable": {"pods": "4"}}}
    assert node_allocatable(unversioned)["pods"] == 4
