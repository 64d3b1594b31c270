"""A rolled-back move keeps the pod's state and its owner's count, on every rollback
cause (spec: "Moves": "The Deployment counts one pod at every step ... When the
replacement fails to restore (RestoreError), fails, or does not run within 60 s, the pod
goes back to its source node and restores there from the same Checkpoint").

The cluster of tests/e2e/test_faults.py (control plane and workers as separate
processes, ``--move-rollback-timeout 6s``); each test starts a target with a fault:

* ``--fault corrupt-restores``: the replacement fails to restore (RestoreError);
* ``--fault crash-restores``: the replacement fails otherwise (terminated Error, restarted
  with back-off);
* ``--fault hang-restores``: it never runs (the rollback timeout);
* ``--fault hang-restores`` and the target SIGKILLed while it restores: the target is lost.

A Deployment's pod is moved there; kubectl's own watches of its pods and its ReplicaSet
record every step, and the pod's proxy answers its counters afterwards.
"""
from __future__ import annotations

import json
import signal
import subprocess
from typing import Callable

import pytest
import yaml

from tests.conftest import wait_for
from tests.e2e.helpers import get_json
from tests.e2e.test_faults import (ROLLBACK_S, FaultCluster, cluster, events_of, image, move_bg,  # noqa: F401
                                   node, the_checkpoint)
from tests.e2e.test_moves import running, state

DAMAGED = "cannot restore the snapshot: the snapshot's trailer does not match its contents"


def deployment(name: str, image: str) -> dict:
    """One replica, only on nodes labelled for this test."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"nodeSelector": {"kube32.io/fault-test": name},
                                           "containers": [{"name": "main", "image": image}]}}}}


def deploy_on(cluster: FaultCluster, name: str, image: str, source: str, target: str) -> str:
    """The Deployment's one pod runs on ``source``; ``target`` may take it too.  Returns
    the pod's name."""
    for n in (source, target):
        cluster.kubectl("label", "node", n, f"kube32.io/fault-test={name}", "--overwrite")
    cluster.kubectl("cordon", target)
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(deployment(name, image)))
        cluster.kubectl("rollout", "status", f"deployment/{name}", "--timeout=60s", timeout=90)
    finally:
        cluster.kubectl("uncordon", target)
    pods = get_json(cluster, "pods", "-l", f"app={name}")["items"]
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == source, pods
    return pods[0]["metadata"]["name"]


def _json_stream(text: str) -> list[dict]:
    decoder, out, pos = json.JSONDecoder(), [], 0
    while (pos := next((i for i in range(pos, len(text)) if not text[i].isspace()), len(text))) < len(text):
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
    return out


class Watches:
    """``kubectl get pods|rs -l app=<name> --watch --output-watch-events -o json`` running
    beside a move: every version of the Deployment's pods and ReplicaSet it went through."""

    def __init__(self, cluster: FaultCluster, app: str) -> None:
        self.files = {kind: cluster.data_dir / f"watch-{app}-{kind}.json" for kind in ("pods", "rs")}
        self.procs = {}
        for kind, path in self.files.items():
            with open(path, "wb") as f:
                self.procs[kind] = subprocess.Popen(
                    ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "--cache-dir", str(cluster.cache_dir),
                     "get", kind, "-l", f"app={app}", "--watch", "--output-watch-events", "-o", "json"],
                    stdout=f, stderr=subprocess.STDOUT)
        # Each watch first lists what is there: the one pod and its ReplicaSet.
        wait_for(lambda: all(len(_json_stream(p.read_text())) >= 1 for p in self.files.values()), 15,
                 what="the watches to list")

    def stop(self) -> dict[str, list[dict]]:
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return {kind: _json_stream(path.read_text()) for kind, path in self.files.items()}


def assert_one_pod_all_along(seen: dict[str, list[dict]], name: str) -> None:
    pods, sets = seen["pods"], seen["rs"]
    assert pods and sets, seen
    names = {e["object"]["metadata"]["name"] for e in pods}
    assert names == {name}, f"the Deployment started another pod: {sorted(names)}"
    assert not [e for e in pods if e["type"] == "DELETED" or e["object"]["metadata"].get("deletionTimestamp")], \
        "a pod went terminating"
    counts = [(e["object"].get("status") or {}).get("replicas", 0) for e in sets]
    assert all(c == 1 for c in counts), f"the ReplicaSet counted {counts}"


