"""The Checkpoint controller: its pure parts (the replacement pod, the kubelet's refusals),
and its decisions from informer copies and its own writes against a fake API."""
import asyncio
import copy
from typing import Any

import pytest

from kube32.client import ApiError
from kube32.controllers.base import ControllerContext, ControllerOptions, SharedInformers
from kube32.controllers.checkpoint import CheckpointController, MoveError, container_of, replacement_of

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "web-1", "namespace": "default", "uid": "u1", "resourceVersion": "7",
                    "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"app": "web"},
                    "annotations": {"a": "b"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                         "uid": "rs1", "controller": True}]},
       "spec": {"nodeName": "sim-1", "containers": [{"name": "c", "image": "x"}]},
       "status": {"phase": "Running"}}


def test_replacement_keeps_name_labels_owners_and_points_at_the_checkpoint() -> None:
    new = replacement_of(POD, "sim-2", "ck1")
    assert new["metadata"] == {"name": "web-1", "namespace": "default", "labels": {"app": "web"},
                               "ownerReferences": POD["metadata"]["ownerReferences"],
                               "annotations": {"a": "b", "kube32.io/restore-from": "ck1"}}
    assert new["spec"]["nodeName"] == "sim-2" and "status" not in new
    assert POD["spec"]["nodeName"] == "sim-1", "the input is not changed"


def test_replacement_for_the_scheduler_and_without_annotation() -> None:
    back = replacement_of(replacement_of(POD, "sim-2", "ck1"), None, None)
    assert "nodeName" not in back["spec"] and "kube32.io/restore-from" not in back["metadata"]["annotations"]


def test_container_defaults_to_the_only_one() -> None:
    assert container_of({"spec": {}}, POD) == "c"
    with pytest.raises(MoveError, match='has no container "d"'):
        container_of({"spec": {"containerName": "d"}}, POD)


def test_kubelet_refusals_keep_every_blocker() -> None:
    msg, blockers = CheckpointController._kubelet_refusal(
        409, '{"reason":"NotMovable","blockers":["open file /a (descriptor 3)","entry point _start runs on its own thread"]}')
    assert blockers == ["open file /a (descriptor 3)", "entry point _start runs on its own thread"]
    assert msg.startswith("the pod cannot move: open file /a")
    msg, blockers = CheckpointController._kubelet_refusal(
        504, '{"reason":"Timeout","blockers":["call k32_handle still running after 10000 ms"]}')
    assert msg == "call k32_handle still running after 10000 ms"


# --- deciding from informer copies and the controller's own writes --------------------


class FakeApi:
    """The API's copies of objects; a status patch naming a resourceVersion is guarded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.rv = 100

    def put(self, plural: str, obj: dict) -> dict:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[(plural, obj["metadata"]["name"])] = obj
        return copy.deepcopy(obj)

    async def try_get(self, kind: Any, name: str, ns: Any = None) -> dict | None:
        self.calls.append(("get", kind.plural))
        obj = self.objects.get((kind.plural, name))
        return copy.deepcopy(obj) if obj else None

    async def patch(self, kind: Any, name: str, body: Any, ns: Any = None, **kw: Any) -> dict:
        self.calls.append(("patch", kind.plural))
        obj = self.objects[(kind.plural, name)]
        want = ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("resourceVersion")
        if want is not None and want != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        if kw.get("subresource") == "status":
            obj.setdefault("status", {}).update(body["status"])
        return self.put(kind.plural, obj)


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def record(self, obj: dict, type_: str, reason: str, message: str) -> None:
        self.events.append(reason)


def controller(api: FakeApi) -> CheckpointController:
    ctx = ControllerContext(api, SharedInformers(api), ControllerOptions(), Recorder())  # type: ignore[arg-type]
    ctl = CheckpointController(ctx)
    ctl.recorder = Recorder()  # type: ignore[assignment]
    return ctl


CK = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
      "metadata": {"name": "mv", "namespace": "default", "uid": "c1", "resourceVersion": "50"},
      "spec": {"podName": "web-1", "action": "Move"}}


def moving(rv: str, **status: Any) -> dict:
    ck = copy.deepcopy(CK)
    ck["metadata"]["resourceVersion"] = rv
    ck["status"] = {"phase": "Moving", "nodeName": "sim-1", "targetNode": "sim-2", "newPodName": "web-1",
                    "podUID": "u1", "newPodUID": "u2", "frozenAtMs": 1, "movingSinceMs": 10 ** 13, **status}
    return ck


def running_replacement() -> dict:
    pod = copy.deepcopy(POD)
    pod["metadata"].update(uid="u2", annotations={})
    pod["spec"]["nodeName"] = "sim-2"
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}
    return pod


def test_a_stale_cached_moving_copy_does_not_complete_the_move_twice() -> None:
    async def go() -> None:
        api = FakeApi()
        done = api.put("checkpoints", {**moving("0"), "status": {**moving("0")["status"], "phase": "Completed"}})
        ctl = controller(api)
        ctl.checkpoints.cache["default/mv"] = moving(str(int(done["metadata"]["resourceVersion"]) - 1))
        ctl.pods.cache["default/web-1"] = running_replacement()
        await ctl.sync("default/mv")
        assert ctl.recorder.events == [], "no second Moved event"
        assert api.objects[("checkpoints", "mv")]["status"]["phase"] == "Completed"
        assert ("get", "checkpoints") in api.calls  # decided again on the API's copy
    asyncio.run(go())


def test_a_move_completes_from_the_caches_without_a_get() -> None:
    async def go() -> None:
        api = FakeApi()
        current = api.put("checkpoints", moving("0"))
        ctl = controller(api)
        ctl.checkpoints.cache["default/mv"] = current
        ctl.pods.cache["default/web-1"] = running_replacement()
        await ctl.sync("default/mv")
        assert ctl.recorder.events == ["Moved"]
        assert api.objects[("checkpoints", "mv")]["status"]["phase"] == "Completed"
        assert ("get", "checkpoints") not in api.calls and ("get", "pods") not in api.calls
    asyncio.run(go())


def test_the_controllers_own_write_is_seen_before_its_watch_event() -> None:
    async def go() -> None:
        api = FakeApi()
        saving = copy.deepcopy(CK)
        saving["status"] = {"phase": "Saving"}
        saving = api.put("checkpoints", saving)
        ctl = controller(api)
        ctl.checkpoints.cache["default/mv"] = saving  # the informer is one write behind
        await ctl._set_status(saving, **moving("0")["status"])  # the controller's own Moving write
        old = copy.deepcopy(POD)
        ctl.pods.cache["default/web-1"] = old  # nor has it shown the replacement yet
        await ctl.sync("default/mv")
        # Moving (not an interrupted Saving), waiting for the replacement: nothing asked, nothing failed.
        assert api.calls == [("patch", "checkpoints")]
        assert api.objects[("checkpoints", "mv")]["status"]["phase"] == "Moving"
    asyncio.run(go())
