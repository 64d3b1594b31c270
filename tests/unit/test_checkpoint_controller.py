"""The Checkpoint controller: its pure parts (the replacement pod, the kubelet's refusals),
and its decisions from informer copies and its own writes against a fake API."""
import asyncio
import copy
import json
from typing import Any

import pytest

from kube32 import timing
from kube32.client import ApiError
from kube32.controllers.base import ControllerContext, ControllerOptions, SharedInformers
from kube32.controllers.checkpoint import (CheckpointController, MoveError, StillInACall, _Take, container_of,
                                          replacement_of)

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


def test_a_pod_still_in_a_call_after_its_tries_fails_with_the_freeze_timeout() -> None:
    """Each try asks the node for 1 s; the blocker then names the whole freeze timeout."""
    busy = StillInACall("call k32_tick still running after 1000 ms", ["call k32_tick still running after 1000 ms"])
    final = busy.outlasted(10000)
    assert type(final) is MoveError
    assert final.blockers == ["call k32_tick still running after 10000 ms"] and final.message == final.blockers[0]


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
        elif isinstance(body, dict):  # a merge patch of metadata (finalizers): null removes
            for k, v in (body.get("metadata") or {}).items():
                if k == "resourceVersion":
                    continue
                if v is None:
                    obj["metadata"].pop(k, None)
                else:
                    obj["metadata"][k] = v
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


# --- rollbacks and restarts -------------------------------------------------------------------
class ReplacingApi(FakeApi):
    """FakeApi that also takes pod replacements (a new uid, the status reset)."""

    def __init__(self) -> None:
        super().__init__()
        self.replacements: list[dict] = []

    async def post_subresource(self, kind: Any, name: str, sub: str, body: dict, ns: Any = None,
                               params: Any = None) -> dict:
        assert sub == "replacement"
        self.replacements.append(body)
        new = copy.deepcopy(body)
        new["metadata"]["uid"] = f"u{len(self.replacements) + 2}"
        return self.put("pods", new)


READY_SOURCE = {"metadata": {"name": "sim-1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def failed_replacement(**container: Any) -> dict:
    pod = running_replacement()
    pod["metadata"]["annotations"] = {"kube32.io/restore-from": "mv"}
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "c", **container}]}
    return pod


def test_a_replacement_that_crash_loops_before_it_runs_rolls_back_at_once() -> None:
    async def go() -> None:
        api = ReplacingApi()
        api.put("checkpoints", moving("0"))
        pod = failed_replacement(state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1s"}},
                                 lastState={"terminated": {"reason": "Error", "message": "image x is no pod"}},
                                 restartCount=1)
        api.put("pods", pod)
        ctl = controller(api)
        ctl.pods.cache["default/web-1"] = pod
        ctl.nodes.cache["sim-1"] = READY_SOURCE
        await ctl.sync("default/mv")
        st = api.objects[("checkpoints", "mv")]["status"]
        assert st["phase"] == "Failed" and st["message"] == "rolled back to sim-1: image x is no pod", st
        [back] = api.replacements
        assert back["spec"]["nodeName"] == "sim-1" and back["metadata"]["annotations"]["kube32.io/restore-from"] == "mv"
    asyncio.run(go())


def test_a_rollback_without_the_data_starts_the_pod_afresh_and_says_so() -> None:
    async def go() -> None:
        api = ReplacingApi()
        gone = {"type": "DataStored", "status": "False", "reason": "ControlPlaneRestarted",
                "message": "the checkpoint's data was lost when the control plane restarted"}
        api.put("checkpoints", moving("0", conditions=[gone]))
        pod = failed_replacement(state={"terminated": {"reason": "RestoreError", "message": "no data"}})
        pod["status"]["phase"] = "Failed"
        api.put("pods", pod)
        ctl = controller(api)
        ctl.pods.cache["default/web-1"] = pod
        ctl.nodes.cache["sim-1"] = READY_SOURCE
        await ctl.sync("default/mv")
        st = api.objects[("checkpoints", "mv")]["status"]
        assert st["message"] == ("not rolled back, the pod starts afresh on sim-1: no data; "
                                 "the checkpoint's data was lost when the control plane restarted"), st
        [fresh] = api.replacements
        assert fresh["spec"]["nodeName"] == "sim-1"
        assert "kube32.io/restore-from" not in fresh["metadata"]["annotations"]
    asyncio.run(go())


