"""The kubelet's node status (issue 25): written when what the server holds differs from
what it would report, else every ``status_report_seconds`` (the Lease is the heartbeat),
read back from a watch of its own Node or a fleet's shared watch of every Node."""
from __future__ import annotations

import asyncio
import copy
import functools
from pathlib import Path
from typing import Any

from tests.conftest import until

from kube32 import objects
from kube32.client import LEASES, NODES, Client
from kube32.kubelet import Kubelet, KubeletOptions
from kube32.kubelet.node import NodeFacts, annotations_to_write, node_status, owned_annotations, status_differs
from kube32.kubelet.nodewatch import NodeWatch
from kube32.sim.controlplane import ControlPlane, ControlPlaneOptions
from kube32.terms import Annotation, Condition, KubeletScheme

FACTS = NodeFacts("n", "127.0.0.1", 1, "devkit", 512 << 10, 0, (), 16, False, 5.0, "boot", "pwasm://0.2a0")


def in_loop(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def _held(status: dict[str, Any], annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n", "resourceVersion": "5", "annotations": annotations or {}},
            "status": copy.deepcopy(status)}


def test_an_unchanged_status_differs_in_nothing_but_its_times() -> None:
    transitions: dict[str, tuple[str, str]] = {}
    held = _held(node_status(FACTS, 200 << 10, True, transitions))
    for c in held["status"]["conditions"]:
        c["lastHeartbeatTime"] = c["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    assert status_differs(held, node_status(FACTS, 200 << 10, True, transitions)) is None
    assert status_differs(None, node_status(FACTS, 200 << 10)) is not None


def test_a_condition_marked_unknown_or_a_changed_field_differs() -> None:
    status = node_status(FACTS, 200 << 10)
    unknown = _held(status)
    for c in unknown["status"]["conditions"]:
        c.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.")
    assert status_differs(unknown, status) == "MemoryPressure is Unknown, not False"
    ready_only = _held(status)
    ready_only["status"]["conditions"] = [c for c in ready_only["status"]["conditions"] if c["type"] != "Ready"]
    assert status_differs(ready_only, status) == "Ready is missing, not True"
    fewer = _held(status)
    fewer["status"]["allocatable"]["pods"] = "8"
    assert status_differs(fewer, status) == "its allocatable changed"
    moved = _held(status)
    moved["status"]["addresses"][0]["address"] = "127.0.0.9"
    assert status_differs(moved, status) == "its addresses changed"
    # The free heap is in MemoryPressure's message: a changed heap is a change.
    assert status_differs(_held(node_status(FACTS, 100 << 10)), status) == "MemoryPressure's reason or message changed"


def test_the_annotations_written_are_those_the_server_does_not_show() -> None:
    owned = owned_annotations(FACTS, 4096, KubeletScheme.HTTPS)
    assert owned[Annotation.KUBELET_SCHEME] == KubeletScheme.HTTPS
    assert owned[Annotation.INTERP_MOPS_MEASURED_ON] is None   # not measured: must not be there
    assert annotations_to_write(None, owned) == owned
    shown = {k: v for k, v in owned.items() if v is not None}
    assert annotations_to_write(_held({}, shown), owned) == {}
    assert annotations_to_write(_held({}, {**shown, Annotation.FREE_HEAP: "1"}), owned) == {
        Annotation.FREE_HEAP: "4096"}
    stale = {**shown, Annotation.INTERP_MOPS_MEASURED_ON: "abc", "other": "kept"}
    assert annotations_to_write(_held({}, stale), owned) == {Annotation.INTERP_MOPS_MEASURED_ON: None}


def test_a_node_watch_answers_the_newer_of_its_copy_and_an_own_write() -> None:
    watch = NodeWatch("n")
    assert watch.held("n") is None   # never listed: not known
    woken: list[str] = []
    watch.follow("n", lambda: woken.append("n"))
    watch.follow("m", lambda: woken.append("m"))
    watch.wrote({"metadata": {"name": "n", "resourceVersion": "7"}})
    # Followers are called by name: an event of "n" wakes n's kubelet alone.
    watch._on_event("MODIFIED", {"metadata": {"name": "n", "resourceVersion": "6"}}, None)  # noqa: SLF001 - the handler
    assert woken == ["n"]
    watch.forget("m")
    watch._on_event("MODIFIED", {"metadata": {"name": "m", "resourceVersion": "8"}}, None)  # noqa: SLF001
    assert woken == ["n"]


async def _status_patches(kl: Kubelet) -> list[dict[str, Any]]:
    """Every status patch ``kl`` sends from now on (the list fills as it sends)."""
    sent: list[dict[str, Any]] = []
    real = kl.client.patch

    async def counted(res, name, body, *args, **kwargs):
        if res is NODES and kwargs.get("subresource") == "status":
            sent.append(body)
        return await real(res, name, body, *args, **kwargs)
    kl.client.patch = counted  # type: ignore[method-assign]
    return sent


async def _mark_unknown(admin: Client, name: str) -> None:
    """What the node lifecycle does to a node it has not heard from."""
    node = await admin.get(NODES, name)
    conditions = []
    for c in objects.status(node).get("conditions") or []:
        conditions.append({**c, "status": "Unknown", "reason": "NodeStatusUnknown",
                           "message": "Kubelet stopped posting node status."})
    await admin.patch(NODES, name, {"status": {"conditions": conditions}}, subresource="status")


def _known(watch: NodeWatch, *names: str):
    async def known() -> bool:
        return all(watch.held(n) is not None for n in names)
    return known


def _options(name: str) -> KubeletOptions:
    return KubeletOptions(node_name=name, interp_mops=1.0, heap_bytes=8 << 20, lease_interval=0.3,
                          status_interval=0.3, status_report_seconds=300.0)


@in_loop
async def test_a_kubelet_skips_unchanged_reports_and_puts_back_what_the_server_lost(tmp_path: Path) -> None:
    cp = ControlPlane(ControlPlaneOptions(data_dir=tmp_path / "cp", port=0))
    await cp.start()
    assert cp.kubeconfig is not None
    admin = Client.from_kubeconfig(cp.kubeconfig)
    kl = Kubelet(Client.from_kubeconfig(tmp_path / "cp" / "node.kubeconfig"), _options("unit-s"))
    try:
        await kl.start()
        sent = await _status_patches(kl)
        await until(_known(kl.node_watch, "unit-s"), 10, what="its Node watched")
        await asyncio.sleep(0.5)
        lease0 = (await admin.get(LEASES, "unit-s", "kube-node-lease"))["spec"]["renewTime"]
        before = len(sent)
        await asyncio.sleep(2.0)   # six status periods: nothing changed, nothing written
        assert len(sent) == before
        lease1 = (await admin.get(LEASES, "unit-s", "kube-node-lease"))["spec"]["renewTime"]
        assert lease1 != lease0   # the Lease is the heartbeat

        await _mark_unknown(admin, "unit-s")

        async def ready_again() -> bool:
            node = await admin.get(NODES, "unit-s")
            return objects.condition_status(node, Condition.READY) == "True" and \
                objects.condition_status(node, Condition.MEMORY_PRESSURE) == "False"
        await until(ready_again, 3, what="Ready=True put back by the kubelet")
        node = await admin.get(NODES, "unit-s")
        ready = objects.condition(node, Condition.READY) or {}
        assert ready["reason"] == "KubeletReady"
        assert ready["lastTransitionTime"] >= ready["lastHeartbeatTime"][:19]   # it transitioned again, now

        # An annotation it owns, removed: written back, and the status left alone.
        written = len(sent)
        await admin.patch(NODES, "unit-s", {"metadata": {"annotations": {Annotation.INTERP_MOPS: None}}})

        async def annotated() -> bool:
            return objects.annotations(await admin.get(NODES, "unit-s")).get(Annotation.INTERP_MOPS) == "1.00"
        await until(annotated, 3, what="its interp-mops annotation back")
        assert len(sent) == written
    finally:
        await kl.stop()
        await kl.client.close()
        await admin.close()
        await cp.stop()


@in_loop
async def test_a_fleets_shared_watch_wakes_each_node_for_its_own_node(tmp_path: Path) -> None:
    """Two kubelets on one NodeWatch of every Node (as a fleet's): one node marked Unknown is
    put back by its own kubelet; the watch moved to the other node's credentials goes on."""
    cp = ControlPlane(ControlPlaneOptions(data_dir=tmp_path / "cp", port=0))
    await cp.start()
    assert cp.kubeconfig is not None
    admin = Client.from_kubeconfig(cp.kubeconfig)
    shared = NodeWatch()
    kubelets = [Kubelet(Client.from_kubeconfig(tmp_path / "cp" / "node.kubeconfig"), _options(n), node_watch=shared)
                for n in ("unit-t", "unit-u")]
    try:
        for kl in kubelets:
            await kl.start()
        t, u = kubelets
        shared.start(t.client.sibling(pool=1))
        await until(_known(shared, "unit-t", "unit-u"), 10, what="both Nodes watched")
        await asyncio.sleep(0.5)
        sent_t, sent_u = await _status_patches(t), await _status_patches(u)

        async def ready(name: str) -> bool:
            return objects.condition_status(await admin.get(NODES, name), Condition.READY) == "True"
        await _mark_unknown(admin, "unit-u")
        await until(lambda: ready("unit-u"), 3, what="unit-u Ready again")
        assert sent_u and not sent_t

        shared.start(u.client.sibling(pool=1))   # unit-t stops watching for the fleet
        await asyncio.sleep(0.5)
        await _mark_unknown(admin, "unit-t")
        await until(lambda: ready("unit-t"), 3, what="unit-t Ready again, read through unit-u's watch")
    finally:
        for kl in kubelets:
            await kl.stop()
            await kl.client.close()
        await shared.stop()
        await admin.close()
        await cp.stop()


def test_the_lease_keeps_its_cadence_and_a_failed_renewal_is_tried_again_soon() -> None:
    """Issue 25: at 1,000 nodes starting 10,000 pods, renewals that took seconds pushed the
    next ones back, and 46 nodes went Unknown with a 20 s grace.  The next renewal is due
    an interval after the last began; a failed one is tried again after 0.2 s."""
    import time

    from kube32.client import ApiError
    kubelet = Kubelet.__new__(Kubelet)
    kubelet.options = KubeletOptions(node_name="cadence", interp_mops=1.0, lease_interval=1.0)
    calls: list[float] = []

    async def renew(name: str) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            await asyncio.sleep(0.6)       # a slow renewal
        elif len(calls) == 2:
            raise ApiError(503, "ServiceUnavailable", "busy")

    kubelet._renew_lease = renew  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(kubelet._lease_loop())
        await asyncio.sleep(1.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(main())
    assert len(calls) >= 3
    assert 0.9 <= calls[1] - calls[0] <= 1.25, calls  # not 1.6: the interval (+4% jitter) counts from the start
    assert 0.15 <= calls[2] - calls[1] <= 0.45, calls  # the failed one again soon
