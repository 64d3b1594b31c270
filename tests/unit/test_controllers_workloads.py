"""Workload controllers against an in-memory API whose watch events the test delivers.

The fake API applies writes at once but hands them to the informers only when
the test calls :meth:`FakeApi.deliver`, so the tests can look at a controller
while its own writes are "in flight" (the expectations), and inject events the
real API cannot produce on demand (a pod replaced in one write).
"""
from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from typing import Any

import pytest

from kube32.client import DAEMONSETS, DEPLOYMENTS, EVENTS, NODES, PODS, REPLICASETS, ApiError, Kind
from kube32 import objects
from kube32.controllers import podutil as pu
from kube32.controllers.base import ControllerContext, ControllerOptions, SharedInformers
from kube32.controllers.daemonset import DaemonSetController, node_eligibility, pin_to_node, target_node
from kube32.controllers.deployment import DeploymentController, resolve_fenceposts
from kube32.controllers.endpoints import desired_slices, desired_subsets, resolve_port
from kube32.controllers.replicaset import ReplicaSetController
from kube32.intstr import scaled_value

Obj = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class FakeApi:
    """Enough of the Client for the controllers; events wait in ``pending`` until delivered."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Obj] = {}
        self.pending: list[tuple[Kind, str, Obj]] = []
        self.calls: list[tuple[str, str, str]] = []  # (verb, plural, name)
        self.informers: SharedInformers | None = None
        self._rv = itertools.count(1)
        self._names = itertools.count(1)

    def _key(self, kind: Kind, ns: str | None, name: str) -> tuple[str, str]:
        return kind.plural, (f"{ns}/{name}" if kind.namespaced else name)

    def _stamp(self, obj: Obj) -> Obj:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None, **_: Any) -> Obj:
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        if kind.namespaced:
            md["namespace"] = namespace or md.get("namespace") or "default"
        if not md.get("name"):
            md["name"] = f"{md['generateName']}{next(self._names):05d}"
        key = self._key(kind, md.get("namespace"), md["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f"{md['name']} exists")
        md["uid"] = str(uuid.uuid4())
        md.setdefault("creationTimestamp", objects.rfc3339())
        md["generation"] = 1
        obj.setdefault("kind", kind.kind)
        self.objects[key] = obj
        self.calls.append(("create", kind.plural, md["name"]))
        out = self._stamp(obj)
        if kind is not EVENTS:
            self.pending.append((kind, "ADDED", out))
        return out

    async def patch(self, kind: Kind, name: str, patch: Any, namespace: str | None = None, *,
                    subresource: str | None = None, **_: Any) -> Obj:
        key = self._key(kind, namespace, name)
        if key not in self.objects:
            raise ApiError(404, "NotFound", name)
        obj = merge_patch(self.objects[key], patch)
        if subresource != "status" and obj.get("spec") != self.objects[key].get("spec"):
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        self.objects[key] = obj
        self.calls.append(("patch" + (f"/{subresource}" if subresource else ""), kind.plural, name))
        out = self._stamp(obj)
        if kind is not EVENTS:
            self.pending.append((kind, "MODIFIED", out))
        return out

    async def update(self, kind: Kind, obj: Obj, subresource: str | None = None) -> Obj:
        md = obj["metadata"]
        key = self._key(kind, md.get("namespace"), md["name"])
        self.objects[key] = copy.deepcopy(obj)
        self.calls.append(("update", kind.plural, md["name"]))
        out = self._stamp(self.objects[key])
        self.pending.append((kind, "MODIFIED", out))
        return out

    async def delete(self, kind: Kind, name: str, namespace: str | None = None, **_: Any) -> Obj:
        key = self._key(kind, namespace, name)
        if key not in self.objects:
            raise ApiError(404, "NotFound", name)
        obj = self.objects.pop(key)
        self.calls.append(("delete", kind.plural, name))
        self.pending.append((kind, "DELETED", copy.deepcopy(obj)))
        return obj

    async def try_get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        obj = self.objects.get(self._key(kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def deliver(self) -> None:
        """Hand every pending write to the informers, in order, as watch events."""
        assert self.informers is not None
        while self.pending:
            kind, etype, obj = self.pending.pop(0)
            inf = self.informers.get(kind)
            key = pu.pod_key(obj) if kind.namespaced else obj["metadata"]["name"]
            old = inf.cache.get(key)
            if etype == "DELETED":
                inf.cache.pop(key, None)
            else:
                inf.cache[key] = obj
            inf._emit(etype, obj, old)

    def put(self, kind: Kind, obj: Obj) -> Obj:
        """Store an object as if someone else wrote it, and deliver it."""
        obj = copy.deepcopy(obj)
        md = obj["metadata"]
        md.setdefault("uid", str(uuid.uuid4()))
        md.setdefault("creationTimestamp", objects.rfc3339())
        md.setdefault("generation", 1)
        if kind.namespaced:
            md.setdefault("namespace", "default")
        self.objects[self._key(kind, md.get("namespace"), md["name"])] = obj
        self.pending.append((kind, "ADDED", self._stamp(obj)))
        self.deliver()
        return obj

    def creates(self, plural: str = "pods") -> int:
        return sum(1 for v, p, _ in self.calls if v == "create" and p == plural)

    def deletes(self, plural: str = "pods") -> int:
        return sum(1 for v, p, _ in self.calls if v == "delete" and p == plural)

    def pods(self) -> list[Obj]:
        return [o for (plural, _), o in self.objects.items() if plural == "pods"]


def controller(cls: type, api: FakeApi):
    informers = SharedInformers(api)  # type: ignore[arg-type]
    api.informers = informers
    ctx = ControllerContext(api, informers, ControllerOptions(), None)  # type: ignore[arg-type]
    c = cls(ctx)
    c.setup()
    return c


def run(coro):
    return asyncio.run(coro)


TEMPLATE = {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "wasm://x/counter.wasm"}]}}


def replica_set(replicas: int = 3, name: str = "web-abc") -> Obj:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": copy.deepcopy(TEMPLATE)}}


def ready(pod: Obj, node: str | None = None) -> Obj:
    pod = copy.deepcopy(pod)
    pod["status"] = {"phase": "Running", "podIP": "127.0.0.1",
                     "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


# --- ReplicaSet ---------------------------------------------------------------------------
def test_replicaset_creates_from_template_and_waits_for_its_creates() -> None:
    async def go() -> None:
        api = FakeApi()
        rsc = controller(ReplicaSetController, api)
        rs = api.put(REPLICASETS, replica_set(3))
        await rsc.sync("default/web-abc")
        assert api.creates() == 3
        pod = api.pods()[0]
        assert pod["metadata"]["generateName"] == "web-abc-"
        assert pod["metadata"]["labels"] == {"app": "web"}
        (ref,) = pod["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                       "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        # The informer has not seen the pods yet: a second sync must not create again.
        await rsc.sync("default/web-abc")
        assert api.creates() == 3
        api.deliver()
        await rsc.sync("default/web-abc")
        assert api.creates() == 3 and len(api.pods()) == 3
        status = api.objects[("replicasets", "default/web-abc")]["status"]
        assert status["replicas"] == 3 and status["readyReplicas"] == 0 and status["observedGeneration"] == 1
    run(go())


def test_replicaset_replacement_in_one_write_is_still_one_pod() -> None:
    """Same name and owner, new uid, other node, as one MODIFIED event: no create, no delete."""
    async def go() -> None:
        api = FakeApi()
        rsc = controller(ReplicaSetController, api)
        api.put(REPLICASETS, replica_set(3))
        await rsc.sync("default/web-abc")
        api.deliver()
        pods = rsc.pod_informer.list()
        for p in pods:
            await api.patch(PODS, p["metadata"]["name"], {"status": ready(p, "sim-1")["status"],
                                                          "spec": {"nodeName": "sim-1"}}, "default")
        api.deliver()
        victim = rsc.pod_informer.list()[0]
        moved = copy.deepcopy(victim)
        moved["metadata"]["uid"] = str(uuid.uuid4())
        moved["spec"]["nodeName"] = "sim-2"
        moved["status"] = {"phase": "Pending"}
        api.objects[("pods", pu.pod_key(victim))] = moved
        api.pending.append((PODS, "MODIFIED", moved))
        api.deliver()
        before = list(api.calls)
        await rsc.sync("default/web-abc")
        assert api.creates() == 3 and api.deletes() == 0, api.calls[len(before):]
        assert rsc.expectations.satisfied("default/web-abc")
        status = api.objects[("replicasets", "default/web-abc")]["status"]
        assert status["replicas"] == 3 and status["readyReplicas"] == 2
    run(go())


def test_replicaset_deletes_the_least_valuable_pods_once() -> None:
    async def go() -> None:
        api = FakeApi()
        rsc = controller(ReplicaSetController, api)
        api.put(REPLICASETS, replica_set(4))
        await rsc.sync("default/web-abc")
        api.deliver()
        names = sorted(p["metadata"]["name"] for p in api.pods())
        for n in names[:3]:
            await api.patch(PODS, n, {"status": ready(api.objects[("pods", f"default/{n}")])["status"],
                                      "spec": {"nodeName": "sim-1"}}, "default")
        api.deliver()
        await api.patch(REPLICASETS, "web-abc", {"spec": {"replicas": 2}}, "default")
        api.deliver()
        await rsc.sync("default/web-abc")
        deleted = [n for v, p, n in api.calls if v == "delete"]
        assert len(deleted) == 2 and names[3] in deleted  # the unscheduled, not-ready one first
        # Deletes not yet observed: nothing more happens.
        await rsc.sync("default/web-abc")
        assert api.deletes() == 2
        api.deliver()
        await rsc.sync("default/web-abc")
        assert api.deletes() == 2 and api.creates() == 4 and len(api.pods()) == 2
    run(go())


def test_replicaset_adopts_orphans_and_ignores_terminating_pods() -> None:
    async def go() -> None:
        api = FakeApi()
        rsc = controller(ReplicaSetController, api)
        orphan = api.put(PODS, {"metadata": {"name": "stray", "labels": {"app": "web"}},
                                "spec": copy.deepcopy(TEMPLATE["spec"])})
        api.put(PODS, {"metadata": {"name": "going", "labels": {"app": "web"},
                                    "deletionTimestamp": objects.rfc3339()},
                       "spec": copy.deepcopy(TEMPLATE["spec"])})
        rs = api.put(REPLICASETS, replica_set(2))
        await rsc.sync("default/web-abc")
        adopted = api.objects[("pods", "default/stray")]
        assert pu.is_controlled_by(adopted, rs) and orphan["metadata"]["uid"] == adopted["metadata"]["uid"]
        assert not objects.controller_ref(api.objects[("pods", "default/going")])
        assert api.creates() == 1  # stray counts, the terminating pod does not
    run(go())


# --- Deployment -----------------------------------------------------------------------------
def deployment(replicas: int, image: str = "wasm://x/counter.wasm", surge: Any = "25%", unavailable: Any = "25%") -> Obj:
    t = copy.deepcopy(TEMPLATE)
    t["spec"]["containers"][0]["image"] = image
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}, "template": t,
                     "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                     "strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}}}


def test_fenceposts_round_as_kubernetes() -> None:
    assert resolve_fenceposts(deployment(3)) == (1, 0)
    assert resolve_fenceposts(deployment(10)) == (3, 2)
    assert resolve_fenceposts(deployment(3, surge=0, unavailable=0)) == (0, 1)
    assert resolve_fenceposts(deployment(5, surge=2, unavailable="50%")) == (2, 2)
    with pytest.raises(ValueError):
        scaled_value("lots", 3, True)


def set_rs_status(api: FakeApi, name: str, n: int) -> None:
    obj = api.objects[("replicasets", f"default/{name}")]
    obj["status"] = {"replicas": n, "readyReplicas": n, "availableReplicas": n,
                     "observedGeneration": obj["metadata"]["generation"]}
    api.pending.append((REPLICASETS, "MODIFIED", api._stamp(obj)))


def test_deployment_rolls_within_surge_and_unavailability() -> None:
    async def go() -> None:
        api = FakeApi()
        dc = controller(DeploymentController, api)
        d = api.put(DEPLOYMENTS, deployment(4))
        await dc.sync("default/web")
        api.deliver()
        (old,) = [o for (p, _), o in api.objects.items() if p == "replicasets"]
        h = old["metadata"]["labels"][pu.POD_TEMPLATE_HASH]
        assert old["metadata"]["name"] == f"web-{h}" and old["spec"]["replicas"] == 4
        assert old["spec"]["selector"]["matchLabels"] == {"app": "web", pu.POD_TEMPLATE_HASH: h}
        assert old["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
        set_rs_status(api, old["metadata"]["name"], 4)
        api.deliver()
        await dc.sync("default/web")
        api.deliver()
        st = api.objects[("deployments", "default/web")]["status"]
        assert {c["type"]: c["reason"] for c in st["conditions"]}["Progressing"] == "NewReplicaSetAvailable"

        # New image: surge 1 and unavailable 1 of 4.
        await api.patch(DEPLOYMENTS, "web", {"spec": {"template": deployment(4, "wasm://x/v2.wasm")["spec"]["template"]}},
                        "default")
        api.deliver()
        await dc.sync("default/web")
        api.deliver()
        sets = {o["metadata"]["name"]: o for (p, _), o in api.objects.items() if p == "replicasets"}
        new_name = next(n for n in sets if n != old["metadata"]["name"])
        assert sets[new_name]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
        assert sets[new_name]["spec"]["replicas"] == 1  # 4 + 1 surge - 4
        assert sets[old["metadata"]["name"]]["spec"]["replicas"] == 3  # 5 - 3 min available - 1 new unavailable
        # Nothing else moves until the new pod is available.
        await dc.sync("default/web")
        api.deliver()
        assert sets[new_name]["spec"]["replicas"] == 1
        for _ in range(10):
            total = sum(o["spec"]["replicas"] for (p, _), o in api.objects.items() if p == "replicasets")
            assert total <= 5
            for name in sets:
                set_rs_status(api, name, api.objects[("replicasets", f"default/{name}")]["spec"]["replicas"])
            api.deliver()
            await dc.sync("default/web")
            api.deliver()
        assert api.objects[("replicasets", f"default/{new_name}")]["spec"]["replicas"] == 4
        assert api.objects[("replicasets", f"default/{old['metadata']['name']}")]["spec"]["replicas"] == 0
        dep = api.objects[("deployments", "default/web")]
        assert dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
        assert dep["status"]["updatedReplicas"] == 4 and dep["status"]["availableReplicas"] == 4
        assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]
        assert d["metadata"]["uid"] == dep["metadata"]["uid"]
    run(go())


def test_deployment_rollback_reuses_the_old_set_and_history_is_limited() -> None:
    async def go() -> None:
        api = FakeApi()
        dc = controller(DeploymentController, api)
        d = deployment(1, surge=1, unavailable=0)
        d["spec"]["revisionHistoryLimit"] = 1
        api.put(DEPLOYMENTS, d)

        async def converge() -> None:
            for _ in range(6):
                api.deliver()
                await dc.sync("default/web")
                api.deliver()
                for (p, _), o in list(api.objects.items()):
                    if p == "replicasets":
                        set_rs_status(api, o["metadata"]["name"], o["spec"]["replicas"])

        def sets() -> dict[str, Obj]:
            return {o["spec"]["template"]["spec"]["containers"][0]["image"]: o
                    for (p, _), o in api.objects.items() if p == "replicasets"}

        def roll_to(image: str):
            return api.patch(DEPLOYMENTS, "web", {"spec": {"template": deployment(1, image)["spec"]["template"]}},
                             "default")
        await converge()
        await roll_to("wasm://x/v2.wasm")
        await converge()
        v1 = sets()["wasm://x/counter.wasm"]["metadata"]["uid"]
        await roll_to("wasm://x/counter.wasm")  # what kubectl rollout undo writes
        await converge()
        now = sets()
        assert now["wasm://x/counter.wasm"]["metadata"]["uid"] == v1  # the same set, not a new one
        assert now["wasm://x/counter.wasm"]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"
        assert now["wasm://x/counter.wasm"]["spec"]["replicas"] == 1 and now["wasm://x/v2.wasm"]["spec"]["replicas"] == 0
        await roll_to("wasm://x/v3.wasm")
        await converge()
        # revisionHistoryLimit 1: of the two idle old sets, only the newest (revision 3) stays.
        for o in sets().values():
            if o["spec"]["replicas"] == 0:
                o["status"] = {"replicas": 0}
        await converge()
        assert set(sets()) == {"wasm://x/counter.wasm", "wasm://x/v3.wasm"}
    run(go())


def test_deployment_recreate_waits_for_old_pods() -> None:
    async def go() -> None:
        api = FakeApi()
        dc = controller(DeploymentController, api)
        d = deployment(2)
        d["spec"]["strategy"] = {"type": "Recreate"}
        api.put(DEPLOYMENTS, d)
        await dc.sync("default/web")
        api.deliver()
        (old,) = [o for (p, _), o in api.objects.items() if p == "replicasets"]
        api.put(PODS, {"metadata": {"name": "old-pod", "labels": dict(old["spec"]["template"]["metadata"]["labels"]),
                                    "ownerReferences": [pu.owner_reference(old, "apps/v1", "ReplicaSet")]},
                       "spec": copy.deepcopy(TEMPLATE["spec"])})
        t = copy.deepcopy(d["spec"]["template"])
        t["spec"]["containers"][0]["image"] = "wasm://x/v2.wasm"
        await api.patch(DEPLOYMENTS, "web", {"spec": {"template": t}}, "default")
        api.deliver()
        await dc.sync("default/web")
        api.deliver()
        assert api.objects[("replicasets", f"default/{old['metadata']['name']}")]["spec"]["replicas"] == 0
        assert sum(1 for (p, _) in api.objects if p == "replicasets") == 1  # not before the old pod is gone
        await api.delete(PODS, "old-pod", "default")
        api.deliver()
        await dc.sync("default/web")
        sets = [o for (p, _), o in api.objects.items() if p == "replicasets"]
        assert sorted(o["spec"]["replicas"] for o in sets) == [0, 2]
    run(go())


def test_template_hash_is_stable_and_ignores_its_own_label() -> None:
    t = copy.deepcopy(TEMPLATE)
    h = pu.template_hash(t)
    t2 = copy.deepcopy(t)
    t2["metadata"]["labels"][pu.POD_TEMPLATE_HASH] = h
    assert pu.template_hash(t2) == h and len(h) == 10 and set(h) <= set(pu.SAFE_ALPHABET)
    assert pu.template_hash(t, 1) != h
    assert pu.templates_equal_ignoring_hash(t, t2)


# --- DaemonSet ----------------------------------------------------------------------------------
def node(name: str, labels: dict | None = None, taints: list | None = None) -> Obj:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


def test_daemon_node_eligibility() -> None:
    spec = {"nodeSelector": {"tier": "edge"}}
    assert node_eligibility(spec, node("a", {"tier": "edge"})) == (True, True)
    assert node_eligibility(spec, node("b", {"tier": "core"})) == (False, False)
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    assert node_eligibility({}, node("c", taints=[unreachable])) == (True, True)  # default toleration
    cordoned = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    assert node_eligibility({}, node("d", taints=[cordoned])) == (True, True)
    dedicated = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    assert node_eligibility({}, node("e", taints=[dedicated])) == (False, True)
    assert node_eligibility({"tolerations": [{"key": "dedicated", "value": "gpu"}]},
                            node("e", taints=[dedicated])) == (True, True)
    evict = {"key": "dedicated", "value": "x", "effect": "NoExecute"}
    assert node_eligibility({}, node("f", taints=[evict])) == (False, False)
    pinned = pin_to_node({"containers": []}, "n1")
    assert target_node({"spec": pinned}) == "n1"
    assert node_eligibility(pinned, node("n1")) == (True, True)
    assert node_eligibility(pinned, node("n2")) == (False, False)


def test_daemonset_covers_nodes_and_rolls_one_at_a_time() -> None:
    async def go() -> None:
        api = FakeApi()
        dsc = controller(DaemonSetController, api)
        for n in ("n1", "n2", "n3"):
            api.put(NODES, node(n))
        ds = api.put(DAEMONSETS, {"apiVersion": "apps/v1", "kind": "DaemonSet",
                                  "metadata": {"name": "agent", "namespace": "default"},
                                  "spec": {"selector": {"matchLabels": {"app": "web"}},
                                           "template": copy.deepcopy(TEMPLATE),
                                           "updateStrategy": {"type": "RollingUpdate",
                                                              "rollingUpdate": {"maxUnavailable": 1}}}})
        await dsc.sync("default/agent")
        await dsc.sync("default/agent")  # creates in flight: no duplicates
        api.deliver()
        assert sorted(target_node(p) for p in api.pods()) == ["n1", "n2", "n3"]
        for p in api.pods():
            await api.patch(PODS, p["metadata"]["name"], {"status": ready(p)["status"]}, "default")
        api.put(NODES, node("n4"))
        await dsc.sync("default/agent")
        api.deliver()
        assert sorted(target_node(p) for p in api.pods()) == ["n1", "n2", "n3", "n4"]
        await api.patch(PODS, next(p for p in api.pods() if target_node(p) == "n4")["metadata"]["name"],
                        {"status": ready({})["status"]}, "default")
        api.deliver()
        # New template: one node at a time.
        t = copy.deepcopy(TEMPLATE)
        t["spec"]["containers"][0]["image"] = "wasm://x/v2.wasm"
        await api.patch(DAEMONSETS, "agent", {"spec": {"template": t}}, "default")
        api.deliver()
        await dsc.sync("default/agent")
        assert api.deletes() == 1
        api.deliver()
        await dsc.sync("default/agent")
        api.deliver()
        assert len(api.pods()) == 4 and api.deletes() == 1  # the recreated pod is not available yet
        await dsc.sync("default/agent")  # status counts what the cache holds
        assert api.deletes() == 1
        st = api.objects[("daemonsets", "default/agent")]["status"]
        assert st["desiredNumberScheduled"] == 4 and st["updatedNumberScheduled"] == 1
        assert st["numberAvailable"] == 3
        assert ds["metadata"]["uid"]
    run(go())


# --- Endpoints ----------------------------------------------------------------------------------
SERVICE = {"metadata": {"name": "web", "namespace": "default", "uid": "svc-uid"},
           "spec": {"selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}


def svc_pod(name: str, is_ready: bool, terminating: bool = False) -> Obj:
    pod = {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {"app": "web"}},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
           "status": {"phase": "Running", "podIP": "127.0.0.1",
                      "conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}]}}
    if terminating:
        pod["metadata"]["deletionTimestamp"] = objects.rfc3339()
    return pod


def test_endpoints_list_ready_pods_and_keep_duplicate_ips() -> None:
    pods = [svc_pod("a", True), svc_pod("b", True), svc_pod("c", False), svc_pod("d", True, terminating=True)]
    assert resolve_port(SERVICE["spec"]["ports"][0], pods[0]) == 8080
    (subset,) = desired_subsets(SERVICE, pods)
    assert [a["targetRef"]["name"] for a in subset["addresses"]] == ["a", "b"]
    assert [a["ip"] for a in subset["addresses"]] == ["127.0.0.1", "127.0.0.1"]
    assert [a["targetRef"]["name"] for a in subset["notReadyAddresses"]] == ["c"]
    assert subset["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    (sl,) = desired_slices(SERVICE, pods).values()
    conds = {e["targetRef"]["name"]: e["conditions"] for e in sl["endpoints"]}
    assert conds["a"] == {"ready": True, "serving": True, "terminating": False}
    assert conds["c"]["ready"] is False
    assert conds["d"] == {"ready": False, "serving": True, "terminating": True}
    assert sl["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
    assert sl["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"
    assert sl["metadata"]["name"].startswith("web-") and sl["addressType"] == "IPv4"
    (empty,) = desired_slices(SERVICE, []).values()
    assert empty["endpoints"] == []