def test_a_saving_move_found_after_a_restart_with_its_replacement_running_completes() -> None:
    async def go() -> None:
        api = ReplacingApi()
        saving = copy.deepcopy(CK)
        saving["status"] = {"phase": "Saving", "nodeName": "sim-1", "targetNode": "sim-2", "podUID": "u1"}
        api.put("checkpoints", saving)
        pod = running_replacement()
        pod["metadata"]["annotations"] = {"kube32.io/restore-from": "mv"}
        api.put("pods", pod)
        ctl = controller(api)
        await ctl.sync("default/mv")
        st = api.objects[("checkpoints", "mv")]["status"]
        assert st["phase"] == "Completed" and st["newPodUID"] == "u2" and "moveMillis" not in st, st
        assert st["message"] == ("moved from sim-1 to sim-2; the time from the freeze is not known "
                                 "(the control plane restarted during the move)")
        assert ctl.recorder.events == ["Moved"] and not api.replacements
    asyncio.run(go())


def test_a_pod_that_failed_to_restore_still_counts_for_its_owner() -> None:
    from kube32.controllers import podutil as pu
    failed = copy.deepcopy(POD)
    failed["status"] = {"phase": "Failed"}
    assert not pu.is_active(failed)
    failed["metadata"]["annotations"] = {"kube32.io/restore-from": "mv"}
    assert pu.is_active(failed) and pu.awaits_replacement(failed)
    assert pu.failure(failed) == "the pod failed"
    assert pu.failure(failed_replacement(state={"running": {}})) is None
    assert pu.failure(failed_replacement(state={"waiting": {}}, restartCount=2)) == "the container restarted"


def test_a_rollback_to_a_source_without_room_goes_to_the_scheduler_with_the_checkpoint() -> None:
    async def go() -> None:
        api = ReplacingApi()
        api.put("checkpoints", moving("0"))
        pod = failed_replacement(state={"terminated": {"reason": "RestoreError", "message": "damaged"}})
        pod["spec"]["containers"][0]["resources"] = {"requests": {"memory": "6Mi"}}
        squatter = copy.deepcopy(pod)
        squatter["metadata"].update(name="squatter", uid="s1", annotations={})
        squatter["spec"]["nodeName"] = "sim-1"
        ctl = controller(api)
        ctl.pods.cache["default/web-1"] = pod
        ctl.pods.cache["default/squatter"] = squatter
        ctl.nodes.cache["sim-1"] = {**READY_SOURCE, "status": {**READY_SOURCE["status"],
                                                              "allocatable": {"memory": "10Mi"}}}
        await ctl.sync("default/mv")
        st = api.objects[("checkpoints", "mv")]["status"]
        assert st["message"] == ("rolled back to the scheduler (sim-1 has no room for it: Insufficient memory): "
                                 "damaged"), st
        [back] = api.replacements
        assert "nodeName" not in back["spec"] and back["metadata"]["annotations"]["kube32.io/restore-from"] == "mv"
    asyncio.run(go())


def test_a_deleted_checkpoint_goes_only_once_no_pod_restores_from_it() -> None:
    async def go() -> None:
        api = FakeApi()
        failed = moving("0", phase="Failed", rollbackPodUID="u3")
        failed["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z",
                                  finalizers=["kube32.io/checkpoint-protection"])
        api.put("checkpoints", failed)
        ctl = controller(api)
        restoring = failed_replacement(state={"waiting": {"reason": "ContainerCreating"}})
        ctl.pods.cache["default/web-1"] = restoring
        await ctl.sync("default/mv")
        assert api.objects[("checkpoints", "mv")]["metadata"]["finalizers"] == ["kube32.io/checkpoint-protection"]
        ctl.pods.cache["default/web-1"] = running_replacement()   # restored: restore-from gone
        await ctl.sync("default/mv")
        assert api.objects[("checkpoints", "mv")]["metadata"].get("finalizers") is None
    asyncio.run(go())


def test_a_restoring_pod_its_node_refused_for_room_is_rebound_still_restoring_with_a_back_off() -> None:
    from kube32.controllers.restore import RestoreController

    async def go() -> None:
        api = ReplacingApi()
        api.put("checkpoints", moving("0", phase="Failed", message="rolled back to sim-1: damaged",
                                      rollbackPodUID="u2"))
        refused = running_replacement()
        refused["metadata"]["annotations"] = {"kube32.io/restore-from": "mv"}
        refused["spec"]["nodeName"] = "sim-1"
        refused["status"] = {"phase": "Failed", "reason": "OutOfmemory",
                             "message": "Pod was rejected: Node didn't have enough resource: memory"}
        api.put("pods", refused)
        ctx = ControllerContext(api, SharedInformers(api), ControllerOptions(), Recorder())  # type: ignore[arg-type]
        ctl = RestoreController(ctx)
        ctl.recorder = Recorder()  # type: ignore[assignment]
        ctl.pods.cache["default/web-1"] = refused
        ctl.nodes.cache["sim-1"] = READY_SOURCE
        await ctl.sync("default/web-1")
        [again] = api.replacements
        assert "nodeName" not in again["spec"] and again["metadata"]["annotations"]["kube32.io/restore-from"] == "mv"
        st = api.objects[("checkpoints", "mv")]["status"]
        assert st["rollbackPodUID"] == "u3" and st["message"].startswith(
            "rolled back to sim-1: damaged; sim-1 refused it (Pod was rejected: "), st
        # Refused again at once (the node and the scheduler disagree for a while): it waits.
        refused["metadata"]["uid"] = "u3"
        ctl.pods.cache["default/web-1"] = refused
        await ctl.sync("default/web-1")
        assert len(api.replacements) == 1, "no second replacement before the back-off"


