"""The hold queue's bounds and bookkeeping on a real registry, with the kubelet faked
(kube32.apiserver.hold): a full queue refuses with the request's own 503, a client that
goes away frees its pod for the next request, a target with nothing left to wait for
answers at once; and the annotation and ``Prefer: wait`` readings (kube32.holding)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from kube32 import holding
from kube32.apiserver import errors, hold
from kube32.apiserver.proxy import Unreached
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.apiserver.selectors import parse_label_selector
from kube32.store import SQLiteStore

PODS = by_plural("pods")


class Upstream:
    """What :meth:`KubeletProxy.send` returns, as much as the hold queue reads."""

    def __init__(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.status, self.headers, self.body = status, headers or {}, body
        self.content = self

    async def read(self, n: int = -1) -> bytes:
        return self.body

    def release(self) -> None:
        pass


FROZEN = {"Retry-After": "1", holding.NOT_STARTED: holding.FROZEN}


async def set_ready(reg: Registry, name: str, ready: bool) -> None:
    def fn(pod: dict) -> dict:
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
        return pod
    await reg.mutate(PODS, "default", name, fn, subresource="status")


def with_holds(tmp_path: Path, body: Callable[[Registry, hold.Holds, hold.Target], Awaitable[None]]) -> None:
    async def go() -> None:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            await reg.create(PODS, "default", {"apiVersion": "v1", "kind": "Pod",
                                               "metadata": {"name": "p1", "labels": {"app": "a"}},
                                               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
            await set_ready(reg, "p1", True)
            holds = hold.Holds(reg)
            svc = {"metadata": {"name": "svc", "namespace": "default", "uid": "u"}}
            target = hold.Target("Service", "default", "svc", parse_label_selector("app=a"), None, svc)
            try:
                await asyncio.wait_for(body(reg, holds, target), 20)
            finally:
                await holds.close()
        finally:
            await store.close()
    asyncio.run(go())


class Pod:
    """The faked pod: refuses while frozen; else answers, or blocks while ``gate`` is clear."""

    def __init__(self) -> None:
        self.frozen = True
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent: list[str] = []
        self.orders: list[str] = []   # the ORDER header of each request the pod was sent

    def send(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def send(pod: dict, headers: dict[str, str] | None = None) -> Upstream:
            self.orders.append((headers or {}).get(holding.ORDER, ""))
            if self.frozen:
                return Upstream(503, dict(FROZEN), b"frozen\n")
            self.sent.append(name)
            await self.gate.wait()
            return Upstream(200, {}, name.encode())
        return send


async def relay(upstream: Any) -> Any:
    return upstream


def no_pod() -> errors.APIError:
    return errors.service_unavailable("no endpoints", retry_after=1)


def test_a_full_queue_refuses_with_the_503_the_request_had(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hold, "MAX_QUEUED", 2)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        tasks = []
        for i in range(3):
            tasks.append(asyncio.ensure_future(holds.serve(target, 10, 0, pod.send(f"r{i}"), relay, no_pod)))
            await asyncio.sleep(0.05)
        refused = tasks[2].result()
        assert (refused.status, refused.body, refused.headers[holding.NOT_STARTED]) == (503, b"frozen\n", "frozen")
        assert not tasks[0].done() and not tasks[1].done()
        assert (holds.stats.held, holds.stats.not_holdable) == (2, 1)
        pod.frozen = False
        await set_ready(reg, "p1", True)   # a change of the pod wakes the queue
        answers = await asyncio.gather(*tasks[:2])
        assert [a.body for a in answers] == [b"r0", b"r1"] and pod.sent == ["r0", "r1"]
        assert (holds.stats.sent, holds.stats.timed_out, holds.bytes_held) == (2, 0, 0)
        assert holds.by_target[target.key].sent == 2
    with_holds(tmp_path, body)


@pytest.mark.parametrize("window", [1, 16])
def test_held_requests_go_first_come_first_and_none_overtakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              window: int) -> None:
    """Handed to the pod in the order they came, up to the window in flight; one that
    comes once the pod can take requests again goes after them."""
    monkeypatch.setattr(hold, "WINDOW", window)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        tasks = []
        for i in range(5):
            tasks.append(asyncio.ensure_future(holds.serve(target, 10, 0, pod.send(f"r{i}"), relay, no_pod)))
            await asyncio.sleep(0.02)
        pod.frozen = False                 # the pod runs again; its status does not say so yet
        tasks.append(asyncio.ensure_future(holds.serve(target, 10, 0, pod.send("late"), relay, no_pod)))
        await asyncio.sleep(0.02)
        assert pod.sent == [], "the late one waits behind the held ones"
        await set_ready(reg, "p1", True)
        answers = await asyncio.gather(*tasks)
        assert pod.sent == ["r0", "r1", "r2", "r3", "r4", "late"]
        assert [a.body for a in answers] == [b"r0", b"r1", b"r2", b"r3", b"r4", b"late"]
    with_holds(tmp_path, body)


def test_a_pod_takes_at_most_the_window_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hold, "WINDOW", 3)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        tasks = [asyncio.ensure_future(holds.serve(target, 10, 0, pod.send(f"r{i}"), relay, no_pod))
                 for i in range(5)]
        await asyncio.sleep(0.05)
        pod.frozen = False
        pod.gate.clear()
        await set_ready(reg, "p1", True)
        # r0 probes the pod that refused: the others wait until it answers or has been in
        # flight PROBE_WAIT s (the pod took it); then up to the window
        for _ in range(300):
            if len(pod.sent) == 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert pod.sent == ["r0", "r1", "r2"], "two wait for one of the three to be answered"
        pod.gate.set()
        await asyncio.gather(*tasks)
        assert pod.sent == [f"r{i}" for i in range(5)]
    with_holds(tmp_path, body)


def test_a_request_a_probed_pod_sends_back_is_not_overtaken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24's order: p1 refuses (slowly); while the first held request probes it, a
    replacement p2 turns Ready and a new request comes.  p2 gets them all in arrival
    order: neither the new one nor those behind the probe go ahead of it."""
    monkeypatch.setattr(hold, "RETRY_REFUSED", 0.2)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        to_p2: list[str] = []
        probes: list[str] = []

        def send(name: str) -> Callable[..., Awaitable[Any]]:
            async def go(pod: dict, headers: dict[str, str] | None = None) -> Upstream:
                if pod["metadata"]["name"] == "p1":
                    probes.append(name)
                    await asyncio.sleep(0.3)   # a refusal that takes a while to come back
                    return Upstream(503, dict(FROZEN), b"frozen\n")
                to_p2.append(name)
                return Upstream(200, {}, name.encode())
            return go
        tasks = []
        for i in range(5):
            tasks.append(asyncio.ensure_future(holds.serve(target, 10, 0, send(f"r{i}"), relay, no_pod)))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.35)              # all refused once; held
        n = len(probes)
        for _ in range(100):                   # the retry: one probe, not the window
            if len(probes) > n:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert probes[n:] == ["r0"], probes
        await reg.create(PODS, "default", {"apiVersion": "v1", "kind": "Pod",
                                           "metadata": {"name": "p2", "labels": {"app": "a"}},
                                           "spec": {"nodeName": "n2", "containers": [{"name": "c", "image": "x"}]}})
        await set_ready(reg, "p2", True)
        tasks.append(asyncio.ensure_future(holds.serve(target, 10, 0, send("late"), relay, no_pod)))
        answers = await asyncio.gather(*tasks)
        assert to_p2 == ["r0", "r1", "r2", "r3", "r4", "late"]
        assert [a.body for a in answers] == [b"r0", b"r1", b"r2", b"r3", b"r4", b"late"]
    with_holds(tmp_path, body)


