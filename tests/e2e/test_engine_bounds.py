"""Engine bounds in a running cluster (issue #21's attack round, moved from
tests/attack/test_attack21.py): ``kube32-sim up --workers 1`` (devkit: pwasm, in a
process of its own; sim-1: wasmtime), driven with kubectl and kube32-cli.

- A pod whose memory limit lies between two pages grows to its cap and moves between
  engines with its state, both ways.
- A module only wasmtime runs (SIMD) cannot move to a pwasm node: the move fails and
  the pod runs on where it was, its state kept.
- The control plane's node runs in a child process: busy pods on devkit do not slow the
  API server, and a pod that calls a big function on devkit does not stall it.
- pwasm refuses what wasmtime refuses: an undeclared ref.func fails on both nodes alike.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import wasmtime

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import cli, get_json

pytestmark = pytest.mark.e2e

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
HEAD = '(import "k32" "k32_resp_body" (func $rb (param i32 i32) (result i32)))'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("bounds"), 1, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=40)


def push_wasm(c: ControlPlane, wasm: bytes, name: str) -> str:
    path = c.data_dir / f"{name}.wasm"
    path.write_bytes(wasm)
    out = cli(c, "image", "push", str(path))
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


def run_pod(c: ControlPlane, name: str, image: str, node: str, memory: str | None = None,
            annotations: dict | None = None, ready: bool = True) -> None:
    container: dict = {"name": "main", "image": image}
    if memory:
        container["resources"] = {"limits": {"memory": memory}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
           "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]}}
    c.kubectl("apply", "-f", "-", input=json.dumps(pod))
    if ready:
        c.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=90s", timeout=120)


def get(c: ControlPlane, pod: str, path: str = "/") -> str:
    return c.kubectl("get", "--raw", f"/api/v1/namespaces/default/pods/{pod}/proxy{path}", timeout=60).stdout


def post(c: ControlPlane, pod: str, path: str) -> str:
    return c.kubectl("create", "--raw", f"/api/v1/namespaces/default/pods/{pod}/proxy{path}",
                     "-f", "-", input="").stdout


def node_of(c: ControlPlane, pod: str) -> str:
    return get_json(c, "pod", pod)["spec"]["nodeName"]


def delete(c: ControlPlane, *names: str) -> None:
    c.kubectl("delete", "pod", *names, "--ignore-not-found", "--wait=false", check=False)


def test_a_pod_with_a_limit_between_pages_moves_between_engines_with_its_state(cluster: ControlPlane) -> None:
    c = cluster
    run_pod(c, "between", push_wasm(c, COUNTER.read_bytes(), "counter"), "sim-1", memory="160Ki")
    assert json.loads(post(c, "between", "/alloc?kb=64"))["grown_kb"] == 64    # 2 pages: its cap
    for node in ("devkit", "sim-1"):                  # wasmtime -> pwasm -> wasmtime
        before = json.loads(get(c, "between"))
        out = cli(c, "move", "between", "--to", node)
        assert out.returncode == 0 and "Completed" in out.stdout.decode(), out.stdout.decode() + out.stderr.decode()
        after = json.loads(get(c, "between"))
        assert node_of(c, "between") == node
        assert (after["requests"], after["grown_kb"]) == (before["requests"] + 1, 64), (before, after)
    delete(c, "between")


SIMD_WAT = f"""(module {HEAD} (memory 1)
  (global $n (mut i32) (i32.const 0))
  (func (export "k32_handle")
    (global.set $n (i32.add (global.get $n) (i32x4.extract_lane 0 (v128.const i32x4 1 2 3 4))))
    (i32.store8 (i32.const 0) (i32.add (i32.const 0x30) (global.get $n)))
    (drop (call $rb (i32.const 0) (i32.const 1)))))"""


def test_a_pod_only_wasmtime_runs_does_not_move_to_pwasm_and_keeps_running(cluster: ControlPlane) -> None:
    c = cluster
    run_pod(c, "simd", push_wasm(c, wasmtime.wat2wasm(SIMD_WAT), "simd"), "sim-1")
    assert get(c, "simd") == "1"
    out = cli(c, "move", "simd", "--to", "devkit")
    text = out.stdout.decode() + out.stderr.decode()
    assert out.returncode != 0, text
    wait_for(lambda: node_of(c, "simd") == "sim-1" and get(c, "simd") in ("2", "3"), 120, 1,
             what="the pod running on sim-1 again")
    delete(c, "simd")


def api_median(c: ControlPlane, n: int = 10) -> float:
    samples = []
    for _ in range(n):
        t = time.monotonic()
        c.kubectl("get", "pods", "-o", "name", timeout=60)
        samples.append(time.monotonic() - t)
        time.sleep(0.1)
    return statistics.median(samples)


SPIN_WAT = f"""(module {HEAD}
  (memory 1)
  (global $x (mut i32) (i32.const 0))
  (func (export "k32_tick")
    (local $n i32)
    (local.set $n (i32.const 3000000))
    (loop $l
      (global.set $x (i32.add (global.get $x) (i32.const 1)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n))))
  (func (export "k32_handle") (drop (call $rb (i32.const 0) (i32.const 1)))))"""


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_the_control_planes_node_runs_in_a_process_of_its_own(cluster: ControlPlane) -> None:
    c = cluster
    commands = {}
    for cp in children(c.proc.popen.pid):
        for kid in children(cp):
            commands[kid] = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
    assert any(b"kube32.sim.node" in cmd for cmd in commands.values()), commands


def node_process(c: ControlPlane) -> int | None:
    for cp in children(c.proc.popen.pid):
        for kid in children(cp):
            if b"kube32.sim.node" in Path(f"/proc/{kid}/cmdline").read_bytes():
                return kid
    return None


def test_the_control_planes_node_is_started_again_when_its_process_dies(cluster: ControlPlane) -> None:
    """Attack round 21b: the devkit node's process killed, nothing noticed it (its pods
    Running, their proxy 503, the node NotReady for good).  The control plane starts it
    again, as a supervisor would, and the node serves its pods once more."""
    c = cluster
    image = push_wasm(c, COUNTER.read_bytes(), "again")
    run_pod(c, "again", image, "devkit")
    first = node_process(c)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: (pid := node_process(c)) is not None and pid != first, 30, 0.5,
             what="the node's process started again")
    wait_for(lambda: '"requests"' in get(c, "again"), 90, 1, what="the pod on devkit answering again")
    delete(c, "again")


def test_busy_pods_on_devkit_do_not_slow_the_api_server(cluster: ControlPlane) -> None:
    c = cluster
    baseline = api_median(c)
    image = push_wasm(c, wasmtime.wat2wasm(SPIN_WAT), "spin")
    names = [f"spin{i}" for i in range(6)]
    try:
        for name in names:
            run_pod(c, name, image, "devkit", annotations={"kube32.io/tick-interval": "10ms"}, ready=False)
        c.kubectl("wait", "--for=condition=Ready", *[f"pod/{n}" for n in names], "--timeout=90s", timeout=120)
        time.sleep(1)
        busy = api_median(c)
    finally:
        delete(c, *names)
    assert busy < max(3 * baseline, 0.3), f"kubectl get pods: median {baseline:.2f} s, {busy:.2f} s with 6 busy pods"


def test_a_big_function_on_devkit_does_not_stall_the_api_server(cluster: ControlPlane) -> None:
    """A function of 48,000 instructions (past the 10,000 pwasm translates): about 5 MiB of
    decoded code, what devkit's 8 MiB heap holds (240,000 is tests/unit/test_wasm_bounds.py's)."""
    c = cluster
    body = "(global.set 0 (i32.add (global.get 0) (i32.const 1)))\n" * 12_000
    wasm = wasmtime.wat2wasm(f"""(module {HEAD} (memory 1) (global (mut i32) (i32.const {time.time_ns() & 0xFFFF}))
      (func (export "k32_handle") {body} (drop (call $rb (i32.const 0) (i32.const 0)))))""")
    run_pod(c, "big", push_wasm(c, wasm, "big"), "devkit")
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t = time.monotonic()
            c.kubectl("get", "--raw", "/readyz", check=False, timeout=60)
            latencies.append(time.monotonic() - t)
            time.sleep(0.1)
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        for _ in range(3):                 # the second call is pwasm's tier-up
            get(c, "big")
    finally:
        done.set()
        prober.join(timeout=70)
        delete(c, "big")
    assert latencies and max(latencies) < 3.0, f"/readyz took up to {max(latencies):.1f} s"


UNDECLARED_WAT = f"""(module {HEAD}
  (memory 1) (table 1 funcref) (func $f)
  (func (export "k32_handle") (table.set (i32.const 0) (ref.func $f))))"""


def test_pwasm_refuses_what_wasmtime_refuses(cluster: ControlPlane) -> None:
    c = cluster
    image = push_wasm(c, wasmtime.wat2wasm(UNDECLARED_WAT), "undeclared")
    messages = {}
    for node in ("sim-1", "devkit"):
        pod = f"undecl-{node}"
        run_pod(c, pod, image, node, ready=False)

        def terminated(pod: str = pod) -> dict | None:
            cs = (get_json(c, "pod", pod)["status"].get("containerStatuses") or [{}])[0]
            return (cs.get("state") or {}).get("terminated")
        messages[node] = wait_for(terminated, 60, 0.5, what=f"{pod} to fail")["message"]
        delete(c, pod)
    for node, message in messages.items():
        assert "does not compile" in message and "undeclared function reference" in message, (node, message)


def _container_state(c: ControlPlane, pod: str) -> dict:
    statuses = get_json(c, "pod", pod)["status"].get("containerStatuses") or [{}]
    return statuses[0].get("state") or {}


def test_a_start_function_or_k32_init_that_loops_for_ever_is_a_start_error_on_both_engines(
        cluster: ControlPlane) -> None:
    """Attack round 21b: a module whose start function loops left its pod
    ContainerCreating with no message (for the 120 s call timeout).  Now the start (the
    start function, then k32_init) has 30 s (kube32.timing.START_TIMEOUT_SECONDS): past
    them the container is terminated StartError naming the cause, with a Warning Failed
    event, as Kubernetes shows a container that failed to start."""
    c = cluster
    loops = {"start": f'(module {HEAD} (memory 1) (func $s (loop $l (br $l))) (start $s) (func (export "k32_handle")))',
             "init": f'(module {HEAD} (memory 1) (func (export "k32_init") (loop $l (br $l))) '
                     '(func (export "k32_handle")))'}
    images = {kind: push_wasm(c, wasmtime.wat2wasm(wat), f"loop-{kind}") for kind, wat in loops.items()}
    pods = {f"loop-{kind}-{node}": (kind, node) for kind in loops for node in ("sim-1", "devkit")}
    try:
        for name, (kind, node) in pods.items():
            run_pod(c, name, images[kind], node, ready=False)
        for name, (kind, _node) in pods.items():
            state = wait_for(lambda n=name: _container_state(c, n).get("terminated"), 90, 1,
                             what=f"{name} to fail its start")
            want = ("cannot instantiate the module: its start function did not return within the start "
                    "timeout of 30000 ms" if kind == "start" else
                    "k32_init failed: call k32_init exceeded the start timeout of 30000 ms")
            assert (state["reason"], state["message"]) == ("StartError", want), state
            assert get_json(c, "pod", name)["status"]["phase"] == "Failed"
            events = c.kubectl("get", "events", "--field-selector", f"involvedObject.name={name},reason=Failed",
                               "-o", "jsonpath={.items[*].message}").stdout
            assert f"Error: {want}" in events, events
    finally:
        delete(c, *pods)
