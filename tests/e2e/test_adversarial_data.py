"""The checkpoint data space under a hostile or careless client, on a real cluster
(``kube32-sim up --workers 2``, 16 MiB of data space), with curl, raw TLS sockets,
kubectl and kube32-cli (docs/security.md, "Checkpoint data").

* A PUT that announces the whole space and trickles a byte every 5 s drops nobody's
  data, holds no other upload or move up, and is cut as too slow.
* The data of a move in flight stays while the move is under way: an upload that
  needs its room is refused, and the rollback restores the pod with its state.
* Another namespace's latest periodic checkpoint keeps its fair share of the space.
"""
from __future__ import annotations

import base64
import itertools
import json
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest
import yaml

from kube32.snapshot import GlobalState, PodState, SnapshotWriter, VALTYPE_I32
from tests.conftest import ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import cli, get_json, push
from tests.e2e.test_faults import move_bg, the_checkpoint
from tests.e2e.test_moves import COUNTER, counter_pod, extra_worker, running, state

SPACE = 16 << 20
A, B = "tenant-a", "tenant-b"


def data_path(ns: str, name: str) -> str:
    return f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints/{name}/data"


def snapshot(memory_bytes: int, fill: int = 3) -> bytes:
    state_ = PodState(image_sha256=bytes(range(32)), memory_bytes=memory_bytes,
                      memory_pages=max(1, -(-memory_bytes // 65536)), pod_time_ms=1, unix_time_ms=0,
                      globals=(GlobalState(0, VALTYPE_I32, 1),))
    return SnapshotWriter(state_, bytes([fill]) * memory_bytes).to_bytes()


class Api:
    """The API server as curl and a raw TLS socket reach it, with the admin's token."""

    def __init__(self, cluster: ControlPlane, tmp: Path) -> None:
        doc = yaml.safe_load(cluster.kubeconfig.read_text())
        self.server = doc["clusters"][0]["cluster"]["server"]
        self.token = doc["users"][0]["user"]["token"]
        self.ca = tmp / "ca.crt"
        self.ca.write_bytes(base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]))
        self.tmp = tmp
        self._calls = itertools.count()

    def curl(self, method: str, path: str, body: bytes | None = None, timeout: float = 60) -> tuple[int, bytes]:
        out = self.tmp / f"answer-{next(self._calls)}"
        cmd = ["curl", "-sS", "--cacert", str(self.ca), "-H", f"Authorization: Bearer {self.token}",
               "-X", method, "-o", str(out), "-w", "%{http_code}", "--max-time", str(timeout)]
        if body is not None:
            sent = out.with_name(out.name + ".sent")
            sent.write_bytes(body)
            cmd += ["-H", "Content-Type: application/octet-stream", "--data-binary", f"@{sent}"]
        done = subprocess.run([*cmd, self.server + path], capture_output=True, timeout=timeout + 10)
        return int(done.stdout or 0), out.read_bytes() if out.exists() else b""

    def connect(self) -> ssl.SSLSocket:
        url = urlparse(self.server)
        ctx = ssl.create_default_context(cafile=str(self.ca))
        return ctx.wrap_socket(socket.create_connection((url.hostname, url.port), timeout=10),
                               server_hostname=url.hostname)


class Trickle(threading.Thread):
    """A PUT that announces ``size`` bytes and sends one every ``every`` seconds until it
    is answered (or ``give_up`` seconds pass)."""

    def __init__(self, api: Api, path: str, size: int, every: float = 5.0, give_up: float = 45.0) -> None:
        super().__init__(daemon=True)
        self.api, self.path, self.size, self.every, self.give_up = api, path, size, every, give_up
        self.sent = 0
        self.answer = b""
        self.answered_after: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        sock = self.api.connect()
        head = (f"PUT {self.path} HTTP/1.1\r\nHost: {urlparse(self.api.server).netloc}\r\n"
                f"Authorization: Bearer {self.api.token}\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {self.size}\r\n\r\n")
        body = snapshot(4096)  # its first bytes: the upload never gets further
        sock.sendall(head.encode())
        sock.settimeout(self.every)
        try:
            while not self.answer and time.monotonic() - started < self.give_up:
                sock.sendall(body[self.sent: self.sent + 1])
                self.sent += 1
                try:
                    self.answer += sock.recv(65536)  # waits up to `every` for an answer
                except TimeoutError:
                    continue
            while not self.answer.rstrip().endswith(b"}") and (chunk := sock.recv(65536)):
                self.answer += chunk
        except OSError:
            pass  # the server may close the connection behind its answer
        finally:
            self.answered_after = time.monotonic() - started if self.answer else None
            sock.close()

    @property
    def status(self) -> int:
        return int(self.answer.split(b" ", 2)[1]) if self.answer else 0

    @property
    def message(self) -> str:
        return json.loads(self.answer.split(b"\r\n\r\n", 1)[1])["message"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("adversarial"), 2, "--backoff", "1",
                      "--move-rollback-timeout", "10s")
    try:
        for ns in (A, B):
            c.kubectl("create", "namespace", ns)
        yield c
    finally:
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: ControlPlane) -> str:
    return push(cluster, COUNTER)


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> Api:
    return Api(cluster, tmp_path)