def test_the_bytes_of_held_bodies_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace holds at most its share (1/SHARES) of the server's bytes."""
    monkeypatch.setattr(hold, "MAX_TOTAL_BYTES", 1000 * hold.SHARES)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        first = asyncio.ensure_future(holds.serve(target, 10, 600, pod.send("a"), relay, no_pod))
        await asyncio.sleep(0.05)
        second = await holds.serve(target, 10, 600, pod.send("b"), relay, no_pod)
        assert second.status == 503 and holds.stats.not_holdable == 1 and holds.bytes_held == 600
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert holds.bytes_held == 0 and holds.stats.gone == 1
    with_holds(tmp_path, body)


def test_a_client_that_goes_away_frees_its_pod_for_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hold, "WINDOW", 1)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        a = asyncio.ensure_future(holds.serve(target, 10, 0, pod.send("a"), relay, no_pod))
        await asyncio.sleep(0.05)
        b = asyncio.ensure_future(holds.serve(target, 10, 0, pod.send("b"), relay, no_pod))
        c = asyncio.ensure_future(holds.serve(target, 10, 0, pod.send("c"), relay, no_pod))
        await asyncio.sleep(0.05)
        pod.frozen = False
        pod.gate.clear()                   # "a" reaches the pod and hangs there
        await set_ready(reg, "p1", True)
        for _ in range(100):
            if pod.sent:
                break
            await asyncio.sleep(0.01)
        assert pod.sent == ["a"], "a window of one: b waits for a's answer"
        b.cancel()                         # b's client goes away while it waits its turn
        a.cancel()                         # a's client goes away while the pod has it
        await asyncio.gather(a, b, return_exceptions=True)
        pod.gate.set()
        assert (await c).body == b"c" and pod.sent == ["a", "c"]
        assert holds.stats.gone == 2
        for _ in range(100):
            if not holds.queues:
                break
            await asyncio.sleep(0.01)
        assert not holds.queues, "a queue with nothing held ends"
    with_holds(tmp_path, body)