def rollback_causes() -> list:
    def kill(w) -> None:
        w.popen.send_signal(signal.SIGKILL)
        w.popen.wait(10)
    return [
        pytest.param("corrupt-restores", None, DAMAGED, id="restore-error"),
        pytest.param("crash-restores", None, "injected fault crash-restores", id="replacement-fails"),
        pytest.param("hang-restores", None, f"the replacement did not run within {ROLLBACK_S} s", id="timeout"),
        pytest.param("hang-restores", kill, f"the replacement did not run within {ROLLBACK_S} s", id="target-lost"),
    ]


@pytest.mark.parametrize("fault, then, why", rollback_causes())
def test_a_rolled_back_deployment_pod_keeps_its_state_and_is_counted_once(
        cluster: FaultCluster, image: str, node, fault: str, then: Callable | None, why: str) -> None:
    app = f"rb-{fault.split('-')[0]}" + ("-lost" if then else "")
    target = f"{app}-target"
    w = node(target, "--fault", fault)
    name = deploy_on(cluster, app, image, "sim-1", target)
    state(cluster, name)
    before = state(cluster, name)
    watches = Watches(cluster, app)
    try:
        mover = move_bg(cluster, name, "--to", target)
        if then is not None:
            the_checkpoint(cluster, name, "Moving")
            then(w)
        out = mover.communicate(timeout=90)[0].decode()
        assert mover.returncode == 1 and "rolled back to sim-1" in out, out
        ck = the_checkpoint(cluster, name, "Failed")
        assert ck["status"]["message"].startswith("rolled back to sim-1: ") and why in ck["status"]["message"], \
            ck["status"]
        back = running(cluster, name)
        assert back["spec"]["nodeName"] == "sim-1"
        after = state(cluster, name)
        assert after["init_calls"] == 1 and after["restored_calls"] == 1, after
        assert after["requests"] == before["requests"] + 1, (before, after)
        wait_for(lambda: events_of(cluster, name, "Restored"), 15, what="the Restored event")
    finally:
        seen = watches.stop()
    assert_one_pod_all_along(seen, name)
    rs = get_json(cluster, "rs", "-l", f"app={app}")["items"][0]["metadata"]["name"]
    assert len(events_of(cluster, rs, "SuccessfulCreate")) == 1 and not events_of(cluster, rs, "SuccessfulDelete")
    cluster.kubectl("delete", "deployment", app)


def test_draining_the_target_of_a_move_under_way_keeps_the_pod_and_its_state(cluster: FaultCluster, image: str,
                                                                             node) -> None:
    """``kubectl drain`` of the node a pod is being restored on does not delete the
    replacement (that would lose the state, and its owner would start a fresh pod): the
    eviction waits for the move to end and answers 429 until then; the move rolls back,
    and the drain's next eviction moves the pod on, with its state."""
    app, target = "rb-drain", "rb-drain-target"
    node(target, "--fault", "hang-restores")
    name = deploy_on(cluster, app, image, "sim-1", target)
    cluster.kubectl("label", "node", "sim-2", f"kube32.io/fault-test={app}", "--overwrite")
    before = state(cluster, name)
    watches = Watches(cluster, app)
    try:
        mover = move_bg(cluster, name, "--to", target)
        the_checkpoint(cluster, name, "Moving")
        drain = cluster.kubectl("drain", target, "--ignore-daemonsets", "--timeout=60s", timeout=90)
        assert "being restored here by move" in drain.stderr + drain.stdout, drain
        out = mover.communicate(timeout=60)[0].decode()
        assert mover.returncode == 1 and "rolled back to sim-1" in out, out
        pod = running(cluster, name)
        assert pod["spec"]["nodeName"] != target
        after = state(cluster, name)
        # Restored on sim-1 by the rollback, then moved on to sim-2 by the drain's next eviction.
        assert after["init_calls"] == 1 and after["restored_calls"] == 2 and pod["spec"]["nodeName"] == "sim-2", after
        assert after["requests"] == before["requests"] + 1, (before, after)
    finally:
        seen = watches.stop()
        cluster.kubectl("label", "node", "sim-2", "kube32.io/fault-test-", check=False)
    assert_one_pod_all_along(seen, name)
    cluster.kubectl("delete", "deployment", app)
