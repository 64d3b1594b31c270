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
import time
from typing import Callable

import pytest
import yaml

from tests.conftest import wait_for
from tests.e2e.helpers import cli, get_json
from tests.e2e.test_faults import (ROLLBACK_S, FaultCluster, checkpoints_of, cluster, events_of,  # noqa: F401
                                   image, move_bg, node, the_checkpoint)
from tests.e2e.test_moves import api_call, counter_pod, running, state

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
    # A move's one write shows as DELETED (marked kube32.io/replaced-by) then ADDED (issue 23
    # item 3); any other DELETED, or a deletionTimestamp, is a pod that went.
    moved = [e for e in pods if e["type"] == "DELETED"
             and "kube32.io/replaced-by" in (e["object"]["metadata"].get("annotations") or {})]
    assert not [e for e in pods if (e["type"] == "DELETED" and e not in moved)
                or e["object"]["metadata"].get("deletionTimestamp")], "a pod went terminating"
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
    and the drain's next eviction (which names the pod only) is about the replacement that
    left the target: the drain completes and the pod stays on sim-1, a node nobody drains,
    with its state (attack round 20b: it was moved off sim-1)."""
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
        # Restored on sim-1 by the rollback, and left there by the drain of the target.
        assert after["init_calls"] == 1 and after["restored_calls"] == 1 and pod["spec"]["nodeName"] == "sim-1", after
        assert "drained" in drain.stdout, drain
        assert after["requests"] == before["requests"] + 1, (before, after)
    finally:
        seen = watches.stop()
        cluster.kubectl("label", "node", "sim-2", "kube32.io/fault-test-", check=False)
    assert_one_pod_all_along(seen, name)
    cluster.kubectl("delete", "deployment", app)


def move_object(name: str, pod: str, target: str) -> str:
    return yaml.safe_dump({"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name},
                           "spec": {"podName": pod, "action": "Move", "target": {"nodeName": target}}})


def test_a_checkpoint_deleted_while_its_replacement_restores_stays_until_the_rollback_ran(
        cluster: FaultCluster, image: str, node) -> None:
    """Spec: "A Checkpoint stays while a pod's kube32.io/restore-from names it", and a
    replacement that does not run in time "goes back to its source node and restores there
    from the same Checkpoint".  ``kubectl delete checkpoint`` while the replacement restores
    only marks it (its finalizer ``kube32.io/checkpoint-protection``): the rollback restores
    the pod from it with its state, and then it goes, its data with it."""
    node("delck-target", "--fault", "hang-restores")
    pod, ck = "delck", "delck-move"
    cluster.kubectl("apply", "-f", "-", input=counter_pod(pod, "sim-1", image))
    running(cluster, pod)
    state(cluster, pod)
    before = state(cluster, pod)
    cluster.kubectl("apply", "-f", "-", input=move_object(ck, pod, "delck-target"))
    the_checkpoint(cluster, pod, "Moving")
    cluster.kubectl("delete", "checkpoint", ck, "--wait=false")
    marked = get_json(cluster, "checkpoint", ck)["metadata"]
    assert marked.get("deletionTimestamp") and marked["finalizers"] == ["kube32.io/checkpoint-protection"], marked
    assert get_json(cluster, "pod", pod)["metadata"]["annotations"]["kube32.io/restore-from"] == ck
    wait_for(lambda: running(cluster, pod)["spec"]["nodeName"] == "sim-1", ROLLBACK_S + 20,
             what="the pod rolled back to sim-1")
    after = state(cluster, pod)
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, after
    # Nothing needs it now: it goes, and its data with it.
    cluster.kubectl("wait", "--for=delete", f"checkpoint/{ck}", "--timeout=30s", timeout=60)
    assert api_call(cluster, "GET", f"/apis/kube32.io/v1/namespaces/default/checkpoints/{ck}/data")[0] == 404
    cluster.kubectl("delete", "pod", pod, "--wait=false")


def test_a_rollback_to_a_source_without_room_restores_where_the_scheduler_binds_it(
        cluster: FaultCluster, image: str, node) -> None:
    """Spec: "The pod's state is never given up while a copy of it can still run".  While the
    replacement hangs, another pod takes the room the pod left on its source: a rollback
    there would be refused (OutOfmemory) and the pod start afresh.  The pod goes to the
    scheduler instead and restores, with its state, on a node with room."""
    small, target = "roomless", "roomless-target"
    node(small, "--heap", "10Mi")
    node(target, "--fault", "hang-restores")
    six = {"resources": {"requests": {"memory": "6Mi"}, "limits": {"memory": "6Mi"}}}
    cluster.kubectl("apply", "-f", "-", input=counter_pod("roomy", small, image, container=six))
    running(cluster, "roomy")
    state(cluster, "roomy")
    before = state(cluster, "roomy")
    mover = move_bg(cluster, "roomy", "--to", target)
    the_checkpoint(cluster, "roomy", "Moving")
    cluster.kubectl("apply", "-f", "-", input=counter_pod("squatter", small, image, container=six))
    running(cluster, "squatter")
    cluster.kubectl("cordon", target)  # the scheduler's choice: sim-1 or sim-2
    out = mover.communicate(timeout=90)[0].decode()
    assert mover.returncode == 1, out
    why = f"rolled back to the scheduler ({small} has no room for it: Insufficient memory)"
    assert why in out and "with its state" in out, out
    ck = the_checkpoint(cluster, "roomy", "Failed")
    assert ck["status"]["message"].startswith(why + ": the replacement did not run within"), ck["status"]
    back = running(cluster, "roomy")
    assert back["spec"]["nodeName"] in ("sim-1", "sim-2"), back["spec"]
    after = state(cluster, "roomy")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, after
    assert after["init_calls"] == 1, after
    cluster.kubectl("delete", "pod", "roomy", "squatter", "--wait=false")


def test_a_drain_whose_move_rolls_back_does_not_say_the_node_is_drained(cluster: FaultCluster, image: str,
                                                                      node) -> None:
    """``kubectl drain`` said ``node/sim-2 drained`` (exit 0) while the pod, its move rolled
    back, ran on sim-2 again.  The eviction's answer says how its move ended: rolled back is
    429 with the move's reason, so kubectl drain prints it, asks again and ends at its
    ``--timeout`` with the reason; meanwhile evictions do not move the pod again (each try
    would roll back again), and it keeps its state where it is."""
    node("drain-bad", "--fault", "corrupt-restores")   # the only node a move of it can go to
    cluster.kubectl("apply", "-f", "-", input=counter_pod("drainrb", "sim-2", image))
    running(cluster, "drainrb")
    state(cluster, "drainrb")
    before = state(cluster, "drainrb")
    cluster.kubectl("cordon", "sim-1")
    try:
        drain = cluster.kubectl("drain", "sim-2", "--force", "--ignore-daemonsets", "--timeout=20s",
                                "--pod-selector=app=drainrb", check=False, timeout=60)
    finally:
        for n in ("sim-1", "sim-2"):
            cluster.kubectl("uncordon", n)
    said = drain.stdout + drain.stderr
    assert drain.returncode != 0 and "drained" not in drain.stdout, said
    assert 'pod "drainrb" was not evicted: its move (checkpoint drainrb-evict-' in drain.stderr, said
    assert "failed: rolled back to sim-2: cannot restore the snapshot" in drain.stderr, said
    assert "evictions do not move it again for" in drain.stderr and "global timeout reached" in said, said
    back = running(cluster, "drainrb")
    assert back["spec"]["nodeName"] == "sim-2"
    after = state(cluster, "drainrb")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, after
    moves = [c for c in checkpoints_of(cluster, "drainrb")
             if (c["metadata"].get("labels") or {}).get("kube32.io/trigger") == "eviction"]
    assert len(moves) == 1 and moves[0]["status"]["phase"] == "Failed", [c["status"] for c in moves]
    cluster.kubectl("delete", "pod", "drainrb", "--wait=false")


def test_a_drained_node_never_gets_back_a_pod_whose_move_rolls_back_after_the_drain_ended(
        cluster: FaultCluster, image: str, node) -> None:
    """Issue #20: the eviction answers 201 after its 5 s wait while the move's replacement
    still restores (the target hangs), ``kubectl drain`` says ``drained``; the rollback 6 s
    later put the pod back on the drained node.  It never does now: the eviction marked the
    move answered, so with no other node to take it then (sim-1 and the target cordoned) the
    pod waits for the scheduler and restores, with its state, where it binds it (sim-1, once
    uncordoned), as a rollback to a source without room does."""
    name, target = "drainlate", "drainlate-target"
    node(target, "--fault", "hang-restores")   # the only node a move of it can go to
    cluster.kubectl("apply", "-f", "-", input=counter_pod(name, "sim-2", image))
    running(cluster, name)
    state(cluster, name)
    before = state(cluster, name)
    cluster.kubectl("cordon", "sim-1")
    try:
        drain = subprocess.Popen(
            ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "--cache-dir", str(cluster.cache_dir), "drain",
             "sim-2", "--force", "--ignore-daemonsets", "--timeout=60s", f"--pod-selector=app={name}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        the_checkpoint(cluster, name, "Moving")
        cluster.kubectl("cordon", target)   # nowhere else to go at the rollback
        out, err = drain.communicate(timeout=60)
        assert drain.returncode == 0 and "node/sim-2 drained" in out, out + err
        ck = the_checkpoint(cluster, name, "Failed", timeout=30)
        why = "rolled back to the scheduler (sim-2 is cordoned and its eviction was answered): "
        assert ck["status"]["message"].startswith(why + "the replacement did not run within"), ck["status"]
        assert ck["metadata"]["annotations"]["kube32.io/eviction-answered"] == "true"
        waiting = get_json(cluster, "pod", name)
        assert not waiting["spec"].get("nodeName"), (   # not sim-2: the scheduler's, and none fits
            waiting["spec"].get("nodeName"), cluster.kubectl("get", "nodes").stdout,
            cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}").stdout)
        cluster.kubectl("uncordon", "sim-1")
        back = running(cluster, name)
    finally:
        for n in ("sim-1", "sim-2", target):
            cluster.kubectl("uncordon", n, check=False)
    assert back["spec"]["nodeName"] == "sim-1", back["spec"]
    after = state(cluster, name)
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, after
    cluster.kubectl("delete", "pod", name, "--wait=false")


# --- what a Checkpoint says: its data, its turn, a control plane restart -------------------------
def serve(cluster: FaultCluster, name: str, node_name: str, image: str) -> dict:
    cluster.kubectl("apply", "-f", "-", input=counter_pod(name, node_name, image))
    running(cluster, name)
    return state(cluster, name)


def saved(cluster: FaultCluster, pod: str) -> dict:
    out = cli(cluster, "checkpoint", pod)
    assert out.returncode == 0, out.stdout.decode()
    return the_checkpoint(cluster, pod, "Saved")


def wide_row(cluster: FaultCluster, ck: str) -> dict[str, str]:
    """``kubectl get checkpoint <ck> -o wide`` as column -> cell."""
    lines = cluster.kubectl("get", "checkpoint", ck, "-o", "wide").stdout.splitlines()
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")
              and not (header[i - 4:i] == "NEW " and header[i:i + 3] == "POD")]
    names = [header[a:b].strip() for a, b in zip(starts, starts[1:] + [None], strict=True)]
    return {n: lines[1][a:b].strip() for n, a, b in zip(names, starts, starts[1:] + [None], strict=True)}


def assert_data_gone(cluster: FaultCluster, ck: str, reason: str, words: str, phase: str) -> None:
    obj = get_json(cluster, "checkpoint", ck)
    st = obj["status"]
    assert st["phase"] == phase, st
    assert not {"sizeBytes", "snapshotSha256", "imageSha256", "podTimeMs"} & set(st), st
    cond = [c for c in st.get("conditions") or [] if c["type"] == "DataStored"]
    assert len(cond) == 1 and cond[0]["status"] == "False" and cond[0]["reason"] == reason, st
    assert words in cond[0]["message"], cond
    row = wide_row(cluster, ck)
    assert row["PHASE"] == phase and row["SIZE"] == "<none>" and words in row["MESSAGE"], row
    path = f"/apis/kube32.io/v1/namespaces/default/checkpoints/{ck}/data"
    assert api_call(cluster, "GET", path)[0] == 404


def test_a_checkpoint_whose_data_was_dropped_to_make_room_says_so(cluster: FaultCluster, image: str) -> None:
    """The control plane holds 16 MiB of checkpoint data: a second 9 MiB snapshot drops the
    older data, and those Checkpoints stop showing a size they no longer hold."""
    serve(cluster, "keepsmall", "sim-1", image)
    small = saved(cluster, "keepsmall")
    assert small["status"]["sizeBytes"] > 0 and wide_row(cluster, small["metadata"]["name"])["SIZE"] != "<none>"
    serve(cluster, "keepbig", "sim-2", image)
    assert api_call(cluster, "POST", "/api/v1/namespaces/default/pods/keepbig/proxy/alloc?kb=9216")[0] == 200
    first = saved(cluster, "keepbig")
    second = cli(cluster, "checkpoint", "keepbig")
    assert second.returncode == 0, second.stdout.decode()
    for ck in (small, first):
        assert_data_gone(cluster, ck["metadata"]["name"], "Dropped", "dropped to make room", "Saved")
    cluster.kubectl("delete", "pod", "keepsmall", "keepbig", "--wait=false")


def test_after_a_control_plane_restart_checkpoints_say_their_data_is_lost(cluster: FaultCluster,
                                                                          image: str) -> None:
    serve(cluster, "amnesia", "sim-1", image)
    ck = saved(cluster, "amnesia")["metadata"]["name"]
    cluster.restart()
    assert_data_gone(cluster, ck, "ControlPlaneRestarted", "lost when the control plane restarted", "Saved")
    # Data stored again says so too.
    assert cli(cluster, "checkpoint", "amnesia").returncode == 0
    again = get_json(cluster, "checkpoints")["items"]
    fresh = [c for c in again if c["spec"]["podName"] == "amnesia" and c["metadata"]["name"] != ck]
    assert fresh and fresh[0]["status"]["sizeBytes"] > 0 and not fresh[0]["status"].get("conditions")
    cluster.kubectl("delete", "pod", "amnesia", "--wait=false")


def test_saving_means_frozen_and_a_snapshot_cut_by_a_restart_thaws_at_once(cluster: FaultCluster, image: str,
                                                                           node) -> None:
    """Two moves from a node whose snapshots pause 8 s halfway: the one waiting for its
    turn stays Pending (its pod not frozen, still answering) and says why; the control plane
    is killed during the first snapshot, and after the restart that pod thaws at once,
    while the second move's snapshot holds the control plane's one slot."""
    node("glacier", "--fault", "slow-snapshots")
    first = serve(cluster, "frz-a", "glacier", image)
    serve(cluster, "frz-b", "glacier", image)
    movers = [move_bg(cluster, "frz-a", "--to", "sim-2")]
    the_checkpoint(cluster, "frz-a", "Saving")
    movers.append(move_bg(cluster, "frz-b", "--to", "sim-2"))
    waiting = wait_for(lambda: next((c for c in checkpoints_of(cluster, "frz-b")
                                     if c["status"].get("message", "").startswith("waiting for its turn")), None),
                       20, what="the second move to wait for its turn")
    assert waiting["status"]["phase"] == "Pending", waiting["status"]
    assert state(cluster, "frz-b")["requests"] >= 1, "the waiting pod answers: it is not frozen"
    cluster.restart()
    back = time.monotonic()
    failed = the_checkpoint(cluster, "frz-a", "Failed", 30)
    assert failed["status"]["message"] == "the snapshot was interrupted (the control plane restarted)"
    pod = running(cluster, "frz-a")
    assert time.monotonic() - back < 10, "the interrupted snapshot's pod stayed frozen"
    assert pod["spec"]["nodeName"] == "glacier"
    after = state(cluster, "frz-a")
    assert after["requests"] == first["requests"] + 1 and after["restored_calls"] == 0
    for m in movers:
        m.kill()
        m.wait()
    cluster.kubectl("delete", "pod", "frz-a", "frz-b", "--wait=false")


def held_move(name: str, pod: str, target: str) -> str:
    return yaml.safe_dump({"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                           "metadata": {"name": name, "labels": {"kube32.io/test-fault": "hold-moving-status"}},
                           "spec": {"podName": pod, "action": "Move", "target": {"nodeName": target}}})


def test_a_move_whose_replacement_was_written_before_a_restart_completes(cluster: FaultCluster, image: str) -> None:
    """The control plane is killed after the replacement was written and before the Moving
    status (a test hook holds that write 30 s): the replacement runs on the target with the
    state, and the move is judged by it - Completed, not "interrupted"."""
    before = serve(cluster, "ontime", "sim-1", image)
    old_uid = get_json(cluster, "pod", "ontime")["metadata"]["uid"]
    cluster.kubectl("apply", "-f", "-", input=held_move("ontime-move", "ontime", "sim-2"))
    moved = wait_for(lambda: (p := running(cluster, "ontime"))["metadata"]["uid"] != old_uid and p, 30,
                     what="the replacement to run on sim-2")
    assert moved["spec"]["nodeName"] == "sim-2"
    assert get_json(cluster, "checkpoint", "ontime-move")["status"]["phase"] == "Saving"
    cluster.restart()
    done = the_checkpoint(cluster, "ontime", "Completed", 30)
    assert done["metadata"]["name"] == "ontime-move"
    assert done["status"]["message"].startswith("moved from sim-1 to sim-2"), done["status"]
    after = state(cluster, "ontime")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, after
    assert "kube32.io/restore-from" not in (get_json(cluster, "pod", "ontime")["metadata"].get("annotations") or {})
    assert events_of(cluster, "ontime", "Moved")
    cluster.kubectl("delete", "pod", "ontime", "--wait=false")


def test_a_move_whose_data_a_restart_lost_says_the_pod_starts_afresh(cluster: FaultCluster, image: str,
                                                                     node) -> None:
    """As above, but the target never finishes the restore: after the restart the data is
    gone, so nothing can be rolled back; the Checkpoint says the pod starts afresh on its
    source, and the Deployment's one pod does, counted once."""
    node("amnesiac", "--fault", "hang-restores")
    app = "rb-lost"
    name = deploy_on(cluster, app, image, "sim-1", "amnesiac")
    old_uid = get_json(cluster, "pod", name)["metadata"]["uid"]
    watches = Watches(cluster, app)
    try:
        cluster.kubectl("apply", "-f", "-", input=held_move(f"{app}-move", name, "amnesiac"))
        wait_for(lambda: (p := get_json(cluster, "pod", name))["metadata"]["uid"] != old_uid
                 and p["spec"]["nodeName"] == "amnesiac", 30, what="the replacement on the target")
        cluster.restart()
        failed = the_checkpoint(cluster, name, "Failed", 40)
        message = failed["status"]["message"]
        # The replacement failed to read the data (the control plane went), or did not run in time.
        assert message.startswith("not rolled back, the pod starts afresh on sim-1: "), message
        assert message.endswith("; the checkpoint's data was lost when the control plane restarted (it lives in "
                                "the control plane's memory)"), message
        pod = running(cluster, name)
        assert pod["spec"]["nodeName"] == "sim-1"
        fresh = state(cluster, name)
        assert fresh["init_calls"] == 1 and fresh["restored_calls"] == 0 and fresh["requests"] == 1, fresh
    finally:
        seen = watches.stop()
    assert_one_pod_all_along(seen, name)
    cluster.kubectl("delete", "deployment", app)