def test_a_target_with_nothing_left_to_wait_for_answers_at_once(tmp_path: Path) -> None:
    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        task = asyncio.ensure_future(holds.serve(target, 10, 0, pod.send("a"), relay, no_pod))
        await asyncio.sleep(0.1)
        assert not task.done()
        await reg.delete(PODS, "default", "p1", options={"gracePeriodSeconds": 0})
        answer = await asyncio.wait_for(task, 3)
        assert answer.status == 503 and answer.body == b"frozen\n" and holds.stats.timed_out == 1
    with_holds(tmp_path, body)


def test_a_namespace_takes_at_most_its_share_of_held_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many targets one namespace holds for, it takes at most 1/SHARES of the room;
    another namespace still finds room."""
    monkeypatch.setattr(hold, "MAX_TOTAL_QUEUED", 2 * hold.SHARES)

    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        tasks = [asyncio.ensure_future(holds.serve(target, 10, 0, pod.send(f"r{i}"), relay, no_pod))
                 for i in range(3)]
        await asyncio.sleep(0.1)
        assert tasks[2].done() and tasks[2].result().status == 503 and not tasks[0].done()
        share = hold.NamespaceShare(4)
        assert await share.take("a", 1) and not await share.take("a", 1) and await share.take("b", 1)
        for t in tasks[:2]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert holds.count_room.used == 0
    with_holds(tmp_path, body)


def _service_target(svc: dict) -> hold.Target:
    return hold.Target("Service", "default", "svc", None, None, svc)


async def _make_service(reg: Registry, selector: dict) -> dict:
    return await reg.create(by_plural("services"), "default", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
        "spec": {"selector": selector, "ports": [{"port": 80}]}})


def test_a_service_hold_follows_its_selector_and_its_deletion(tmp_path: Path) -> None:
    async def body(reg: Registry, holds: hold.Holds, _: hold.Target) -> None:
        svc = await _make_service(reg, {"app": "a"})
        target = _service_target(svc)
        frozen, running = Pod(), Pod()
        running.frozen = False

        async def send(p: dict, headers: dict[str, str] | None = None) -> Any:   # p1 is frozen, p2 answers
            return await (running if p["metadata"]["name"] == "p2" else frozen).send(p["metadata"]["name"])(p, headers)
        first = asyncio.ensure_future(holds.serve(target, 10, 0, send, relay, no_pod))
        await asyncio.sleep(0.1)
        assert not first.done()
        await reg.create(PODS, "default", {"apiVersion": "v1", "kind": "Pod",
                                           "metadata": {"name": "p2", "labels": {"app": "b"}},
                                           "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
        await set_ready(reg, "p2", True)
        second = asyncio.ensure_future(holds.serve(target, 10, 0, send, relay, no_pod))
        await asyncio.sleep(0.1)
        assert not first.done() and not second.done(), "p2 is not the Service's yet"
        svc = await reg.get(by_plural("services"), "default", "svc")
        svc["spec"]["selector"] = {"app": "b"}
        await reg.update(by_plural("services"), "default", "svc", svc)
        answers = await asyncio.wait_for(asyncio.gather(first, second), 3)
        assert [getattr(a, "body", None) for a in answers] == [b"p2", b"p2"]

        third = asyncio.ensure_future(holds.serve(target, 10, 0, frozen.send("c"), relay, no_pod))
        await asyncio.sleep(0.1)
        await reg.delete(by_plural("services"), "default", "svc")
        with pytest.raises(errors.APIError) as e:
            await asyncio.wait_for(third, 3)
        assert e.value.code == 404
    with_holds(tmp_path, body)


def test_a_pod_whose_kubelet_is_gone_and_no_move_ends_the_hold(tmp_path: Path) -> None:
    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        async def gone(pod: dict, headers: dict[str, str] | None = None) -> Any:
            raise Unreached("error trying to reach the kubelet: connection refused")
        task = asyncio.ensure_future(holds.serve(target, 10, 0, gone, relay, no_pod))
        with pytest.raises(errors.APIError) as e:
            await asyncio.wait_for(task, 3)
        assert e.value.code == 503 and e.value.headers.get("Retry-After") == "1"
    with_holds(tmp_path, body)


def test_stopping_answers_every_held_request_503_with_retry_after(tmp_path: Path) -> None:
    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        tasks = [asyncio.ensure_future(holds.serve(target, 10, 0, pod.send(f"r{i}"), relay, no_pod))
                 for i in range(2)]
        await asyncio.sleep(0.1)
        holds.stop_holding()
        for t in tasks:
            with pytest.raises(errors.APIError) as e:
                await asyncio.wait_for(t, 2)
            assert e.value.code == 503 and e.value.headers.get("Retry-After") == "1"
            assert "stopping" in e.value.message
    with_holds(tmp_path, body)


def test_the_bound_and_the_wait_preference_are_read_strictly() -> None:
    assert holding.hold_seconds(None) == holding.DEFAULT_HOLD_SECONDS == 10
    assert holding.hold_seconds({"kube32.io/hold-requests": "2500ms"}) == 2.5
    assert holding.hold_seconds({"kube32.io/hold-requests": "3"}) == 3
    assert holding.hold_seconds({"kube32.io/hold-requests": "0"}) == 0
    assert holding.hold_seconds({"kube32.io/hold-requests": "soon"}) == 10   # stored before it was checked
    assert holding.parse_hold("1.5s") == 1.5 and holding.parse_hold("1m") == 60 and holding.parse_hold(" 10 ") == 10
    # huge values (issue 24's attack round: 400 nines were a 500 OverflowError): ValueError only
    assert holding.hold_seconds({"kube32.io/hold-requests": "9" * 400 + "ms"}) == 10
    for bad, why in (("soon", "is not a duration"), ("61s", "more than the longest hold"), ("-1", "not a duration"),
                     ("9" * 400, "at most 32 characters"), ("9" * 400 + "ms", "at most 32 characters"),
                     ("9" * 12 + "ms", "more than the longest hold"), ("9" * 13, "not a duration"),
                     ("1e3", "not a duration"), ("inf", "not a duration"), ("nan", "not a duration"),
                     ("-0", "not a duration"), ("0." + "0" * 10 + "1", "not a duration")):
        with pytest.raises(ValueError, match=why):
            holding.parse_hold(bad)
    assert holding.prefer_wait(["respond-async, wait=5"]) == 5
    assert holding.prefer_wait(["wait=100000"]) == holding.MAX_HOLD_SECONDS
    assert holding.prefer_wait(["wait=soon"]) is None
    assert holding.prefer_wait(["handling=strict", "Wait = 2"]) == 2
    assert holding.prefer_wait([]) is None


def test_held_requests_are_numbered_per_pod_in_arrival_order(tmp_path: Path) -> None:
    """The hold numbers what it sends each pod (holding.ORDER) in arrival order, a refused
    request again when it is sent again; a request sent straight on carries no number."""
    async def body(reg: Registry, holds: hold.Holds, target: hold.Target) -> None:
        pod = Pod()
        tasks = []
        for i in range(4):
            tasks.append(asyncio.ensure_future(holds.serve(target, 10, 0, pod.send(f"r{i}"), relay, no_pod)))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        pod.frozen = False
        await set_ready(reg, "p1", True)
        await asyncio.gather(*tasks)
        assert pod.sent == ["r0", "r1", "r2", "r3"]
        numbered = [holding.parse_order(o) for o in pod.orders if o]
        assert pod.orders[0] == "" and all(numbered)   # r0 was tried straight on first
        streams = {o[0] for o in numbered if o}
        assert len(streams) == 1
        ns = [o[1] for o in numbered if o]
        assert ns == list(range(len(ns))), ns   # 0, 1, 2, ... in the order they were sent
        await holds.serve(target, 10, 0, pod.send("after"), relay, no_pod)
        assert pod.orders[-1] == ""   # nothing held: straight on, no number, no wait
    with_holds(tmp_path, body)


def test_the_kubelet_lets_numbered_requests_in_by_number() -> None:
    """kube32.kubelet.ordering: requests of one stream that come shuffled go in by number;
    one lost on its way is waited for at most the bound; unnumbered ones never wait."""
    from kube32.kubelet.ordering import OrderGate

    async def go() -> None:
        gate = OrderGate(wait=0.3)
        into: list[int] = []

        async def request(n: int | None, delay: float) -> None:
            await asyncio.sleep(delay)
            value = None if n is None else holding.order_value("ab12", n)
            async with gate.turn("default", "p", value):
                into.append(-1 if n is None else n)
        arrivals = [(3, 0.0), (1, 0.01), (None, 0.02), (0, 0.05), (2, 0.06), (4, 0.07)]
        await asyncio.gather(*(request(n, d) for n, d in arrivals))
        assert into == [-1, 0, 1, 2, 3, 4]
        loop = asyncio.get_running_loop()
        start = loop.time()
        await request(6, 0)   # 5 never comes
        assert 0.25 < loop.time() - start < 1.0 and into[-1] == 6
        await request(5, 0)   # late: in at once
        assert into[-1] == 5
        assert holding.parse_order("ab12:" + "9" * 13) is None and holding.parse_order("x" * 100) is None
        assert holding.parse_order("AB:1") is None and holding.parse_order(None) is None
    asyncio.run(asyncio.wait_for(go(), 10))
