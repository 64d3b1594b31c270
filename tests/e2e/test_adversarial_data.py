"""The checkpoint data space under a hostile or careless client, on a real cluster
(``kube32-sim up --workers 2``, 16 MiB of data space), with curl, raw TLS sockets,
kubectl and kube32-cli (docs/security.md, "Checkpoint data").

* A PUT that announces the whole space and trickles a byte every 5 s drops nobody's
  data, holds no other upload or move up, and is cut as too slow.
* The data of a move in flight stays while the move is under way: an upload that
  needs its room waits for it, and the rollback restores the pod with its state first.
* Another namespace's latest periodic checkpoint keeps its fair share of the space.

Issue #19's attack round (tests/attack/test_attack19.py, findings 9-11), each one
namespace (``tenant-a``) against the admin's pods and data in ``default``:

* a move of a pod of nearly the whole space that stays in flight does not refuse the
  other namespaces' moves: they wait for room, their pods running, and the tenant's
  next moves wait behind them; nothing is stored beyond the space;
* two uploads of the whole space at the least allowed pace do not make another
  namespace's upload fail (namespaces take the room for uploads arriving in turn);
* Saves of a pod that never leaves its call do not hold another namespace's Save up
  (the pod gives the snapshot slot up after a second, and tries again at its turn);
* a node (joined with the bootstrap token) that never answers the control plane's
  ``/checkpoint`` holds no other snapshot up (504 after the freeze timeout and 5 s).
"""
from __future__ import annotations

import base64
import http.server
import itertools
import json
import re
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import pytest
import wasmtime
import yaml

from kube32.kubelet.join import make_csr
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

    def json(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        """A JSON request with another identity's token (a node's, the bootstrap token)."""
        req = urllib.request.Request(self.server + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        ctx = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


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


def ready(cluster: ControlPlane, ns: str, pod: str) -> None:
    wait_for(lambda: ((get_json(cluster, "pod", pod, "-n", ns).get("status") or {})
                      .get("containerStatuses") or [{}])[0].get("ready"), 30, what=f"{ns}/{pod} ready")


def saved_checkpoints(cluster: ControlPlane, ns: str, pod: str) -> list[str]:
    return sorted(c["metadata"]["name"] for c in get_json(cluster, "checkpoints", "-n", ns)["items"]
                  if c["spec"]["podName"] == pod and c["status"].get("phase") == "Saved")


def test_a_slow_put_drops_nobody_is_cut_and_holds_no_move_or_upload_up(cluster: ControlPlane, image: str,
                                                                        api: Api) -> None:
    # Namespace B: a pod with two Saved checkpoints.
    cluster.kubectl("apply", "-n", B, "-f", "-", input=counter_pod("keeper", "sim-1", image))
    ready(cluster, B, "keeper")
    for _ in range(2):
        out = cli(cluster, "checkpoint", "keeper", "-n", B)
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    saved = saved_checkpoints(cluster, B, "keeper")
    assert len(saved) == 2
    kept = {name: api.curl("GET", data_path(B, name)) for name in saved}
    assert all(status == 200 for status, _ in kept.values()), kept

    cluster.kubectl("apply", "-n", A, "-f", "-", input=counter_pod("mover", "sim-1", image))
    ready(cluster, A, "mover")

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
        # An upload in another namespace that only fits without the move's data: it waits
        # for room (the PUT's patience, 30 s, outlasts the 10 s rollback timeout).
        checkpoint(cluster, A, "filler")
        filler = snapshot(SPACE - (16 << 10) - 200)
        answered: list[tuple[int, bytes]] = []
        uploader = threading.Thread(target=lambda: answered.append(api.curl("PUT", data_path(A, "filler"), filler)))
        uploader.start()
        time.sleep(2)
        assert not answered, answered
        assert api.curl("GET", data_path("default", name)) == (200, move_data), "the move's data stayed"
        assert api.curl("GET", data_path(A, "filler"))[0] == 404

        out = mover.communicate(timeout=60)[0].decode()
        assert mover.returncode == 1 and "rolled back to sim-1" in out, out
        back = running(cluster, "held")
        assert back["spec"]["nodeName"] == "sim-1"
        after = state(cluster, "held")
        assert after["requests"] == before["requests"] + 1 and after["init_calls"] == 1, after
        assert after["restored_calls"] == 1, "restored from the move's data, not started afresh"
        # Once the rollback restored from it, the move's data goes for the upload.
        uploader.join(60)
        assert answered and answered[0][0] == 200, answered[0][1][:300] if answered else None
        assert api.curl("GET", data_path(A, "filler")) == (200, filler)
        assert api.curl("GET", data_path("default", name))[0] == 404
    finally:
        cluster.kubectl("delete", "pod", "held", "--wait=false")
        stuck.stop()
        cluster.kubectl("delete", "node", "stuck", "--wait=false", check=False)



def test_another_namespaces_latest_periodic_checkpoint_keeps_its_fair_share(cluster: ControlPlane, image: str,
                                                                             api: Api) -> None:
    """What node-loss recovery needs in B does not go for a snapshot of A's that wants
    nearly the whole space; A's data that fits beside it does go in."""
    cluster.kubectl("apply", "-n", B, "-f", "-", input=counter_pod("recover", "sim-1", image))
    ready(cluster, B, "recover")
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


# --- issue #19's attack round: one namespace against another's moves and data ---------------

# A request pod whose calls never return within a minute: k32_tick runs every 100 ms.
SPIN_WAT = """(module
  (import "k32" "k32_time_ms" (func $time_ms (result i64)))
  (memory 1)
  (func $spin (local $end i64)
    (local.set $end (i64.add (call $time_ms) (i64.const 60000)))
    (block $done (loop $l (br_if $done (i64.gt_s (call $time_ms) (local.get $end))) (br $l))))
  (func (export "k32_handle") (call $spin))
  (func (export "k32_tick") (call $spin)))"""

# 255 pages: its snapshot fills the 16 MiB space but for 64 KiB, less than a counter pod's.
PIN_WAT = """(module (memory 255) (func (export "k32_handle")))"""


def wasm_image(cluster: ControlPlane, tmp: Path, name: str, wat: str) -> str:
    path = tmp / f"{name}.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    return push(cluster, path)


def clear_data(cluster: ControlPlane) -> None:
    """No checkpoint data left by the tests before: each attack starts from an empty space."""
    for ns in (A, B, "default"):
        cluster.kubectl("delete", "checkpoints", "--all", "-n", ns, "--wait=false")


def checkpoints_in(cluster: ControlPlane, ns: str, pod: str) -> list[dict]:
    return [c for c in get_json(cluster, "checkpoints", "-n", ns)["items"] if c["spec"]["podName"] == pod]


def save(cluster: ControlPlane, ns: str, name: str, pod: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name}, "spec": {"podName": pod}}))


