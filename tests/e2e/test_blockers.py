"""A refused move names every reason, the control plane's and the node's (spec: "What
keeps a pod from moving": "status.blockers names every reason, a MoveFailed event
repeats them, and the pod keeps running where it is").

Real processes (``kube32-sim up --workers 2``) and real kubectl: a pod with
``kube32.io/migration: Never``, the capability DISPLAY and a ``k32_fs`` file it holds open
between calls.  The first two the control plane finds in the pod spec, the third only
the node can see; nothing freezes while the control plane asks the node for it.
"""
from __future__ import annotations

import json
from typing import Iterator

import pytest
import wasmtime

from tests.conftest import ControlPlane, start_cluster
from tests.e2e.helpers import cli, get_json, push
from tests.e2e.test_moves import COUNTER, HOLDS_A_FILE, api_call, checkpoint_named, counter_pod, running, state

EVERY_REASON = ["grant capability DISPLAY", "annotation kube32.io/migration: Never",
                "open file /etc/app/conf (descriptor 3)"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("blockers"), 2, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


def test_a_refused_move_names_the_control_planes_and_the_nodes_blockers(cluster: ControlPlane, tmp_path) -> None:
    wasm = tmp_path / "holds.wasm"
    wasm.write_bytes(wasmtime.wat2wasm(HOLDS_A_FILE))
    holds = push(cluster, wasm)
    cluster.kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {conf: x=1}\n")
    cluster.kubectl("apply", "-f", "-", input=counter_pod(
        "all3", "sim-1", holds, annotations={"kube32.io/migration": "Never"},
        container={"volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}],
                   "securityContext": {"capabilities": {"add": ["DISPLAY"]}}},
        volumes=[{"name": "cfg", "configMap": {"name": "app"}}]))
    pod = running(cluster, "all3")
    assert api_call(cluster, "GET", "/api/v1/namespaces/default/pods/all3/proxy/")[0] == 200  # opens the file

    # The node's own answer: all three.
    status, _, body = api_call(cluster, "POST", "/api/v1/nodes/sim-1/proxy/checkpoint/default/all3/main")
    assert status == 409 and json.loads(body)["blockers"] == EVERY_REASON, body

    out = cli(cluster, "move", "all3", "--to", "sim-2")
    assert out.returncode == 1
    for reason in EVERY_REASON:
        assert f"- {reason}" in out.stdout.decode(), out.stdout.decode()
    ck = checkpoint_named(cluster, "all3", "Failed")
    assert ck["status"]["blockers"] == EVERY_REASON, ck["status"]
    assert ck["status"]["message"] == "the pod cannot move: " + "; ".join(EVERY_REASON)
    failed = cluster.kubectl("get", "events", "--field-selector", "involvedObject.name=all3,reason=MoveFailed",
                             "-o", "json").stdout
    messages = [e["message"] for e in json.loads(failed)["items"]]
    assert messages and all(all(r in m for r in EVERY_REASON) for m in messages), messages

    # It keeps running where it is, never frozen: Ready all along, the same uid, answering.
    now = get_json(cluster, "pod", "all3")
    assert now["metadata"]["uid"] == pod["metadata"]["uid"] and now["spec"]["nodeName"] == "sim-1"
    ready = [c for c in now["status"]["conditions"] if c["type"] == "Ready"][0]
    assert ready["status"] == "True" and ready["lastTransitionTime"] == \
        [c for c in pod["status"]["conditions"] if c["type"] == "Ready"][0]["lastTransitionTime"]
    assert api_call(cluster, "GET", "/api/v1/namespaces/default/pods/all3/proxy/")[0] == 200
    cluster.kubectl("delete", "pod", "all3", "--wait=false")


def test_the_node_answers_a_dry_run_without_freezing(cluster: ControlPlane) -> None:
    """``dryRun=All``: the node's blockers, or 200 with none; the pod never freezes."""
    image = push(cluster, COUNTER)
    cluster.kubectl("apply", "-f", "-", input=counter_pod("dry", "sim-1", image))
    running(cluster, "dry")
    before = state(cluster, "dry")
    path = "/api/v1/nodes/sim-1/proxy/checkpoint/default/dry/main"
    for leave in ("frozen", "running"):
        status, _, body = api_call(cluster, "POST", f"{path}?dryRun=All&leave={leave}")
        assert status == 200 and json.loads(body)["blockers"] == [], body
    # Not frozen: the next request is answered at once, the clock ran on.
    after = state(cluster, "dry")
    assert after["requests"] == before["requests"] + 1 and after["time_ms"] >= before["time_ms"]
    status, _, body = api_call(cluster, "POST", f"{path}?dryRun=true")
    assert status == 400 and json.loads(body)["message"] == 'dryRun must be "All", not "true"', body
    cluster.kubectl("delete", "pod", "dry", "--wait=false")