# --- room in the checkpoint data space, before the pod freezes ----------------------------

class RoomAnswers:
    """``PUT .../data?reserve=true`` as the API server answers it: the answers in turn
    (status, body, from the node), each after ``delay`` seconds; the asks are kept."""

    def __init__(self, *answers: tuple[int, dict, bool], delay: float = 0.0) -> None:
        self.answers, self.delay = list(answers), delay
        self.asked: list[dict] = []

    def request(self, method: str, path: str, params: dict, **kw: Any) -> Any:
        self.asked.append(dict(params))
        status, body, from_node = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        delay = self.delay

        class Response:
            headers = {"X-Kube32-From-Node": "sim-1"} if from_node else {}

            def __init__(self) -> None:
                self.status = status

            async def text(self) -> str:
                return json.dumps(body)

            async def __aenter__(self) -> "Response":
                await asyncio.sleep(delay)
                return self

            async def __aexit__(self, *exc: Any) -> None:
                pass
        return Response()


WAITING = (429, {"message": "no room came within 5 s: it is 1 of 2 in line", "details": {"causes": [
    {"reason": "WaitingForRoom", "message": "the snapshot of 9 bytes fits ... it is 1 of 2 in line"}]}}, False)


def take_of(api: FakeApi) -> _Take:
    ck = api.put("checkpoints", {**CK, "status": {"phase": "Pending"}})
    return _Take(ck, copy.deepcopy(POD), "c", "sim-1", "sim-2", True)


def test_a_snapshot_waits_for_room_pending_saying_where_it_stands_then_goes() -> None:
    async def go() -> None:
        api = FakeApi()
        answers = RoomAnswers(WAITING, WAITING, (200, {"sizeBytes": 9}, False))
        api.request = answers.request  # type: ignore[attr-defined]
        ctl, take = controller(api), take_of(api)
        await ctl._wait_for_room(take)
        status = api.objects[("checkpoints", "mv")]["status"]
        assert status["phase"] == "Pending", "its pod is never frozen meanwhile"
        assert status["message"] == ("waiting for room in the checkpoint data space: the snapshot of 9 bytes "
                                     "fits ... it is 1 of 2 in line")
        assert [a["waitSeconds"] for a in answers.asked] == ["0", "5", "5"], "the first ask answers at once"
        assert all(a["reserve"] == "true" and a["fromNode"] == "sim-1" for a in answers.asked)
        assert api.calls.count(("patch", "checkpoints")) == 1, "the message is written when it changes"
    asyncio.run(go())


def test_a_wait_for_room_is_bounded_and_refusals_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "ROOM_WAIT_EXTRA_SECONDS", 0.0)

    async def go() -> None:
        api = FakeApi()
        api.request = RoomAnswers(WAITING, delay=0.05).request  # type: ignore[attr-defined]
        ctl, take = controller(api), take_of(api)
        ctl.rollback_seconds = 0.2
        with pytest.raises(MoveError, match=r"no room for the snapshot in the checkpoint data space within 0.2 s: "
                                            r"the snapshot of 9 bytes fits"):
            await ctl._wait_for_room(take)
        api.request = RoomAnswers((429, {"message": "the snapshot of 9 bytes does not fit ..., even once every "  # type: ignore[attr-defined]
                                                    "move in flight ended"}, False)).request
        with pytest.raises(MoveError, match="the snapshot cannot be stored: the snapshot of 9 bytes does not fit"):
            await ctl._wait_for_room(take_of(api))
        api.request = RoomAnswers((409, {"reason": "NotMovable", "blockers": ["open file /a"]}, True)).request  # type: ignore[attr-defined]
        with pytest.raises(MoveError, match="the pod cannot move: open file /a") as e:
            await ctl._wait_for_room(take_of(api))
        assert e.value.blockers == ["open file /a"]
    asyncio.run(go())
