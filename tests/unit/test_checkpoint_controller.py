"""Pure parts of the Checkpoint controller: the replacement pod and the kubelet's refusals."""
import pytest

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