def phase_within(cluster: ControlPlane, ns: str, name: str, timeout: float) -> tuple[dict, float]:
    """The Checkpoint's status once it ended (Saved, Completed or Failed), and how long that took."""
    started = time.monotonic()
    status = wait_for(lambda: (st := get_json(cluster, "checkpoint", name, "-n", ns).get("status") or {})
                      .get("phase") in ("Saved", "Completed", "Failed") and st, timeout, 0.2,
                      what=f"checkpoint {ns}/{name} to end")
    return status, time.monotonic() - started


def space_figures(cluster: ControlPlane) -> list[tuple[int, int]]:
    """(bytes held, capacity) of the checkpoint data space after each store, as the API
    server logs them."""
    log = (cluster.data_dir / "logs" / "control-plane.log").read_text(errors="replace")
    return [(int(u), int(c)) for u, c in re.findall(r"the checkpoint data space holds (\d+) of its (\d+) bytes", log)]


def test_a_tenants_move_in_flight_cannot_pin_the_whole_data_space(cluster: ControlPlane, image: str,
                                                                   api: Api, tmp_path: Path) -> None:
    """A's move of a pod of 16 MiB less 64 KiB to a node that never finishes a restore
    stays Moving (its data may not go) until it rolls back (10 s here).  The admin's move
    of a pod in default meanwhile used to fail ("does not fit ... beside the data that may
    not go"), and a drain then deleted the pod and its state.  Now it waits for room,
    Pending, its pod running, saying whose moves hold the room; A's next move, started
    while it waits, waits behind it; it completes with its state once A's move rolled back
    (with its state too), and the space never holds more than its 16 MiB: nothing is lent."""
    clear_data(cluster)
    pin = wasm_image(cluster, tmp_path, "pin", PIN_WAT)
    stuck = extra_worker(cluster, "pinned", "--fault", "hang-restores")
    stored_before = len(space_figures(cluster))
    try:
        for name in ("pin", "pin2"):
            cluster.kubectl("apply", "-n", A, "-f", "-", input=counter_pod(
                name, "sim-1", pin, container={"resources": {"limits": {"memory": "16Mi"}}}))
            ready(cluster, A, name)
        cluster.kubectl("apply", "-f", "-", input=counter_pod("beside", "sim-1", image))
        running(cluster, "beside")
        before = state(cluster, "beside")
        mover = move_bg(cluster, "pin", "-n", A, "--to", "pinned")
        in_flight = wait_for(lambda: next((c for c in checkpoints_in(cluster, A, "pin")
                                           if c["status"].get("phase") == "Moving"), None), 30, what="A's move Moving")
        assert in_flight["status"]["sizeBytes"] > SPACE - (64 << 10)

        moved = move_bg(cluster, "beside", "--to", "sim-2")
        waiting = wait_for(lambda: next((c for c in checkpoints_in(cluster, "default", "beside")
                                         if "waiting for room" in c["status"].get("message", "")), None), 30,
                           0.2, what="the admin's move to wait for room")
        message = waiting["status"]["message"]
        assert waiting["status"].get("phase", "Pending") == "Pending", waiting["status"]
        assert f"moves in flight end: they hold {in_flight['status']['sizeBytes']} bytes (namespace {A} " in message \
            and "it is 1 of 1 in line for room" in message, message
        assert state(cluster, "beside")["requests"] == before["requests"] + 1, "its pod runs on, not frozen"

        # A cannot keep it out by starting another move: that one waits behind it.
        mover2 = move_bg(cluster, "pin2", "-n", A, "--to", "sim-2")
        second = wait_for(lambda: next((c for c in checkpoints_in(cluster, A, "pin2")
                                        if "waiting for room" in c["status"].get("message", "")), None), 30,
                          0.2, what="A's second move to wait for room")
        assert "it is 2 of 2 in line for room" in second["status"]["message"], second["status"]

        out = moved.communicate(timeout=90)[0].decode()
        assert moved.returncode == 0 and "Completed" in out and "waiting for room" in out, out
        after = state(cluster, "beside")
        assert after["requests"] == before["requests"] + 2 and after["restored_calls"] == 1, after
        assert get_json(cluster, "pod", "beside")["spec"]["nodeName"] == "sim-2"
        # A's move rolled back with its data: nothing of A's was given up either.
        out = mover.communicate(timeout=90)[0].decode()
        assert "rolled back to sim-1" in out and "with its state" in out, out
        # A's second move went after the admin's, once that one's data could go.
        out = mover2.communicate(timeout=120)[0].decode()
        assert mover2.returncode == 0 and "Completed" in out, out
        admins = next(c for c in checkpoints_in(cluster, "default", "beside") if c["status"]["phase"] == "Completed")
        a2 = next(c for c in checkpoints_in(cluster, A, "pin2") if c["status"]["phase"] == "Completed")
        assert admins["status"]["snapshotEndMs"] <= a2["status"]["snapshotStartMs"], (admins["status"], a2["status"])
        # Never more stored than the space: each store's figure, from the API server's log.
        figures = space_figures(cluster)[stored_before:]
        assert len(figures) >= 3 and all(used <= capacity == SPACE for used, capacity in figures), figures
    finally:
        cluster.kubectl("delete", "pod", "beside", "--wait=false")
        for name in ("pin", "pin2"):
            cluster.kubectl("delete", "pod", "-n", A, name, "--wait=false")
        stuck.stop()
        cluster.kubectl("delete", "node", "pinned", "--wait=false", check=False)


