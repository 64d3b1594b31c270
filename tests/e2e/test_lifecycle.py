"""Lifecycle paths of real processes that the other suites do not walk (issue 20):
how a node measures its speed on a loaded machine, how the control plane and the
workers stop and start again, what a pod's image change and a failed restore do.

Every test starts its own processes (``kube32-sim control-plane`` and ``worker``) and
drives them with the real kubectl."""
from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, Proc, sim_command, start, start_control_plane, wait_for
from tests.e2e.helpers import cli, get_json, push, raw
from tests.e2e.test_moves import counter_pod, running

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
BUSY_SECONDS = 90  # a busy loop never outlives its test by more than this


@contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` busy loops in processes of their own, bounded in time."""
    loops = [subprocess.Popen([sys.executable, "-c",
                               f"import time\nend = time.monotonic() + {BUSY_SECONDS}\n"
                               "while time.monotonic() < end: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait(5)


def worker(cp: ControlPlane, name: str, address: str, *flags: str) -> Proc:
    return start(sim_command("worker", "--kubeconfig", str(cp.data_dir / "node.kubeconfig"), "--name", name,
                             "--address", address, "--lease-interval", "0.5", "--backoff", "1", *flags),
                 cp.data_dir / f"{name}.log")


def ready(cp: ControlPlane, name: str) -> dict:
    def check() -> dict | None:
        node = get_json(cp, "node", name)
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
        return node if ok else None
    return wait_for(check, 60, what=f"node {name} Ready")


# --- kube32.io/interp-mops -------------------------------------------------------------

def test_identical_workers_measure_alike_under_load_and_a_placement_pod_stays(control_plane: ControlPlane) -> None:
    """Two workers of one profile on one machine, started under different CPU load,
    report figures within 20 % of each other, the same machine, and an Auto pod with
    ``placement: fastest`` does not move between them."""
    cp = control_plane
    procs: list[Proc] = []
    try:
        with cpu_load(1):
            procs.append(worker(cp, "calm", "127.0.0.21"))
            calm = ready(cp, "calm")
            with cpu_load(4):
                procs.append(worker(cp, "busy", "127.0.0.22"))
                busy = ready(cp, "busy")
        figures = [float(n["metadata"]["annotations"]["kube32.io/interp-mops"]) for n in (calm, busy)]
        assert min(figures) >= 0.8 * max(figures), figures
        machines = {n["metadata"]["annotations"].get("kube32.io/interp-mops-measured-on") for n in (calm, busy)}
        assert len(machines) == 1 and None not in machines, machines

        image = push(cp, COUNTER)
        cp.kubectl("apply", "-f", "-", input=counter_pod(
            "racer", "calm", image, annotations={"kube32.io/migration": "Auto", "kube32.io/placement": "fastest"}))
        running(cp, "racer")
        time.sleep(3)  # the placement pass runs at once on every pod and node change
        assert get_json(cp, "checkpoints")["items"] == []
        assert get_json(cp, "pod", "racer")["spec"]["nodeName"] == "calm"
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)


# --- stopping and starting again -----------------------------------------------------------

def test_the_control_plane_stops_on_sigterm_with_workers_and_streams_connected(tmp_path: Path) -> None:
    """Workers hold a topic subscription, watches and (here) a followed log through the
    API server; none of them keeps the control plane from stopping."""
    cp = start_control_plane(tmp_path / "cp", "--interp-mops", "5")
    board = worker(cp, "board", "127.0.0.23", "--interp-mops", "5")
    follow = None
    try:
        ready(cp, "board")
        image = push(cp, COUNTER)
        cp.kubectl("apply", "-f", "-", input=counter_pod("talker", "board", image))
        running(cp, "talker")
        follow = cp.kubectl_bg("logs", "-f", "talker")
        watch = cp.kubectl_bg("get", "pods", "--watch")
        time.sleep(1)
        assert follow.poll() is None and watch.poll() is None
        started = time.monotonic()
        code = cp.proc.stop(signal.SIGTERM, timeout=30)
        took = time.monotonic() - started
        assert code == 0 and took < 10, (code, took, cp.proc.output()[-2000:])
        assert "kube32 control plane stopping" in cp.proc.output()
        for client in (follow, watch):
            client.wait(10)  # the streams ended with the server
    finally:
        for p in (follow,):
            if p is not None and p.poll() is None:
                p.kill()
        board.stop(signal.SIGKILL)
        cp.proc.stop(signal.SIGKILL)


def node_marks(cp: ControlPlane, name: str) -> tuple[bool, dict]:
    node = get_json(cp, "node", name)
    ann = node["metadata"].get("annotations") or {}
    return bool(node["spec"].get("unschedulable")), {k: v for k, v in ann.items() if k.startswith("kube32.io/left")}


def test_a_worker_that_starts_again_undoes_its_own_cordon_and_keeps_a_users(control_plane: ControlPlane) -> None:
    cp = control_plane
    board = worker(cp, "returner", "127.0.0.24", "--interp-mops", "5")
    try:
        ready(cp, "returner")
        assert board.stop(signal.SIGTERM, timeout=40) == 0
        cordoned, marks = node_marks(cp, "returner")
        assert cordoned and marks["kube32.io/left"] == "true"
        board = worker(cp, "returner", "127.0.0.24", "--interp-mops", "5")
        ready(cp, "returner")
        assert wait_for(lambda: node_marks(cp, "returner") == (False, {}), 10, what="the drain undone")
        assert "SchedulingDisabled" not in cp.kubectl("get", "node", "returner").stdout

        # A user's cordon, made before the worker stops, stays through its drain and return.
        cp.kubectl("cordon", "returner")
        assert board.stop(signal.SIGTERM, timeout=40) == 0
        assert node_marks(cp, "returner") == (True, {"kube32.io/left": "true"})
        board = worker(cp, "returner", "127.0.0.24", "--interp-mops", "5")
        ready(cp, "returner")
        wait_for(lambda: node_marks(cp, "returner")[1] == {}, 10, what="the left mark gone")
        assert node_marks(cp, "returner") == (True, {})
    finally:
        board.stop(signal.SIGKILL)


def test_a_failed_restores_fresh_start_stays_on_the_users_node(control_plane: ControlPlane) -> None:
    """A pod a user put on a node (``spec.nodeName``) that cannot restore (its Checkpoint
    has no data) starts afresh on that node, not where the scheduler would put it."""
    cp = control_plane
    boards = [worker(cp, "a-spare", "127.0.0.25", "--interp-mops", "5"),
              worker(cp, "b-pinned", "127.0.0.26", "--interp-mops", "5")]
    try:
        for name in ("a-spare", "b-pinned"):
            ready(cp, name)
        image = push(cp, COUNTER)
        first = cp.kubectl("create", "-f", "-", "-o", "jsonpath={.metadata.uid}", input=counter_pod(
            "pinned", "b-pinned", image, annotations={"kube32.io/restore-from": "no-such-checkpoint"})).stdout
        pod = wait_for(lambda: (p := get_json(cp, "pod", "pinned"))["metadata"]["uid"] != first and p, 30,
                       what="the fresh replacement")
        assert pod["spec"]["nodeName"] == "b-pinned"
        assert "kube32.io/restore-from" not in (pod["metadata"].get("annotations") or {})
        running(cp, "pinned")
        events = cp.kubectl("get", "events", "--field-selector", "involvedObject.name=pinned,reason=MoveFailed").stdout
        assert "the pod starts afresh on b-pinned" in events, events
    finally:
        for b in boards:
            b.stop(signal.SIGKILL)


# --- a pod's image changes -----------------------------------------------------------------

class _Modules(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def movers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane (no node of its own) and two workers, src and dst."""
    root = tmp_path_factory.mktemp("images")
    cp = start_control_plane(root / "cp", "--no-kubelet", "--move-rollback-timeout", "15s")
    boards = [worker(cp, "src", "127.0.0.31", "--interp-mops", "5"),
              worker(cp, "dst", "127.0.0.32", "--interp-mops", "5")]
    try:
        for name in ("src", "dst"):
            ready(cp, name)
        yield cp
    finally:
        for b in boards:
            b.stop(signal.SIGKILL)
        cp.proc.stop()


@pytest.fixture(scope="module")
def images(movers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two images of the counter pod: the module, and the module with a custom section
    appended (the same pod, another digest)."""
    other = tmp_path_factory.mktemp("modules") / "counter-b.wasm"
    other.write_bytes(COUNTER.read_bytes() + b"\x00\x06\x05extra")
    return push(movers, COUNTER), push(movers, other)


def state(cp: ControlPlane, name: str) -> dict:
    return raw(cp, f"/api/v1/namespaces/default/pods/{name}/proxy/")


def container_status(cp: ControlPlane, name: str) -> dict:
    return (get_json(cp, "pod", name).get("status") or {}).get("containerStatuses", [{}])[0]


def set_image(cp: ControlPlane, name: str, image: str) -> None:
    cp.kubectl("patch", "pod", name, "-p", json.dumps({"spec": {"containers": [{"name": "main", "image": image}]}}))


def test_an_image_change_restarts_the_container_with_the_new_image(movers: ControlPlane,
                                                                   images: tuple[str, str]) -> None:
    """As Kubernetes' kubelet: the container is killed and the new image starts afresh
    (k32_init), restartCount counts it, the status shows the new image; the pod then
    moves with the new module's state."""
    cp, (first, second) = movers, images
    cp.kubectl("apply", "-f", "-", input=counter_pod("swapper", "src", first))
    running(cp, "swapper")
    state(cp, "swapper")
    assert state(cp, "swapper")["requests"] == 2
    set_image(cp, "swapper", second)
    cs = wait_for(lambda: (c := container_status(cp, "swapper"))["image"] == second and c.get("ready") and c, 30,
                  what="the container restarted with the new image")
    assert cs["restartCount"] == 1 and cs["imageID"] == second
    assert cs["lastState"]["terminated"]["message"] == "Container main definition changed, will be restarted"
    fresh = state(cp, "swapper")
    assert fresh["requests"] == 1 and fresh["init_calls"] == 1 and fresh["restored_calls"] == 0
    events = cp.kubectl("get", "events", "--field-selector", "involvedObject.name=swapper,reason=Killing").stdout
    assert "Container main definition changed, will be restarted" in events, events

    out = cli(cp, "move", "swapper", "--to", "dst")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    moved = state(cp, "swapper")
    assert moved["requests"] == 2 and moved["restored_calls"] == 1
    assert container_status(cp, "swapper")["image"] == second
    cp.kubectl("delete", "pod", "swapper", "--wait=false")


def test_an_image_change_during_a_move_fails_it_before_the_replacement(movers: ControlPlane,
                                                                       images: tuple[str, str],
                                                                       tmp_path: Path) -> None:
    """The snapshot is of the module that ran: the replacement, made from the pod as it
    was, must neither undo the user's change nor hand the old state to the new image.
    The move fails, the pod thaws where it ran and restarts with the new image.

    The window: the pod's first image is served over HTTP, and the target's pull of it
    during the move (which the freeze waits for) is held until the image changed.  Then
    either the pod's kubelet restarted it with the new image before the freeze (the
    snapshot is of that module, not the one the target pulled) or the spec changed
    under the replacement: both fail the move before the replacement."""
    cp, (_, second) = movers, images
    (tmp_path / "app.wasm").write_bytes(COUNTER.read_bytes())
    gate, asked = threading.Event(), threading.Event()

    class Held(_Modules):
        served = 0

        def do_GET(self) -> None:
            Held.served += 1
            if Held.served > 1:  # the source's pull goes through; the target's waits
                asked.set()
                gate.wait(30)
            super().do_GET()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             lambda *a, **k: Held(*a, directory=str(tmp_path), **k))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mover = None
    try:
        cp.kubectl("apply", "-f", "-", input=counter_pod(
            "changer", "src", f"wasm://127.0.0.1:{server.server_address[1]}/app.wasm"))
        running(cp, "changer")
        uid = get_json(cp, "pod", "changer")["metadata"]["uid"]
        state(cp, "changer")
        mover = subprocess.Popen([sys.executable, "-m", "kube32.cli.main", "move", "changer", "--to", "dst",
                                  "--kubeconfig", str(cp.kubeconfig)], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        assert asked.wait(30), "the target pulls the image during the move"
        cp.kubectl("set", "image", "pod/changer", f"main={second}")
        gate.set()
        text, _ = mover.communicate(timeout=90)
    finally:
        gate.set()
        if mover is not None and mover.poll() is None:
            mover.kill()
        server.shutdown()
        server.server_close()
    assert mover.returncode == 1, text
    ck = next(c for c in get_json(cp, "checkpoints")["items"] if c["spec"]["podName"] == "changer")
    assert ck["status"]["phase"] == "Failed"
    message = ck["status"]["message"]
    assert "the pod's spec changed since the replacement was made from it (spec.containers)" in message \
        or "not the module the snapshot was taken from" in message, message
    pod = get_json(cp, "pod", "changer")
    assert pod["metadata"]["uid"] == uid and pod["spec"]["nodeName"] == "src"
    assert pod["spec"]["containers"][0]["image"] == second, "the user's change stays"
    cs = wait_for(lambda: (c := container_status(cp, "changer"))["image"] == second and c.get("ready") and c, 30,
                  what="the thawed pod restarted with the new image")
    assert cs["restartCount"] == 1
    assert state(cp, "changer")["init_calls"] == 1 and state(cp, "changer")["restored_calls"] == 0
    cp.kubectl("delete", "pod", "changer", "--wait=false")


def test_a_move_whose_target_cannot_pull_the_image_fails_before_the_replacement(movers: ControlPlane,
                                                                                tmp_path: Path) -> None:
    """The module's server went away after the source pulled it: the target cannot pull
    it, so the move fails before the replacement and the pod goes on where it runs."""
    cp = movers
    (tmp_path / "app.wasm").write_bytes(COUNTER.read_bytes())
    handler = lambda *a, **k: _Modules(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    image = f"wasm://127.0.0.1:{server.server_address[1]}/app.wasm"
    try:
        cp.kubectl("apply", "-f", "-", input=counter_pod("stranded", "src", image))
        running(cp, "stranded")
    finally:
        server.shutdown()
        server.server_close()
    uid = get_json(cp, "pod", "stranded")["metadata"]["uid"]
    before = state(cp, "stranded")
    out = cli(cp, "move", "stranded", "--to", "dst")
    text = out.stdout.decode() + out.stderr.decode()
    assert out.returncode == 1, text
    ck = next(c for c in get_json(cp, "checkpoints")["items"] if c["spec"]["podName"] == "stranded")
    assert ck["status"]["phase"] == "Failed"
    assert ck["status"]["message"].startswith(f"node dst cannot pull image {image}: cannot pull {image}"), \
        ck["status"]["message"]
    pod = running(cp, "stranded")
    assert pod["metadata"]["uid"] == uid and pod["spec"]["nodeName"] == "src"
    assert state(cp, "stranded")["requests"] == before["requests"] + 1, "the state stays"
    events = cp.kubectl("get", "events", "--field-selector", "involvedObject.name=stranded,reason=MoveFailed").stdout
    assert "node dst cannot pull image" in events
    cp.kubectl("delete", "pod", "stranded", "--wait=false")
