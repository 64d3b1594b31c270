"""kube32.controllers.history: a DaemonSet's ControllerRevisions, as Kubernetes keeps them."""
from __future__ import annotations

from typing import Any

from kube32.controllers import history

Obj = dict[str, Any]
DS: Obj = {"metadata": {"name": "agent", "namespace": "default", "uid": "u1",
                        "annotations": {"kubernetes.io/change-cause": "v2"}},
           "spec": {"revisionHistoryLimit": 2}}


def template(version: str) -> Obj:
    return {"metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "c", "image": "x", "env": [{"name": "V", "value": version}]}]}}


def rev(version: str, number: int) -> Obj:
    return history.new_revision(DS, "apps/v1", "DaemonSet", template(version), f"h{version}", number)


def test_a_new_template_is_recorded_on_top() -> None:
    r = rev("2", 2)
    assert r["metadata"]["name"] == "agent-h2" and r["revision"] == 2
    assert r["metadata"]["labels"] == {"app": "agent", "controller-revision-hash": "h2"}
    assert r["metadata"]["annotations"] == {"kubernetes.io/change-cause": "v2"}
    assert r["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert r["data"] == {"spec": {"template": {**template("2"), "$patch": "replace"}}}
    p = history.plan(DS, [rev("1", 1)], template("2"), "h2", [])
    assert (p.create, p.renumber, p.delete) == (2, None, [])


def test_the_current_template_is_not_recorded_twice() -> None:
    p = history.plan(DS, [rev("1", 1), rev("2", 2)], template("2"), "h2", [])
    assert (p.create, p.renumber, p.delete) == (None, None, [])


def test_a_template_coming_back_is_renumbered_to_the_top() -> None:
    one, two = rev("1", 1), rev("2", 2)
    p = history.plan(DS, [one, two], template("1"), "h1", [])
    assert p.create is None and p.renumber == (one, 3) and p.delete == []


def test_old_revisions_beyond_the_limit_go_unless_pods_run_them() -> None:
    revs = [rev(str(i), i) for i in range(1, 6)]
    p = history.plan(DS, revs, template("5"), "h5", ["h5"])
    assert [r["revision"] for r in p.delete] == [1, 2]           # limit 2 old ones: 3 and 4 stay
    p = history.plan(DS, revs, template("5"), "h5", ["h1"])
    assert [r["revision"] for r in p.delete] == [2, 3]            # pods still run revision 1: it stays


def test_duplicates_of_the_current_template_are_dropped() -> None:
    a, b = rev("1", 1), rev("1", 3)
    b["metadata"]["name"] = "agent-other"
    p = history.plan(DS, [a, rev("2", 2), b], template("1"), "h1", [])
    assert p.delete == [a] and p.create is None and p.renumber is None


def test_the_daemonset_controller_records_renumbers_and_keeps_within_the_limit() -> None:
    import copy

    from kube32.client import DAEMONSETS, NODES
    from kube32.controllers.daemonset import DaemonSetController
    from tests.unit.test_controllers_workloads import TEMPLATE, FakeApi, controller, node, run

    def revisions(api: FakeApi) -> dict[int, str]:
        return {o["revision"]: o["metadata"]["labels"]["controller-revision-hash"]
                for (plural, _), o in api.objects.items() if plural == "controllerrevisions"}

    async def set_template(api: FakeApi, image: str) -> None:
        t = copy.deepcopy(TEMPLATE)
        t["spec"]["containers"][0]["image"] = image
        await api.patch(DAEMONSETS, "agent", {"spec": {"template": t}}, "default")
        api.deliver()

    async def go() -> None:
        api = FakeApi()
        dsc = controller(DaemonSetController, api)
        api.put(NODES, node("n1"))
        api.put(DAEMONSETS, {"apiVersion": "apps/v1", "kind": "DaemonSet",
                             "metadata": {"name": "agent", "namespace": "default"},
                             "spec": {"selector": {"matchLabels": {"app": "web"}}, "revisionHistoryLimit": 1,
                                      "template": copy.deepcopy(TEMPLATE)}})
        await dsc.sync("default/agent")
        api.deliver()
        (first,) = revisions(api).values()
        assert all(p["metadata"]["labels"]["controller-revision-hash"] == first for p in api.pods())
        await set_template(api, "wasm://x/v2.wasm")
        await dsc.sync("default/agent")
        api.deliver()
        second = revisions(api)[2]
        assert revisions(api) == {1: first, 2: second}
        await set_template(api, TEMPLATE["spec"]["containers"][0]["image"])   # an undo
        await dsc.sync("default/agent")
        api.deliver()
        assert revisions(api) == {2: second, 3: first}
        for _ in range(2):   # the pods of revision 2 go, then so may it (limit 1: one old one kept)
            await dsc.sync("default/agent")
            api.deliver()
        await set_template(api, "wasm://x/v3.wasm")
        for _ in range(3):
            await dsc.sync("default/agent")
            api.deliver()
        assert sorted(revisions(api)) == [3, 4]
    run(go())


def test_controllerrevision_strategy() -> None:
    from kube32.apiserver.strategies.apps import ControllerRevisionStrategy
    s = ControllerRevisionStrategy()
    r = rev("1", 1)
    assert s.validate(r) == []
    assert s.validate({**r, "revision": -1}) == [("revision", "Invalid value: -1: must be greater than or equal to 0")]
    changed = {**r, "data": {"spec": {}}}
    assert ("data", "Invalid value: field is immutable") in s.validate_update(changed, r)
    assert s.row(r)[:3] == ["agent-h1", "daemonset.apps/agent", 1]