class Paced(threading.Thread):
    """A PUT of ``body`` at the least pace docs/security.md allows (1 MiB/s after the first
    10 s: k MiB by 7 + k s), counted from when ``go`` is set; a byte every 5 s until then
    (it waits for room).  ``stop`` ends it early."""

    def __init__(self, api: Api, path: str, body: bytes, go: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.api, self.path, self.body, self.go = api, path, body, go
        self.stop = threading.Event()
        self.answer = b""

    def run(self) -> None:
        sock = self.api.connect()
        sock.sendall((f"PUT {self.path} HTTP/1.1\r\nHost: {urlparse(self.api.server).netloc}\r\n"
                      f"Authorization: Bearer {self.api.token}\r\nContent-Type: application/octet-stream\r\n"
                      f"Content-Length: {len(self.body)}\r\n\r\n").encode() + self.body[:100])
        sent = 100
        try:
            while self.go is not None and not self.go.wait(5) and not self.stop.is_set():
                sock.sendall(self.body[sent: sent + 1])
                sent += 1
            start = time.monotonic()
            for k in itertools.count(1):
                if sent >= len(self.body) or self.stop.wait(max(0.0, start + 7 + k - time.monotonic())):
                    break
                end = min(k << 20, len(self.body))
                sock.sendall(self.body[sent:end])
                sent = max(sent, end)
            sock.settimeout(60)
            while not self.stop.is_set() and b"\r\n\r\n" not in self.answer and (chunk := sock.recv(65536)):
                self.answer += chunk
        except OSError:
            pass
        finally:
            sock.close()

    @property
    def status(self) -> int:
        return int(self.answer.split(b" ", 2)[1]) if self.answer else 0


def test_paced_uploads_cannot_make_other_namespaces_uploads_fail(cluster: ControlPlane, api: Api) -> None:
    """Two uploads of A's of nearly the whole space, each at exactly the allowed pace
    (23 s): the second used to wait ahead of the admin's 128 KiB PUT in default, take the
    room for uploads arriving next, and the admin's PUT waited 30 s and got 429.  Now
    namespaces take that room in turn: the admin's goes in as soon as A's first is done."""
    clear_data(cluster)
    for name in ("a1", "a2"):
        checkpoint(cluster, A, name)
    checkpoint(cluster, "default", "victim-data")
    whole = snapshot(SPACE - (16 << 10) - 200)
    first = Paced(api, data_path(A, "a1"), whole)
    first.start()
    time.sleep(0.5)
    done = threading.Event()
    second = Paced(api, data_path(A, "a2"), whole, go=done)
    second.start()
    time.sleep(1.5)
    small = snapshot(128 << 10)
    victim: list[tuple[int, bytes, float]] = []

    def put_victim() -> None:
        started = time.monotonic()
        victim.append((*api.curl("PUT", data_path("default", "victim-data"), small, timeout=90),
                       time.monotonic() - started))
    uploader = threading.Thread(target=put_victim)
    uploader.start()
    try:
        first.join(60)
        done.set()
        uploader.join(90)
    finally:
        second.stop.set()
        second.join(30)
    assert first.status == 200, first.answer[:300]
    assert victim and victim[0][0] == 200, (victim[0][0], victim[0][1][:300], victim[0][2]) if victim else None
    assert api.curl("GET", data_path("default", "victim-data")) == (200, small)


def test_a_tenants_busy_pod_does_not_hold_other_namespaces_checkpoints(cluster: ControlPlane, image: str,
                                                                      tmp_path: Path) -> None:
    """A's pod never leaves its call; A asks for 4 Saves of it.  Each used to hold the
    control plane's one snapshot slot for the whole freeze timeout (10 s), and the admin's
    Save in default waited 40 s.  Now a pod still in a call after a second gives the slot
    to the next snapshot (other namespaces first) and tries again at its turn: the
    admin's Save is done within seconds, and A's end Failed as the spec says, each after
    the freeze timeout, the pod running on."""
    spin = wasm_image(cluster, tmp_path, "spin", SPIN_WAT)
    cluster.kubectl("apply", "-n", A, "-f", "-", input=counter_pod("spin", "sim-2", spin))
    ready(cluster, A, "spin")
    cluster.kubectl("apply", "-f", "-", input=counter_pod("sec", "sim-1", image))
    running(cluster, "sec")
    try:
        time.sleep(1)  # its first tick is under way
        for i in range(4):
            save(cluster, A, f"spin-{i}", "spin")
        time.sleep(1)
        save(cluster, "default", "sec-save", "sec")
        status, took = phase_within(cluster, "default", "sec-save", 60)
        assert status["phase"] == "Saved" and took < 10, (status, took)
        for i in range(4):
            failed, _ = phase_within(cluster, A, f"spin-{i}", 60)
            assert failed["phase"] == "Failed", failed
            assert failed["blockers"] == ["call k32_tick still running after 10000 ms"], failed
        pod = get_json(cluster, "pod", "spin", "-n", A)
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == "sim-2"
    finally:
        cluster.kubectl("delete", "pod", "sec", "--wait=false")
        cluster.kubectl("delete", "pod", "-n", A, "spin", "--wait=false")


class StallingNode:
    """A node joined with the bootstrap token (``node.kubeconfig``) whose kubelet endpoint
    is this test's own TLS listener: it answers ``POST /checkpoint/...`` only after
    ``stall`` seconds (503 then), but its dry run (the snapshot's size) at once, and
    anything else with 503 at once."""

    def __init__(self, cluster: ControlPlane, api: Api, name: str, stall: float) -> None:
        self.api, self.name = api, name
        self.asked: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.asked.append(self.path)
                if self.command == "POST" and self.path.startswith("/checkpoint/") and "dryRun=All" in self.path:
                    body = json.dumps({"blockers": [], "sizeBytes": 4096}).encode()  # at once: its size
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.command == "POST" and self.path.startswith("/checkpoint/"):
                    time.sleep(stall)
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = _any  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        bootstrap = re.search(r"token: (\S+)", (cluster.data_dir / "node.kubeconfig").read_text())
        assert bootstrap is not None
        key, csr = make_csr(name, ["127.0.0.1", name])  # the API server verifies a kubelet by name
        st, creds = api.json("POST", f"/apis/kube32.io/v1/nodecredentials/{name}", bootstrap.group(1),
                             {"csr": csr.decode()})
        assert st == 201, (st, creds)
        self.token = creds["token"]
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "c.pem").write_text(creds["certificate"])
            (Path(tmp) / "k.pem").write_bytes(key)
            ctx.load_cert_chain(Path(tmp) / "c.pem", Path(tmp) / "k.pem")
        socketserver.ThreadingTCPServer.daemon_threads = True
        self.srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        st, out = api.json("POST", "/api/v1/nodes", self.token, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kube32.io/kubelet-scheme": "https"}}})
        assert st == 201, (st, out)
        self._ready()

    def _ready(self) -> None:
        for _ in range(10):   # as a kubelet: a 409 (the node lifecycle controller wrote it) is read again
            if self._ready_once():
                self._lease()
                return
        raise AssertionError(f"node {self.name}'s status could not be written")

    def _ready_once(self) -> bool:
        st, node = self.api.json("GET", f"/api/v1/nodes/{self.name}", self.token)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node["status"] = {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.srv.server_address[1]}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "capacity": {"memory": "512Mi", "pods": "10"}, "allocatable": {"memory": "512Mi", "pods": "10"}}
        st, out = self.api.json("PUT", f"/api/v1/nodes/{self.name}/status", self.token, node)
        if st == 409:
            return False
        assert st == 200, (st, out)
        return True

    def _lease(self) -> None:
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40,
                "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}
        st, out = self.api.json("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", self.token,
                                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                 "metadata": {"name": self.name}, "spec": spec})
        assert st == 201, (st, out)

    def run_pod(self, ns: str, pod: str) -> None:
        """Report ``pod`` (bound here) Running and Ready, as a kubelet would."""
        st, p = self.api.json("GET", f"/api/v1/namespaces/{ns}/pods/{pod}", self.token)
        assert st == 200, (st, p)
        c = p["spec"]["containers"][0]
        p["status"] = {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
                       "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"],
                                              "imageID": c["image"], "state": {"running": {
                                                  "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}}]}
        st, out = self.api.json("PUT", f"/api/v1/namespaces/{ns}/pods/{pod}/status", self.token, p)
        assert st == 200, (st, out)

    def evict(self, ns: str, pod: str) -> int:
        return self.api.json("POST", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", self.token,
                             {"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": pod, "namespace": ns}})[0]

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def test_a_node_that_stalls_its_snapshot_does_not_hold_every_other_checkpoint(cluster: ControlPlane, image: str,
                                                                             api: Api) -> None:
    """A node evicts a pod bound to it and answers the control plane's ``/checkpoint``
    only after 115 s: the one snapshot slot used to be held all that time (and a Save of
    a healthy node's pod waited behind it).  Now a node must begin its answer within the
    freeze timeout it was given and 5 s: the move fails saying so, and the admin's Save
    on sim-1 is done within seconds."""
    stalling = StallingNode(cluster, api, "stalling", 115)
    try:
        cluster.kubectl("apply", "-n", A, "-f", "-", input=counter_pod("on-stall", "stalling", image))
        stalling.run_pod(A, "on-stall")
        cluster.kubectl("apply", "-f", "-", input=counter_pod("healthy", "sim-1", image))
        running(cluster, "healthy")
        assert stalling.evict(A, "on-stall") == 201
        wait_for(lambda: any(p.startswith("/checkpoint/") and "dryRun" not in p for p in stalling.asked), 30, 0.2,
                 what="the control plane to ask the node for its snapshot")
        save(cluster, "default", "healthy-save", "healthy")
        status, took = phase_within(cluster, "default", "healthy-save", 60)
        assert status["phase"] == "Saved" and took < 10, (status, took)
        move = next(c for c in checkpoints_in(cluster, A, "on-stall"))
        failed, _ = phase_within(cluster, A, move["metadata"]["name"], 30)
        assert failed["phase"] == "Failed" and "the snapshot transfer from stalling failed: the node did not " \
            "answer within 6 s" in failed["message"], failed
    finally:
        stalling.close()
        cluster.kubectl("delete", "pod", "healthy", "--wait=false")
        cluster.kubectl("delete", "pod", "-n", A, "on-stall", "--wait=false", "--force", "--grace-period=0",
                        check=False)
        cluster.kubectl("delete", "node", "stalling", "--wait=false", check=False)
