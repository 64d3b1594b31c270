"""Deleting a pod that has a finalizer ends once the finalizer is removed (Kubernetes: a
DELETE of an object already terminating changes nothing; the kubelet stops a pod once).

Real processes (``kube32-sim up --workers 2``) and real kubectl, as an operator (kopf,
controller-runtime) sees it: the pod stays Terminating with its resourceVersion still,
so the operator's write that removes its finalizer, made with the resourceVersion it
read, is not refused; then the pod is gone and ``kubectl delete`` returns.
"""
from __future__ import annotations

import json
import time

from tests.conftest import ControlPlane, wait_for
from tests.e2e.helpers import get_json, pod_yaml, push
from tests.e2e.test_moves import COUNTER, api_call, running

FINALIZER = "example.com/cleanup"


def _with_finalizer(name: str, image: str) -> str:
    import yaml
    pod = yaml.safe_load(pod_yaml(name, "sim-1", image))
    pod["metadata"]["finalizers"] = [FINALIZER]
    return yaml.safe_dump(pod)


def _gone(cluster: ControlPlane, name: str) -> bool:
    return cluster.kubectl("get", "pod", name, check=False).returncode != 0


def test_a_terminating_pod_with_a_finalizer_is_not_written_again_and_goes_once_it_is_removed(
        sim_cluster: ControlPlane) -> None:
    image = push(sim_cluster, COUNTER)
    sim_cluster.kubectl("apply", "-f", "-", input=_with_finalizer("fin", image))
    running(sim_cluster, "fin")
    sim_cluster.kubectl("delete", "pod", "fin", "--wait=false")
    # The kubelet stops the pod; nothing writes the object after that.
    wait_for(lambda: api_call(sim_cluster, "GET", "/api/v1/namespaces/default/pods/fin/proxy/")[0] != 200, 15,
             what="the pod stopped")
    time.sleep(0.5)
    pod = get_json(sim_cluster, "pod", "fin")
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["finalizers"] == [FINALIZER]
    time.sleep(1.5)
    assert get_json(sim_cluster, "pod", "fin")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    # A repeated DELETE of the terminating pod changes nothing either.
    status, _, body = api_call(sim_cluster, "DELETE", "/api/v1/namespaces/default/pods/fin")
    assert status == 200 and json.loads(body)["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    sim_cluster.kubectl("delete", "pod", "fin", "--wait=false")
    assert get_json(sim_cluster, "pod", "fin")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]

    # The operator removes its finalizer with the object it read (PUT with its
    # resourceVersion): accepted, and the pod is gone; a waiting kubectl delete returns.
    waiting = sim_cluster.kubectl_bg("delete", "pod", "fin", "--timeout=30s")
    time.sleep(1.0)
    pod["metadata"]["finalizers"] = []
    sim_cluster.kubectl("replace", "-f", "-", input=json.dumps(pod))
    assert waiting.wait(30) == 0, waiting.stderr.read() if waiting.stderr else ""
    assert _gone(sim_cluster, "fin")


def test_a_finalizer_removed_by_patch_ends_the_deletion(sim_cluster: ControlPlane) -> None:
    image = push(sim_cluster, COUNTER)
    sim_cluster.kubectl("apply", "-f", "-", input=_with_finalizer("fin2", image))
    running(sim_cluster, "fin2")
    sim_cluster.kubectl("delete", "pod", "fin2", "--wait=false")
    time.sleep(1.0)
    rv = get_json(sim_cluster, "pod", "fin2")["metadata"]["resourceVersion"]
    time.sleep(1.0)
    assert get_json(sim_cluster, "pod", "fin2")["metadata"]["resourceVersion"] == rv
    sim_cluster.kubectl("patch", "pod", "fin2", "--type=json", "-p",
                        json.dumps([{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                                    {"op": "remove", "path": "/metadata/finalizers"}]))
    sim_cluster.kubectl("wait", "--for=delete", "pod/fin2", "--timeout=30s")