def checkpoint(cluster: ControlPlane, ns: str, name: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input="apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                    f"metadata: {{name: {name}}}\nspec: {{podName: no-such-pod}}\n")


def saved_checkpoints(cluster: ControlPlane, ns: str, pod: str) -> list[str]:
    return sorted(c["metadata"]["name"] for c in get_json(cluster, "checkpoints", "-n", ns)["items"]
                  if c["spec"]["podName"] == pod and c["status"].get("phase") == "Saved")


def test_a_slow_put_drops_nobody_is_cut_and_holds_no_move_or_upload_up(cluster: ControlPlane, image: str,
                                                                        api: Api) -> None:
    # Namespace B: a pod with two Saved checkpoints.
    cluster.kubectl("apply", "-n", B, "-f", "-", input=counter_pod("keeper", "sim-1", image))
    wait_for(lambda: ((get_json(cluster, "pod", "keeper", "-n", B).get("status") or {})
                      .get("containerStatuses") or [{}])[0].get("ready"), 30, what="keeper ready")
    for _ in range(2):
        out = cli(cluster, "checkpoint", "keeper", "-n", B)
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    saved = saved_checkpoints(cluster, B, "keeper")
    assert len(saved) == 2
    kept = {name: api.curl("GET", data_path(B, name)) for name in saved}
    assert all(status == 200 for status, _ in kept.values()), kept

    cluster.kubectl("apply", "-n", A, "-f", "-", input=counter_pod("mover", "sim-1", image))
    wait_for(lambda: ((get_json(cluster, "pod", "mover", "-n", A).get("status") or {})
                      .get("containerStatuses") or [{}])[0].get("ready"), 30, what="mover ready")

    # Namespace A: a PUT announcing the whole space, a byte every 5 s.
    checkpoint(cluster, A, "slow")
    slow = Trickle(api, data_path(A, "slow"), SPACE)
    slow.start()
    time.sleep(1.5)
    for name, answer in kept.items():
        assert api.curl("GET", data_path(B, name)) == answer, f"{B}/{name}'s data went for bytes that never came"

    # Meanwhile another upload in A waits its turn instead of failing, and a move works.
    checkpoint(cluster, A, "quick")
    quick_body = snapshot(1 << 20)
    quick: list[tuple[int, bytes]] = []
    uploader = threading.Thread(target=lambda: quick.append(api.curl("PUT", data_path(A, "quick"), quick_body)))
    uploader.start()
    moved = cli(cluster, "move", "mover", "-n", A, "--to", "sim-2")
    assert moved.returncode == 0, moved.stdout.decode() + moved.stderr.decode()
    assert "Completed" in moved.stdout.decode()
    assert not slow.answer, "the move was done while the slow PUT was still open"
    assert get_json(cluster, "pod", "mover", "-n", A)["spec"]["nodeName"] == "sim-2"

    # The slow PUT is cut as too slow, with nothing stored; then the waiting upload goes in.
    slow.join(60)
    assert slow.status == 408, slow.answer[:400]
    assert "too slow" in slow.message and "nothing was stored" in slow.message, slow.message
    assert slow.answered_after is not None and slow.answered_after < 25, slow.answered_after
    assert api.curl("GET", data_path(A, "slow"))[0] == 404
    uploader.join(60)
    assert quick and quick[0][0] == 200, quick
    assert api.curl("GET", data_path(A, "quick")) == (200, quick_body)
    for name, answer in kept.items():
        assert api.curl("GET", data_path(B, name)) == answer
    cluster.kubectl("delete", "pod", "-n", A, "mover", "--wait=false")
    cluster.kubectl("delete", "pod", "-n", B, "keeper", "--wait=false")


def test_a_moves_data_stays_while_it_moves_and_the_rollback_restores_it(cluster: ControlPlane, image: str,
                                                                         api: Api) -> None:
    """Issue 20: unrelated uploads dropped the data of a move still Moving, and the
    rollback then started the pod afresh."""
    stuck = extra_worker(cluster, "stuck", "--fault", "hang-restores")  # never finishes a restore
    try:
        cluster.kubectl("apply", "-f", "-", input=counter_pod("held", "sim-1", image))
        running(cluster, "held")
        before = state(cluster, "held")
        mover = move_bg(cluster, "held", "--to", "stuck")
        name = the_checkpoint(cluster, "held", "Moving")["metadata"]["name"]
        status, move_data = api.curl("GET", data_path("default", name))
        assert status == 200
        # An upload in another namespace that only fits without the move's data.
        checkpoint(cluster, A, "filler")
        status, body = api.curl("PUT", data_path(A, "filler"), snapshot(SPACE - (16 << 10) - 200))
        assert status == 429, body[:300]
        assert "moves in flight" in json.loads(body)["message"], body
        assert api.curl("GET", data_path("default", name)) == (200, move_data), "the move's data stayed"
        assert api.curl("GET", data_path(A, "filler"))[0] == 404

        out = mover.communicate(timeout=60)[0].decode()
        assert mover.returncode == 1 and "rolled back to sim-1" in out, out
        back = running(cluster, "held")
        assert back["spec"]["nodeName"] == "sim-1"
        after = state(cluster, "held")
        assert after["requests"] == before["requests"] + 1 and after["init_calls"] == 1, after
        assert after["restored_calls"] == 1, "restored from the move's data, not started afresh"
    finally:
        cluster.kubectl("delete", "pod", "held", "--wait=false")
        stuck.stop()
        cluster.kubectl("delete", "node", "stuck", "--wait=false", check=False)



def test_another_namespaces_latest_periodic_checkpoint_keeps_its_fair_share(cluster: ControlPlane, image: str,
                                                                             api: Api) -> None:
    """What node-loss recovery needs in B does not go for a snapshot of A's that wants
    nearly the whole space; A's data that fits beside it does go in."""
    cluster.kubectl("apply", "-n", B, "-f", "-", input=counter_pod("recover", "sim-1", image))
    wait_for(lambda: ((get_json(cluster, "pod", "recover", "-n", B).get("status") or {})
                      .get("containerStatuses") or [{}])[0].get("ready"), 30, what="recover ready")
    # As the periodic checkpoints controller makes them.
    cluster.kubectl("apply", "-n", B, "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kube32.io/v1", "kind": "Checkpoint",
        "metadata": {"name": "recover-periodic", "labels": {"kube32.io/trigger": "periodic"}},
        "spec": {"podName": "recover", "action": "Save"}}))
    wait_for(lambda: get_json(cluster, "checkpoint", "recover-periodic", "-n", B)["status"].get("phase") == "Saved",
             30, what="the periodic checkpoint")
    status, recovery = api.curl("GET", data_path(B, "recover-periodic"))
    assert status == 200
    try:
        checkpoint(cluster, A, "hog")
        status, body = api.curl("PUT", data_path(A, "hog"), snapshot(SPACE - (16 << 10) - 200))
        assert status == 429 and "fair share" in json.loads(body)["message"], body[:300]
        assert api.curl("GET", data_path(B, "recover-periodic")) == (200, recovery)
        half = snapshot(SPACE // 2)
        assert api.curl("PUT", data_path(A, "hog"), half)[0] == 200
        assert api.curl("GET", data_path(A, "hog")) == (200, half)
        assert api.curl("GET", data_path(B, "recover-periodic")) == (200, recovery)
    finally:
        cluster.kubectl("delete", "pod", "-n", B, "recover", "--wait=false")
