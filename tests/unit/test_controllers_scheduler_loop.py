"""The scheduler's control loop against fakes: creation order, counting its own bindings,
the FailedScheduling report and its de-duplication."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.client import ApiError
from kube32.controllers.base import ControllerContext, ControllerOptions
from kube32.controllers.scheduler import PASS, Scheduler


class FakeInformer:
    def __init__(self, objs: list[dict]) -> None:
        self.cache = {o["metadata"]["name"]: o for o in objs}
        self.handlers: list = []

    def add_handler(self, h) -> None:
        self.handlers.append(h)

    def list(self) -> list[dict]:
        return list(self.cache.values())

    def get(self, key: str) -> dict | None:
        return self.cache.get(key)


class FakeInformers:
    def __init__(self, pods: FakeInformer, nodes: FakeInformer) -> None:
        self.by_plural = {"pods": pods, "nodes": nodes}

    def get(self, kind) -> FakeInformer:
        return self.by_plural[kind.plural]


class FakeClient:
    def __init__(self) -> None:
        self.bindings: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.conditions: list[tuple[str, dict]] = []
        self.refuse: set[str] = set()

    async def create(self, kind, obj: dict, namespace: str | None = None, subresource_of: str | None = None,
                     subresource: str | None = None) -> dict:
        if kind.plural == "events":
            self.events.append((obj["involvedObject"]["name"], obj["reason"], obj["message"]))
            return obj
        assert subresource == "binding"
        if subresource_of in self.refuse:
            raise ApiError(409, "Conflict", "already assigned")
        self.bindings.append((subresource_of, obj["target"]["name"]))
        return {}

    async def patch(self, kind, name: str, patch: Any, namespace: str | None = None, **kw) -> dict:
        self.conditions.append((name, patch["status"]["conditions"][0]))
        return {}


def node(name: str, memory: str) -> dict:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"allocatable": {"memory": memory, "pods": "10"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, created: str, memory: str) -> dict:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}", "creationTimestamp": created},
            "spec": {"schedulerName": "default-scheduler",
                     "containers": [{"name": "c", "resources": {"requests": {"memory": memory}}}]},
            "status": {"phase": "Pending"}}


def make(pods: list[dict], nodes: list[dict]) -> tuple[Scheduler, FakeClient]:
    client = FakeClient()
    ctx = ControllerContext(client, FakeInformers(FakeInformer(pods), FakeInformer(nodes)),  # type: ignore[arg-type]
                            ControllerOptions(), None)  # type: ignore[arg-type]
    return Scheduler(ctx), client


def test_pods_are_bound_in_creation_order_and_each_binding_counts() -> None:
    # Room for two 64Ki pods; the oldest two get it whatever their names, the third waits.
    pods = [pod("c-newest", "2026-01-01T00:00:03Z", "64Ki"), pod("a-oldest", "2026-01-01T00:00:01Z", "64Ki"),
            pod("b-middle", "2026-01-01T00:00:02Z", "64Ki")]
    sched, client = make(pods, [node("n1", "128Ki")])
    asyncio.run(sched.sync(PASS))
    assert client.bindings == [("a-oldest", "n1"), ("b-middle", "n1")]
    assert ("c-newest", "FailedScheduling", "0/1 nodes are available: 1 Insufficient memory.") in client.events
    assert ("a-oldest", "Scheduled", "Successfully assigned default/a-oldest to n1") in client.events
    cond = dict(client.conditions)["c-newest"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")

    # A second pass (the cache has not caught up) binds nothing twice and reports nothing twice.
    asyncio.run(sched.sync(PASS))
    assert len(client.bindings) == 2
    assert sum(1 for e in client.events if e[1] == "FailedScheduling") == 1


def test_a_pod_bound_by_someone_else_is_skipped() -> None:
    sched, client = make([pod("p", "2026-01-01T00:00:01Z", "1Ki")], [node("n1", "1Mi")])
    client.refuse.add("p")
    asyncio.run(sched.sync(PASS))
    assert client.bindings == [] and not client.events


def test_events_on_nodes_and_pending_pods_request_a_pass() -> None:
    sched, _ = make([], [node("n1", "1Mi")])
    sched.setup()
    pods_inf, nodes_inf = sched.pods, sched.nodes
    nodes_inf.handlers[0]("MODIFIED", node("n1", "1Mi"), None)
    assert len(sched.queue) == 1
    sched.queue = type(sched.queue)()
    bound = pod("q", "2026-01-01T00:00:01Z", "1Ki")
    bound["spec"]["nodeName"] = "n1"
    pods_inf.handlers[0]("MODIFIED", bound, bound)
    assert len(sched.queue) == 0          # a running pod changing is no reason for a pass
    pods_inf.handlers[0]("DELETED", bound, bound)
    assert len(sched.queue) == 1          # a pod leaving frees room


def _bound(name: str, node_name: str) -> dict:
    p = pod(name, "2026-01-01T00:00:00Z", "1Ki")
    p["spec"]["nodeName"] = node_name
    p["status"]["phase"] = "Running"
    return p


def big_node(name: str) -> dict:
    n = node(name, "64Mi")
    n["status"]["allocatable"]["pods"] = "1000"
    return n


def test_a_status_report_asks_for_no_pass_and_a_pass_does_not_sum_every_pod() -> None:
    # Issue 25: a thousand nodes report status every 10 s; a pass summed every pod of the cluster.
    summed = []
    for per_node in (2, 200):
        nodes = [big_node(f"n{i}") for i in range(5)]
        bound = [_bound(f"p{i}-{j}", f"n{i}") for i in range(5) for j in range(per_node)]
        sched, client = make([], nodes)
        sched.setup()
        for p in bound:
            sched.pods.handlers[0]("ADDED", p, None)
        sched.queue = type(sched.queue)()
        report = big_node("n1")
        report["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:10Z"
        sched.nodes.handlers[0]("MODIFIED", report, big_node("n1"))
        assert len(sched.queue) == 0                # nothing a choice reads changed
        cordoned = big_node("n1")
        cordoned["spec"]["unschedulable"] = True
        sched.nodes.handlers[0]("MODIFIED", cordoned, big_node("n1"))
        assert len(sched.queue) == 1                # this could change a choice
        new = pod("new", "2026-01-01T00:00:05Z", "1Ki")
        sched.pods.handlers[0]("ADDED", new, None)
        asyncio.run(sched.sync(PASS))
        assert [b[0] for b in client.bindings] == ["new"], client.events
        summed.append(sched.by_node.summed)
        asyncio.run(sched.sync(PASS))              # nothing pending: nothing summed, nothing bound
        assert sched.by_node.summed == summed[-1] and len(client.bindings) == 1
    assert summed[0] == summed[1] == 5, summed      # once a node, whatever its pods
