"""Fault injection: every fault of a move, caused for real, is survived and loses nothing
the spec says it keeps (spec: "Moves", "Kubelet endpoints", "Checkpoint objects and
data", "Limits").  docs/reliability.md is the table of these tests.

The control plane and the workers run as separate processes (``kube32-sim
control-plane`` + ``kube32-sim worker``), so a test can SIGKILL one node or restart the
control plane alone on the same data directory and port.  Faults a process cannot be
made to have from outside are test-only hooks: ``kube32-sim worker --fault
hang-restores|truncate-restores|slow-snapshots`` and, in the control plane,
``KUBE32_TEST_FAULTS=corrupt-stored-data,hold-moving-status`` for Checkpoints labelled
``kube32.io/test-fault: corrupt-stored-data`` (or ``hold-moving-status``: tests/e2e/test_rollbacks.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import http.server
import io
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from kube32.client import Client
from kube32.snapshot import VALTYPE_I32, VALTYPE_I64, SnapshotReader, SnapshotWriter, TableState
from tests.conftest import ROOT, ControlPlane, Proc, sim_command, start, wait_for
from tests.e2e.helpers import cli, get_json, push
from tests.e2e.test_moves import api_call, counter_pod, running, state

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
ROLLBACK_S = 6
DAMAGED = "cannot restore the snapshot: the snapshot's trailer does not match its contents " \
          "(damaged in transfer or storage)"
TRUNCATED = "cannot restore the snapshot: the snapshot ends before its trailer (truncated)"
CP_FLAGS = ("--no-kubelet", "--move-rollback-timeout", f"{ROLLBACK_S}s", "--node-monitor-grace-period", "3s",
            "--pod-eviction-timeout", "1s", "--node-monitor-period", "0.5s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultCluster(ControlPlane):
    """A control plane that can be restarted on the same data directory and port."""

    port: int = 0

    def start_control_plane(self) -> None:
        n = len(list(self.data_dir.glob("control-plane*.log")))
        self.proc = start(sim_command("control-plane", "--data-dir", str(self.data_dir), "--port", str(self.port),
                                      *CP_FLAGS), self.data_dir / f"control-plane{n}.log",
                          env={"KUBE32_TEST_FAULTS": "corrupt-stored-data,hold-moving-status"})
        wait_for(lambda: "listening on" in self.proc.output() or self.proc.popen.poll() is not None, 30,
                 what="the control plane to listen")
        assert self.proc.popen.poll() is None, self.proc.output()

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.proc.stop(sig, timeout=15)
        self.start_control_plane()
        wait_for(lambda: self.kubectl("get", "nodes", check=False).returncode == 0, 30, what="the API back")

    def worker(self, name: str, *flags: str) -> Proc:
        w = start(sim_command("worker", "--kubeconfig", str(self.data_dir / "node.kubeconfig"), "--name", name,
                              "--interp-mops", "100", "--lease-interval", "0.5", "--backoff", "1", *flags),
                  self.data_dir / f"{name}.log")
        wait_for(lambda: node_ready(self, name), 30, what=f"{name} Ready")
        return w


def node_ready(cluster: ControlPlane, name: str) -> bool:
    node = get_json(cluster, "node", name)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    data_dir = tmp_path_factory.mktemp("faults")
    c = FaultCluster(data_dir, None, data_dir / "admin.kubeconfig", data_dir / "kubectl-cache")  # type: ignore[arg-type]
    c.port = free_port()
    c.start_control_plane()
    workers = [c.worker(n) for n in ("sim-1", "sim-2")]
    try:
        yield c
    finally:
        for w in workers:
            w.stop()
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: FaultCluster) -> str:
    return push(cluster, COUNTER)


@pytest.fixture
def node(cluster: FaultCluster, request: pytest.FixtureRequest):
    """Start an extra worker with faults; stopped and deleted after the test."""
    started: list[tuple[str, Proc]] = []

    def make(name: str, *flags: str) -> Proc:
        w = cluster.worker(name, *flags)
        started.append((name, w))
        return w
    yield make
    for name, w in started:
        w.stop(signal.SIGKILL)
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def checkpoints_of(cluster: ControlPlane, pod: str) -> list[dict]:
    items = [c for c in get_json(cluster, "checkpoints")["items"] if c["spec"]["podName"] == pod]
    return sorted(items, key=lambda c: int(c["metadata"]["resourceVersion"]))


def the_checkpoint(cluster: ControlPlane, pod: str, phase: str, timeout: float = 30) -> dict:
    return wait_for(lambda: next((c for c in reversed(checkpoints_of(cluster, pod))
                                  if c["status"].get("phase") == phase), None), timeout,
                    what=f"a {phase} checkpoint of {pod}")


def events_of(cluster: ControlPlane, pod: str, reason: str) -> list[dict]:
    return [e for e in get_json(cluster, "events")["items"]
            if e["involvedObject"]["name"] == pod and e["reason"] == reason]


def move_bg(cluster: ControlPlane, pod: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kube32.cli.main", "move", pod, *args,
                             "--kubeconfig", str(cluster.kubeconfig)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def serve_pod(cluster: ControlPlane, name: str, node: str, image: str, **extra) -> dict:
    cluster.kubectl("apply", "-f", "-", input=counter_pod(name, node, image, **extra))
    running(cluster, name)
    return state(cluster, name)


def assert_back_with_state(cluster: ControlPlane, name: str, source: str, before: dict) -> None:
    back = running(cluster, name)
    assert back["spec"]["nodeName"] == source
    after = state(cluster, name)
    assert after["requests"] == before["requests"] + 1, (before, after)
    assert after["init_calls"] == 1 and after["restored_calls"] == 1


# --- the target fails ------------------------------------------------------------------------
def test_target_never_starts_the_replacement_rolls_back_after_the_timeout(cluster, image, node) -> None:
    node("never", "--fault", "hang-restores")
    before = serve_pod(cluster, "nvr", "sim-1", image)
    out = cli(cluster, "move", "nvr", "--to", "never")
    assert out.returncode == 1 and "rolled back to sim-1" in out.stdout.decode(), out.stdout.decode()
    ck = the_checkpoint(cluster, "nvr", "Failed")
    assert ck["status"]["message"] == f"rolled back to sim-1: the replacement did not run within {ROLLBACK_S} s"
    assert_back_with_state(cluster, "nvr", "sim-1", before)
    cluster.kubectl("delete", "pod", "nvr", "--wait=false")


def test_target_killed_while_it_restores_rolls_back_with_the_state(cluster, image, node) -> None:
    doomed = node("doomed", "--fault", "hang-restores")
    before = serve_pod(cluster, "kil", "sim-1", image)
    mover = move_bg(cluster, "kil", "--to", "doomed")
    the_checkpoint(cluster, "kil", "Moving")
    doomed.popen.send_signal(signal.SIGKILL)
    doomed.popen.wait(10)
    out = mover.communicate(timeout=60)[0].decode()
    assert mover.returncode == 1 and "rolled back to sim-1" in out, out
    ck = the_checkpoint(cluster, "kil", "Failed")
    assert "the replacement did not run within" in ck["status"]["message"]
    assert_back_with_state(cluster, "kil", "sim-1", before)
    # The lost node's eviction did not delete the replacement under way (that would lose the state).
    assert not events_of(cluster, "kil", "TaintManagerEviction")
    cluster.kubectl("delete", "pod", "kil", "--wait=false")


def test_truncated_download_rolls_back_with_the_state(cluster, image, node) -> None:
    node("cutter", "--fault", "truncate-restores")
    before = serve_pod(cluster, "cut", "sim-1", image)
    out = cli(cluster, "move", "cut", "--to", "cutter")
    assert out.returncode == 1 and "rolled back to sim-1" in out.stdout.decode(), out.stdout.decode()
    assert TRUNCATED in the_checkpoint(cluster, "cut", "Failed")["status"]["message"]
    assert_back_with_state(cluster, "cut", "sim-1", before)
    restore_errors = events_of(cluster, "cut", "RestoreError")
    assert restore_errors and all(TRUNCATED in e["message"] for e in restore_errors)
    cluster.kubectl("delete", "pod", "cut", "--wait=false")


def test_data_corrupted_in_storage_is_refused_and_the_pod_starts_afresh(cluster, image) -> None:
    """Damaged stored data fails the restore on the target and, from the same data, on
    the source: the pod ends replaced without the annotation and starts afresh."""
    serve_pod(cluster, "rot", "sim-1", image)
    ck = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
          "metadata": {"name": "rot-move", "labels": {"kube32.io/test-fault": "corrupt-stored-data"}},
          "spec": {"podName": "rot", "action": "Move", "target": {"nodeName": "sim-2"}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(ck))
    failed = the_checkpoint(cluster, "rot", "Failed", 60)
    assert failed["status"]["message"].startswith(f"rolled back to sim-1: {DAMAGED}")
    # Once the restore on the source failed as well, the Checkpoint says so.
    wait_for(lambda: get_json(cluster, "checkpoint", "rot-move")["status"]["message"] ==
             f"rolled back to sim-1: {DAMAGED}; the restore on sim-1 failed too ({DAMAGED}): the pod started afresh",
             30, what="the Checkpoint to say the pod started afresh")
    fresh = wait_for(lambda: (s := state(cluster, "rot")) and s["init_calls"] == 1 and s["restored_calls"] == 0
                     and s, 30, what="the pod to start afresh")
    assert fresh["requests"] == 1
    pod = running(cluster, "rot")
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert "kube32.io/restore-from" not in (pod["metadata"].get("annotations") or {})
    errors = events_of(cluster, "rot", "RestoreError")
    assert {e["source"]["host"] for e in errors} == {"sim-1", "sim-2"}
    assert all(e["message"] == DAMAGED for e in errors)
    assert not events_of(cluster, "rot", "BackOff"), "a container that failed to restore is not restarted"
    assert any("starts afresh" in e["message"] for e in events_of(cluster, "rot", "MoveFailed"))
    cluster.kubectl("delete", "pod", "rot", "--wait=false")


class _Modules(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_module_replaced_at_the_same_url_is_refused(cluster, image, tmp_path: Path) -> None:
    shutil.copy(COUNTER, tmp_path / "app.wasm")
    handler = lambda *a, **k: _Modules(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"wasm://127.0.0.1:{server.server_address[1]}/app.wasm"
        serve_pod(cluster, "swap", "sim-1", url)
        # The same module with a custom section appended: a valid pod, another digest.
        (tmp_path / "app.wasm").write_bytes(COUNTER.read_bytes() + b"\x00\x06\x05extra")
        out = cli(cluster, "move", "swap", "--to", "sim-2")
        assert out.returncode == 1, out.stdout.decode()
        message = the_checkpoint(cluster, "swap", "Failed")["status"]["message"]
        assert "cannot restore the snapshot: the snapshot was taken from image sha256:" in message
        assert "not from this pod's image sha256:" in message
        # The source pulls the URL again and gets the new module too: that restore fails
        # the same way, and the pod starts afresh on the new module.
        fresh = wait_for(lambda: (s := state(cluster, "swap")) and s["init_calls"] == 1 and s["restored_calls"] == 0
                         and s, 30, what="the pod to start afresh")
        assert fresh["requests"] == 1
    finally:
        server.shutdown()
        cluster.kubectl("delete", "pod", "swap", "--wait=false")


# --- the source fails --------------------------------------------------------------------------
def test_a_long_call_delays_the_move_and_is_answered(cluster, image) -> None:
    """The freeze waits for the current call (here 6 s, under the 10 s freeze timeout);
    the call is answered and the move then completes with the state.  A call past the
    freeze timeout: the next test."""
    before = serve_pod(cluster, "long", "sim-1", image)
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(
        api_call(cluster, "POST", "/api/v1/namespaces/default/pods/long/proxy/work?ms=6000")[0]))
    worker.start()
    time.sleep(0.5)
    out = cli(cluster, "move", "long", "--to", "sim-2")
    worker.join()
    assert out.returncode == 0, out.stdout.decode()
    assert results == [200]
    after = state(cluster, "long")
    assert after["requests"] == before["requests"] + 2 and after["restored_calls"] == 1
    assert get_json(cluster, "pod", "long")["spec"]["nodeName"] == "sim-2"
    cluster.kubectl("delete", "pod", "long", "--wait=false")


def test_a_call_past_the_freeze_timeout_refuses_the_move_and_the_pod_keeps_running(cluster, image) -> None:
    """A call still running 10 s after the freeze began: the move fails with the spec's
    blocker, the call is answered, and the pod keeps running where it is."""
    before = serve_pod(cluster, "slow", "sim-1", image)
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(
        api_call(cluster, "POST", "/api/v1/namespaces/default/pods/slow/proxy/work?ms=15000")[0]))
    worker.start()
    time.sleep(2.5)  # the call is under way (even on a loaded machine) and has 12.5 s to go
    out = cli(cluster, "move", "slow", "--to", "sim-2")
    worker.join()
    assert out.returncode == 1
    assert "- call k32_handle still running after 10000 ms" in out.stdout.decode(), out.stdout.decode()
    assert results == [200]
    assert get_json(cluster, "pod", "slow")["spec"]["nodeName"] == "sim-1"
    after = state(cluster, "slow")
    assert after["requests"] == before["requests"] + 2 and after["restored_calls"] == 0
    assert after["init_calls"] == 1
    cluster.kubectl("delete", "pod", "slow", "--wait=false")


def test_source_killed_while_it_streams(cluster, image, node) -> None:
    """The Checkpoint fails; the pod with a periodic checkpoint comes back elsewhere from
    it; the Deployment's pod without one is started afresh by its owner."""
    src = node("streamer", "--fault", "slow-snapshots")
    serve_pod(cluster, "keep", "streamer", image, annotations={"kube32.io/checkpoint-interval": "10s"})
    for _ in range(2):
        state(cluster, "keep")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "lose"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "lose"}},
                    "template": {"metadata": {"labels": {"app": "lose"}},
                                 "spec": {"containers": [{"name": "main", "image": image}]}}}}
    for n in ("sim-1", "sim-2"):
        cluster.kubectl("cordon", n)
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(dep))
        cluster.kubectl("rollout", "status", "deployment/lose", "--timeout=60s", timeout=90)
    finally:
        for n in ("sim-1", "sim-2"):
            cluster.kubectl("uncordon", n)
    lose = get_json(cluster, "pods", "-l", "app=lose")["items"][0]
    assert lose["spec"]["nodeName"] == "streamer"
    saved = wait_for(lambda: next((c for c in checkpoints_of(cluster, "keep") if c["status"].get("phase") == "Saved"),
                                  None), 20, what="a periodic checkpoint")
    at_save = saved["status"]["podTimeMs"]

    mover = move_bg(cluster, "keep", "--to", "sim-2")
    wait_for(lambda: any(c["status"].get("phase") == "Saving" for c in checkpoints_of(cluster, "keep")), 20,
             what="the move's snapshot to start")
    time.sleep(0.5)
    src.popen.send_signal(signal.SIGKILL)
    src.popen.wait(10)
    out = mover.communicate(timeout=60)[0].decode()
    assert mover.returncode == 1, out
    failed = the_checkpoint(cluster, "keep", "Failed")
    assert failed["status"]["message"].startswith(("the snapshot transfer from streamer failed",
                                                   "the snapshot could not be stored")), failed["status"]
    back = wait_for(lambda: (p := get_json(cluster, "pod", "keep"))["spec"].get("nodeName") not in (None, "streamer")
                    and p, 40, what="keep to come back elsewhere")
    running(cluster, "keep")
    restored = state(cluster, "keep")
    assert restored["restored_calls"] == 1 and restored["time_ms"] >= at_save, restored
    assert back["spec"]["nodeName"] in ("sim-1", "sim-2")
    fresh = wait_for(lambda: [p for p in get_json(cluster, "pods", "-l", "app=lose")["items"]
                              if p["spec"].get("nodeName") not in (None, "streamer")
                              and not p["metadata"].get("deletionTimestamp")], 40, what="a fresh Deployment pod")
    name = fresh[0]["metadata"]["name"]
    running(cluster, name)
    s = state(cluster, name)
    assert s["init_calls"] == 1 and s["restored_calls"] == 0 and s["requests"] == 1
    cluster.kubectl("delete", "deployment", "lose")
    cluster.kubectl("delete", "pod", "keep", "--wait=false")


# --- the control plane restarts ------------------------------------------------------------------
def test_control_plane_restarted_mid_snapshot_thaws_the_pod(cluster, image, node) -> None:
    node("slow", "--fault", "slow-snapshots")
    before = serve_pod(cluster, "mid", "slow", image)
    mover = move_bg(cluster, "mid", "--to", "sim-2")
    wait_for(lambda: any(c["status"].get("phase") == "Saving" for c in checkpoints_of(cluster, "mid")), 20,
             what="the snapshot to start")
    time.sleep(0.5)
    cluster.restart()
    mover.kill()
    mover.wait()
    failed = the_checkpoint(cluster, "mid", "Failed", 30)
    assert failed["status"]["message"] == "the snapshot was interrupted (the control plane restarted)"
    pod = running(cluster, "mid")  # Ready again: thawed
    assert pod["spec"]["nodeName"] == "slow"
    after = state(cluster, "mid")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 0
    cluster.kubectl("delete", "pod", "mid", "--wait=false")


def test_control_plane_restarted_while_moving_loses_the_data_and_the_pod_starts_afresh(cluster, image,
                                                                                       node) -> None:
    node("stuck", "--fault", "hang-restores")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "amid"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "amid"}},
                    "template": {"metadata": {"labels": {"app": "amid"}},
                                 "spec": {"nodeSelector": {"kube32.io/fault-test": "amid"},
                                          "containers": [{"name": "main", "image": image}]}}}}
    for n in ("sim-1", "stuck"):
        cluster.kubectl("label", "node", n, "kube32.io/fault-test=amid", "--overwrite")
    cluster.kubectl("cordon", "stuck")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(dep))
    cluster.kubectl("rollout", "status", "deployment/amid", "--timeout=60s", timeout=90)
    cluster.kubectl("uncordon", "stuck")
    name = get_json(cluster, "pods", "-l", "app=amid")["items"][0]["metadata"]["name"]
    state(cluster, name)
    mover = move_bg(cluster, name, "--to", "stuck")
    ck = the_checkpoint(cluster, name, "Moving")
    cluster.restart()
    mover.kill()
    mover.wait()
    assert get_json(cluster, "checkpoint", ck["metadata"]["name"])["status"]["phase"] in ("Moving", "Failed")
    status, _, _ = api_call(cluster, "GET", f"/apis/kube32.io/v1/namespaces/default/checkpoints/"
                                            f"{ck['metadata']['name']}/data")
    assert status == 404, "a control plane restart loses checkpoint data"
    # Nothing to roll back without the data: the Checkpoint says so, and the pod starts
    # afresh on its source under its name, one pod all along.
    failed = the_checkpoint(cluster, name, "Failed", 30)
    assert failed["status"]["message"].startswith("not rolled back, the pod starts afresh on sim-1: "), failed
    assert "the checkpoint's data was lost when the control plane restarted" in failed["status"]["message"]

    def one_fresh_pod() -> dict | None:
        pods = [p for p in get_json(cluster, "pods", "-l", "app=amid")["items"]
                if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        cs = (pods[0].get("status") or {}).get("containerStatuses") or [{}]
        return pods[0] if cs[0].get("ready") else None
    pod = wait_for(one_fresh_pod, 40, what="one fresh pod, ready (none frozen)")
    assert pod["metadata"]["name"] == name and pod["spec"]["nodeName"] == "sim-1"
    fresh = state(cluster, pod["metadata"]["name"])
    assert fresh["init_calls"] == 1 and fresh["restored_calls"] == 0 and fresh["requests"] == 1
    cluster.kubectl("delete", "deployment", "amid")


def test_control_plane_restarted_between_moves_keeps_objects_not_data(cluster, image) -> None:
    before = serve_pod(cluster, "calm", "sim-1", image)
    assert cli(cluster, "checkpoint", "calm").returncode == 0
    saved = the_checkpoint(cluster, "calm", "Saved")["metadata"]["name"]
    cluster.restart(signal.SIGTERM)
    assert get_json(cluster, "checkpoint", saved)["status"]["phase"] == "Saved"
    path = f"/apis/kube32.io/v1/namespaces/default/checkpoints/{saved}/data"
    assert api_call(cluster, "GET", path)[0] == 404
    after = state(cluster, "calm")
    assert after["requests"] == before["requests"] + 1, "the pod ran on through the restart"
    # A pod asked to restore from it fails to, and is replaced to start afresh.
    pod = yaml.safe_load(counter_pod("phoenix", "sim-2", image, annotations={"kube32.io/restore-from": saved}))
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    fresh = wait_for(lambda: (s := state(cluster, "phoenix")) and s["init_calls"] == 1 and s, 30,
                     what="phoenix to start afresh")
    assert fresh["restored_calls"] == 0
    assert any(f"checkpoint {saved} has no data" in e["message"] for e in events_of(cluster, "phoenix", "RestoreError"))
    # And a move after the restart works as before.
    out = cli(cluster, "move", "calm", "--to", "sim-2")
    assert out.returncode == 0, out.stdout.decode()
    assert state(cluster, "calm")["requests"] == before["requests"] + 2
    cluster.kubectl("delete", "pod", "calm", "phoenix", "--wait=false")


# --- uploads, events ------------------------------------------------------------------------------
def _put(cluster: ControlPlane, ck: str, body: bytes, length: int) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        async with Client.from_kubeconfig(cluster.kubeconfig) as c:
            path = f"/apis/kube32.io/v1/namespaces/default/checkpoints/{ck}/data"
            if len(body) == length:
                async with c.request("PUT", path, data=body,
                                     headers={"Content-Type": "application/octet-stream"}) as r:
                    return r.status, await r.text()

            async def cut():  # the connection ends before Content-Length bytes came
                yield body
                raise ConnectionResetError("cut")
            try:
                async with c.request("PUT", path, data=cut(), headers={"Content-Type": "application/octet-stream",
                                                                      "Content-Length": str(length)}) as r:
                    return r.status, await r.text()
            except Exception as e:  # noqa: BLE001 - the client gives up on the cut body
                return 0, str(e)
    return asyncio.run(go())


def test_truncated_uploads_store_nothing(cluster, image) -> None:
    serve_pod(cluster, "up", "sim-1", image)
    status, _, snap = api_call(cluster, "POST", "/api/v1/nodes/sim-1/proxy/checkpoint/default/up/main")
    assert status == 200
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": "up-manual"},
        "spec": {"podName": "up-nowhere"}}))  # no such pod: the controller fails it, the data stays ours
    code, text = _put(cluster, "up-manual", snap[:-100], len(snap) - 100)
    # The last bytes read as the trailer, which then does not match: refused all the same.
    assert code == 422 and json.loads(text)["message"].startswith("the snapshot is not valid: "), text
    code, _ = _put(cluster, "up-manual", snap[: len(snap) // 2], len(snap))
    assert code != 200
    path = "/apis/kube32.io/v1/namespaces/default/checkpoints/up-manual/data"
    wait_for(lambda: api_call(cluster, "GET", path)[0] == 404, 5, what="no data stored")
    assert "sizeBytes" not in (get_json(cluster, "checkpoint", "up-manual").get("status") or {})
    assert _put(cluster, "up-manual", snap, len(snap))[0] == 200
    assert api_call(cluster, "GET", path)[2] == snap
    cluster.kubectl("delete", "checkpoint", "up-manual")
    cluster.kubectl("delete", "pod", "up", "--wait=false")


def test_events_while_frozen_eight_held_in_order_the_rest_dropped_and_counted(cluster, image) -> None:
    before = serve_pod(cluster, "ev", "sim-1", image)
    base = "/api/v1/nodes/sim-1/proxy"
    assert api_call(cluster, "POST", f"{base}/checkpoint/default/ev/main?leave=frozen")[0] == 200
    for i in range(1, 12):
        assert cli(cluster, "publish", "greet", f"e{i}").returncode == 0
    time.sleep(0.5)
    # The move carries the 8 held events in the snapshot; they reach the pod after the restore.
    out = cli(cluster, "move", "ev", "--to", "sim-2")
    assert out.returncode == 0, out.stdout.decode()
    after = wait_for(lambda: (s := state(cluster, "ev"))["events"] >= before["events"] + 8 and s, 10,
                     what="the held events")
    assert after["events"] == before["events"] + 8 and after["last_event"] == "greet:e8"
    dropped = wait_for(lambda: events_of(cluster, "ev", "EventsDropped"), 10, what="EventsDropped")
    assert sum(e["count"] for e in dropped) == 3 and dropped[0]["type"] == "Warning"
    assert "at most 8 wait for a pod while it is frozen or moving" in dropped[0]["message"]
    cluster.kubectl("delete", "pod", "ev", "--wait=false")


def _put_data(cluster: ControlPlane, name: str, data: bytes) -> int:
    async def go() -> int:
        async with Client.from_kubeconfig(cluster.kubeconfig) as c:
            async with c.request("PUT", f"/apis/kube32.io/v1/namespaces/default/checkpoints/{name}/data", data=data,
                                 headers={"Content-Type": "application/octet-stream"}) as r:
                return r.status
    return asyncio.run(go())


def test_a_snapshot_whose_globals_or_tables_do_not_match_the_module_is_refused(cluster, image) -> None:
    """The spec's "a global or a table does not match the module", end to end: a real
    snapshot of the counter, rewritten with a global of another type or a table the
    module lacks (same image, valid trailer), stored as a Checkpoint's data and restored
    by a pod that names it: RestoreError, with the mismatch named."""
    serve_pod(cluster, "shape", "sim-1", image)
    assert cli(cluster, "checkpoint", "shape").returncode == 0
    saved = the_checkpoint(cluster, "shape", "Saved")["metadata"]["name"]
    code, _, data = api_call(cluster, "GET", f"/apis/kube32.io/v1/namespaces/default/checkpoints/{saved}/data")
    assert code == 200
    memory = bytearray()
    state_ = SnapshotReader(None, lambda h: memoryview(memory.extend(bytes(h.memory_bytes)) or memory)
                            ).read_from(io.BytesIO(data)).state
    first = state_.globals[0]
    assert first.valtype == VALTYPE_I32  # clang's stack pointer
    variants = {
        "shape-g": (dataclasses.replace(state_, globals=(dataclasses.replace(first, valtype=VALTYPE_I64),
                                                         *state_.globals[1:])),
                    f"global {first.index} is i64 in the snapshot but i32 in the module"),
        "shape-t": (dataclasses.replace(state_, tables=(*state_.tables, TableState(7, ()))),
                    "table 7 is in the snapshot but the module has no table 7"),
    }
    try:
        for pod, (state_variant, message) in variants.items():
            cluster.kubectl("apply", "-f", "-", input=f"apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                            f"metadata: {{name: {pod}-data}}\nspec: {{podName: nobody-{pod}}}\n")
            assert _put_data(cluster, f"{pod}-data", SnapshotWriter(state_variant, memory).to_bytes()) == 200
            cluster.kubectl("apply", "-f", "-", input=counter_pod(
                pod, "sim-2", image, annotations={"kube32.io/restore-from": f"{pod}-data"}))
            errors = wait_for(lambda: events_of(cluster, pod, "RestoreError"), 30, what=f"{pod}'s RestoreError")
            assert any(message in e["message"] for e in errors), errors
    finally:
        cluster.kubectl("delete", "pod", "shape", "shape-g", "shape-t", "--wait=false", check=False)
        cluster.kubectl("delete", "checkpoint", "shape-g-data", "shape-t-data", "--wait=false", check=False)
